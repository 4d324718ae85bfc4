/* attention.cuh - causal grouped-query attention on Hopper, forward and
 * backward (src/cuda/attention.c launches it; what it computes: coda.h
 * section 11; the CPU oracle: src/layer/attention.c).
 *
 *   coda_attn_fwd_kernel      o, lse from qkv: one block per (128 query rows,
 *                             head, sequence), online softmax over 64-key tiles
 *                             (the longest rows first: grid z reversed)
 *   coda_attn_bwd_prep_kernel D[r][h] = do_r . o_r over the head (f32), one
 *                             warp per 32 positions of a head
 *   coda_attn_bwd_dq_kernel   dq: one block per (64 query rows, head, seq)
 *   coda_attn_bwd_dkdv_kernel dk, dv: one block per (64 key rows, kv head,
 *                             seq), over every query head of its group
 *
 * FlashAttention-2's formulation (P = exp(s - lse), dS = P (dP - D)) on
 * warp-level bf16 tensor-core MMAs (mma.sync m16n8k16, f32 accumulators),
 * operands staged in shared memory by cp.async (double-buffered) and read
 * with ldmatrix from an XOR-swizzled layout (16-byte chunk c of row r sits
 * at chunk c ^ (r & 7): the eight rows an ldmatrix reads hit eight different
 * bank groups). Each warp owns 16 rows (32 in the forward at HD 128) of its
 * block's output, so nothing is
 * reduced across warps and nothing is accumulated with atomics: dq and
 * dk/dv are separate kernels (dq's recomputes P: 7 matrix products where a
 * fused backward with atomics does 5) and every result is bitwise the same
 * run to run.
 *
 * CODA_ATTN_HD (64 or 128, an NVRTC -D option) is the head dimension. Rows
 * past the sequence's end are loaded as zeros (cp.async with source size
 * 0) and never stored; keys past a query (causal) or past the end get
 * probability 0 by a select, so what lies there, NaN included, never leaks
 * in. NaN in a key or query the row does attend to gives NaN (exp2 of NaN;
 * the running max ignores it, the sum and the output do not).
 *
 * Softmax in base 2: scores are scaled by scale * log2(e) before exp2, and
 * lse is stored in natural log (lse = m ln 2 + ln l) for the CPU's
 * convention. P is rounded to bf16 for the P V product (as
 * FlashAttention); the row sum l adds the unrounded values. */

#ifndef CODA_ATTN_HD
#define CODA_ATTN_HD 128
#endif
#define HD CODA_ATTN_HD
#define HD_CHUNKS (HD / 8)       /* 16-byte chunks in a row of HD bf16   */
#define KV_TILE 64               /* keys per tile                        */
#define FWD_ROWS 128             /* query rows of a forward block        */
/* m-tiles (16 rows) a forward warp owns: 2 at HD 128 (each K and V
 * fragment feeds two products: 233 against 199 TFLOP/s at the 8B shape on
 * the H200), 1 at HD 64 (189 against 184: there the registers bind) */
#define FWD_MT (HD == 128 ? 2 : 1)
#define FWD_WARPS (FWD_ROWS / (16 * FWD_MT))
#define BWD_ROWS 64              /* rows a backward block owns           */
#define BWD_WARPS (BWD_ROWS / 16)
#define BWD_QTILE (HD == 128 ? 32 : 64) /* queries per dk/dv step        */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NEG_INF (-__int_as_float(0x7f800000))

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

/* ---- small PTX wrappers ---- */

/* 2^x on MUFU.EX2 alone, results below 2^-126 flushed to zero: exp2f
 * keeps them with a range test and two predicated multiplies, 4 more
 * instructions for each element of every softmax. A probability below
 * 2^-126 is below anything the result can show (each row's sum holds a
 * term 2^0; P enters dS and the products beside terms near 1 / seq), so
 * only the instruction count changes. NaN stays NaN, -inf gives 0. */
static __device__ __forceinline__ float attn_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
static __device__ __forceinline__ u32 smem_u32(const void *p) {
    return (u32)__cvta_generic_to_shared(p);
}
/* 16 bytes global -> shared, zero-filled when !valid. */
static __device__ __forceinline__ void cp16(u32 dst, const void *src, int valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
static __device__ __forceinline__ void cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
#define cp_wait(n) asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory")

static __device__ __forceinline__ void ldsm_x4(u32 addr, u32 *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(u32 addr, u32 *r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
/* c (16x8 f32) += a (16x16 bf16) b (16x8 bf16) */
static __device__ __forceinline__ void mma(float *c, const u32 *a, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ u32 pack_bf2(float lo, float hi) {
    u32 u;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
    return u;
}
static __device__ __forceinline__ float bf_lo(u32 v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float bf_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

/* ---- tiles in shared memory ---- */

/* Byte offset of 16-byte chunk c of row r in a swizzled tile of HD columns. */
static __device__ __forceinline__ u32 swz(int r, int c) {
    return (u32)(r * (HD * 2) + ((c ^ (r & 7)) << 4));
}

/* rows [row0, row0 + n) of a (rows, HD) slab at `base` (element row stride
 * ld) into the tile at `dst`; rows at or past `limit` are zero-filled. All
 * threads of the block take part. */
static __device__ __forceinline__ void load_tile(u32 dst, const u16 *base, long long ld, int row0, int n,
                                                 int limit) {
    for (int i = threadIdx.x; i < n * HD_CHUNKS; i += blockDim.x) {
        int r = i / HD_CHUNKS, c = i % HD_CHUNKS, row = row0 + r;
        int ok = row < limit;
        const u16 *src = base + (long long)(ok ? row : 0) * ld + c * 8;
        cp16(dst + swz(r, c), src, ok);
    }
}

/* A fragment (16x16, rows row0.., columns 16 kk..) of a row-major tile. */
static __device__ __forceinline__ void frag_a(u32 tile, int row0, int kk, u32 *a) {
    int lane = threadIdx.x & 31;
    ldsm_x4(tile + swz(row0 + (lane & 15), kk * 2 + (lane >> 4)), a);
}
/* B fragments of two n-tiles (tile rows n0..n0+15 as n, columns 16 kk.. as
 * k): b[0], b[1] for rows n0..n0+7, b[2], b[3] for n0+8.. (B = tile^T). */
static __device__ __forceinline__ void frag_b_nk(u32 tile, int n0, int kk, u32 *b) {
    int lane = threadIdx.x & 31;
    ldsm_x4(tile + swz(n0 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)), b);
}
/* B fragments of two n-tiles (columns 16 np.. as n, tile rows k0..k0+15 as
 * k): b[0], b[1] for columns 16 np..+7, b[2], b[3] for +8.. (B = tile). */
static __device__ __forceinline__ void frag_b_kn(u32 tile, int k0, int np, u32 *b) {
    int lane = threadIdx.x & 31;
    ldsm_x4_t(tile + swz(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), np * 2 + (lane >> 4)), b);
}

/* s (16 x 8 NT f32, NT n-tiles) = A rows [a_row0, +16) . B rows [0, 8 NT)^T
 * over the HD columns of both tiles. */
#define MMA_NT(s, NT, ta, a_row0, tb)                                          \
    do {                                                                       \
        for (int i_ = 0; i_ < (NT) * 4; i_++) (s)[i_ / 4][i_ % 4] = 0.f;       \
        _Pragma("unroll") for (int kk_ = 0; kk_ < HD / 16; kk_++) {            \
            u32 a_[4];                                                         \
            frag_a((ta), (a_row0), kk_, a_);                                   \
            _Pragma("unroll") for (int np_ = 0; np_ < (NT) / 2; np_++) {       \
                u32 b_[4];                                                     \
                frag_b_nk((tb), np_ * 16, kk_, b_);                            \
                mma((s)[2 * np_], a_, b_[0], b_[1]);                           \
                mma((s)[2 * np_ + 1], a_, b_[2], b_[3]);                       \
            }                                                                  \
        }                                                                      \
    } while (0)

/* acc (16 x HD f32) += P (16 x 8 NT, as bf16 A fragments from registers) .
 * B rows [0, 8 NT) of tile tb (k = tile row, n = column). */
#define MMA_PV(acc, p, NT, tb)                                                 \
    do {                                                                       \
        _Pragma("unroll") for (int kk_ = 0; kk_ < (NT) / 2; kk_++) {           \
            u32 a_[4];                                                         \
            a_[0] = pack_bf2((p)[2 * kk_][0], (p)[2 * kk_][1]);                \
            a_[1] = pack_bf2((p)[2 * kk_][2], (p)[2 * kk_][3]);                \
            a_[2] = pack_bf2((p)[2 * kk_ + 1][0], (p)[2 * kk_ + 1][1]);        \
            a_[3] = pack_bf2((p)[2 * kk_ + 1][2], (p)[2 * kk_ + 1][3]);        \
            _Pragma("unroll") for (int np_ = 0; np_ < HD / 16; np_++) {        \
                u32 b_[4];                                                     \
                frag_b_kn((tb), kk_ * 16, np_, b_);                            \
                mma((acc)[2 * np_], a_, b_[0], b_[1]);                         \
                mma((acc)[2 * np_ + 1], a_, b_[2], b_[3]);                     \
            }                                                                  \
        }                                                                      \
    } while (0)

/* The same with MT m-tiles a warp (rows a_row0 + 16 mt): each B fragment
 * loaded from shared memory feeds MT products, halving (MT = 2) the shared
 * memory traffic per product. s[MT][NT][4]; p[MT][NT][4], acc[MT][HD/8][4]. */
#define MMA_NT_MT(s, MT, NT, ta, a_row0, tb)                                   \
    do {                                                                       \
        _Pragma("unroll") for (int m_ = 0; m_ < (MT); m_++)                    \
            _Pragma("unroll") for (int i_ = 0; i_ < (NT) * 4; i_++)            \
                (s)[m_][i_ / 4][i_ % 4] = 0.f;                                 \
        _Pragma("unroll") for (int kk_ = 0; kk_ < HD / 16; kk_++) {            \
            u32 a_[MT][4];                                                     \
            _Pragma("unroll") for (int m_ = 0; m_ < (MT); m_++)                \
                frag_a((ta), (a_row0) + 16 * m_, kk_, a_[m_]);                 \
            _Pragma("unroll") for (int np_ = 0; np_ < (NT) / 2; np_++) {       \
                u32 b_[4];                                                     \
                frag_b_nk((tb), np_ * 16, kk_, b_);                            \
                _Pragma("unroll") for (int m_ = 0; m_ < (MT); m_++) {          \
                    mma((s)[m_][2 * np_], a_[m_], b_[0], b_[1]);               \
                    mma((s)[m_][2 * np_ + 1], a_[m_], b_[2], b_[3]);           \
                }                                                              \
            }                                                                  \
        }                                                                      \
    } while (0)

#define MMA_PV_MT(acc, p, MT, NT, tb)                                          \
    do {                                                                       \
        _Pragma("unroll") for (int kk_ = 0; kk_ < (NT) / 2; kk_++) {           \
            u32 a_[MT][4];                                                     \
            _Pragma("unroll") for (int m_ = 0; m_ < (MT); m_++) {              \
                a_[m_][0] = pack_bf2((p)[m_][2 * kk_][0], (p)[m_][2 * kk_][1]);         \
                a_[m_][1] = pack_bf2((p)[m_][2 * kk_][2], (p)[m_][2 * kk_][3]);         \
                a_[m_][2] = pack_bf2((p)[m_][2 * kk_ + 1][0], (p)[m_][2 * kk_ + 1][1]); \
                a_[m_][3] = pack_bf2((p)[m_][2 * kk_ + 1][2], (p)[m_][2 * kk_ + 1][3]); \
            }                                                                  \
            _Pragma("unroll") for (int np_ = 0; np_ < HD / 16; np_++) {        \
                u32 b_[4];                                                     \
                frag_b_kn((tb), kk_ * 16, np_, b_);                            \
                _Pragma("unroll") for (int m_ = 0; m_ < (MT); m_++) {          \
                    mma((acc)[m_][2 * np_], a_[m_], b_[0], b_[1]);             \
                    mma((acc)[m_][2 * np_ + 1], a_[m_], b_[2], b_[3]);         \
                }                                                              \
            }                                                                  \
        }                                                                      \
    } while (0)

/* The problem, as every kernel takes it. Element strides. */
typedef struct {
    const u16 *qkv;  /* (M, nq + 2 nkv) bf16, row stride ld_qkv */
    const u16 *o;    /* (M, nq) bf16                             */
    const u16 *dout; /* (M, nq) bf16                             */
    float *lse;      /* (M, n_heads) f32, row stride ld_lse      */
    float *dsum;     /* workspace: D, then lse log2(e) (STAT_AT)  */
    void *out;       /* fwd: o (bf16); bwd: dqkv (f32)           */
    long long ld_qkv, ld_o, ld_do, ld_lse, ld_out;
    int seq, n_heads, n_kv_heads;
    float scale;     /* softmax scale, 1/sqrt(HD)                */
    int kv_parts;    /* fused bwd: blocks a kv group's heads are shared over (dk, dv added in order) */
    int kv_chunk;    /* fused bwd: (kv head part, sequence) pairs a launch chunk (ab_block), 0 all   */
    int batch;       /* sequences (the forward's items, the backward's statistics planes: STAT_PLANE) */
} coda_attn_args_t;

/* The backward's per-row statistics in the workspace, written by
 * coda_attn_bwd_prep_kernel: two planes of (batch, n_heads, STAT_PAD(seq))
 * f32, D = do . o, then lse log2(e). A head's rows are contiguous (the
 * wgmma backward copies 64 of them with one bulk copy) and padded to 128
 * (those copies never leave the plane; the pad is never used unmasked). */
#define STAT_PAD(seq) (((seq) + 127) / 128 * 128)
#define STAT_AT(p, b, h, pos) (((long long)(b) * (p).n_heads + (h)) * STAT_PAD((p).seq) + (pos))
#define STAT_PLANE(p) ((long long)(p).batch * (p).n_heads * STAT_PAD((p).seq))

/* ---- forward ---- */

extern "C" __global__ void __launch_bounds__(FWD_WARPS * 32)
coda_attn_fwd_kernel(coda_attn_args_t p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int seq = p.seq, h = blockIdx.x, b = blockIdx.y;
    const int tile = (int)gridDim.z - 1 - (int)blockIdx.z; /* the longest rows first */
    const int q0 = tile * FWD_ROWS, kvh = h / (p.n_heads / p.n_kv_heads);
    const int nq = p.n_heads * HD, nkv = p.n_kv_heads * HD;
    const long long r0 = (long long)b * seq; /* the sequence's first row */
    const u16 *qb = p.qkv + r0 * p.ld_qkv + h * HD;
    const u16 *kb = p.qkv + r0 * p.ld_qkv + nq + kvh * HD;
    const u16 *vb = kb + nkv;
    const u32 sq = smem_u32(smem);                       /* FWD_ROWS x HD */
    const u32 sk[2] = {sq + FWD_ROWS * HD * 2, sq + (FWD_ROWS + KV_TILE) * HD * 2};
    const u32 sv[2] = {sq + (FWD_ROWS + 2 * KV_TILE) * HD * 2, sq + (FWD_ROWS + 3 * KV_TILE) * HD * 2};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qend = min(q0 + FWD_ROWS, seq);
    const int n_kv = (qend + KV_TILE - 1) / KV_TILE; /* causal: keys < qend */
    const int w0 = q0 + warp * 16 * FWD_MT;          /* this warp's first row */

    load_tile(sq, qb, p.ld_qkv, q0, FWD_ROWS, seq);
    load_tile(sk[0], kb, p.ld_qkv, 0, KV_TILE, seq);
    load_tile(sv[0], vb, p.ld_qkv, 0, KV_TILE, seq);
    cp_commit();

    /* per m-tile mt and half r: the thread's row w0 + 16 mt + 8 r + lane / 4 */
    float acc[FWD_MT][HD / 8][4];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
        for (int i = 0; i < HD / 8; i++) acc[mt][i][0] = acc[mt][i][1] = acc[mt][i][2] = acc[mt][i][3] = 0.f;
    float mrow[FWD_MT][2], lrow[FWD_MT][2];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++) mrow[mt][0] = mrow[mt][1] = NEG_INF, lrow[mt][0] = lrow[mt][1] = 0.f;
    const float sl2 = p.scale * LOG2E;

    for (int j = 0; j < n_kv; j++) {
        const int buf = j & 1;
        if (j + 1 < n_kv) {
            load_tile(sk[buf ^ 1], kb, p.ld_qkv, (j + 1) * KV_TILE, KV_TILE, seq);
            load_tile(sv[buf ^ 1], vb, p.ld_qkv, (j + 1) * KV_TILE, KV_TILE, seq);
        }
        cp_commit();
        cp_wait(1);
        __syncthreads();

        const int k0 = j * KV_TILE;
        if (k0 > w0 + 16 * FWD_MT - 1) { /* every key of the tile is past this warp's rows */
            __syncthreads();
            continue;
        }
        float s[FWD_MT][KV_TILE / 8][4];
        MMA_NT_MT(s, FWD_MT, KV_TILE / 8, sq, warp * 16 * FWD_MT, sk[buf]);
        const int need_mask = k0 + KV_TILE > w0 || k0 + KV_TILE > seq;
#pragma unroll
        for (int mt = 0; mt < FWD_MT; mt++) {
            const int qr = w0 + 16 * mt + (lane >> 2);
            float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int t = 0; t < KV_TILE / 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int kc = k0 + t * 8 + (lane & 3) * 2 + (e & 1), row = qr + (e >> 1) * 8;
                    float v = s[mt][t][e] * sl2;
                    if (need_mask && (kc > row || kc >= seq)) v = NEG_INF;
                    s[mt][t][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float mnew = fmaxf(mrow[mt][r], mx[r]);
                const float base = mnew == NEG_INF ? 0.f : mnew;
                alpha[r] = attn_exp2(mrow[mt][r] - base);
                mrow[mt][r] = mnew;
                mx[r] = base;
            }
            float ls[2] = {0.f, 0.f};
#pragma unroll
            for (int t = 0; t < KV_TILE / 8; t++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float pe = attn_exp2(s[mt][t][e] - mx[e >> 1]);
                    s[mt][t][e] = pe;
                    ls[e >> 1] += pe;
                }
#pragma unroll
            for (int r = 0; r < 2; r++) lrow[mt][r] = lrow[mt][r] * alpha[r] + ls[r];
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                acc[mt][i][0] *= alpha[0];
                acc[mt][i][1] *= alpha[0];
                acc[mt][i][2] *= alpha[1];
                acc[mt][i][3] *= alpha[1];
            }
        }
        MMA_PV_MT(acc, s, FWD_MT, KV_TILE / 8, sv[buf]);
        __syncthreads(); /* the buffer is refilled next iteration */
    }
    cp_wait(0);

    /* finish: the quad's row sums, o = acc / l, lse */
    u16 *ob = (u16 *)p.out + r0 * p.ld_o + h * HD;
#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = lrow[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = w0 + 16 * mt + 8 * r + (lane >> 2);
            if (row >= seq) continue;
            const float inv = 1.f / l;
            u32 *orow = (u32 *)(ob + (long long)row * p.ld_o);
#pragma unroll
            for (int i = 0; i < HD / 8; i++)
                orow[(i * 8 + (lane & 3) * 2) / 2] = pack_bf2(acc[mt][i][2 * r] * inv, acc[mt][i][2 * r + 1] * inv);
            if ((lane & 3) == 0) p.lse[(r0 + row) * p.ld_lse + h] = mrow[mt][r] * LN2 + logf(l);
        }
}

/* ---- backward ---- */

/* D = sum over the head of do * o and lse log2(e) into the workspace's two
 * planes (STAT_AT). One warp per 32 positions of a (sequence, head): 16-byte
 * loads, PREP_LPR lanes a row and PREP_RPL rows a load, four loads of each
 * operand in flight; each row's sum then goes to the lane of its position,
 * so both planes are written 128 bytes at a time. (A warp per (row, head)
 * with 4-byte loads and scattered 4-byte stores read the 70B shape's 537 MB
 * at 71% of the H100's DRAM throughput, ncu, stop 52.) */
#define PREP_LPR (HD / 8)        /* lanes a row: 8 bf16 each */
#define PREP_RPL (32 / PREP_LPR) /* rows a load */
#define PREP_LOADS (32 / PREP_RPL)

static __device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b) {
    return bf_lo(a.x) * bf_lo(b.x) + bf_hi(a.x) * bf_hi(b.x) + bf_lo(a.y) * bf_lo(b.y) + bf_hi(a.y) * bf_hi(b.y) +
           bf_lo(a.z) * bf_lo(b.z) + bf_hi(a.z) * bf_hi(b.z) + bf_lo(a.w) * bf_lo(b.w) + bf_hi(a.w) * bf_hi(b.w);
}

/* 8 warps a block: launched with 256 threads only (attention.c's run) */
extern "C" __global__ void __launch_bounds__(256)
coda_attn_bwd_prep_kernel(coda_attn_args_t p) {
    const int chunks = (p.seq + 31) / 32;
    const long long units = (long long)p.batch * p.n_heads * chunks, warps = (long long)gridDim.x * 8;
    const long long plane = STAT_PLANE(p);
    const int lane = threadIdx.x & 31, g = lane / PREP_LPR, c = lane % PREP_LPR;
    for (long long w = (long long)blockIdx.x * 8 + (threadIdx.x >> 5); w < units; w += warps) {
        const int pos0 = (int)(w % chunks) * 32, h = (int)(w / chunks % p.n_heads), b = (int)(w / chunks / p.n_heads);
        const long long r0 = (long long)b * p.seq + pos0;
        const u16 *o = p.o + r0 * p.ld_o + h * HD + 8 * c, *d = p.dout + r0 * p.ld_do + h * HD + 8 * c;
        float mine = 0.f; /* the sum of row pos0 + lane */
#pragma unroll
        for (int k0 = 0; k0 < PREP_LOADS; k0 += 4) {
            uint4 a[4], e[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int row = (k0 + k) * PREP_RPL + g;
                const int ok = pos0 + row < p.seq;
                a[k] = ok ? *(const uint4 *)(o + row * p.ld_o) : make_uint4(0, 0, 0, 0);
                e[k] = ok ? *(const uint4 *)(d + row * p.ld_do) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float s = dot8_bf16(a[k], e[k]);
#pragma unroll
                for (int off = PREP_LPR / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
                /* rows (k0 + k) PREP_RPL + g': lane L takes row L's from its group */
                const float t = __shfl_sync(0xffffffffu, s, (lane % PREP_RPL) * PREP_LPR);
                if (lane / PREP_RPL == k0 + k) mine = t;
            }
        }
        if (pos0 + lane < p.seq) {
            const long long at = STAT_AT(p, b, h, pos0 + lane);
            p.dsum[at] = mine;
            p.dsum[plane + at] = p.lse[(r0 + lane) * p.ld_lse + h] * LOG2E;
        }
    }
}

/* Stores a (16 x HD) f32 accumulator, scaled, at rows row0.. of a dqkv
 * column block (rows past seq dropped). */
static __device__ __forceinline__ void store_rows_f32(float (*acc)[4], float scale, float *base, long long ld,
                                                      int row0, int seq) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + (lane >> 2) + r * 8;
        if (row >= seq) continue;
        float *dst = base + (long long)row * ld;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            float2 v = make_float2(acc[i][2 * r] * scale, acc[i][2 * r + 1] * scale);
            *(float2 *)(dst + i * 8 + (lane & 3) * 2) = v;
        }
    }
}

/* dq for 64 query rows of one head: over the key tiles up to the diagonal,
 * S = Q K^T, P = exp(S - lse), dP = dO V^T, dS = P (dP - D), dQ += dS K. */
extern "C" __global__ void __launch_bounds__(BWD_WARPS * 32)
coda_attn_bwd_dq_kernel(coda_attn_args_t p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int seq = p.seq, h = blockIdx.x, b = blockIdx.y;
    const int tile = (int)gridDim.z - 1 - (int)blockIdx.z;
    const int q0 = tile * BWD_ROWS, kvh = h / (p.n_heads / p.n_kv_heads);
    const int nq = p.n_heads * HD, nkv = p.n_kv_heads * HD;
    const long long r0 = (long long)b * seq;
    const u16 *qb = p.qkv + r0 * p.ld_qkv + h * HD;
    const u16 *kb = p.qkv + r0 * p.ld_qkv + nq + kvh * HD;
    const u16 *vb = kb + nkv;
    const u32 sq = smem_u32(smem), sdo = sq + BWD_ROWS * HD * 2;
    const u32 sk[2] = {sdo + BWD_ROWS * HD * 2, sdo + (BWD_ROWS + KV_TILE) * HD * 2};
    const u32 sv[2] = {sdo + (BWD_ROWS + 2 * KV_TILE) * HD * 2, sdo + (BWD_ROWS + 3 * KV_TILE) * HD * 2};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qend = min(q0 + BWD_ROWS, seq);
    const int n_kv = (qend + KV_TILE - 1) / KV_TILE;

    load_tile(sq, qb, p.ld_qkv, q0, BWD_ROWS, seq);
    load_tile(sdo, p.dout + r0 * p.ld_do + h * HD, p.ld_do, q0, BWD_ROWS, seq);
    load_tile(sk[0], kb, p.ld_qkv, 0, KV_TILE, seq);
    load_tile(sv[0], vb, p.ld_qkv, 0, KV_TILE, seq);
    cp_commit();

    const float sl2 = p.scale * LOG2E;
    const int qr = q0 + warp * 16 + (lane >> 2);
    float lse2[2], dd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = qr + r * 8, ok = row < seq;
        lse2[r] = ok ? p.lse[(r0 + row) * p.ld_lse + h] * LOG2E : 0.f;
        dd[r] = ok ? p.dsum[STAT_AT(p, b, h, row)] : 0.f;
    }
    float dq[HD / 8][4];
    for (int i = 0; i < HD / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

    for (int j = 0; j < n_kv; j++) {
        const int buf = j & 1;
        if (j + 1 < n_kv) {
            load_tile(sk[buf ^ 1], kb, p.ld_qkv, (j + 1) * KV_TILE, KV_TILE, seq);
            load_tile(sv[buf ^ 1], vb, p.ld_qkv, (j + 1) * KV_TILE, KV_TILE, seq);
        }
        cp_commit();
        cp_wait(1);
        __syncthreads();

        const int k0 = j * KV_TILE;
        if (k0 > q0 + warp * 16 + 15) {
            __syncthreads();
            continue;
        }
        float s[KV_TILE / 8][4], dp[KV_TILE / 8][4];
        MMA_NT(s, KV_TILE / 8, sq, warp * 16, sk[buf]);
        MMA_NT(dp, KV_TILE / 8, sdo, warp * 16, sv[buf]);
#pragma unroll
        for (int t = 0; t < KV_TILE / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kc = k0 + t * 8 + (lane & 3) * 2 + (e & 1), row = qr + (e >> 1) * 8;
                const float pe = attn_exp2(s[t][e] * sl2 - lse2[e >> 1]);
                const int keep = kc <= row && kc < seq && row < seq;
                s[t][e] = keep ? pe * (dp[t][e] - dd[e >> 1]) : 0.f; /* dS */
            }
        MMA_PV(dq, s, KV_TILE / 8, sk[buf]);
        __syncthreads();
    }
    cp_wait(0);
    store_rows_f32(dq, p.scale, (float *)p.out + r0 * p.ld_out + h * HD, p.ld_out, q0 + warp * 16, seq);
}

/* dk, dv for 64 key rows of one kv head: over the group's query heads and
 * the query tiles from the diagonal on, S^T = K Q^T, P^T = exp(S^T - lse),
 * dP^T = V dO^T, dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q. */
extern "C" __global__ void __launch_bounds__(BWD_WARPS * 32)
coda_attn_bwd_dkdv_kernel(coda_attn_args_t p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int seq = p.seq, kvh = blockIdx.x, b = blockIdx.y;
    const int tile = (int)gridDim.z - 1 - (int)blockIdx.z;
    const int k0 = tile * BWD_ROWS, group = p.n_heads / p.n_kv_heads;
    const int nq = p.n_heads * HD, nkv = p.n_kv_heads * HD;
    const long long r0 = (long long)b * seq;
    const u16 *kb = p.qkv + r0 * p.ld_qkv + nq + kvh * HD;
    const u16 *vb = kb + nkv;
    const u32 sk = smem_u32(smem), sv = sk + BWD_ROWS * HD * 2;
    const u32 sq[2] = {sv + BWD_ROWS * HD * 2, sv + (BWD_ROWS + BWD_QTILE) * HD * 2};
    const u32 sdo[2] = {sv + (BWD_ROWS + 2 * BWD_QTILE) * HD * 2, sv + (BWD_ROWS + 3 * BWD_QTILE) * HD * 2};
    float *slse = (float *)(smem + (BWD_ROWS * 2 + BWD_QTILE * 4) * HD * 2); /* [2][BWD_QTILE] */
    float *sdd = slse + 2 * BWD_QTILE;                                      /* [2][BWD_QTILE] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int qt0 = k0 / BWD_QTILE, n_qt = (seq + BWD_QTILE - 1) / BWD_QTILE - qt0;
    const int steps = group * n_qt; /* step i: head kvh * group + i / n_qt, query tile qt0 + i % n_qt */

    load_tile(sk, kb, p.ld_qkv, k0, BWD_ROWS, seq);
    load_tile(sv, vb, p.ld_qkv, k0, BWD_ROWS, seq);

#define LOAD_STEP(i_, buf_)                                                                       \
    do {                                                                                          \
        const int h_ = kvh * group + (i_) / n_qt, qs_ = (qt0 + (i_) % n_qt) * BWD_QTILE;          \
        load_tile(sq[buf_], p.qkv + r0 * p.ld_qkv + h_ * HD, p.ld_qkv, qs_, BWD_QTILE, seq);      \
        load_tile(sdo[buf_], p.dout + r0 * p.ld_do + h_ * HD, p.ld_do, qs_, BWD_QTILE, seq);      \
        for (int c_ = threadIdx.x; c_ < BWD_QTILE; c_ += blockDim.x) {                            \
            const int row_ = qs_ + c_, ok_ = row_ < seq;                                          \
            slse[(buf_) * BWD_QTILE + c_] = ok_ ? p.lse[(r0 + row_) * p.ld_lse + h_] * LOG2E : 0.f; \
            sdd[(buf_) * BWD_QTILE + c_] = ok_ ? p.dsum[STAT_AT(p, b, h_, row_)] : 0.f;            \
        }                                                                                         \
    } while (0)

    if (steps > 0) LOAD_STEP(0, 0);
    cp_commit();

    const float sl2 = p.scale * LOG2E;
    const int kr = k0 + warp * 16 + (lane >> 2); /* this thread's key rows: kr, kr + 8 */
    float dk[HD / 8][4], dv[HD / 8][4];
    for (int i = 0; i < HD / 8; i++)
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;

    for (int i = 0; i < steps; i++) {
        const int buf = i & 1;
        if (i + 1 < steps) LOAD_STEP(i + 1, buf ^ 1);
        cp_commit();
        cp_wait(1);
        __syncthreads();

        const int qs = (qt0 + i % n_qt) * BWD_QTILE;
        if (qs + BWD_QTILE - 1 < k0 + warp * 16) { /* every query of the tile is before this warp's keys */
            __syncthreads();
            continue;
        }
        float s[BWD_QTILE / 8][4], dp[BWD_QTILE / 8][4];
        MMA_NT(s, BWD_QTILE / 8, sk, warp * 16, sq[buf]);
        MMA_NT(dp, BWD_QTILE / 8, sv, warp * 16, sdo[buf]);
        const float *lb = slse + buf * BWD_QTILE, *db = sdd + buf * BWD_QTILE;
#pragma unroll
        for (int t = 0; t < BWD_QTILE / 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = t * 8 + (lane & 3) * 2 + (e & 1), qc = qs + c, row = kr + (e >> 1) * 8;
                const int keep = qc >= row && qc < seq && row < seq;
                const float pe = keep ? attn_exp2(s[t][e] * sl2 - lb[c]) : 0.f;
                s[t][e] = pe;                                      /* P^T  */
                dp[t][e] = keep ? pe * (dp[t][e] - db[c]) : 0.f;    /* dS^T */
            }
        MMA_PV(dv, s, BWD_QTILE / 8, sdo[buf]);
        MMA_PV(dk, dp, BWD_QTILE / 8, sq[buf]);
        __syncthreads();
    }
#undef LOAD_STEP
    cp_wait(0);
    float *out = (float *)p.out + r0 * p.ld_out + nq + kvh * HD;
    store_rows_f32(dk, p.scale, out, p.ld_out, k0 + warp * 16, seq);
    store_rows_f32(dv, 1.f, out + nkv, p.ld_out, k0 + warp * 16, seq);
}
