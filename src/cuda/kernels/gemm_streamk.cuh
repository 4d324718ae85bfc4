/* gemm_streamk.cuh - which tiles and k-blocks a CTA works on (cooperative
 * schedule), with a stream-K tail.
 *
 * A persistent grid of G clusters working through U tile pairs in waves of G
 * loses (ceil(U/G) - U/G) / ceil(U/G) of the machine in the last, partial
 * wave (4096^3 on 66 clusters: 256 pairs = 3.88 waves, 3% idle). With
 * stream-K (Osama et al., 2023) the last units are shared out by k-blocks
 * instead: every cluster g first takes its whole units below sk.dp_units
 * (g, g + G, ..., the same count for all), then the contiguous range
 * [b_r, b_{r+1}) of the remaining units' k-blocks, numbered
 * unit * kiters + kb, where r = G - 1 - g (see below), b_r = dp_units *
 * kiters + r T / G (rounded so that the shares differ by at most one) and
 * T the remaining k-block count. The host keeps one whole wave plus the
 * partial one for this part, so each cluster's range spans at least one
 * unit.
 *
 * The split form (few waves): only the partial wave's p units make the
 * tail, cut into S = G / p parts of ceil(kiters / S) k-blocks each (share,
 * extra = 0); b_r stops at sk.end (all units' k-blocks), so at least the
 * last G - S p ranges are empty (more where S does not divide kiters), and
 * those clusters stop after their whole units. A range then lies within one unit where S divides kiters (else
 * it may cross into the next, as below); the clusters running the tail
 * work through S aligned k-ranges side by side, and those of one range
 * share its k-blocks in L2 as a whole wave does.
 *
 * A range cut inside a unit leaves it to more than one cluster:
 *   - the cluster whose range starts inside the unit (kb0 > 0) is a
 *     contributor: that piece is the first of its range; it stores its f32
 *     accumulators to its slot of sk.part, raises its flags and runs no
 *     epilogue;
 *   - the cluster that has the unit's first k-block (kb0 = 0, kb1 < kiters)
 *     owns it: that piece is the last of its range, so the contributors
 *     (ranges r + 1, ... that start inside the unit) are long done with
 *     theirs; it waits for their flags, adds their partials in range order
 *     (the same sum every run) and runs the epilogue.
 * Ranges are numbered from the last cluster down (r = G - 1 - g) so that
 * an owner waits only on clusters of lower index: blocks are dispatched in
 * index order, so those are running whenever the owner is, even when the
 * grid does not fit on the GPU at once (another kernel holding SMs).
 * A cluster contributes at most once (its first piece), so a slot per CTA
 * and consumer warpgroup is enough (with a flag per warp). The owner
 * clears each flag it waited for, which leaves them all 0 for the next
 * launch on the stream.
 *
 * Host mirror of struct coda_sk_params: src/cuda/gemm.c. */

struct coda_sk_params {
    float *part;          /* (gridDim.x, 2, 64 * CODA_BN) f32 partials, or NULL */
    unsigned *flag;       /* (gridDim.x, 2, 4): 1 = that warp's partial is ready */
    int dp_units;         /* units done whole; n_units: no stream-K           */
    int share, extra;     /* the tail's k-blocks T = share G + extra: cluster g
                             gets share + (g < extra) of them (host-computed,
                             T < 2^31, so no 64-bit division here); the split
                             form: share ceil(kiters / S), extra 0           */
    int end;              /* units * kiters: no range reaches past it         */
};
static_assert(CODA_OFFSETOF(coda_sk_params, flag) == 8 && CODA_OFFSETOF(coda_sk_params, dp_units) == 16 &&
                  CODA_OFFSETOF(coda_sk_params, share) == 20 && CODA_OFFSETOF(coda_sk_params, extra) == 24 &&
                  CODA_OFFSETOF(coda_sk_params, end) == 28 && sizeof(coda_sk_params) == 32,
              "coda_sk_params: the layout of sk_params_t (src/cuda/gemm.c)");

/* What a cluster works on next: tile pair `unit`, k-blocks [kb0, kb1). */
struct coda_work {
    int unit, kb0, kb1;
    int next_dp;                /* next whole unit */
    int pos, end;               /* the stream-K range still to do */
};

/* Start of stream-K range r (b_r above; r = G gives the end), never past
 * sk.end. 64-bit before that cap: in the split form r share may pass
 * 2^31 for the empty ranges. */
static __device__ __forceinline__ int coda_sk_begin(const coda_sk_params &sk, int r, int kiters) {
    const long long b = (long long)sk.dp_units * kiters + (long long)r * sk.share + min(r, sk.extra);
    return (int)min(b, (long long)sk.end);
}

/* Cluster g of n_clusters: its whole units, then range r = n_clusters - 1 - g. */
static __device__ __forceinline__ void coda_work_start(coda_work &w, const coda_sk_params &sk,
                                                       int g, int n_clusters, int kiters) {
    const int r = n_clusters - 1 - g;
    w.next_dp = g;
    w.pos = coda_sk_begin(sk, r, kiters);
    w.end = coda_sk_begin(sk, r + 1, kiters);
    w.unit = w.kb0 = w.kb1 = 0;
}

static __device__ __forceinline__ bool coda_work_next(coda_work &w, const coda_sk_params &sk,
                                                      int n_clusters, int kiters) {
    if (w.next_dp < sk.dp_units) {
        w.unit = w.next_dp;
        w.kb0 = 0;
        w.kb1 = kiters;
        w.next_dp += n_clusters;
        return true;
    }
    if (w.pos >= w.end) return false;
    w.unit = w.pos / kiters;
    w.kb0 = w.pos - w.unit * kiters;
    w.kb1 = min(kiters, w.kb0 + (w.end - w.pos));
    w.pos += w.kb1 - w.kb0;
    return true;
}

/* ---- partial sums between CTAs ---- */
static __device__ __forceinline__ void coda_st_relaxed_u32(unsigned *p, unsigned v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

#define CODA_SK_SLOT_FLOATS (64 * CODA_BN) /* one consumer warpgroup's 64 x BN accumulators */

/* Slot of CTA `cta`, consumer warpgroup c: thread tid's accumulator 4i..4i+3
 * at float4 index i * 128 + tid (each warp writes 512 contiguous bytes). */
static __device__ __forceinline__ float4 *coda_sk_slot(const coda_sk_params &sk, int cta, int c) {
    return (float4 *)(sk.part + (size_t)(2 * cta + c) * CODA_SK_SLOT_FLOATS);
}

/* Flags are per warp: a warp of the owner reads exactly what the same warp
 * of the contributor wrote (the same fragment positions), so the handover
 * needs no barrier. (A warpgroup barrier here made ptxas assume diverged
 * warps afterwards and keep a second copy of the whole epilogue.) */
static __device__ __forceinline__ unsigned *coda_sk_flag(const coda_sk_params &sk, int cta, int c, int tid) {
    return sk.flag + (2 * cta + c) * 4 + tid / 32;
}

/* A contributor's piece: partial sums out, then its warp's flag (every lane
 * stores the same value, so no lane-divergent branch). */
static __device__ __forceinline__ void coda_sk_contribute(const coda_sk_params &sk, int cta, int c,
                                                          int tid, const float *acc) {
    float4 *slot = coda_sk_slot(sk, cta, c);
#pragma unroll
    for (int i = 0; i < CODA_BN / 8; i++)
        __stcg(slot + i * 128 + tid, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
    __threadfence();
    __syncwarp();
    coda_st_release_u32(coda_sk_flag(sk, cta, c, tid), 1u);
}

/* The owner's piece: wait for contributor `cta`'s warp and add its sums.
 * The poll's loop condition is the same in every lane; the flag is cleared
 * when all lanes have seen it set, for the next launch on the stream. */
static __device__ __forceinline__ void coda_sk_collect(const coda_sk_params &sk, int cta, int c,
                                                       int tid, float *acc) {
    unsigned *f = coda_sk_flag(sk, cta, c, tid);
    while (!__all_sync(0xffffffffu, coda_ld_acquire_u32(f) != 0)) __nanosleep(64);
    coda_st_relaxed_u32(f, 0u);
    const float4 *slot = coda_sk_slot(sk, cta, c);
#pragma unroll
    for (int i = 0; i < CODA_BN / 8; i++) {
        const float4 v = __ldcg(slot + i * 128 + tid);
        acc[4 * i] += v.x;
        acc[4 * i + 1] += v.y;
        acc[4 * i + 2] += v.z;
        acc[4 * i + 3] += v.w;
    }
}
