/* attention_wgmma.cuh - the causal GQA forward on Hopper's warpgroup MMA
 * (wgmma) with TMA loads: coda_attn_fwd_wgmma_kernel, the forward that
 * src/cuda/attention.c launches (coda_attn_fwd_kernel in attention.cuh,
 * mma.sync, stays as the CODA_DEBUG_ATTN_MMA alternative).
 *
 * Compiled after gemm_prelude.cuh (TMA, mbarrier, descriptors),
 * gemm_wgmma.cuh (the wgmma wrappers, CODA_TA = CODA_TB = 0) and
 * attention.cuh (HD, coda_attn_args_t, constants).
 *
 * Work items of (64 x AW_NC query rows, head, sequence), the longest rows
 * first, heads fastest; a 1-D grid of 128 x (AW_NC + 1)-thread blocks
 * (AW_NC = CODA_AW_CONSUMERS consumer warpgroups: 2, or 3 at head_dim 64,
 * 192 rows over 128-key tiles, where the first warpgroups may need a key
 * tile fewer than the block loads: they release it unread). With as many blocks as
 * items each takes one; with fewer (persistent: one a multiprocessor, the
 * host's choice) block j takes items j, then 2G - 1 - j, then 2G + j...
 * (G blocks; rounds alternate in direction so that every block's sum of
 * lengths is about the same), and the producer loads the next item's q
 * and tiles while the consumers finish this one (the ring and the
 * barriers' phases run on across items). Each block:
 *   warpgroup 0      the producer: one thread issues the TMA loads of the
 *                    block's q and, through a ring of AW_STAGES stages, each
 *                    128-key tile's k and v (3-D tensor map over (column,
 *                    position, sequence): rows past the sequence's end come
 *                    in as zeros, nothing of the next sequence is read)
 *   warpgroups 1..   consumers, 64 query rows each:
 *                    S = q k^T   wgmma m64n128k16, q and k K-major in shared
 *                                memory (128-byte swizzle)
 *                    online softmax on S in registers (base 2, as attention.cuh)
 *                    o += P v    wgmma m64nHDk16, P from registers (the S
 *                                accumulator's layout is the A fragment's),
 *                                v N-major in shared memory
 *                    with the next tile's S issued before this tile's P v,
 *                    so the softmax of one overlaps the product of the other
 *                    (FlashAttention-3's intra-warpgroup overlap).
 * With CODA_AW_PINGPONG (an NVRTC option from attention.c) the two
 * consumers also take turns at the tensor cores (FlashAttention-3's
 * ping-pong): a warpgroup issues its products only when the other has
 * issued its own and passed the turn (named barriers 4 + c), so one's
 * softmax runs under the other's products instead of both contending.
 * Only the last key tile of a block (the diagonal, and the sequence's end)
 * is masked; tiles past it are never loaded.
 *
 * With CODA_AW_APART a stage's k is freed as soon as both consumers' S of
 * its tile are made, and its v when their P v are; without, both when the
 * P v are. (A tile's k is needed one round of products before its v: freed
 * together, the next tile's k could only be loaded once the other
 * warpgroup's round had ended, just when the first wants to issue.)
 *
 * Shared memory (1024-byte aligned for the swizzle; the host adds the slack):
 *   q       HD / 64 chunks of 128 rows x 128 bytes (warpgroup c's rows at
 *           + 8 KiB c in each)
 *   k[s]    HD / 64 chunks of 128 rows x 128 bytes, per stage (CODA_AW_STAGES)
 *   v[s]    the same
 *   barriers q full, k full[s], v full[s], k empty[s], v empty[s] (v empty
 *            unused without CODA_AW_APART), q empty */

#ifndef CODA_AW_STAGES
#define CODA_AW_STAGES 2
#endif
#ifndef CODA_AW_APART
#define CODA_AW_APART 0
#endif
#ifndef CODA_AW_CONSUMERS
#define CODA_AW_CONSUMERS 2
#endif
#define AW_NC CODA_AW_CONSUMERS      /* the forward's consumer warpgroups, 64 query rows each */
#define AW_BM (64 * AW_NC)           /* query rows of a forward item     */
#define AW_BN 128                    /* keys per tile                    */
#define AW_STAGES CODA_AW_STAGES
#define AW_CONSUMER_THREADS 256      /* the backward's two consumer warpgroups */
#define AW_FWD_CONSUMER_THREADS (128 * AW_NC)
/* Positions of one TMA box: a whole tile with two consumers (q and k both
 * 128 rows), 64 with three (q 192 rows, k 128: loaded in 64-row pieces,
 * which land as one tile would, the swizzle repeating every 8 rows). The
 * host's map (src/cuda/attention.c) has the same. */
#define AW_BOX_ROWS (AW_NC == 2 ? 128 : 64)
#define AW_CHUNK (AW_BN * 128)       /* bytes of one 64-column chunk of a k or v tile */
#define AW_QCHUNK (AW_BM * 128)      /* and of q                          */
#define AW_TILE_BYTES (HD / 64 * AW_CHUNK)
#define AW_Q_BYTES (HD / 64 * AW_QCHUNK)
#define AW_BAR_OFF (AW_Q_BYTES + 2 * AW_STAGES * AW_TILE_BYTES)
#define AW_SMEM (AW_BAR_OFF + 8 * (2 + 4 * AW_STAGES)) /* + 1024 of slack on the host */

/* 3-D TMA tile load (column, position, sequence), completing on `bar`. */
static __device__ __forceinline__ void aw_tma_load3(u32 dst, const coda_tmap *map, int col, int pos, int b,
                                                    u32 bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
                 "l"((u64)map), "r"(col), "r"(pos), "r"(b), "r"(bar)
                 : "memory");
}

/* `rows` positions from pos (HD columns from column col0) into the tile at
 * dst, its 64-column chunks rows x 128 bytes apart; in boxes of AW_BOX_ROWS. */
static __device__ __forceinline__ void aw_load_tile(u32 dst, const coda_tmap *map, int col0, int pos, int b,
                                                    u32 bar, const int rows) {
#pragma unroll
    for (int c = 0; c < HD / 64; c++)
#pragma unroll
        for (int r = 0; r < rows; r += AW_BOX_ROWS)
            aw_tma_load3(dst + c * rows * 128 + r * 128, map, col0 + 64 * c, pos + r, b, bar);
}

/* One key tile of the online softmax for the thread's rows row0 and row0 + 8
 * (s: the S accumulator, m64n128 layout): mask (when `mask`), the running
 * max m (base 2, scaled), the row sums l; s becomes the probabilities and
 * alpha the factor by which the rows' o must be rescaled. */
static __device__ __forceinline__ void aw_softmax(float *s, int k0, int row0, int seq, int mask, float sl2,
                                                  float *m, float *l, float *alpha) {
    const int lane = threadIdx.x & 31;
    float mx[2] = {NEG_INF, NEG_INF};
    if (mask) {
#pragma unroll
        for (int i = 0; i < AW_BN / 2; i++) {
            const int kc = k0 + (i >> 2) * 8 + (lane & 3) * 2 + (i & 1), row = row0 + (i & 2) * 4;
            if (kc > row || kc >= seq) s[i] = NEG_INF;
        }
    }
#pragma unroll
    for (int i = 0; i < AW_BN / 2; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mnew = fmaxf(m[r], mx[r] * sl2);
        base[r] = mnew == NEG_INF ? 0.f : mnew;
        alpha[r] = attn_exp2(m[r] - base[r]);
        m[r] = mnew;
    }
    float ls[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < AW_BN / 2; i++) {
        const int r = (i >> 1) & 1;
        s[i] = attn_exp2(fmaf(s[i], sl2, -base[r]));
        ls[r] += s[i];
    }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + ls[r];
}

/* An accumulator (m64nN layout, N = 16 k16) as bf16 A fragments, one per
 * 16 columns: P for P v here, P^T and dS^T (and dS) in the backward. */
static __device__ __forceinline__ void aw_pack(const float *s, u32 (*a)[4], const int k16) {
#pragma unroll
    for (int kk = 0; kk < k16; kk++) {
        a[kk][0] = pack_bf2(s[8 * kk + 0], s[8 * kk + 1]);
        a[kk][1] = pack_bf2(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = pack_bf2(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = pack_bf2(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* S = q k^T for the warpgroup's 64 rows (q at qa) and the 128 keys at kb. */
static __device__ __forceinline__ void aw_issue_s(float *s, u32 qa, u32 kb) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        coda_wgmma_n128(s, coda_desc(qa + (kk >> 2) * AW_QCHUNK + (kk & 3) * 32, 16, 1024),
                        coda_desc(kb + (kk >> 2) * AW_CHUNK + (kk & 3) * 32, 16, 1024), kk > 0);
    coda_wgmma_commit();
}

/* acc (64 x HD) += a (64 x 16 k16, registers) . b (16 k16 rows of HD at b,
 * N-major: k16 step kk 16 rows = 2 KiB further, the HD / 64 column chunks
 * chunk bytes apart); not committed. o += P v here (a 128-key tile), dv,
 * dk and dq in the backward (64-row tiles). */
static __device__ __forceinline__ void aw_issue_rs(float *acc, u32 (*a)[4], u32 b, const int k16, u32 chunk) {
#pragma unroll
    for (int kk = 0; kk < k16; kk++) {
#if HD == 128
        coda_wgmma_rs_n128(acc, a[kk], coda_desc(b + kk * 2048, chunk, 1024));
#else
        coda_wgmma_rs_n64(acc, a[kk], coda_desc(b + kk * 2048, chunk, 1024));
#endif
    }
}

/* o += P v for the 128 keys of the tile at vb. */
static __device__ __forceinline__ void aw_issue_pv(float *o, u32 (*pa)[4], u32 vb) {
    aw_issue_rs(o, pa, vb, AW_BN / 16, AW_CHUNK);
    coda_wgmma_commit();
}

/* The ping-pong's turn: warpgroup c waits on barrier 4 + c before it
 * issues and passes to the next, 4 + (c + 1) % AW_NC, after (256 threads:
 * 128 wait, 128 of the other arrive): the consumers take the tensor cores
 * round robin. The last warpgroup passes once before its first turn, so 0
 * goes first, and skips its pass after its last (of the block's last
 * item), so every arrival is waited for. */
#ifndef CODA_AW_PINGPONG
#define CODA_AW_PINGPONG 0
#endif
#if CODA_AW_PINGPONG
#define AW_TURN_WAIT(c) coda_turn_wait(4 + (c))
#define AW_TURN_PASS(c, last) \
    do {                      \
        if (!((c) == AW_NC - 1 && (last))) coda_turn_pass(4 + ((c) + 1) % AW_NC); \
    } while (0)
#else
#define AW_TURN_WAIT(c) ((void)0)
#define AW_TURN_PASS(c, last) ((void)0)
#endif

#define AW_FENCE(v, n)                                                          \
    do {                                                                        \
        _Pragma("unroll") for (int i_ = 0; i_ < (n); i_++) coda_fence_reg((v)[i_]); \
    } while (0)

/* The block's k-th item (-1: none left): round k, in alternating directions. */
static __device__ __forceinline__ int aw_item(int k, int n_items) {
    const int g = (int)gridDim.x, j = (int)blockIdx.x;
    const long long it = (long long)k * g + (k & 1 ? g - 1 - j : j);
    return it < n_items ? (int)it : -1;
}

/* Causal: the 128-key tiles that rows below `end` see (keys past the
 * sequence's end are never loaded). */
static __device__ __forceinline__ int aw_key_tiles(int end, int seq) {
    return (min(end, seq) + AW_BN - 1) / AW_BN;
}

/* An item's rows, head and sequence: the longest rows (the last tile) first,
 * heads fastest, then sequences. */
static __device__ __forceinline__ void aw_decode(const coda_attn_args_t &p, int item, int n_tiles, int *tile,
                                                 int *h, int *b) {
    const int hb = p.n_heads * p.batch;
    *tile = n_tiles - 1 - item / hb;
    *h = item % hb % p.n_heads;
    *b = item % hb / p.n_heads;
}

/* Registers a thread after setmaxnreg: the producer gives back what its
 * one loading thread does not need; the consumers take the rest
 * (128 x (AW_NC + 1) threads, 64 K registers: 40 + 2 x 232, 24 + 3 x 160). */
#define AW_PRODUCER_REGS (AW_NC == 2 ? 40 : 24)
#define AW_CONSUMER_REGS (AW_NC == 2 ? 232 : 160)

extern "C" __global__ void __launch_bounds__(128 * (AW_NC + 1), 1)
coda_attn_fwd_wgmma_kernel(const __grid_constant__ coda_tmap tmap, coda_attn_args_t p) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const u32 base = (coda_smem_addr(smem) + 1023u) & ~1023u;
    const u32 sq = base, sk = base + AW_Q_BYTES, sv = sk + AW_STAGES * AW_TILE_BYTES;
    const u32 bars = base + AW_BAR_OFF;
#define BAR_Q (bars)
#define BAR_K(s) (bars + 8 + 8 * (s))
#define BAR_V(s) (bars + 8 + 8 * AW_STAGES + 8 * (s))
#define BAR_E(s) (bars + 8 + 16 * AW_STAGES + 8 * (s)) /* k's, or the whole stage's */
#define BAR_EV(s) (bars + 8 + 24 * AW_STAGES + 8 * (s))
#define BAR_QE (bars + 8 + 32 * AW_STAGES)              /* q read: the next item's may come */
    const int seq = p.seq, n_tiles = (seq + AW_BM - 1) / AW_BM, n_items = n_tiles * p.n_heads * p.batch;
    const int group = p.n_heads / p.n_kv_heads;
    /* warp-uniform as far as the compiler can tell (a lane's shuffle): the
     * consumers' tile counts depend on it, and a loop over wgmma whose
     * bounds might diverge within a warp gets its wgmma serialised */
    const int wg = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);

    if (threadIdx.x == 0) {
        coda_mbar_init(BAR_Q, 1);
        coda_mbar_init(BAR_QE, AW_FWD_CONSUMER_THREADS);
        for (int s = 0; s < AW_STAGES; s++) {
            coda_mbar_init(BAR_K(s), 1);
            coda_mbar_init(BAR_V(s), 1);
            coda_mbar_init(BAR_E(s), AW_FWD_CONSUMER_THREADS); /* each releases for itself (below) */
            coda_mbar_init(BAR_EV(s), AW_FWD_CONSUMER_THREADS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) { /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(AW_PRODUCER_REGS));
        if (threadIdx.x == 0) {
            coda_prefetch_tmap(&tmap);
            int g = 0; /* tiles loaded so far, over the block's items: the ring's place */
            for (int k = 0, item; (item = aw_item(k, n_items)) >= 0; k++) {
                int tile, h, b;
                aw_decode(p, item, n_tiles, &tile, &h, &b);
                const int col_k = p.n_heads * HD + h / group * HD, col_v = col_k + p.n_kv_heads * HD;
                /* causal: the keys below the item's last row (or the sequence's end) */
                const int n_kv = aw_key_tiles(tile * AW_BM + AW_BM, seq);
                if (k > 0) coda_mbar_wait(BAR_QE, (u32)(k - 1) & 1u);
                coda_mbar_expect_tx(BAR_Q, AW_Q_BYTES);
                aw_load_tile(sq, &tmap, h * HD, tile * AW_BM, b, BAR_Q, AW_BM);
                for (int j = 0; j < n_kv; j++, g++) {
                    const int s = g % AW_STAGES;
                    const u32 ph = (u32)((g / AW_STAGES) - 1) & 1u;
                    if (g >= AW_STAGES) coda_mbar_wait(BAR_E(s), ph);
                    coda_mbar_expect_tx(BAR_K(s), AW_TILE_BYTES);
                    aw_load_tile(sk + s * AW_TILE_BYTES, &tmap, col_k, j * AW_BN, b, BAR_K(s), AW_BN);
                    if (CODA_AW_APART && g >= AW_STAGES) coda_mbar_wait(BAR_EV(s), ph);
                    coda_mbar_expect_tx(BAR_V(s), AW_TILE_BYTES);
                    aw_load_tile(sv + s * AW_TILE_BYTES, &tmap, col_v, j * AW_BN, b, BAR_V(s), AW_BN);
                }
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(AW_CONSUMER_REGS));
    const int c = wg - 1, tid = threadIdx.x % 128, lane = tid & 31;
    const u32 qa = sq + c * 8192;
    const float sl2 = p.scale * LOG2E;
#if CODA_AW_PINGPONG
    if (c == AW_NC - 1) coda_turn_pass(4);
#endif
    int g0 = 0; /* the ring's place of the item's first tile */
    for (int k = 0, item; (item = aw_item(k, n_items)) >= 0; k++) {
        int tile, h, b;
        aw_decode(p, item, n_tiles, &tile, &h, &b);
        const int last_item = aw_item(k + 1, n_items) < 0;
        const int q0 = tile * AW_BM, n_kv = aw_key_tiles(q0 + AW_BM, seq);
        /* This warpgroup's key tiles: those below its own last row. With
         * three consumers (192 rows over 128-key tiles) the first ones
         * may need one tile fewer than the block loads; rows wholly past
         * the sequence's end (none are stored) take one. Only the last of
         * a warpgroup's tiles holds keys past its first row or the end. */
        const int r_first = q0 + 64 * c;
        const int n_mine = r_first < seq ? aw_key_tiles(r_first + 64, seq) : 1;
        const int row0 = r_first + 16 * (tid >> 5) + (lane >> 2); /* and row0 + 8 */
        float o[HD / 2], s[AW_BN / 2], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f}, alpha[2];
        u32 pa[AW_BN / 16][4];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) o[i] = 0.f;

        const int s0 = g0 % AW_STAGES;
        coda_mbar_wait(BAR_Q, (u32)k & 1u);
        coda_mbar_wait(BAR_K(s0), (u32)(g0 / AW_STAGES) & 1u);
        AW_TURN_WAIT(c);
        coda_wgmma_fence();
        aw_issue_s(s, qa, sk + s0 * AW_TILE_BYTES);
        AW_TURN_PASS(c, 0);
        coda_wgmma_wait(0);
        AW_FENCE(s, AW_BN / 2);
        if (CODA_AW_APART) coda_mbar_arrive(BAR_E(s0)); /* k of tile 0 read */
        if (n_mine == 1) coda_mbar_arrive(BAR_QE);        /* q read for the last time */
        aw_softmax(s, 0, row0, seq, n_mine == 1, sl2, m, l, alpha);
        aw_pack(s, pa, AW_BN / 16);

        for (int j = 1; j < n_mine; j++) {
            const int gj = g0 + j, s_now = gj % AW_STAGES, s_prev = (gj - 1) % AW_STAGES;
            coda_mbar_wait(BAR_K(s_now), (u32)(gj / AW_STAGES) & 1u);
            AW_TURN_WAIT(c);
            coda_wgmma_fence();
            aw_issue_s(s, qa, sk + s_now * AW_TILE_BYTES);
            coda_mbar_wait(BAR_V(s_prev), (u32)((gj - 1) / AW_STAGES) & 1u);
            aw_issue_pv(o, pa, sv + s_prev * AW_TILE_BYTES);
            AW_TURN_PASS(c, 0);
            coda_wgmma_wait(1); /* S done, P v of the previous tile in flight */
            AW_FENCE(s, AW_BN / 2);
            if (CODA_AW_APART) coda_mbar_arrive(BAR_E(s_now)); /* k of tile j read */
            if (j == n_mine - 1) coda_mbar_arrive(BAR_QE);     /* q read for the last time */
            aw_softmax(s, j * AW_BN, row0, seq, j == n_mine - 1, sl2, m, l, alpha);
            coda_wgmma_wait(0);
            AW_FENCE(o, HD / 2);
            /* every thread releases for itself: no __syncwarp before one
             * lane's arrive (measured faster in the backward's dk/dv kernel) */
            coda_mbar_arrive(CODA_AW_APART ? BAR_EV(s_prev) : BAR_E(s_prev));
#pragma unroll
            for (int i = 0; i < HD / 2; i++) o[i] *= alpha[(i >> 1) & 1];
            aw_pack(s, pa, AW_BN / 16);
        }
        {
            const int gl = g0 + n_mine - 1, s_last = gl % AW_STAGES;
            coda_mbar_wait(BAR_V(s_last), (u32)(gl / AW_STAGES) & 1u);
            AW_TURN_WAIT(c);
            coda_wgmma_fence();
            aw_issue_pv(o, pa, sv + s_last * AW_TILE_BYTES);
            AW_TURN_PASS(c, last_item && n_mine == n_kv);
            coda_wgmma_wait(0);
            AW_FENCE(o, HD / 2);
            coda_mbar_arrive(CODA_AW_APART ? BAR_EV(s_last) : BAR_E(s_last));
        }
        /* The block's tiles past this warpgroup's: release each stage
         * (after its loads have landed: an arrival before would count
         * towards the stage's previous use, freeing it while another
         * warpgroup still reads it) and take the turns the products would
         * have, so the round robin stays in step. */
        for (int j = n_mine; j < n_kv; j++) {
            const int gj = g0 + j, sj = gj % AW_STAGES;
            const u32 ph = (u32)(gj / AW_STAGES) & 1u;
            coda_mbar_wait(BAR_K(sj), ph);
            coda_mbar_arrive(BAR_E(sj));
            if (CODA_AW_APART) {
                coda_mbar_wait(BAR_V(sj), ph);
                coda_mbar_arrive(BAR_EV(sj));
            }
            AW_TURN_WAIT(c);
            AW_TURN_PASS(c, last_item && j == n_kv - 1);
        }
        g0 += n_kv;

        /* finish: the quad's row sums, o = acc / l, lse (natural log) */
        const long long r0 = (long long)b * seq;
        u16 *ob = (u16 *)p.out + r0 * p.ld_o + h * HD;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lr = l[r];
            lr += __shfl_xor_sync(0xffffffffu, lr, 1);
            lr += __shfl_xor_sync(0xffffffffu, lr, 2);
            const int row = row0 + 8 * r;
            if (row >= seq) continue;
            const float inv = 1.f / lr;
            u32 *orow = (u32 *)(ob + (long long)row * p.ld_o);
#pragma unroll
            for (int t = 0; t < HD / 8; t++)
                orow[4 * t + (lane & 3)] = pack_bf2(o[4 * t + 2 * r] * inv, o[4 * t + 2 * r + 1] * inv);
            if ((lane & 3) == 0) p.lse[(r0 + row) * p.ld_lse + h] = m[r] * LN2 + logf(lr);
        }
    }
#undef BAR_Q
#undef BAR_K
#undef BAR_V
#undef BAR_E
#undef BAR_EV
#undef BAR_QE
}
