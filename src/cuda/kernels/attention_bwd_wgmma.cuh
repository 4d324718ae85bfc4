/* attention_bwd_wgmma.cuh - the causal GQA backward on wgmma + TMA, the
 * one src/cuda/attention.c launches after coda_attn_bwd_prep_kernel:
 * coda_attn_bwd_wgmma_kernel, dk, dv and dq in one kernel (the default);
 * coda_attn_bwd_dkdv_wgmma_kernel and coda_attn_bwd_dq_wgmma_kernel, the
 * same as two kernels (CODA_DEBUG_ATTN_SPLIT_BWD, and where dqkv is not
 * aligned for TMA); attention.cuh's mma.sync dq and dk/dv kernels stay as
 * the CODA_DEBUG_ATTN_MMA alternative.
 *
 * Compiled after attention_wgmma.cuh (its 3-D TMA load, aw_pack,
 * aw_issue_rs, AW_FENCE, and through it the prelude, the wgmma wrappers
 * and attention.cuh).
 *
 * FlashAttention-2's backward with the row statistics of the forward
 * (P = exp2(s scale log2(e) - lse log2(e)), dS = P (dP - D), D = do . o).
 * Every result is bitwise the same run to run: the fused kernel adds the
 * key blocks' parts of dq in a fixed order (ab_dq_writer), the split ones
 * accumulate nothing across blocks (7 products instead of 5, since dq
 * recomputes S and dP).
 *
 *   fused  one block per (128 key rows, kv head, sequence), over every
 *          64-query tile from the last back to the diagonal, each over the
 *          query heads of the group:
 *            S^T  = k q^T      wgmma m64n64, k and q K-major
 *            dP^T = v do^T     the same
 *            P^T, dS^T in registers; dS^T then bf16 into shared memory
 *            dv  += P^T do     wgmma m64nHD, P^T from registers
 *                              (CODA_AB_PT_REG), do from shared memory
 *            dk  += dS^T q     wgmma m64nHD from shared memory (from
 *                              registers at HD 64 under CODA_AB_DST_REG,
 *                              off: measured level at stop 55)
 *            dq   = dS k       over the block's 128 keys, by one
 *                              warpgroup a step (the steps' parity), a
 *                              step late (beside the next step's dv and
 *                              dk: CODA_AB_DQ_LAG), staged as f32 and
 *                              added into dqkv by a TMA reduce-add in
 *                              the block's turn
 *   dk/dv  as the fused kernel without dq, head by head, query tiles (128
 *          rows at HD 64) from the diagonal on, P^T and dS^T as register
 *          A operands (the accumulator layout is the A fragment's)
 *   dq     one block per (128 query rows, head, sequence), over the 64-key
 *          tiles up to the diagonal:
 *            S = q k^T, dP = do v^T, dS = P (dP - D), dq += dS k
 *
 * 384 threads each: warpgroup 0 produces (one thread: TMA through 3-D maps
 * (column, position, sequence), so rows past a sequence's end come in as
 * zeros; warp 1 the statistics of a query tile; fused: threads 64 and 96
 * write dq, the even and the odd steps), warpgroups 1 and 2 consume 64 of
 * the block's rows each. The
 * streamed tiles go through a ring of AB_STAGES stages (mbarriers full /
 * empty, as the forward).
 *
 * Masking: a product is masked only on the tiles that cross the diagonal
 * or the sequence's end, by a select (what lies past either, NaN
 * included, never leaks in); a split warpgroup skips a tile none of its
 * rows attends to. Rows past the end are computed on zeros and never
 * stored.
 *
 * Shared memory (1024-byte aligned; the host adds the slack), HD / 64
 * column chunks of 128 bytes per row, swizzled:
 *   the block's two 128-row operands (dk/dv: k, v; dq: q, do)
 *   AB_STAGES x the two streamed tiles (dk/dv: q, do of AB_KV_QT rows;
 *   fused: q, do of 64 rows; dq: k, v)
 *   dk/dv and fused: AB_STAGES x the tile's D and lse log2(e)
 *   fused: P^T and dS^T (128 keys x 64 queries bf16; with CODA_AB_DQ_LAG
 *   dS^T of the even and the odd steps), 2 dq tiles (64 x HD f32)
 *   barriers: block operands full, stage full[s], stage empty[s], fused:
 *   dq full[2], dq empty[2] */

#define AB_ROWS 128                       /* rows a block owns              */
#define AB_TILE 64                        /* rows of a streamed tile        */
#ifndef CODA_AB_STAGES
#define CODA_AB_STAGES 2                  /* the host passes its choice (attention.c) */
#endif
#ifndef CODA_AB_PIPE
#define CODA_AB_PIPE 1                    /* 1: the dq kernel's steps overlapped; 0: one at a time */
#endif
#define AB_STAGES CODA_AB_STAGES
#ifndef CODA_AB_DQ_PERM
#define CODA_AB_DQ_PERM 0                 /* 1: the staged dq tile's rows permuted (ab_dq_at) */
#endif
#ifndef CODA_AB_DQ_ONE
#define CODA_AB_DQ_ONE 1                  /* the fused kernel's dq: 1 by one warpgroup a step over all 128
                                             keys; 0 both warpgroups' 64-key parts, summed in the staging */
#endif
#ifndef CODA_AB_PT_REG
#define CODA_AB_PT_REG 1                  /* with CODA_AB_DQ_ONE: dv += P^T do with P^T from registers
                                             (1), or from shared memory (0) */
#endif
#ifndef CODA_AB_DQ_LAG                    /* with CODA_AB_DQ_ONE and CODA_AB_PT_REG: 1 step i's dq issued at
                                             step i + 1, dS^T double-buffered (the loop's comment); 2 the
                                             same, warpgroup 1 started half a step late; 0 dq in its step */
#define CODA_AB_DQ_LAG (CODA_AB_DQ_ONE && CODA_AB_PT_REG)
#endif
#if CODA_AB_DQ_LAG && !(CODA_AB_DQ_ONE && CODA_AB_PT_REG)
#error "CODA_AB_DQ_LAG needs CODA_AB_DQ_ONE and CODA_AB_PT_REG (the P^T buffer holds dS^T of odd steps)"
#endif
#ifndef CODA_AB_DST_REG                   /* with CODA_AB_DQ_LAG, at head_dim 64: dk += dS^T q with dS^T from
                                             registers (1), as dv's P^T, or from its shared-memory copy that
                                             dq reads (0); at 128 it does not fit (ptxas spills 80 bytes and
                                             serialises the wgmma), so AB_DST_REG is 0 there */
#define CODA_AB_DST_REG 0
#endif
#if CODA_AB_DST_REG && !CODA_AB_DQ_LAG
#error "CODA_AB_DST_REG needs CODA_AB_DQ_LAG"
#endif
#define AB_DST_REG (CODA_AB_DST_REG && HD == 64)
#define AB_BIG_CHUNK (AB_ROWS * 128)      /* one 64-column chunk of a block */
#define AB_SMALL_CHUNK (AB_TILE * 128)    /* ... of a streamed tile         */
#define AB_BIG (HD / 64 * AB_BIG_CHUNK)
#define AB_SMALL (HD / 64 * AB_SMALL_CHUNK)
/* dk/dv's query tiles: 128 rows at HD 64 (64 would make every product
 * short: S^T and dP^T m64n64 over 64, dv and dk over 64), 64 at HD 128
 * (128 would not fit in the registers beside dk and dv); the fused kernel
 * takes 64 (its dq turn is per 64-query tile), in a ring of its own
 * (AB_F_*, below) */
#define AB_KV_QT (HD == 64 ? 128 : 64)
#define AB_KV_CHUNK (AB_KV_QT * 128)      /* one 64-column chunk of a dk/dv query tile */
#define AB_KV_SMALL (HD / 64 * AB_KV_CHUNK)
#define AB_STAT_BYTES (2 * AB_KV_QT * 4)  /* D and lse log2(e) of a query tile */
#define AB_TILES_OFF (2 * AB_BIG)
#define AB_STATS_OFF (AB_TILES_OFF + 2 * AB_STAGES * AB_KV_SMALL)
#define AB_BARS_DKDV (AB_STATS_OFF + AB_STAGES * AB_STAT_BYTES)
#define AB_BARS_DQ (AB_TILES_OFF + 2 * AB_STAGES * AB_SMALL)
/* The fused kernel's ring holds its own 64-query tiles (AB_SMALL each, and
 * 64 rows of statistics), not dk/dv's 128 at HD 64: at HD 128 the same
 * room, at HD 64 half of it (3 stages take 147 KiB in all instead of 196
 * with 128-row slots, where a fourth would have taken 229 of the 227 an
 * SM has) */
#define AB_F_STAT_BYTES (2 * AB_TILE * 4)
#define AB_F_STATS_OFF (AB_TILES_OFF + 2 * AB_STAGES * AB_SMALL)
#define AB_DS_OFF ((AB_F_STATS_OFF + AB_STAGES * AB_F_STAT_BYTES + 1023) & ~1023) /* fused: P^T, dS^T (wgmma
                                                                                     operands: 1024-aligned) */
/* A stage's q (or do) tile, its statistics, and where they start, by
 * kernel (fused: 1, dk/dv: 0) */
#define AB_RING_TILE(fused) ((fused) ? AB_SMALL : AB_KV_SMALL)
#define AB_RING_STAT(fused) ((fused) ? AB_F_STAT_BYTES : AB_STAT_BYTES)
#define AB_RING_STATS_OFF(fused) ((fused) ? AB_F_STATS_OFF : AB_STATS_OFF)
#define AB_DS_BYTES (AB_ROWS * 128)            /* 128 keys x 64 queries bf16 */
/* fused: 2 dq tiles (64 queries x HD f32) that the writers add
 * into dq by TMA, as HD / 32 boxes of 32 columns (64 rows of 128 bytes,
 * swizzled as the f32 map's 128-byte swizzle; with CODA_AB_DQ_PERM the rows
 * permuted, ab_dq_at) */
#define AB_DQB_OFF (AB_DS_OFF + 2 * AB_DS_BYTES)
#define AB_DQB_BOX (AB_TILE * 128)
#define AB_DQB_BYTES (HD / 32 * AB_DQB_BOX)
#define AB_BARS_FUSED (AB_DQB_OFF + 2 * AB_DQB_BYTES)
#define AB_SMEM_DKDV (AB_BARS_DKDV + 8 * (1 + 2 * AB_STAGES)) /* + 1024 of slack */
#define AB_SMEM_DQ (AB_BARS_DQ + 8 * (1 + 2 * AB_STAGES))
#define AB_SMEM_FUSED (AB_BARS_FUSED + 8 * (5 + 2 * AB_STAGES)) /* + dq full[2], empty[2] */

/* HD columns of `rows` positions from column col0 (one TMA per 64-column
 * chunk, chunk_bytes apart). */
static __device__ __forceinline__ void ab_load(u32 dst, const coda_tmap *map, int col0, int pos, int b,
                                               u32 chunk_bytes, u32 bar) {
#pragma unroll
    for (int c = 0; c < HD / 64; c++) aw_tma_load3(dst + c * chunk_bytes, map, col0 + 64 * c, pos, b, bar);
}

/* acc (64 x n) = a (64 rows of a 128-row block, K-major) . b^T (a tile of
 * n = 64 or 128 rows, K-major, its 64-column chunks chunk bytes apart),
 * over HD. */
static __device__ __forceinline__ void ab_issue_nt_n(float *acc, u32 a, u32 b, const int n, const u32 chunk) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const u64 da = coda_desc(a + (kk >> 2) * AB_BIG_CHUNK + (kk & 3) * 32, 16, 1024);
        const u64 db = coda_desc(b + (kk >> 2) * chunk + (kk & 3) * 32, 16, 1024);
        if (n == 128)
            coda_wgmma_n128(acc, da, db, kk > 0);
        else
            coda_wgmma_n64(acc, da, db, kk > 0);
    }
    coda_wgmma_commit();
}
/* The same with a 64-row tile (every product of the dq kernel). */
static __device__ __forceinline__ void ab_issue_nt(float *acc, u32 a, u32 b) {
    ab_issue_nt_n(acc, a, b, AB_TILE, AB_SMALL_CHUNK);
}

/* Column of element i of a thread's m64n64 accumulator, and its row (0 or 8
 * past the thread's first). */
#define AB_COL(i, lane) (((i) >> 2) * 8 + ((lane) & 3) * 2 + ((i) & 1))
#define AB_ROW8(i) (((i) & 2) * 4)

/* Stores a 64 x HD accumulator of one warpgroup, times scale, as f32 rows
 * (the thread's rows row0 and row0 + 8; rows past seq dropped); with
 * `add`, added to what is there (read through L2: another block wrote it). */
static __device__ __forceinline__ void ab_store(const float *acc, float scale, float *base, long long ld,
                                                int row0, int seq, const int add) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + 8 * r;
        if (row >= seq) continue;
        float *dst = base + (long long)row * ld + (lane & 3) * 2;
#pragma unroll
        for (int t = 0; t < HD / 8; t++) {
            float2 v = make_float2(acc[4 * t + 2 * r] * scale, acc[4 * t + 2 * r + 1] * scale);
            if (add) {
                const float2 o = __ldcg((const float2 *)(dst + 8 * t));
                v.x += o.x;
                v.y += o.y;
            }
            *(float2 *)(dst + 8 * t) = v;
        }
    }
}

#define AB_BAR_BLOCK(bars) (bars)
#define AB_BAR_FULL(bars, s) ((bars) + 8 + 8 * (s))
#define AB_BAR_EMPTY(bars, s) ((bars) + 8 + 8 * AB_STAGES + 8 * (s))
/* fused, dq tile d: staged (by warpgroup d, or with CODA_AB_DQ_ONE=0 both
 * warpgroups' parts summed), read out by TMA */
#define AB_BAR_DQ_FULL(bars, d) ((bars) + 8 + 16 * AB_STAGES + 8 * (d))
#define AB_BAR_DQ_EMPTY(bars, d) ((bars) + 24 + 16 * AB_STAGES + 8 * (d))

/* The barriers of a block: the block operands' (one arrival), each stage's
 * full (`full` arrivals) and empty (every consumer thread); with `fused`,
 * the two dq tiles' full and empty. */
static __device__ __forceinline__ void ab_init_bars(u32 bars, u32 full, const int fused) {
    if (threadIdx.x == 0) {
        coda_mbar_init(AB_BAR_BLOCK(bars), 1);
        for (int s = 0; s < AB_STAGES; s++) {
            coda_mbar_init(AB_BAR_FULL(bars, s), full);
            coda_mbar_init(AB_BAR_EMPTY(bars, s), AW_CONSUMER_THREADS);
        }
        if (fused)
            for (int d = 0; d < 2; d++) {
                coda_mbar_init(AB_BAR_DQ_FULL(bars, d), 128);
                coda_mbar_init(AB_BAR_DQ_EMPTY(bars, d), 1);
            }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

/* A consumer thread is done with stage s. Every consumer thread arrives
 * (AW_CONSUMER_THREADS), not one lane a warp after a __syncwarp: the dk/dv
 * kernel's consumers read the statistics with ordinary loads, and each
 * thread's own release then orders its loads before the producer's next
 * stores to the stage, in a form compute-sanitizer's racecheck follows
 * (with one lane a warp it reported the stores as racing the loads). */
static __device__ __forceinline__ void ab_release(u32 bars, int s) {
    coda_mbar_arrive(AB_BAR_EMPTY(bars, s));
}

/* The staged dq tile (a consumer thread's part of a dq product: 64
 * queries x HD, the thread's rows row and row + 8 of the tile): column col
 * in box col / 32, 16-byte chunk (col % 32 / 4) ^ (row & 7), the layout
 * the f32 map's 128-byte swizzle reads.
 *
 * Bank conflicts: shared memory serves a warp's 8-byte accesses half a
 * warp (16 lanes, 128 bytes) a wavefront. In column order, the four rows
 * of a half warp (row & 7 = 0..3 or 4..7) land on only two of the four
 * 32-byte bank groups: four wavefronts where two do (ncu: 2.9 wavefronts
 * a shared store, 35% of them excess). So a thread visits its column
 * groups of 8 (t, within each 32-column box) in the order k ^ m, m = row &
 * 3: access k of a half warp then covers every bank group once. The
 * values are moved to that order first (ab_dq_order), by two conditional
 * swaps of registers (selects: no local memory, no branch). */
static __device__ __forceinline__ void ab_dq_swap(float *v, const int bit, int on) {
#pragma unroll
    for (int t = 0; t < 8; t++)
        if (!(t & bit))
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float a = v[4 * t + e], b = v[4 * (t ^ bit) + e];
                v[4 * t + e] = on ? b : a;
                v[4 * (t ^ bit) + e] = on ? a : b;
            }
}
/* v[4k + e] := v[4 (k ^ m) + e] (the 32 values of a 64-column part). */
static __device__ __forceinline__ void ab_dq_order(float *v, int m) {
    ab_dq_swap(v, 1, m & 1);
    ab_dq_swap(v, 2, m & 2);
}
/* With CODA_AB_DQ_PERM (where seq is a multiple of 8, attention.c) the
 * staged tile's rows are permuted instead: tile row 8 g + 4 h + q is
 * staged as row 8 g + 2 q + h, and the f32 map reads the tile as (column,
 * h, q, g) boxes, so TMA puts every row back in place. Then a half warp's
 * four rows (q = 0..3 of one h) have row & 7 = 2q + h, whose swizzles send
 * their 32-byte pieces to the four different bank groups with every
 * thread taking its columns in order: conflict-free with no ab_dq_order
 * (its selects, 2 a value) and one XOR an address pair.
 *
 * ab_dq_at: the staged address of the thread's float2 of column group t
 * (columns 8t + 2 (lane & 3), + 1) in tile row row + 8 r; without the
 * permutation, group t holds what ab_dq_order moved there, group (t & ~7)
 * | ((t & 7) ^ (row & 3)). */
static __device__ __forceinline__ u32 ab_dq_at(u32 buf, int row, int t, int r) {
    const int lane = threadIdx.x & 31;
#if CODA_AB_DQ_PERM
    /* the chunk 2 (t & 3) + ((lane & 3) >> 1), swizzled ^ x (x: the staged
     * row's low bits); bits 4-6 of buf + row * 128 are zero, so the
     * thread's part ((lane & 3) >> 1) ^ x goes in by addition and t's by
     * XOR; row + 8 is staged 8 rows on, with the same swizzle */
    const int x = ((row & 3) << 1) | ((row >> 2) & 1);
    const u32 p0 = buf + ((row & ~7) | x) * 128 + ((((lane & 3) >> 1) ^ x) << 4) + (lane & 1) * 8;
    return (p0 ^ ((t & 3) << 5)) + (t >> 2) * AB_DQB_BOX + r * 1024;
#else
    const int rr = row + 8 * r, col = 8 * ((t & ~7) | ((t & 7) ^ (row & 3))) + 2 * (lane & 3);
    return buf + (col >> 5) * AB_DQB_BOX + rr * 128 + ((((col & 31) >> 2) ^ (rr & 7)) << 4) + (col & 3) * 4;
#endif
}

/* The thread's dq values (64 x HD accumulator layout; put in ab_dq_order's
 * order here first unless CODA_AB_DQ_PERM), times scale, into the staged
 * tile at buf; with `add`, added to what the other warpgroup's thread
 * staged there. */
static __device__ __forceinline__ void ab_dq_stage(float *dq, float scale, u32 buf, int row, const int add) {
#if !CODA_AB_DQ_PERM
#pragma unroll
    for (int h = 0; h < HD / 64; h++) ab_dq_order(dq + 32 * h, row & 3);
#endif
    /* four accesses' loads, then their stores: the loads' latencies
     * overlap (one load then its store, 32 times, was a chain of
     * latencies). Predicated loads, not a branch (a branch here, on
     * registers a wgmma wrote, made ptxas serialise the products; one
     * around the whole staging spilled), nor loads whose values are dropped
     * (warpgroup 0's, half the staging's wavefronts). */
#pragma unroll
    for (int t0 = 0; t0 < HD / 8; t0 += 2) {
        float a[2][2][2];
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                a[k][r][0] = a[k][r][1] = 0.f;
                asm volatile("{ .reg .pred p; setp.ne.s32 p, %3, 0;\n"
                             " @p ld.shared.v2.f32 {%0, %1}, [%2]; }"
                             : "+f"(a[k][r][0]), "+f"(a[k][r][1]) : "r"(ab_dq_at(buf, row, t0 + k, r)), "r"(add)
                             : "memory");
            }
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int e = 4 * (t0 + k) + 2 * r;
                coda_st_shared_f32x2(ab_dq_at(buf, row, t0 + k, r), fmaf(dq[e], scale, a[k][r][0]),
                                     fmaf(dq[e + 1], scale, a[k][r][1]));
            }
    }
}

/* The dq warpgroup's whole dq tile (its product waited for), times scale,
 * into staged tile d, handed to the writer of parity d (ab_dq_writer). */
static __device__ __forceinline__ void ab_dq_hand(float *dq, float scale, u32 sdq, int d, u32 bars) {
    const int tid = threadIdx.x % 128;
    ab_dq_stage(dq, scale, sdq + d * AB_DQB_BYTES, 16 * (tid >> 5) + ((tid & 31) >> 2), 0);
    coda_fence_proxy_async(); /* the staged tile before the writer's TMA reads it */
    coda_mbar_arrive(AB_BAR_DQ_FULL(bars, d));
}

/* dq (64 queries x HD) = dS (64 queries x `keys` keys, key-major at ds,
 * 128-byte rows) . k (those keys' rows from kb): both operands MN-major;
 * keys 64 (a warpgroup's own, CODA_AB_DQ_ONE=0) or 128 (the block's: both
 * warpgroups' halves of the dS^T buffer, k from the block's first row).
 * Issued, not committed. */
static __device__ __forceinline__ void ab_issue_dq(float *dq, u32 ds, u32 kb, const int keys) {
#pragma unroll
    for (int kk = 0; kk < keys / 16; kk++)
#if HD == 128
        coda_wgmma_mn_n128(dq, coda_desc(ds + kk * 2048, AB_DS_BYTES, 1024),
                           coda_desc(kb + kk * 2048, AB_BIG_CHUNK, 1024), kk > 0);
#else
        coda_wgmma_mn_n64(dq, coda_desc(ds + kk * 2048, AB_DS_BYTES, 1024),
                          coda_desc(kb + kk * 2048, AB_BIG_CHUNK, 1024), kk > 0);
#endif
}

/* acc (64 keys x HD) += a (64 keys x 64 queries, key-major at a: 128-byte
 * rows, swizzled) . b (the step's 64-query tile, N-major): dk += dS^T q of
 * the fused kernel (and dv += P^T do where P^T is stored: CODA_AB_PT_REG=0
 * or CODA_AB_DQ_ONE=0), both operands from shared memory. Issued, not
 * committed. */
static __device__ __forceinline__ void ab_issue_kn(float *acc, u32 a, u32 b) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#if HD == 128
        coda_wgmma_kn_n128(acc, coda_desc(a + kk * 32, 16, 1024), coda_desc(b + kk * 2048, AB_KV_CHUNK, 1024),
                           1);
#else
        coda_wgmma_kn_n64(acc, coda_desc(a + kk * 32, 16, 1024), coda_desc(b + kk * 2048, AB_KV_CHUNK, 1024), 1);
#endif
}

/* dv += P^T do (P^T from the packed registers pa with CODA_AB_PT_REG, else
 * from spt) and dk += dS^T q (dS^T from the packed registers pd with
 * AB_DST_REG, else at sdt), the fused kernel's step i under
 * CODA_AB_DQ_ONE: issued and committed as one group. */
static __device__ __forceinline__ void ab_issue_dv_dk(float *dv, float *dk, u32 (*pa)[4], u32 (*pd)[4], u32 spt,
                                                      u32 sdt, u32 tq, u32 tdo) {
#if CODA_AB_PT_REG
    (void)spt;
    aw_issue_rs(dv, pa, tdo, AB_TILE / 16, AB_TILE * 128);
#else
    (void)pa;
    ab_issue_kn(dv, spt, tdo);
#endif
#if AB_DST_REG
    (void)sdt;
    aw_issue_rs(dk, pd, tq, AB_TILE / 16, AB_TILE * 128);
#else
    (void)pd;
    ab_issue_kn(dk, sdt, tq);
#endif
    coda_wgmma_commit();
}

/* Step i of a dk/dv block: its query head (of the group's) and query tile.
 * The split kernel goes head by head, each from the diagonal's tile on;
 * the fused one from the last tile back, each tile over the group's heads,
 * so that every key block reaches a (tile, head) at the same step of its
 * own: ab_dq_writer's order costs no waiting when blocks start together. */
static __device__ __forceinline__ void ab_kv_step(int i, int group, int n_qt, int qt0, const int fused, int *g,
                                                  int *tile) {
    *g = fused ? i % group : i / n_qt;
    *tile = fused ? qt0 + n_qt - 1 - i / group : qt0 + i % n_qt;
}

/* TMA store (add = 0) or reduce-add (add = 1) of one staged f32 box (32
 * columns x 64 positions) into dq: through the 3-D map (column, position,
 * sequence), or with CODA_AB_DQ_PERM the 5-D one (column, h, q, g,
 * sequence) whose box puts position 8 g + 4 h + q back from the staged
 * row 8 g + 2 q + h (ab_dq_at); positions past a sequence's end
 * are not written. */
static __device__ __forceinline__ void ab_tma_out_dq(const coda_tmap *map, u32 src, int col, int pos, int b, int add) {
#if CODA_AB_DQ_PERM /* the map is (column, h, q, g, sequence), position 8 g + 4 h + q */
    if (add)
        asm volatile("cp.reduce.async.bulk.tensor.5d.global.shared::cta.add.tile.bulk_group"
                     " [%0, {%2, %3, %3, %4, %5}], [%1];"
                     ::"l"((u64)map), "r"(src), "r"(col), "r"(0), "r"(pos >> 3), "r"(b)
                     : "memory");
    else
        asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %3, %4, %5}], [%1];"
                     ::"l"((u64)map), "r"(src), "r"(col), "r"(0), "r"(pos >> 3), "r"(b)
                     : "memory");
#else
    if (add)
        asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group"
                     " [%0, {%2, %3, %4}], [%1];"
                     ::"l"((u64)map), "r"(src), "r"(col), "r"(pos), "r"(b)
                     : "memory");
    else
        asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];"
                     ::"l"((u64)map), "r"(src), "r"(col), "r"(pos), "r"(b)
                     : "memory");
#endif
}

/* One of the fused kernel's two dq writers (threads 64 and 96 of the
 * producer warpgroup, steps i = first, first + 2, ...: the two dq tiles):
 * step i's dq tile (head hq, 64-query tile qti: the sum over the block's
 * 128 keys), once staged, goes into dq in its turn. The contributions to
 * a tile come from the key blocks j = 0 ... jmax in that order (block j's turn is j: the
 * first stores, the others add), each waiting for the one before it
 * through the tile's counter in the workspace; blocks are launched with j
 * ascending (the longest first), so a block only ever waits for blocks
 * launched before it, and since every block walks the tiles from the last
 * back (ab_kv_step), block j - 1 reaches a tile at the same step as block
 * j. The order fixes the sum's rounding: the result is the same run to
 * run. The consumers go on meanwhile: a staged tile is given back as soon
 * as TMA has read it (wait_group.read), the counter once the adds are
 * done. Two writers, so that one step's adds are in flight while the
 * other's wait for their turn and complete: with one thread doing both
 * steps' chains one after the other, the consumers waited for the dq tile
 * (the wait before warpgroup 0's first product, 5% of the warps' samples
 * at LLaMA-3 1B) and the backward ran at 334 / 421 / 387 TFLOP/s at 1B /
 * 8B / 70B against 364-373 / 415-422 / 396-398 with two (H200,
 * test_attention_gpu benchonly, two runs). Consecutive steps are
 * different (head, tile) pairs, so the two never add into the same dq
 * rows and each tile's order stays the key blocks'. */
static __device__ __forceinline__ void ab_dq_writer(const coda_tmap *t_dq, const coda_attn_args_t &p, u32 bars,
                                                    u32 sdq, int first, int steps, int group, int n_qt, int qt0,
                                                    int h0, int jb, int b) {
    u32 *counters = (u32 *)(p.dsum + 2 * STAT_PLANE(p));
    const u32 turn = (u32)jb;
    coda_prefetch_tmap(t_dq);
    for (int i = first; i < steps; i += 2) {
        int g, qti;
        ab_kv_step(i, group, n_qt, qt0, 1, &g, &qti);
        const int d = i & 1, hq = h0 + g;
        u32 *count = counters + (((long long)b * p.n_heads + hq) * (STAT_PAD(p.seq) / AB_TILE) + qti) * 2;
        coda_mbar_wait(AB_BAR_DQ_FULL(bars, d), (u32)(i >> 1) & 1u);
#ifndef CODA_PROBE_NO_DQ_TURN /* a measurement probe: the adds in no order, wrong dq (what the order costs) */
        while (coda_ld_acquire_u32(count) != turn) {
        }
#endif
        asm volatile("fence.proxy.async;" ::: "memory"); /* the last turn's adds (async proxy) before ours */
        const u32 src = sdq + d * AB_DQB_BYTES;
#pragma unroll
        for (int t = 0; t < HD / 32; t++)
            ab_tma_out_dq(t_dq, src + t * AB_DQB_BOX, hq * HD + 32 * t, qti * AB_TILE, b, turn > 0);
        coda_bulk_commit();
        coda_bulk_wait_read(0);
        coda_mbar_arrive(AB_BAR_DQ_EMPTY(bars, d));
        coda_bulk_wait(0);
        asm volatile("fence.proxy.async;" ::: "memory"); /* our adds done before the counter says so */
        coda_st_release_u32(count, turn + 1);
    }
}

/* The elementwise part of a dk/dv step (the thread's keys kr and kr + 8,
 * the tile's qt queries from qs): P^T = exp2(S^T scale log2 e - lse log2 e)
 * in place of S^T, masked by a select where the tile crosses the diagonal
 * or the end (what lies past either, NaN included, never leaks in); the
 * mask bits are returned for dS^T. */
static __device__ __forceinline__ u64 ab_kv_p(float *s, const float *l2, int qs, int kr, int seq, float sl2,
                                              int mask, const int qt) {
    const int lane = threadIdx.x & 31;
    u64 keep = ~0ull;
#pragma unroll
    for (int e = 0; e < qt / 2; e++) {
        const int col = AB_COL(e, lane), qc = qs + col;
        if (mask && !(qc >= kr + AB_ROW8(e) && qc < seq)) keep &= ~(1ull << e);
        const float pe = attn_exp2(fmaf(s[e], sl2, -l2[col])); /* computed always, then selected: no branch */
        s[e] = (keep >> e) & 1u ? pe : 0.f;
    }
    return keep;
}

/* dS^T = P^T (dP^T - D) in place of dP^T (D per query: the tile's column). */
static __device__ __forceinline__ void ab_kv_ds(float *dp, const float *s, const float *dd, u64 keep, const int qt) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < qt / 2; e++) dp[e] = (keep >> e) & 1u ? s[e] * (dp[e] - dd[AB_COL(e, lane)]) : 0.f;
}

/* The same for a dq step (the thread's queries row0 and row0 + 8, the
 * tile's keys from k0): P in place of S, the mask bits returned. */
static __device__ __forceinline__ u32 ab_q_p(float *s, const float *l2, int k0, int row0, int seq, float sl2,
                                             int mask) {
    const int lane = threadIdx.x & 31;
    u32 keep = 0xffffffffu;
#pragma unroll
    for (int e = 0; e < AB_TILE / 2; e++) {
        const int kc = k0 + AB_COL(e, lane), r = (e >> 1) & 1;
        if (mask && !(kc <= row0 + 8 * r && kc < seq)) keep &= ~(1u << e);
        const float pe = attn_exp2(fmaf(s[e], sl2, -l2[r]));
        s[e] = (keep >> e) & 1u ? pe : 0.f;
    }
    return keep;
}

/* dS = P (dP - D) in place of dP (D per query: the thread's row). */
static __device__ __forceinline__ void ab_q_ds(float *dp, const float *s, const float *dd, u32 keep) {
#pragma unroll
    for (int e = 0; e < AB_TILE / 2; e++) dp[e] = (keep >> e) & 1u ? s[e] * (dp[e] - dd[(e >> 1) & 1]) : 0.f;
}

/* dS^T (the warp's packed bf16 fragments: its 16 rows from wrow of the
 * 128 keys, 64 queries) into the key-major dS buffer: row = key, 64
 * queries of 128 bytes, 16-byte chunks swizzled (chunk ^ (row & 7)), the
 * layout an MN-major wgmma operand reads. One stmatrix a 16-query step:
 * fragment f of step kk is the 8 x 8 matrix of rows wrow + 8 (f & 1) and
 * chunk 2 kk + (f >> 1) (the accumulator layout is stmatrix's), lane l
 * giving the address of row l & 7 of matrix l >> 3. A matrix's 8 rows
 * land in 8 different chunks: one wavefront each. (Four b32 stores a
 * fragment before: 4x the instructions.) */
static __device__ __forceinline__ void ab_store_ds(u32 ds, u32 (*pd)[4], int wrow) {
    const int lane = threadIdx.x & 31, m = lane >> 3, i = lane & 7;
    const u32 at = ds + (wrow + 8 * (m & 1) + i) * 128;
#pragma unroll
    for (int kk = 0; kk < AB_TILE / 16; kk++)
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                         at + (((2 * kk + (m >> 1)) ^ i) << 4)),
                     "r"(pd[kk][0]), "r"(pd[kk][1]), "r"(pd[kk][2]), "r"(pd[kk][3])
                     : "memory");
}

/* The block's (kv head x part, sequence, key block). Blocks go out in the
 * order of the linear block index, in chunks of p.kv_chunk (kv head x part,
 * sequence) pairs (0: all of them; the last chunk may be short): within a
 * chunk the key blocks in order, the longest first, the chunk's pairs
 * fastest. Fewer pairs a chunk keep the blocks running at once on fewer
 * heads' q, do and dq (the L2); more put the longest blocks earlier (the
 * tail). 1 is one pair's key blocks after another, 0 every pair's first key
 * block, then every pair's second... Either way a key block comes after the
 * one before it and a part after the one before it, which is all the dq and
 * dk/dv orders wait for. */
static __device__ __forceinline__ void ab_block(const coda_attn_args_t &p, int *xb, int *b, int *jb) {
    const unsigned lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned pairs = gridDim.x * gridDim.y, kb = gridDim.z;
    const unsigned g = p.kv_chunk > 0 && (unsigned)p.kv_chunk < pairs ? (unsigned)p.kv_chunk : pairs;
    const unsigned c = lin / (g * kb), r = lin - c * g * kb; /* the chunk, the place in it */
    const unsigned n = min(g, pairs - c * g);                /* its pairs */
    const unsigned pair = c * g + r % n;
    *jb = (int)(r / n);
    *xb = (int)(pair % gridDim.x);
    *b = (int)(pair / gridDim.x);
}

/* dk, dv (and with `fused`, dq) of one block of 128 keys: the body of
 * coda_attn_bwd_dkdv_wgmma_kernel (fused = 0, dq from its own kernel) and
 * coda_attn_bwd_wgmma_kernel (fused = 1). */
static __device__ __forceinline__ void ab_dkdv(const coda_tmap *t_qkv128, const coda_tmap *t_q,
                                               const coda_tmap *t_do, const coda_tmap *t_dq,
                                               const coda_attn_args_t &p, const int fused) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const u32 base = (coda_smem_addr(smem) + 1023u) & ~1023u;
    const u32 sk = base, sv = base + AB_BIG;                       /* (128 keys, HD) each */
    const u32 sq = base + AB_TILES_OFF, sdo = sq + AB_STAGES * AB_RING_TILE(fused); /* [s] (qt queries, HD) */
    const u32 sst = base + AB_RING_STATS_OFF(fused);               /* [s] D[qt], lse2[qt] */
    const float *stats = (const float *)(smem + (sst - coda_smem_addr(smem)));
    const u32 sds = base + AB_DS_OFF;                              /* [2] dS^T (128 keys, 64 queries) */
    const u32 sdq = base + AB_DQB_OFF;                             /* [2] dq (64 queries, HD) f32 */
    const u32 bars = base + (fused ? AB_BARS_FUSED : AB_BARS_DKDV);
    const int seq = p.seq;
    int xb, b, jb; /* (kv head, part), sequence, key block */
    ab_block(p, &xb, &b, &jb);
    const int k0 = jb * AB_ROWS;
    const int group = p.n_heads / p.n_kv_heads, nq = p.n_heads * HD, nkv = p.n_kv_heads * HD;
    /* the block's heads: hpb of kvh's group from h0 */
    const int kvh = xb / p.kv_parts, part = xb % p.kv_parts, hpb = group / p.kv_parts;
    const int h0 = kvh * group + part * hpb;
    /* the query tiles' rows (t_q and t_do have boxes of qt rows) */
    const int qt = fused ? AB_TILE : AB_KV_QT;
    const int qt0 = k0 / qt, n_qt = (seq + qt - 1) / qt - qt0;
    const int steps = hpb * n_qt; /* step i: ab_kv_step's head (of the block's) and query tile */
    const int wg = threadIdx.x / 128;

    ab_init_bars(bars, 1 + 32, fused); /* the TMA thread's expect_tx, the statistics warp's 32 lanes */

    if (wg == 0) { /* producer: thread 0 the tiles (TMA), warp 1 the statistics, fused: threads 64, 96 dq */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (fused && (threadIdx.x == 64 || threadIdx.x == 96)) /* even steps, odd steps */
            ab_dq_writer(t_dq, p, bars, sdq, threadIdx.x == 96, steps, hpb, n_qt, qt0, h0, jb, b);
        if (threadIdx.x == 0) {
            coda_prefetch_tmap(t_q);
            coda_prefetch_tmap(t_do);
            coda_mbar_expect_tx(AB_BAR_BLOCK(bars), 2 * AB_BIG);
            ab_load(sk, t_qkv128, nq + kvh * HD, k0, b, AB_BIG_CHUNK, AB_BAR_BLOCK(bars));
            ab_load(sv, t_qkv128, nq + nkv + kvh * HD, k0, b, AB_BIG_CHUNK, AB_BAR_BLOCK(bars));
            for (int i = 0; i < steps; i++) {
                int g, tile;
                ab_kv_step(i, hpb, n_qt, qt0, fused, &g, &tile);
                const int s = i % AB_STAGES, h = h0 + g, qs = tile * qt;
                const u32 full = AB_BAR_FULL(bars, s);
                if (i >= AB_STAGES) coda_mbar_wait(AB_BAR_EMPTY(bars, s), (u32)(i / AB_STAGES - 1) & 1u);
                coda_mbar_expect_tx(full, 2 * (HD / 64) * qt * 128);
                ab_load(sq + s * AB_RING_TILE(fused), t_q, h * HD, qs, b, qt * 128, full);
                ab_load(sdo + s * AB_RING_TILE(fused), t_do, h * HD, qs, b, qt * 128, full);
            }
        } else if (threadIdx.x / 32 == 1) {
            /* Ordinary loads and stores, not a bulk copy: the consumers read
             * the statistics with ordinary loads too, so both directions
             * are ordered by the stage barriers alone (a bulk copy would
             * write through the async proxy). qt / 2 float4 of a tile, qt
             * / 4 of D then qt / 4 of lse2: one a lane at qt 64, two at
             * 128 (the second loaded after the wait: in the warp's 24
             * registers two in flight spilled). */
            const int lane = threadIdx.x & 31, q4 = qt / 4;
            const long long plane = STAT_PLANE(p);
            float4 *dst = (float4 *)(smem + (sst - coda_smem_addr(smem)));
            for (int i = 0; i < steps; i++) {
                int g, tile;
                ab_kv_step(i, hpb, n_qt, qt0, fused, &g, &tile);
                const int s = i % AB_STAGES, h = h0 + g, qs = tile * qt;
                const float *src = p.dsum + STAT_AT(p, b, h, qs);
                const float4 v = ((const float4 *)(src + (lane < q4 ? 0 : plane)))[lane % q4];
                if (i >= AB_STAGES) coda_mbar_wait(AB_BAR_EMPTY(bars, s), (u32)(i / AB_STAGES - 1) & 1u);
                dst[s * (AB_RING_STAT(fused) / 16) + lane] = v;
                if (qt == 128) /* lanes 32-63 of the tile's 64 float4: lse2 */
                    dst[s * (AB_RING_STAT(fused) / 16) + 32 + lane] = ((const float4 *)(src + plane))[lane];
                coda_mbar_arrive(AB_BAR_FULL(bars, s));
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int c = wg - 1, tid = threadIdx.x % 128, lane = tid & 31;
    const int lo = k0 + 64 * c;                          /* the warpgroup's first key */
    const int kr = lo + 16 * (tid >> 5) + (lane >> 2);   /* the thread's keys: kr, kr + 8 */
    const float sl2 = p.scale * LOG2E;
    float dk[HD / 2], dv[HD / 2], s[AB_KV_QT / 2], dp[AB_KV_QT / 2];
    u32 pa[AB_KV_QT / 16][4], pd[AB_KV_QT / 16][4];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dk[i] = dv[i] = 0.f;

    coda_mbar_wait(AB_BAR_BLOCK(bars), 0);
    for (int i = 0; i < steps; i++) {
        int g, tile;
        ab_kv_step(i, hpb, n_qt, qt0, fused, &g, &tile);
        const int st = i % AB_STAGES, qs = tile * qt;
        coda_mbar_wait(AB_BAR_FULL(bars, st), (u32)(i / AB_STAGES) & 1u);
        if (!fused && qs + qt - 1 < lo) { /* every query of the tile before every key of the warpgroup */
            ab_release(bars, st);
            continue;
        }
        const u32 tq = sq + st * AB_RING_TILE(fused), tdo = sdo + st * AB_RING_TILE(fused);
        /* fused: the warpgroup that stages a dq this step (with
         * CODA_AB_DQ_LAG that of step i - 1, by (i + 1) & 1; else step
         * i's, by i & 1, or 0 with CODA_AB_DQ_ONE=0) needs a tile the
         * writer has read out (ab_dq_writer); waited for here, before any
         * product */
        if (CODA_AB_DQ_LAG) {
            if (fused && c == ((i + 1) & 1) && i >= 3) /* dq of step i - 1 */
                coda_mbar_wait(AB_BAR_DQ_EMPTY(bars, (i - 1) & 1), (u32)(((i - 1) >> 1) - 1) & 1u);
        } else if (fused && c == (CODA_AB_DQ_ONE ? (i & 1) : 0) && i >= 2)
            coda_mbar_wait(AB_BAR_DQ_EMPTY(bars, i & 1), (u32)((i >> 1) - 1) & 1u);
        const float *dd = stats + st * (AB_RING_STAT(fused) / 4), *l2 = dd + qt;
        /* CODA_AB_DQ_LAG=2: warpgroup 1 starts half a step behind 0, its
         * first products once 0's first S^T is done (named barrier 10) */
        const int stagger = CODA_AB_DQ_LAG >= 2 && fused && i == 0;
        if (stagger && c == 1) coda_turn_wait(10);
        coda_wgmma_fence();
        ab_issue_nt_n(s, sk + c * 8192, tq, qt, qt * 128);
        ab_issue_nt_n(dp, sv + c * 8192, tdo, qt, qt * 128);
        coda_wgmma_wait(1);
        AW_FENCE(s, qt / 2);
        if (stagger && c == 0) coda_turn_pass(10);
        /* fused: the tiles no mask touches (most) take a path with no
         * selects (in the split kernel's registers that branch serialised
         * its products: ptxas C7512) */
        const int masked = qs < lo + 63 || qs + qt > seq;
        u64 keep = ~0ull;
        if (!fused || masked) keep = ab_kv_p(s, l2, qs, kr, seq, sl2, masked, qt);
        else ab_kv_p(s, l2, qs, kr, seq, sl2, 0, qt);
        coda_wgmma_wait(0);
        AW_FENCE(dp, qt / 2);
        if (!fused || masked) ab_kv_ds(dp, s, dd, keep, qt);
        else ab_kv_ds(dp, s, dd, ~0ull, qt);
        aw_pack(s, pa, qt / 16);
        aw_pack(dp, pd, qt / 16);
        if (!fused) {
            coda_wgmma_fence();
            aw_issue_rs(dv, pa, tdo, qt / 16, qt * 128);
            aw_issue_rs(dk, pd, tq, qt / 16, qt * 128);
            coda_wgmma_commit();
            coda_wgmma_wait(0);
            AW_FENCE(dk, HD / 2);
            AW_FENCE(dv, HD / 2);
            ab_release(bars, st);
        } else if (CODA_AB_DQ_LAG) {
            /* Step i's dq a step late: D_i, the warpgroup c == (i + 1) & 1,
             * issues dq of step i - 1 beside its dv and dk of step i, from
             * the dS^T buffer of that step's parity (dS^T(i) in buffer i &
             * 1: the P^T buffer is free with CODA_AB_PT_REG). Both halves
             * of dS^T(i - 1) were stored a step earlier, so neither
             * warpgroup waits on the other at the dS^T point of its own
             * step, and their softmaxes need not line up (with dq in the
             * same step, the reading that led here, the dq warpgroup's
             * barrier on the other's half put both at the same phase, the
             * tensor pipes idle while both ran the softmax). Named
             * barriers, each arrived by one warpgroup and synced by the
             * other:
             *   6 + (i & 1): D_i's half of dS^T(i) stored (D_{i + 1}
             *                syncs before dq(i), at step i + 1, or after
             *                the loop for the last step);
             *   8 + (i & 1): dq(i) has read buffer i & 1 (D_{i + 1}
             *                arrives at step i + 1 where a step i + 2
             *                exists, D_{i + 2} syncs before storing
             *                dS^T(i + 2) there).
             * Storing as D_i, a warpgroup overwrites a buffer whose last
             * dq was the other's (barrier 8); storing as the other, it
             * computed that dq itself and waited for it. Backward TFLOP/s
             * at LLaMA-3 1B / 8B / 70B, the means of four rounds (H100,
             * stop 54, test_attention_gpu dqab benchonly dqforms=2,3,4):
             * dq in its step 418 / 489 / 494, a step late 438 / 532 / 526
             * (+5% / +9% / +6%), a step late with warpgroup 1 started half
             * a step behind (CODA_AB_DQ_LAG=2) 432 / 520 / 519. */
            const int wrow = 64 * c + 16 * (tid >> 5);
            const int isd = c == ((i + 1) & 1);
            const u32 dsb = sds + (i & 1) * AB_DS_BYTES;
            if (isd && i >= 2) coda_turn_wait(8 + (i & 1));
            ab_store_ds(dsb, pd, wrow);
            coda_fence_proxy_async();
            if (isd) coda_turn_pass(6 + (i & 1));
            /* the warpgroup's own barrier: its four warps' rows stored
             * before dk's product reads them; with AB_DST_REG dk takes
             * dS^T from registers and the only reader is a dq, a step on,
             * behind barrier 6 + (i & 1), whose sync counts these warps */
            if (!AB_DST_REG) coda_wg_sync(2 + c);
            if (isd && i >= 1) {
                const int d = (i - 1) & 1;
                coda_turn_wait(6 + d); /* the other's half of dS^T(i - 1) */
                float dq[HD / 2];
                coda_wgmma_fence();
                ab_issue_dq(dq, sds + d * AB_DS_BYTES, sk, 128);
                coda_wgmma_commit();
                ab_issue_dv_dk(dv, dk, pa, pd, 0, dsb + c * 8192, tq, tdo);
                coda_wgmma_wait(1);
                AW_FENCE(dq, HD / 2);
                if (i + 1 < steps) coda_turn_pass(8 + d);
                ab_dq_hand(dq, p.scale, sdq, d, bars);
            } else {
                coda_wgmma_fence();
                ab_issue_dv_dk(dv, dk, pa, pd, 0, dsb + c * 8192, tq, tdo);
            }
            coda_wgmma_wait(0);
            AW_FENCE(dk, HD / 2);
            AW_FENCE(dv, HD / 2);
            ab_release(bars, st);
        } else if (CODA_AB_DQ_ONE) {
            /* dS^T goes to shared memory (key-major, the warpgroup's 64
             * rows of the buffer; why: the other form's comment, below), P^T
             * too where CODA_AB_PT_REG=0. dq by one warpgroup a step, over
             * all 128 keys: warpgroup i & 1 (the "dq warpgroup"), which
             * stages it alone into dq tile i & 1
             * (no sum of two parts, no turn between the warpgroups' staging:
             * +9% / +4% / +5% at LLaMA-3 1B / 8B / 70B over both warpgroups'
             * 64-key parts summed in the staging, H100, test_attention_gpu
             * dqab, two rounds; the dq product is twice as long on one
             * warpgroup and none on the other, and they alternate).
             * It reads the other warpgroup's half of dS^T, so named barrier
             * 6 says that half is stored (the other arrives, the dq
             * warpgroup syncs: its own 128 threads are counted too) and 7 +
             * (i & 1) that step i's dq product has read both halves (the dq
             * warpgroup arrives once its product is done, the other syncs
             * before it stores its next dS^T: it is the next step's dq
             * warpgroup). One barrier for the latter hung at LLaMA-3
             * shapes: the dq warpgroup, a step ahead (the ring's next stage
             * was free), synced at step i + 2 on its own arrival of step i,
             * 256 arrivals without the other's. With a barrier per parity
             * its next arrival there comes after the other's sync (it
             * follows barrier 6 of step i + 2). The dq warpgroup of a
             * parity is always the same, so dq tile d has one writer
             * warpgroup. */
            const int wrow = 64 * c + 16 * (tid >> 5);
            const int mine = (i & 1) == c;
            const u32 spt = sds + c * 8192, sdt = sds + AB_DS_BYTES + c * 8192;
            /* P^T: a register A operand of dv's product (CODA_AB_PT_REG:
             * +1% / +1% / +3% at 1B / 8B / 70B, H100, dqab, two rounds; no
             * spill beside dq, dk and dv now that only dS^T is shared), or
             * stored like dS^T; its buffer is then unused */
            if (!CODA_AB_PT_REG) ab_store_ds(sds, pa, wrow);
            if (mine && i > 0) coda_turn_wait(7 + ((i - 1) & 1)); /* step i - 1's dq has read our half */
            ab_store_ds(sds + AB_DS_BYTES, pd, wrow);
            coda_fence_proxy_async();
            if (mine) {
                coda_turn_wait(6); /* both halves of dS^T stored */
                float dq[HD / 2];
                coda_wgmma_fence();
                ab_issue_dq(dq, sds + AB_DS_BYTES, sk, 128);
                coda_wgmma_commit();
                ab_issue_dv_dk(dv, dk, pa, pd, spt, sdt, tq, tdo);
                coda_wgmma_wait(1);
                AW_FENCE(dq, HD / 2);
                if (i + 1 < steps) coda_turn_pass(7 + (i & 1));
                ab_dq_hand(dq, p.scale, sdq, i & 1, bars);
            } else {
                coda_turn_pass(6);
                coda_wg_sync(2 + c);
                coda_wgmma_fence();
                ab_issue_dv_dk(dv, dk, pa, pd, spt, sdt, tq, tdo);
            }
            coda_wgmma_wait(0);
            AW_FENCE(dk, HD / 2);
            AW_FENCE(dv, HD / 2);
            ab_release(bars, st);
        } else { /* CODA_AB_DQ_ONE=0: the form before stop 44 (the A/B's base) */
            /* P^T and dS^T go to shared memory (key-major, the warpgroup's
             * 64 rows of each buffer), so that dv += P^T do, dk += dS^T q
             * and dq += dS k are all read from there and in flight at
             * once: with P^T and dS^T as register operands, dq beside dk
             * and dv did not fit in the registers (ptxas serialised or
             * spilled). The proxy fence first (wgmma reads what ordinary
             * stores wrote), then the warpgroup's barrier; the buffers are
             * free again once this step's products are waited for. */
            const int wrow = 64 * c + 16 * (tid >> 5); /* the warp's first key in the block */
            const u32 spt = sds + c * 8192, sdt = sds + AB_DS_BYTES + c * 8192, kb = sk + c * 8192;
            ab_store_ds(sds, pa, wrow);
            ab_store_ds(sds + AB_DS_BYTES, pd, wrow);
            coda_fence_proxy_async();
            coda_wg_sync(2 + c);
            float dq[HD / 2];
            coda_wgmma_fence();
            ab_issue_dq(dq, sdt, kb, 64);
            coda_wgmma_commit();
            ab_issue_kn(dv, spt, tdo);
            ab_issue_kn(dk, sdt, tq);
            coda_wgmma_commit();
            coda_wgmma_wait(1); /* dq's group: staged while dv and dk run */
            AW_FENCE(dq, HD / 2);
            /* dq's part (the warpgroup's 64 keys) is staged for the writer
             * of step i's parity (ab_dq_writer) in the dq tile of that parity:
             * warpgroup 0 stores (the tile was free at the step's start),
             * warpgroup 1 then adds its own (a fixed order: the same bits
             * run to run), after named barrier 6 + (i & 1): a barrier, not
             * a wait on an mbarrier, since ptxas serialises every product
             * when a spin loop lies between a product and the use of its
             * registers. Warpgroup 0 cannot arrive on it twice before 1
             * has synced: its next arrival there, two steps on, waits for
             * the writer, which waits for 1. */
            const u32 dqb = sdq + (i & 1) * AB_DQB_BYTES;
            const int row = 16 * (tid >> 5) + (lane >> 2);
            if (c == 1) coda_turn_wait(6 + (i & 1));
            ab_dq_stage(dq, p.scale, dqb, row, c);
            if (c == 0) {
                coda_turn_pass(6 + (i & 1));
            } else {
                coda_fence_proxy_async(); /* the sums before the writer's TMA reads them */
                coda_mbar_arrive(AB_BAR_DQ_FULL(bars, i & 1));
            }
            coda_wgmma_wait(0);
            AW_FENCE(dk, HD / 2);
            AW_FENCE(dv, HD / 2);
            ab_release(bars, st);
        }
    }

    if (fused && CODA_AB_DQ_LAG && steps > 0 && c == ((steps + 1) & 1)) { /* dq of the last step */
        const int i = steps - 1, d = i & 1;
        if (i >= 2) coda_mbar_wait(AB_BAR_DQ_EMPTY(bars, d), (u32)((i >> 1) - 1) & 1u);
        coda_turn_wait(6 + d);
        float dq[HD / 2];
        coda_wgmma_fence();
        ab_issue_dq(dq, sds + d * AB_DS_BYTES, sk, 128);
        coda_wgmma_commit();
        coda_wgmma_wait(0);
        AW_FENCE(dq, HD / 2);
        ab_dq_hand(dq, p.scale, sdq, d, bars);
    }
    float *out = (float *)p.out + (long long)b * seq * p.ld_out + nq + kvh * HD;
    const int row0 = kr;
    if (p.kv_parts == 1) {
        ab_store(dk, p.scale, out, p.ld_out, row0, seq, 0);
        ab_store(dv, 1.f, out + nkv, p.ld_out, row0, seq, 0);
        return;
    }
    /* the group's parts of dk and dv, in the order of the parts (the same
     * bits run to run): part 0 stores, each next adds once the one before
     * has said so through the key block's counter (ab_dq_writer's counters'
     * second word); part - 1 was launched before this block (ab_block) */
    u32 *count = (u32 *)(p.dsum + 2 * STAT_PLANE(p)) +
                 (((long long)b * p.n_heads + kvh) * (STAT_PAD(p.seq) / AB_TILE) + jb) * 2 + 1;
    if (threadIdx.x == 128)
        while (coda_ld_acquire_u32(count) != (u32)part) {
        }
    coda_consumer_sync();
    ab_store(dk, p.scale, out, p.ld_out, row0, seq, part > 0);
    ab_store(dv, 1.f, out + nkv, p.ld_out, row0, seq, part > 0);
    coda_consumer_sync();
    if (threadIdx.x == 128) {
        __threadfence();
        coda_st_release_u32(count, (u32)part + 1);
    }
}

extern "C" __global__ void __launch_bounds__(384, 1)
coda_attn_bwd_dkdv_wgmma_kernel(const __grid_constant__ coda_tmap t_qkv128, const __grid_constant__ coda_tmap t_q,
                                const __grid_constant__ coda_tmap t_do, coda_attn_args_t p) {
    ab_dkdv(&t_qkv128, &t_q, &t_do, NULL, p, 0); /* t_q, t_do: boxes of AB_KV_QT rows */
}

extern "C" __global__ void __launch_bounds__(384, 1)
coda_attn_bwd_wgmma_kernel(const __grid_constant__ coda_tmap t_qkv128, const __grid_constant__ coda_tmap t_qkv64,
                           const __grid_constant__ coda_tmap t_do64, const __grid_constant__ coda_tmap t_dq,
                           coda_attn_args_t p) {
    ab_dkdv(&t_qkv128, &t_qkv64, &t_do64, &t_dq, p, 1); /* t_dq: dqkv f32, boxes of 32 columns x 64 rows */
}

extern "C" __global__ void __launch_bounds__(384, 1)
coda_attn_bwd_dq_wgmma_kernel(const __grid_constant__ coda_tmap t_qkv128, const __grid_constant__ coda_tmap t_qkv64,
                              const __grid_constant__ coda_tmap t_do128, coda_attn_args_t p) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const u32 base = (coda_smem_addr(smem) + 1023u) & ~1023u;
    const u32 sq = base, sdo = base + AB_BIG;                           /* (128 queries, HD) each */
    const u32 sk = base + AB_TILES_OFF, sv = sk + AB_STAGES * AB_SMALL; /* [s] (64 keys, HD) */
    const u32 bars = base + AB_BARS_DQ;
    const int seq = p.seq, h = blockIdx.x, b = blockIdx.y;
    const int tile = (int)gridDim.z - 1 - (int)blockIdx.z; /* the longest rows first */
    const int q0 = tile * AB_ROWS, qend = min(q0 + AB_ROWS, seq);
    const int n_kv = (qend + AB_TILE - 1) / AB_TILE;
    const int kvh = h / (p.n_heads / p.n_kv_heads);
    const int col_k = p.n_heads * HD + kvh * HD, col_v = col_k + p.n_kv_heads * HD;
    const int wg = threadIdx.x / 128;

    ab_init_bars(bars, 1, 0);

    if (wg == 0) { /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0) {
            coda_prefetch_tmap(&t_qkv64);
            coda_mbar_expect_tx(AB_BAR_BLOCK(bars), 2 * AB_BIG);
            ab_load(sq, &t_qkv128, h * HD, q0, b, AB_BIG_CHUNK, AB_BAR_BLOCK(bars));
            ab_load(sdo, &t_do128, h * HD, q0, b, AB_BIG_CHUNK, AB_BAR_BLOCK(bars));
            for (int j = 0; j < n_kv; j++) {
                const int s = j % AB_STAGES;
                const u32 full = AB_BAR_FULL(bars, s);
                if (j >= AB_STAGES) coda_mbar_wait(AB_BAR_EMPTY(bars, s), (u32)(j / AB_STAGES - 1) & 1u);
                coda_mbar_expect_tx(full, 2 * AB_SMALL);
                ab_load(sk + s * AB_SMALL, &t_qkv64, col_k, j * AB_TILE, b, AB_SMALL_CHUNK, full);
                ab_load(sv + s * AB_SMALL, &t_qkv64, col_v, j * AB_TILE, b, AB_SMALL_CHUNK, full);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int c = wg - 1, tid = threadIdx.x % 128, lane = tid & 31;
    const int lo = q0 + 64 * c;                        /* the warpgroup's first query */
    const int row0 = lo + 16 * (tid >> 5) + (lane >> 2); /* the thread's rows: row0, row0 + 8 */
    const float sl2 = p.scale * LOG2E;
    const long long plane = STAT_PLANE(p);
    float l2[2], dd[2]; /* rows past seq read the pad: what they compute is never stored */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const long long at = STAT_AT(p, b, h, row0 + 8 * r);
        dd[r] = p.dsum[at];
        l2[r] = p.dsum[plane + at];
    }
    float dq[HD / 2], s[AB_TILE / 2], dp[AB_TILE / 2];
    u32 pd[AB_TILE / 16][4];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dq[i] = 0.f;

    coda_mbar_wait(AB_BAR_BLOCK(bars), 0);
#if CODA_AB_PIPE
    /* Pipelined (FlashAttention-3's intra-warpgroup overlap): step j issues
     * tile j's S and dP and then tile j - 1's dq product (its dS packed by
     * the step before), so tile j's softmax runs while dP_j and dq_{j-1}
     * are on the tensor cores; the groups complete in that order. The
     * warpgroup's tiles are j < n_on; the later ones lie after every query
     * of its rows and are only released. */
    const int n_on = min(n_kv, lo / AB_TILE + 1);
    /* tile 0's S and dP, P and dS */
    coda_mbar_wait(AB_BAR_FULL(bars, 0), 0);
    coda_wgmma_fence();
    ab_issue_nt(s, sq + c * 8192, sk);
    ab_issue_nt(dp, sdo + c * 8192, sv);
    coda_wgmma_wait(1);
    AW_FENCE(s, AB_TILE / 2);
    u32 keep = ab_q_p(s, l2, 0, row0, seq, sl2, 63 > lo || AB_TILE > seq);
    coda_wgmma_wait(0);
    AW_FENCE(dp, AB_TILE / 2);
    ab_q_ds(dp, s, dd, keep);
    aw_pack(dp, pd, AB_TILE / 16);
    /* tile j: S_j and dP_j, then dq += dS_{j-1} k_{j-1}; the softmax of j
     * while those run; nothing left in flight at the end of a step */
    for (int j = 1; j < n_on; j++) {
        const int st = j % AB_STAGES, sp = (j - 1) % AB_STAGES, k0 = j * AB_TILE;
        coda_mbar_wait(AB_BAR_FULL(bars, st), (u32)(j / AB_STAGES) & 1u);
        coda_wgmma_fence();
        ab_issue_nt(s, sq + c * 8192, sk + st * AB_SMALL);
        ab_issue_nt(dp, sdo + c * 8192, sv + st * AB_SMALL);
        aw_issue_rs(dq, pd, sk + sp * AB_SMALL, AB_TILE / 16, AB_SMALL_CHUNK);
        coda_wgmma_commit();
        coda_wgmma_wait(2);
        AW_FENCE(s, AB_TILE / 2);
        keep = ab_q_p(s, l2, k0, row0, seq, sl2, k0 + 63 > lo || k0 + AB_TILE > seq);
        coda_wgmma_wait(1);
        AW_FENCE(dp, AB_TILE / 2);
        ab_q_ds(dp, s, dd, keep);
        coda_wgmma_wait(0); /* dq's product of tile j - 1: its stage goes back */
        ab_release(bars, sp);
        aw_pack(dp, pd, AB_TILE / 16);
    }
    const int sl = (n_on - 1) % AB_STAGES;
    coda_wgmma_fence();
    aw_issue_rs(dq, pd, sk + sl * AB_SMALL, AB_TILE / 16, AB_SMALL_CHUNK);
    coda_wgmma_commit();
    coda_wgmma_wait(0);
    AW_FENCE(dq, HD / 2);
    ab_release(bars, sl);
    for (int j = n_on; j < n_kv; j++) {
        const int st = j % AB_STAGES;
        coda_mbar_wait(AB_BAR_FULL(bars, st), (u32)(j / AB_STAGES) & 1u);
        ab_release(bars, st);
    }
#else
    for (int j = 0; j < n_kv; j++) {
        const int st = j % AB_STAGES, k0 = j * AB_TILE;
        coda_mbar_wait(AB_BAR_FULL(bars, st), (u32)(j / AB_STAGES) & 1u);
        if (k0 > lo + 63) { /* every key of the tile after every query of the warpgroup */
            ab_release(bars, st);
            continue;
        }
        const u32 tk = sk + st * AB_SMALL, tv = sv + st * AB_SMALL;
        coda_wgmma_fence();
        ab_issue_nt(s, sq + c * 8192, tk);
        ab_issue_nt(dp, sdo + c * 8192, tv);
        coda_wgmma_wait(1);
        AW_FENCE(s, AB_TILE / 2);
        const u32 keep = ab_q_p(s, l2, k0, row0, seq, sl2, k0 + 63 > lo || k0 + AB_TILE > seq);
        coda_wgmma_wait(0);
        AW_FENCE(dp, AB_TILE / 2);
        ab_q_ds(dp, s, dd, keep);
        aw_pack(dp, pd, AB_TILE / 16);
        coda_wgmma_fence();
        aw_issue_rs(dq, pd, tk, AB_TILE / 16, AB_SMALL_CHUNK);
        coda_wgmma_commit();
        coda_wgmma_wait(0);
        AW_FENCE(dq, HD / 2);
        ab_release(bars, st);
    }

#endif

    ab_store(dq, p.scale, (float *)p.out + (long long)b * seq * p.ld_out + h * HD, p.ld_out, row0, seq, 0);
}
