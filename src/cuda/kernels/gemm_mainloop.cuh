/* gemm_mainloop.cuh - persistent, warp-specialised Hopper GEMM mainloop.
 *
 *   C (M, N) = epilogue( op(A) op(B) ),  bf16 operands, f32 accumulators.
 *
 * Compile-time parameters (NVRTC -D options, set by src/cuda/gemm.c):
 *   CODA_PINGPONG  0: cooperative schedule, both consumer warpgroups work
 *                  on every tile (64 rows each);
 *                  1: ping-pong schedule (CODA_BN 128 only), each consumer
 *                  warpgroup owns every other 128 x 128 tile, so one runs
 *                  its epilogue while the other runs its mainloop
 *   CODA_BN        block tile columns: 128 or 256 (rows: CODA_BM = 128)
 *   CODA_STAGES    shared-memory pipeline depth
 *   CODA_TA        0: A is K-major (M, K) [NT, NN];  1: A is M-major (K, M) [TN]
 *   CODA_TB        0: B is K-major (N, K) [NT];      1: B is N-major (K, N) [NN, TN]
 *   CODA_CLUSTER   CTAs per cluster along M (1 or 2); the pair shares B tiles,
 *                  each CTA loads half of B and multicasts it to both
 *   CODA_EPI_STORE_C  1: the values the epilogue leaves in each pair are the
 *                  main output C, stored through shared memory by TMA (tma_c);
 *                  0: the epilogue does all its own stores
 *   CODA_C_F32     C's type when stored: 1 f32, 0 bf16
 *   CODA_EPI_OVERLAP  1: each tile's epilogue runs beside the next tile's
 *                  k-loop, from the tile held as bf16 (gemm_overlap.cuh;
 *                  fused cooperative kernels without stream-K or ring)
 *
 * Threads: 3 warpgroups. Warpgroup 0 is the producer (one thread issues TMA
 * loads); warpgroups 1 and 2 are consumers issuing m64nBNk16 wgmma:
 * cooperative, each on one 64-row half of every tile; ping-pong, each on
 * both halves (CODA_WG_MH = 2 row blocks, 2 x 64 accumulators per thread)
 * of the tiles it owns. In ping-pong the producer still
 * fills one stage ring in tile order; a consumer's tile starts at ring
 * position (its tile sequence number) x (k-blocks per tile). The two take
 * turns at the mainloop (named barriers 4 + c: a warpgroup starts its
 * tile's k-loop once the other has issued its previous tile's last wgmma),
 * so each epilogue runs beside the other's mainloop. The turns are also
 * what makes the mbarrier parity waits sound: a consumer must never wait on
 * a stage more than one phase ahead of the producer, and without turns a
 * warpgroup done with its epilogue would wait on its next tile's stages
 * while the other warpgroup's fills of those stages are still pending.
 * The grid is persistent:
 * CTA i takes tiles i, i + gridDim.x, ... in a grouped order (CODA_GROUP_M
 * tile rows at a time) so that concurrently running tiles share A and B
 * blocks in L2.
 *
 * Shared memory, per stage (1024-byte aligned for the 128B swizzle):
 *   A: 2 halves of 64 rows x 64 k (8 KiB each). K-major: 64 rows of 128 B.
 *      M-major: 64 k-rows of 64 m (128 B) - one 64-wide MN atom column.
 *   B: K-major: BN rows of 128 B (64 k). N-major: BN/64 chunks of 64 k-rows x 64 n.
 * After the stages: C staging, per consumer two 64-row x 128-byte buffers
 * (8 KiB each, 128B-swizzled like TMA's view), then the mbarriers, then the
 * epilogue's scratch.
 * K tails and M/N edges come in as zeros from TMA (out-of-bounds fill); TMA
 * stores drop rows >= M and columns >= N.
 *
 * Epilogue inputs through the ring (CODA_EPI_RING, set by a generated
 * epilogue of the RING form on the cooperative schedule): after a tile's
 * k-blocks the producer puts CODA_BN / 64 more entries into the same ring,
 * each the tile's 128 rows x 64 columns of the program's ring inputs
 * (struct coda_ring_params). They are copied while the consumers run the
 * tile's last k-blocks; the consumers read each chunk in the epilogue and
 * free its stage as they would a k-block's, and the next tile's k-blocks
 * follow in the ring.
 *
 * Measurement probes (timeline stamps, the C store or the whole plain
 * epilogue left out): CODA_PROBE_* and the macros they set, all in
 * probes.cuh; the library compiles none of them in. */

#define CODA_BM 128
#define CODA_BK 64
#ifndef CODA_GROUP_M
#define CODA_GROUP_M 8
#endif
/* Every consumer warp that reads a stage frees it: the ring's chunks are
 * read per warp, so one arrive per warpgroup would free a chunk other
 * warps still read (and for k-blocks it measured no faster). */
#define CODA_ARRIVERS (CODA_PINGPONG ? 4 : 8)
#define CODA_IS_ARRIVER (tid % 32 == 0)
#ifndef CODA_CLUSTER
#define CODA_CLUSTER 1
#endif

#ifndef CODA_EPI_STORE_C
#define CODA_EPI_STORE_C 0
#endif
#ifndef CODA_EPI_RING
#define CODA_EPI_RING 0
#endif
#ifndef CODA_STREAMK /* 1: the stream-K tail (gemm_streamk.cuh) is compiled in */
#define CODA_STREAMK 0
#endif
#if CODA_STREAMK && CODA_PINGPONG
#error "stream-K is for the cooperative schedule"
#endif
#if CODA_EPI_RING && (CODA_PINGPONG || CODA_EPI_STORE_C || (8 % CODA_EPI_BATCH) != 0)
#error "ring inputs need the cooperative schedule, no C store and batches inside 64-column chunks"
#endif
#if CODA_EPI_RING && CODA_CLUSTER > 1 && CODA_BN != 256
#error "ring box 1 sits over the CTA's own half of B: needs BN = 256 with clusters (see ring_box)"
#endif
#ifndef CODA_C_F32
#define CODA_C_F32 0
#endif
/* CODA_C_TAIL 1: N is not a whole number of 16-byte units of C, and the
 * columns past the last whole unit are stored by their threads (see the C
 * store below); a kernel of its own, so that every other GEMM runs the
 * code it ran before. */
#ifndef CODA_C_TAIL
#define CODA_C_TAIL 0
#endif
#define CODA_C_ESZ (CODA_C_F32 ? 4 : 2)
#define CODA_C_CHUNK_COLS (128 / CODA_C_ESZ)             /* columns per 128-byte chunk */
#define CODA_C_NCHUNK (CODA_BN / CODA_C_CHUNK_COLS)
#define CODA_CBUF_BYTES (2 * 2 * 8192)                   /* 2 consumers x 2 buffers */

#define CODA_A_BYTES (CODA_BM * CODA_BK * 2)
#define CODA_B_BYTES (CODA_BN * CODA_BK * 2)
#define CODA_STAGE_BYTES (CODA_A_BYTES + CODA_B_BYTES)

#if CODA_BN == 256
#define coda_wgmma coda_wgmma_n256
#elif CODA_BN == 128
#define coda_wgmma coda_wgmma_n128
#else
#error "CODA_BN must be 128 or 256"
#endif

/* The pieces of work of this CTA, in order: tile pair `unit`, k-blocks
 * [kb_begin, kb_end). The producer and the cooperative consumers must walk
 * exactly the same sequence (the stage ring's order), so both loops are
 * this one. Without stream-K: the CTA's units, whole. Opens the loop body
 * (the caller writes the brace). */
#if CODA_STREAMK
#define CODA_FOR_EACH_PIECE(unit, kb_begin, kb_end)                            \
    coda_work work_;                                                          \
    coda_work_start(work_, sk, unit0, unit_step, kiters);                     \
    for (int unit, kb_begin, kb_end;                                          \
         coda_work_next(work_, sk, unit_step, kiters) &&                      \
         (unit = work_.unit, kb_begin = work_.kb0, kb_end = work_.kb1, 1);)
#else
#define CODA_FOR_EACH_PIECE(unit, kb_begin, kb_end)                            \
    for (int unit = unit0, kb_begin = 0, kb_end = kiters; unit < n_units; unit += unit_step)
#endif

/* Keep the compiler from moving any accumulator access across this point
 * (around wgmma issue and wait). */
#define CODA_FENCE_ACC(acc)                                                   \
    do {                                                                      \
        _Pragma("unroll") for (int mh_ = 0; mh_ < CODA_WG_MH; mh_++)          \
            _Pragma("unroll") for (int i_ = 0; i_ < CODA_BN / 2; i_++)        \
                coda_fence_reg((acc)[mh_][i_]);                               \
    } while (0)

/* Tile index -> (tile row, tile column), grouped by CODA_GROUP_M tile rows. */
static __device__ __forceinline__ void coda_tile_coords(int tile, int tiles_m, int tiles_n,
                                                        int *tm, int *tn) {
    const int per_group = CODA_GROUP_M * tiles_n;
    const int first_m = (tile / per_group) * CODA_GROUP_M;
    const int rows = min(tiles_m - first_m, CODA_GROUP_M);
    const int r = tile % per_group;
    *tm = first_m + r % rows;
    *tn = r / rows;
}

/* Descriptors for k16 step kk of a stage. K-major: the k16 slice is 32 bytes
 * into each 128-byte row; MN-major: 16 k-rows further, i.e. two 1024-byte
 * swizzle atoms. LBO (MN-major): 8 KiB between 64-wide MN chunks; SBO: 1 KiB
 * between groups of 8 rows (K-major) or 8 k-rows (MN-major). */
#define CODA_MN_LBO 8192
#define CODA_MN_SBO 1024
static __device__ __forceinline__ u64 coda_desc_a(u32 a_half, int kk) {
#if CODA_TA
    return coda_desc(a_half + kk * 2048, CODA_MN_LBO, CODA_MN_SBO);
#else
    return coda_desc(a_half + kk * 32, 16, 1024);
#endif
}
static __device__ __forceinline__ u64 coda_desc_b(u32 b, int kk) {
#if CODA_TB
    return coda_desc(b + kk * 2048, CODA_MN_LBO, CODA_MN_SBO);
#else
    return coda_desc(b + kk * 32, 16, 1024);
#endif
}

/* What the epilogue sees of a consumer thread's tile (the ring fields are
 * set per chunk in the epilogue). In fused kernels the C staging buffers
 * are each consumer warp's 4 KiB slab (stage): the epilogue's staged tile
 * inputs and outputs (coda_epi_vput / coda_epi_fetch, coda_epi_pair /
 * coda_epi_flush) and the column vectors coda_epi_preload copies in. */
static __device__ __forceinline__ coda_epi_tile coda_tile_view(int M, int N, int tm, int tn, int trow, int c,
                                                              int tid, unsigned char *scratch, u32 cbufs) {
    coda_epi_tile t;
    t.m = M;
    t.n = N;
    t.tile_m = tm;
    t.tile_n = tn;
    t.row = trow;
    t.col = tn * CODA_BN + 2 * (tid % 4);
    t.wg = c;
    t.tid = tid;
    t.scratch = scratch;
    t.stage = cbufs + (u32)(c * 4 + tid / 32) * 4096u;
    t.ring = 0;
    t.ring_box = 0;
    return t;
}

/* A consumer warp is done with a stage: with clusters, the peer CTA's
 * producer waits for it too (its multicast writes B into this CTA's stage). */
static __device__ __forceinline__ void coda_stage_release(u32 empty_bar) {
#if CODA_CLUSTER > 1
    for (u32 r = 0; r < CODA_CLUSTER; r++) coda_mbar_arrive_cluster(empty_bar, r);
#else
    coda_mbar_arrive(empty_bar);
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1)
coda_gemm_kernel(const __grid_constant__ coda_tmap tma_a, const __grid_constant__ coda_tmap tma_b,
                 const __grid_constant__ coda_tmap tma_c, int M, int N, int K,
                 const __grid_constant__ coda_epi_params epi,
                 const __grid_constant__ coda_ring_params ring,
                 const __grid_constant__ coda_store_maps smaps,
                 const __grid_constant__ coda_sk_params sk) {
    extern __shared__ unsigned char coda_smem_raw[];
    /* 1024-byte alignment for the swizzle atoms (the host adds the slack). */
    const u32 raw = coda_smem_addr(coda_smem_raw);
    const u32 base = (raw + 1023u) & ~1023u;
    const u32 cbufs = base + CODA_STAGES * CODA_STAGE_BYTES;
    const u32 bars = cbufs + CODA_CBUF_BYTES;  /* full[s], then empty[s] */
#define FULL(s) (bars + 8u * (s))
#define EMPTY(s) (bars + 8u * (CODA_STAGES + (s)))
    unsigned char *scratch = coda_smem_raw + (bars + 16u * CODA_STAGES - raw);

    const int tiles_m = (M + CODA_BM - 1) / CODA_BM;
    const int tiles_n = (N + CODA_BN - 1) / CODA_BN;
    /* With clusters, tiles go out in pairs of vertically adjacent tile rows
     * (same tile column): cluster c takes tile pair c, c + clusters, ... */
    const int tiles_m2 = (tiles_m + CODA_CLUSTER - 1) / CODA_CLUSTER;
    const int n_units = tiles_m2 * tiles_n;
    const int kiters = (K + CODA_BK - 1) / CODA_BK;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const u32 crank = CODA_CLUSTER > 1 ? coda_cluster_rank() : 0;
    const int unit0 = blockIdx.x / CODA_CLUSTER, unit_step = gridDim.x / CODA_CLUSTER;
    /* Ring box b sits b ring_box bytes into its stage: box 0 over A (which
     * only this CTA writes), box 1 over this CTA's own half of B. The peer
     * CTA's multicast writes the other half of B here, and its next write
     * there is ordered after this CTA's consumers freed the stage only by a
     * CTA-scope release (as for k-blocks, whose reads are wgmma's): the ring
     * keeps out of its way. */
    const u32 ring_box = CODA_RING_BOX_BYTES * (1u + crank);

    if (threadIdx.x == 0) {
        /* the descriptors' first fetch would otherwise delay the first loads */
        coda_prefetch_tmap(&tma_a);
        coda_prefetch_tmap(&tma_b);
#if CODA_EPI_STORE_C
        coda_prefetch_tmap(&tma_c);
#endif
        for (int s = 0; s < CODA_STAGES; s++) {
            coda_mbar_init(FULL(s), 1);
            /* every consumer warp of every CTA in the cluster frees a stage:
             * B in this CTA's stage s is also written by the peer's multicast */
            coda_mbar_init(EMPTY(s), CODA_ARRIVERS * CODA_CLUSTER);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
#if CODA_CLUSTER > 1
    coda_cluster_sync();
#endif

    if (wg == 0) {
        /* ---- producer ---- (24 registers leave the overlap's consumers 240) */
#if CODA_EPI_OVERLAP
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
#else
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
#endif
        if (tid == 0) {
            int it = 0;
            CODA_FOR_EACH_PIECE(unit, kb_begin, kb_end) {
                int tm2, tn;
                coda_tile_coords(unit, tiles_m2, tiles_n, &tm2, &tn);
                const int tm = tm2 * CODA_CLUSTER + (int)crank;
                const int m0 = tm * CODA_BM, n0 = tn * CODA_BN;
                for (int kb = kb_begin; kb < kb_end; kb++, it++) {
                    const int s = it % CODA_STAGES;
                    coda_mbar_wait(EMPTY(s), ((it / CODA_STAGES) & 1) ^ 1);
                    const u32 sa = base + s * CODA_STAGE_BYTES, sb = sa + CODA_A_BYTES;
                    const int k0 = kb * CODA_BK;
                    coda_mbar_expect_tx(FULL(s), CODA_STAGE_BYTES);
#if CODA_TA
                    coda_tma_load(sa, &tma_a, m0, k0, FULL(s));
                    coda_tma_load(sa + 8192, &tma_a, m0 + 64, k0, FULL(s));
#else
                    coda_tma_load(sa, &tma_a, k0, m0, FULL(s));
#endif
#if CODA_CLUSTER == 1
#if CODA_TB
                    for (int c = 0; c < CODA_BN / 64; c++)
                        coda_tma_load(sb + c * 8192, &tma_b, n0 + 64 * c, k0, FULL(s));
#else
                    coda_tma_load(sb, &tma_b, k0, n0, FULL(s));
#endif
#else
                    /* this CTA loads its half of B into both CTAs of the pair */
#if CODA_TB
                    for (int c = (int)crank * (CODA_BN / 128); c < ((int)crank + 1) * (CODA_BN / 128); c++)
                        coda_tma_load_mc(sb + c * 8192, &tma_b, n0 + 64 * c, k0, FULL(s), 3);
#else
                    coda_tma_load_mc(sb + crank * (CODA_B_BYTES / 2), &tma_b, k0,
                                     n0 + (int)crank * (CODA_BN / 2), FULL(s), 3);
#endif
#endif
                }
#if CODA_EPI_RING
                /* the epilogue's ring inputs, one 64-column chunk a stage
                 * (a stream-K contributor runs no epilogue) */
                for (int q = 0; q < (kb_begin == 0 ? CODA_BN / 64 : 0); q++, it++) {
                    const int s = it % CODA_STAGES;
                    coda_mbar_wait(EMPTY(s), ((it / CODA_STAGES) & 1) ^ 1);
                    const u32 sa = base + s * CODA_STAGE_BYTES;
                    /* the box count is the generated text's (the host fills
                     * ring from the same plan) */
                    coda_mbar_expect_tx(FULL(s), CODA_EPI_RING_BOXES * CODA_RING_BOX_BYTES);
#pragma unroll
                    for (int bx = 0; bx < CODA_EPI_RING_BOXES; bx++)
                        coda_tma_load(sa + bx * ring_box, &ring.map[bx],
                                      ring.xmul[bx] * (n0 + 64 * q) + ring.xadd[bx], m0, FULL(s));
                }
#endif
            }
        }
    } else {
        /* ---- consumers ---- */
#if CODA_EPI_OVERLAP
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
#else
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
#endif
        const int c = wg - 1;
#if CODA_EPI_OVERLAP
        /* each tile's epilogue beside the next tile's k-loop (gemm_overlap.cuh):
         * the finished tile waits in held as bf16 pairs, with its coordinates,
         * row vectors, epilogue state and staged inputs */
        float acc[1][CODA_BN / 2];
        u32 held[CODA_BN / 4];
        int it = 0, have = 0, htm = 0, htn = 0, hrow = 0;
        coda_epi_pre hpre;
        coda_epi_state hst;
        coda_epi_vin hvin;
        CODA_FOR_EACH_PIECE(unit, kb_begin, kb_end) {
            int tm2, tn;
            coda_tile_coords(unit, tiles_m2, tiles_n, &tm2, &tn);
            const int tm = tm2 * CODA_CLUSTER + (int)crank;
            const int trow = tm * CODA_BM + 64 * c + 16 * (tid / 32) + (tid % 32) / 4;
            /* this tile's preload copies its column vectors into the slabs'
             * free part, where the held tile's stay until its epilogue ends:
             * so right after that (in the k-loop), or now for the first */
            coda_epi_pre pre;
            if (!have) coda_epi_preload(epi, coda_tile_view(M, N, tm, tn, trow, c, tid, scratch, cbufs), pre);
#pragma unroll
            for (int i = 0; i < CODA_BN / 2; i++) acc[0][i] = 0.0f;
            coda_epi_tile ht = coda_tile_view(M, N, htm, htn, hrow, c, tid, scratch, cbufs);
            if (have) {
                coda_epi_begin(epi, ht, hst, hpre);
                coda_epi_vload(epi, ht, 0, 0, hvin);
            }
            int done = -1; /* the ring position of the k-block before: freed once its wgmma is done */
            for (int kb = kb_begin; kb < kb_end; kb++) {
                const int s = it % CODA_STAGES;
                coda_mbar_wait(FULL(s), (it / CODA_STAGES) & 1);
                const u32 sa = base + s * CODA_STAGE_BYTES + c * 8192;
                const u32 sb = base + s * CODA_STAGE_BYTES + CODA_A_BYTES;
                CODA_FENCE_ACC(acc);
                coda_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < CODA_BK / 16; kk++)
                    coda_wgmma(acc[0], coda_desc_a(sa, kk), coda_desc_b(sb, kk), 1);
                coda_wgmma_commit();
                CODA_FENCE_ACC(acc);
                const int mine = it++;
                /* while this k-block's wgmma runs: the held tile's batches due here */
                if (have) {
#pragma unroll
                    for (int b = 0; b < CODA_OV_NB; b++)
                        if (kb == coda_ov_slot(b, kiters))
                            coda_ov_batch(epi, ht, hst, hvin, held, CODA_EPI_BATCH * b, smaps);
                    /* the held tile is done: its partials, this tile's preload */
                    if (kb == coda_ov_slot(CODA_OV_NB - 1, kiters)) {
                        coda_epi_end(epi, ht, hst);
                        coda_epi_preload(epi, coda_tile_view(M, N, tm, tn, trow, c, tid, scratch, cbufs), pre);
                    }
                }
                coda_wgmma_wait(1);
                if (done >= 0 && CODA_IS_ARRIVER) coda_stage_release(EMPTY(done % CODA_STAGES));
                done = mine;
            }
            coda_wgmma_wait(0);
            CODA_FENCE_ACC(acc);
            if (done >= 0 && CODA_IS_ARRIVER) coda_stage_release(EMPTY(done % CODA_STAGES));
#pragma unroll
            for (int i = 0; i < CODA_BN / 4; i++) held[i] = coda_pack_bf16x2(acc[0][2 * i], acc[0][2 * i + 1]);
            htm = tm, htn = tn, hrow = trow, hpre = pre, have = 1;
        }
        if (have) { /* the last tile's epilogue, with nothing left to hide behind */
            coda_epi_tile ht = coda_tile_view(M, N, htm, htn, hrow, c, tid, scratch, cbufs);
            coda_epi_begin(epi, ht, hst, hpre);
            coda_epi_vload(epi, ht, 0, 0, hvin);
#pragma unroll
            for (int b = 0; b < CODA_OV_NB; b++) coda_ov_batch(epi, ht, hst, hvin, held, CODA_EPI_BATCH * b, smaps);
            coda_epi_end(epi, ht, hst);
        }
        if (tid % 32 == 0) coda_bulk_wait_read(0); /* TMA has read the slabs before shared memory goes */
#else
        float acc[CODA_WG_MH][CODA_BN / 2]; /* row block mh: rows 64 mh .. of the warpgroup's */
        int it = 0;
        CODA_PROBE_TL_LOG;
#if CODA_PINGPONG
        /* tiles c, c + 2, c + 4, ... of this CTA's sequence */
        for (int seq = c, unit = unit0 + c * unit_step; unit < n_units;
             seq += 2, unit += 2 * unit_step) {
            it = seq * kiters;
            const int kb_begin = 0, kb_end = kiters;
#else
        CODA_FOR_EACH_PIECE(unit, kb_begin, kb_end) {
#endif
            int tm2, tn;
            coda_tile_coords(unit, tiles_m2, tiles_n, &tm2, &tn);
            const int tm = tm2 * CODA_CLUSTER + (int)crank;
#if CODA_PINGPONG
            if (seq > 0) coda_turn_wait(4 + c);
#endif
            CODA_PROBE_TL_TILE;
            /* this thread's first row of the tile (fragment layout, below) */
            const int trow = tm * CODA_BM + (CODA_PINGPONG ? 0 : 64 * c) + 16 * (tid / 32) + (tid % 32) / 4;
            /* the epilogue's row vectors (and column vectors), loaded now so
             * that the k-loop hides their latency (at the epilogue's start
             * the row vectors' was 7% of a one-wave fused GEMM: session 6,
             * ncu source counters). The tile view is made again after the
             * k-loop: kept alive across it, it cost a fused kernel spills. */
            coda_epi_pre pre;
            coda_epi_preload(epi, coda_tile_view(M, N, tm, tn, trow, c, tid, scratch, cbufs), pre);
#pragma unroll
            for (int mh = 0; mh < CODA_WG_MH; mh++)
#pragma unroll
                for (int i = 0; i < CODA_BN / 2; i++) acc[mh][i] = 0.0f;
            for (int kb = kb_begin; kb < kb_end; kb++, it++) {
                const int s = it % CODA_STAGES;
                coda_mbar_wait(FULL(s), (it / CODA_STAGES) & 1);
                if (kb == kb_begin) CODA_PROBE_TL_STAMP(1);
                const u32 sa = base + s * CODA_STAGE_BYTES + (CODA_PINGPONG ? 0 : c * 8192);
                const u32 sb = base + s * CODA_STAGE_BYTES + CODA_A_BYTES;
                CODA_FENCE_ACC(acc);
                coda_wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < CODA_BK / 16; kk++)
#pragma unroll
                    for (int mh = 0; mh < CODA_WG_MH; mh++)
                        coda_wgmma(acc[mh], coda_desc_a(sa + mh * 8192, kk), coda_desc_b(sb, kk), 1);
                coda_wgmma_commit();
                CODA_FENCE_ACC(acc);
                /* keep one wgmma group in flight; free the stage before it */
                coda_wgmma_wait(1);
                if (kb > kb_begin && CODA_IS_ARRIVER) {
                    const int ps = (it + CODA_STAGES - 1) % CODA_STAGES;
                    coda_stage_release(EMPTY(ps));
                }
            }
#if CODA_PINGPONG
            /* the other warpgroup's next tile (if any) may start issuing */
            if (unit + unit_step < n_units) coda_turn_pass(4 + (1 - c));
#endif
            coda_wgmma_wait(0);
            CODA_FENCE_ACC(acc);
            CODA_PROBE_TL_STAMP(2);
            if (kb_end > kb_begin && CODA_IS_ARRIVER) {
                const int ps = (it + CODA_STAGES - 1) % CODA_STAGES;
                coda_stage_release(EMPTY(ps));
            }
#if CODA_STREAMK
            /* stream-K (gemm_streamk.cuh): a contributor hands its partial
             * sums on and runs no epilogue; the owner of a cut unit adds
             * the contributors' partials to its own first. (With this
             * branch ptxas keeps a second copy of the epilogue for diverged
             * warps, hence a kernel variant of its own.) */
            if (kb_begin > 0) {
                coda_sk_contribute(sk, (int)blockIdx.x, c, tid, acc[0]);
            } else {
                /* the contributors: ranges r + 1, ... (clusters g - 1, ...) */
                for (int r = unit_step - unit0; kb_end < kiters && r < unit_step &&
                                                coda_sk_begin(sk, r, kiters) < (unit + 1) * kiters; r++)
                    coda_sk_collect(sk, (unit_step - 1 - r) * CODA_CLUSTER + (int)crank, c, tid, acc[0]);
                CODA_FENCE_ACC(acc);
#else
            {
#endif

                /* ---- epilogue: the spliced-in program sees each adjacent column pair ----
                 * Accumulator (mh, 4j + 2h + e) is row 64 mh + 8 h of the thread's
                 * rows, column 8j + e of its columns: row slot rs = 2 mh + h,
                 * column slot cs = mh (CODA_BN / 8) + j. */
                coda_epi_tile t = coda_tile_view(M, N, tm, tn, trow, c, tid, scratch, cbufs);
                coda_epi_state st;
                coda_epi_begin(epi, t, st, pre);
#if CODA_EPI_STORE_C && CODA_PROBE_NO_EPI
                coda_probe_keep(acc[0], epi.c);
#elif CODA_EPI_STORE_C
                /* C goes out in 128-byte-wide column chunks, each warp its own
                 * 16 rows (the wgmma fragment gives warp w rows 16w..16w+15 of
                 * the 64-row block) through two 2 KiB staging buffers of its
                 * own: while TMA stores one, the warp fills the other. No
                 * warpgroup barrier: a warp syncs with itself only. */
                const int lane = tid % 32, wrow = lane / 4; /* row in the warp's 16 */
                const u32 wbuf = cbufs + (u32)(c * 4 + tid / 32) * 4096u;
                /* The copy engine writes whole 16-byte units of a row: past
                 * the last whole unit (column n16) a store would write into
                 * the row's padding, which may be a caller's data (C a
                 * column slice of a wider matrix). So C's tensor map ends at
                 * n16 (src/cuda/gemm.c), and columns n16 .. N-1 are stored
                 * by their threads (coda_epi_store_tail); only a chunk that
                 * reaches n16 tests its pairs (a uniform branch), and only
                 * in the CODA_C_TAIL kernel. */
                const int n16 = N & ~(16 / CODA_C_ESZ - 1);
#pragma unroll
                for (int mh = 0; mh < CODA_WG_MH; mh++)
#pragma unroll
                for (int q = 0; q < CODA_C_NCHUNK; q++) {
                    const u32 buf = wbuf + ((mh * CODA_C_NCHUNK + q) & 1) * 2048;
                    if (lane == 0) coda_bulk_wait_read(1); /* the store from this buffer is done */
                    __syncwarp();
                    coda_epi_in in[2 * (CODA_C_CHUNK_COLS / 8)];
#pragma unroll
                    for (int jj = 0; jj < CODA_C_CHUNK_COLS / 8; jj++) {
                        const int j = q * (CODA_C_CHUNK_COLS / 8) + jj, r = t.row + 64 * mh;
                        coda_epi_fetch(epi, t, r, t.col + 8 * j, in[2 * jj]);
                        coda_epi_fetch(epi, t, r + 8, t.col + 8 * j, in[2 * jj + 1]);
                    }
                    const int c0 = tn * CODA_BN + q * CODA_C_CHUNK_COLS; /* the chunk's first column */
#pragma unroll
                    for (int jj = 0; jj < CODA_C_CHUNK_COLS / 8; jj++) {
                        const int j = q * (CODA_C_CHUNK_COLS / 8) + jj;
                        float *a = acc[mh];
                        float v0 = a[4 * j], v1 = a[4 * j + 1], v2 = a[4 * j + 2], v3 = a[4 * j + 3];
                        const int r = t.row + 64 * mh, cs = mh * (CODA_BN / 8) + j;
                        coda_epi_pair(epi, t, st, 2 * mh, cs, r, t.col + 8 * j, v0, v1, in[2 * jj]);
                        coda_epi_pair(epi, t, st, 2 * mh + 1, cs, r + 8, t.col + 8 * j, v2, v3, in[2 * jj + 1]);
                        if (CODA_C_TAIL && c0 + CODA_C_CHUNK_COLS > n16) {
                            coda_epi_store_tail(epi, t, n16, r, t.col + 8 * j, v0, v1);
                            coda_epi_store_tail(epi, t, n16, r + 8, t.col + 8 * j, v2, v3);
                        }
                        /* 128B swizzle: 16-byte unit u of row r sits at u ^ (r % 8);
                         * rows wrow and wrow + 8 share r % 8 */
                        const u32 b = (u32)(jj * 8 + 2 * (tid % 4)) * CODA_C_ESZ;
                        const u32 off = ((((b >> 4) ^ (u32)wrow) << 4) | (b & 15));
                        const u32 a0 = buf + (u32)wrow * 128 + off, a1 = a0 + 8 * 128;
#if CODA_C_F32
                        coda_st_shared_f32x2(a0, v0, v1);
                        coda_st_shared_f32x2(a1, v2, v3);
#else
                        coda_st_shared_b32(a0, coda_pack_bf16x2(v0, v1));
                        coda_st_shared_b32(a1, coda_pack_bf16x2(v2, v3));
#endif
                    }
                    coda_fence_proxy_async();
                    __syncwarp();
                    if (CODA_C_ST_OK(lane == 0 && (!CODA_C_TAIL || c0 < n16))) {
                        coda_tma_store(&tma_c, buf, tn * CODA_BN + q * CODA_C_CHUNK_COLS,
                                       trow - (tid % 32) / 4 + 64 * mh);
                        coda_bulk_commit();
                    }
                }
#else
                /* inputs for CODA_EPI_BATCH column chunks (both rows) are
                 * fetched before the program runs on any of them. Staged inputs
                 * (CODA_EPI_STAGE): the next batch's 16-byte vectors are loaded
                 * while this batch runs (coda_epi_vload / coda_epi_vput). */
#if CODA_EPI_STAGE
                coda_epi_vin vin;
                coda_epi_vload(epi, t, 0, 0, vin);
#endif
#pragma unroll
                for (int mh = 0; mh < CODA_WG_MH; mh++)
#pragma unroll
                    for (int j0 = 0; j0 < CODA_BN / 8; j0 += CODA_EPI_BATCH) {
                        const int r = t.row + 64 * mh;
#if CODA_EPI_STAGE
                        coda_epi_vput(t, vin);
                        if (j0 + CODA_EPI_BATCH < CODA_BN / 8) coda_epi_vload(epi, t, mh, j0 + CODA_EPI_BATCH, vin);
                        else if (mh + 1 < CODA_WG_MH) coda_epi_vload(epi, t, mh + 1, 0, vin);
#endif
#if CODA_EPI_RING
                        if (j0 % 8 == 0) { /* a new 64-column chunk: wait for its stage */
                            coda_mbar_wait(FULL(it % CODA_STAGES), (it / CODA_STAGES) & 1);
                            t.ring = base + (it % CODA_STAGES) * CODA_STAGE_BYTES;
                            t.ring_box = ring_box;
                        }
#endif
                        coda_epi_in in[2 * CODA_EPI_BATCH]; /* pair (jj, h) in in[2 jj + h] */
                        coda_epi_fetch_batch(epi, t, r, t.col + 8 * j0, in);
#if CODA_EPI_RING
                        /* The chunk's stage is read through the generic proxy and
                         * next written by TMA (the async proxy): without a proxy
                         * fence between, TMA's next copy may overtake the reads
                         * (measured: 'loads' in test_epilogue_gpu read wrong x
                         * values in 1 of 2-6 runs without it, 0 of 20 with it). */
                        if ((j0 + CODA_EPI_BATCH) % 8 == 0) coda_fence_proxy_async();
#endif
#if CODA_EPI_STAGE
                        __syncwarp(); /* inputs read out of the slab (and the ring) before the pairs write outputs */
                        coda_epi_slab_wait(t); /* and TMA has read the last batch's outputs */
#endif
#if CODA_EPI_RING
                        /* the chunk's last batch: free its stage. With clusters the
                         * peer's producer waits for this too; its next multicast of B
                         * into this stage lands in the peer's half of B, where no ring
                         * box is (ring_box), so the CTA-scope release of k-blocks is
                         * enough (a cluster-scope one stalls on the epilogue's pending
                         * global stores: measured 4-6% slower at 4096). */
                        if ((j0 + CODA_EPI_BATCH) % 8 == 0) {
                            if (CODA_IS_ARRIVER) coda_stage_release(EMPTY(it % CODA_STAGES));
                            it++;
                        }
#endif
#pragma unroll
                        for (int jj = 0; jj < CODA_EPI_BATCH; jj++) {
                            const int j = j0 + jj, cs = mh * (CODA_BN / 8) + j;
#if CODA_EPI_ROUND_ACC
                            /* the overlap's bitwise reference (gemm_overlap.cuh) */
#pragma unroll
                            for (int e = 0; e < 4; e += 2) {
                                const u32 w = coda_pack_bf16x2(acc[mh][4 * j + e], acc[mh][4 * j + e + 1]);
                                acc[mh][4 * j + e] = coda_bf16_lo(w), acc[mh][4 * j + e + 1] = coda_bf16_hi(w);
                            }
#endif
                            coda_epi_pair(epi, t, st, 2 * mh, cs, r, t.col + 8 * j, acc[mh][4 * j],
                                          acc[mh][4 * j + 1], in[2 * jj]);
                            coda_epi_pair(epi, t, st, 2 * mh + 1, cs, r + 8, t.col + 8 * j,
                                          acc[mh][4 * j + 2], acc[mh][4 * j + 3], in[2 * jj + 1]);
                        }
                        coda_epi_flush(epi, st, t, mh, j0, smaps);
                    }
#endif
                coda_epi_end(epi, t, st);
            }
            CODA_PROBE_TL_TILE_END;
        }
        CODA_PROBE_TL_WRITE;
#if CODA_EPI_STORE_C || CODA_EPI_TMA_STORES
        /* TMA must have read the staging buffers (the C store's, or the
         * slabs of a generated epilogue's outputs) before the CTA's shared
         * memory goes; the global writes complete on their own */
        if (tid % 32 == 0) coda_bulk_wait_read(0);
#endif
#endif /* CODA_EPI_OVERLAP */
    }
#if CODA_CLUSTER > 1
    /* a CTA must not exit while its peer may still multicast into it or
     * arrive on its barriers */
    coda_cluster_sync();
#endif
#undef FULL
#undef EMPTY
}
