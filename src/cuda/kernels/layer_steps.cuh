/* layer_steps.cuh - the LLaMA layer's steps that are not GEMMs, on the GPU
 * (src/cuda/layer_steps.c launches them; the CPU versions are
 * src/layer/llama_cpu.c):
 *
 *   coda_norm_prologue_kernel   xg = bf16(x g), ss[i] = sum_j x_ij^2
 *   coda_rope_backward_kernel   dz = R^T dy per column pair, s[i] = sum_j y_ij dy_ij
 *                               (dy's columns in up to three parts: dq, dk, dv)
 *   coda_convert_vec_kernel     out = in (f32 -> bf16 or f32), any element strides
 *   coda_check_targets_kernel   the first target outside [0, V) that is not ignored
 *
 * Compiled with FMA contraction off (--fmad=false), like finish.cuh, so each
 * element is computed with the CPU's float operations in the CPU's order:
 * xg equals the CPU's bit for bit, dz too except where the GPU's cosf/sinf
 * differ from the host's in the last ulp (CUDA's precise cosf/sinf are
 * within 2 ulp, glibc's within 1), which moves a bf16 result by one ulp only
 * when the f32 value sits at a rounding boundary.
 *
 * Row sums (ss, s) are not summed in the CPU's order (j = 0..d-1, one
 * thread) but in one fixed order that depends on the row length alone:
 * never on the data's addresses, strides or alignment, on the grid, or on
 * timing (no atomics). The row is cut into chunks of 8 elements (4 column
 * pairs); chunk c belongs to thread c % T of the row's T threads (T = 32, a
 * warp per row, or 256, a block per row, chosen from the row length by the
 * host); each thread adds its chunks' elements in increasing c, the row's
 * short tail chunk (length % 8 elements) last, element by element; then the
 * T partial sums are combined by a butterfly within each warp and the
 * warps' sums in increasing warp order. So results are bitwise equal run to
 * run and between a 16-byte-aligned view (vector loads) and any other view
 * of the same values (element loads, same arithmetic).
 *
 * NaN in, NaN out, by IEEE arithmetic alone (no max or min here): a NaN x
 * makes its xg element and its row's ss NaN, a NaN g its column of xg; a
 * NaN dy makes its pair of dz and its row's s NaN, a NaN y its row's s, a
 * NaN pos its row of dz. bf16 NaNs are quiet; their payload bits may differ
 * from the CPU's (cvt.rn gives the canonical NaN).
 *
 * Extents and strides are in elements, as long long: rows up to 2^31 (the
 * grid loops over them) and row lengths up to 2^31. */

typedef unsigned short coda_bf16_t; /* bf16 bits */

static __device__ __forceinline__ float coda_bf(coda_bf16_t h) {
    return __int_as_float((int)((unsigned)h << 16));
}
/* round to nearest even, NaN stays NaN: one cvt instruction (as the epilogues) */
static __device__ __forceinline__ coda_bf16_t coda_to_bf(float f) {
    coda_bf16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
/* a (lower address) and b as packed bf16x2, both rounded as coda_to_bf */
static __device__ __forceinline__ unsigned coda_to_bf2(float a, float b) {
    unsigned u;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(b), "f"(a));
    return u;
}
static __device__ __forceinline__ float coda_lo(unsigned u) { return __int_as_float((int)(u << 16)); }
static __device__ __forceinline__ float coda_hi(unsigned u) { return __int_as_float((int)(u & 0xffff0000u)); }

static __device__ __forceinline__ int coda_aligned16(const void *p) {
    return ((unsigned long long)p & 15ull) == 0;
}

/* Sum of v over a warp by butterfly: every lane ends with the same bits. */
static __device__ __forceinline__ float coda_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define CODA_STEPS_THREADS 256 /* every kernel here runs blocks of 256 threads (8 warps) */

/* Row statistic of a row's T = 32 wpr threads: the warp sums, then (wpr > 1)
 * the row's warps in increasing order, through shared memory. Called by
 * every thread of the block the same number of times (the barriers); the
 * result is valid in the row's first thread. */
static __device__ __forceinline__ float coda_row_sum(float acc, int wpr,
                                                    float *red) {  // (8) f32 shared: a sum per warp
    acc = coda_warp_sum(acc);
    if (wpr == 1) return acc;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = acc;
    __syncthreads();
    float s = red[warp - warp % wpr];
    for (int w = 1; w < wpr; w++) s += red[warp - warp % wpr + w];
    __syncthreads(); /* red is free again for the next row */
    return s;
}

/* RMSNorm prologue: xg_ij = bf16(x_ij g_j) (the product of two bf16 is exact
 * in f32: one rounding, as the CPU) and ss_i = sum_j x_ij^2 in f32.
 *   x (rows, d) bf16, row stride xs; g (d) bf16, contiguous;
 *   xg (rows, d) bf16, row stride os; ss (rows) f32, element stride sss.
 * wpr: warps per row, 1 or 8 (the host's choice from d alone). Grid: any
 * number of blocks; each takes groups of 8 / wpr rows in turn. */
extern "C" __global__ void __launch_bounds__(CODA_STEPS_THREADS)
coda_norm_prologue_kernel(const coda_bf16_t *x,  // (rows, d) bf16, row stride xs
                          long long xs,
                          const coda_bf16_t *g,  // (d) bf16, contiguous
                          coda_bf16_t *xg,       // (rows, d) bf16, row stride os
                          long long os,
                          float *ss,             // (rows) f32, element stride sss
                          long long sss, long long rows, long long d, int wpr) {
    __shared__ float red[8];
    const int rpb = 8 / wpr, T = 32 * wpr;
    const int warp = threadIdx.x >> 5;
    const int t = (warp % wpr) * 32 + (threadIdx.x & 31); /* thread within its row */
    const long long nfull = d >> 3, tail0 = nfull << 3;
    for (long long r0 = (long long)blockIdx.x * rpb; r0 < rows; r0 += (long long)gridDim.x * rpb) {
        const long long i = r0 + warp / wpr;
        float acc = 0.0f;
        if (i < rows) {
            const coda_bf16_t *xr = x + i * xs;  // (d) bf16: row i of x
            coda_bf16_t *outr = xg + i * os;     // (d) bf16: row i of xg
            /* vector loads where this row allows them; the same arithmetic either way */
            const int vec = coda_aligned16(xr) & coda_aligned16(outr) & coda_aligned16(g);
            for (long long c = t; c < nfull; c += T) {
                const long long j0 = c << 3;
                float xv[8], gv[8];
                if (vec) {
                    const uint4 a = *(const uint4 *)(xr + j0), b = *(const uint4 *)(g + j0);
                    const unsigned au[4] = {a.x, a.y, a.z, a.w}, bu[4] = {b.x, b.y, b.z, b.w};
                    for (int k = 0; k < 4; k++) {
                        xv[2 * k] = coda_lo(au[k]), xv[2 * k + 1] = coda_hi(au[k]);
                        gv[2 * k] = coda_lo(bu[k]), gv[2 * k + 1] = coda_hi(bu[k]);
                    }
                } else {
                    for (int k = 0; k < 8; k++) xv[k] = coda_bf(xr[j0 + k]), gv[k] = coda_bf(g[j0 + k]);
                }
                for (int k = 0; k < 8; k++) acc += xv[k] * xv[k];
                if (vec) {
                    uint4 o;
                    o.x = coda_to_bf2(xv[0] * gv[0], xv[1] * gv[1]);
                    o.y = coda_to_bf2(xv[2] * gv[2], xv[3] * gv[3]);
                    o.z = coda_to_bf2(xv[4] * gv[4], xv[5] * gv[5]);
                    o.w = coda_to_bf2(xv[6] * gv[6], xv[7] * gv[7]);
                    *(uint4 *)(outr + j0) = o;
                } else {
                    for (int k = 0; k < 8; k++) outr[j0 + k] = coda_to_bf(xv[k] * gv[k]);
                }
            }
            /* the tail chunk (d % 8 elements) is chunk nfull: its owner adds it last */
            if (tail0 < d && t == (int)(nfull % T)) {
                for (long long j = tail0; j < d; j++) {
                    const float v = coda_bf(xr[j]);
                    acc += v * v;
                    outr[j] = coda_to_bf(v * coda_bf(g[j]));
                }
            }
        }
        const float tot = coda_row_sum(acc, wpr, red);
        if (i < rows && t == 0) ss[i * sss] = tot;
    }
}

/* One column pair of the RoPE backward, as the CPU (llama_cpu.c): the
 * angle th = pos_i freq_p in f32, precise cosf/sinf, no FMA (--fmad=false).
 * Adds y . dy of the pair to *acc the CPU's way: (ye de + yo dd) first. */
static __device__ __forceinline__ void coda_rope_rotate(float de, float dd, float ye, float yo, float c, float sn,
                                                        float *acc, float *ze, float *zo) {
    *acc += ye * de + yo * dd;
    /* forward: (ye, yo) = (ze c - zo s, ze s + zo c); the backward is R^T */
    *ze = de * c + dd * sn;
    *zo = dd * c - de * sn;
}

/* cos th and sin th, with th = 0 (the v columns, whose frequency is 0)
 * taken without the polynomials: cosf(+-0) = 1 and sinf(+-0) = +-0 exactly,
 * so the bits are cosf's and sinf's. */
static __device__ __forceinline__ void coda_rope_cos_sin(float th, float *c, float *sn) {
    if (th == 0.0f) {
        *c = 1.0f;
        *sn = th;
    } else {
        *c = cosf(th);
        *sn = sinf(th);
    }
}

static __device__ __forceinline__ void coda_rope_pair(float de, float dd, float ye, float yo, float pos_i,
                                                      float fp, float *acc, float *ze, float *zo) {
    float c, sn;
    coda_rope_cos_sin(pos_i * fp, &c, &sn);
    coda_rope_rotate(de, dd, ye, yo, c, sn, acc, ze, zo);
}

/* The most distinct angles a row's table holds (coda_rope_backward_kernel's
 * period: head_dim / 2 of the layer, so head_dim up to 256); the host's
 * CODA_ROPE_PERIOD_MAX (core/context.h) is the same number. */
#define CODA_ROPE_TAB 128

/* dy's columns come in up to three parts, concatenated (an attention's dq,
 * dk and dv as it returns them: no copy into one matrix first): part q is
 * (rows, n_q) with its own base and row stride, at columns [off_q, off_q +
 * n_q) of the row; unused parts have n_q = 0. */
typedef struct {
    const void *p[3]; /* (rows, n_q) f32 or bf16 */
    long long st[3];  /* row strides, elements */
    long long off[4]; /* off[q]: part q's first column; off[3] = n */
} coda_rope_parts_t;

/* The part holding column j (j < n): its base, row stride and columns
 * [*c0, *c1). Constant indices only: a run-time index into the parameter
 * struct would copy it to local memory. */
static __device__ __forceinline__ const void *coda_rope_part(const coda_rope_parts_t *P, long long j, long long *st,
                                                             long long *c0, long long *c1) {
    const int a = j >= P->off[1], b = j >= P->off[2];
    *st = b ? P->st[2] : a ? P->st[1] : P->st[0];
    *c0 = b ? P->off[2] : a ? P->off[1] : P->off[0];
    *c1 = b ? P->off[3] : a ? P->off[2] : P->off[1];
    return b ? P->p[2] : a ? P->p[1] : P->p[0];
}

/* dy[i][j] as f32. */
static __device__ __forceinline__ float coda_rope_dy(const coda_rope_parts_t *P, int dy_bf16, long long i,
                                                     long long j) {
    long long st, c0, c1;
    const void *base = coda_rope_part(P, j, &st, &c0, &c1);
    const long long e = i * st + (j - c0);
    return dy_bf16 ? coda_bf(((const coda_bf16_t *)base)[e]) : ((const float *)base)[e];
}

/* RoPE backward and the QKV RMSNorm's row statistic:
 *   dz[i][2p] = bf16(de c + dd s), dz[i][2p+1] = bf16(dd c - de s), with
 *   (de, dd) = dy[i][2p..2p+1], th = pos_i freq_p; s_i = sum_j y_ij dy_ij.
 *   dy (rows, n) f32, or bf16 when dy_bf16 (as an attention library gives
 *   it), in parts (coda_rope_parts_t; every n_q even, so a pair never
 *   straddles two); y (rows, n) bf16, row stride ys;
 *   pos (rows) f32, element stride ps; freq (n/2) f32, contiguous;
 *   dz (rows, n) bf16, row stride dzs; s (rows) f32, element stride s_s.
 * n even. A chunk is 8 columns of the whole row: 4 pairs, 32 bytes of dy,
 * 16 of y, freq and dz; vector loads where it lies in one part and every
 * address is 16-byte aligned, element loads otherwise (the same arithmetic,
 * so the parts change no bit of the result, nor the row sum's order: that
 * depends on n alone). wpr and the grid as for the norm prologue.
 * period > 0 (a multiple of 4, at most CODA_ROPE_TAB; rot_pairs a multiple
 * of 4): the caller promises freq[p] = freq[p % period] for p < rot_pairs
 * (a layer's q and k heads all rotate by the same head_dim / 2
 * frequencies). Each row's cos and sin of those angles are then made once
 * into shared memory, from freq[0, period), and the pairs below rot_pairs
 * read them: the same th, so the same bits, with 1/40 of the sincos work at
 * LLaMA-3-1B's 40 rotated heads. period 0: every pair makes its own. */
extern "C" __global__ void __launch_bounds__(CODA_STEPS_THREADS)
coda_rope_backward_kernel(coda_rope_parts_t P,   // dy (rows, n) in parts, f32 or bf16 (dy_bf16)
                          const coda_bf16_t *y,  // (rows, n) bf16, row stride ys
                          long long ys,
                          const float *pos,      // (rows) f32, element stride ps
                          long long ps,
                          const float *freq,     // (n/2) f32, contiguous
                          coda_bf16_t *dz,       // (rows, n) bf16, row stride dzs
                          long long dzs,
                          float *s,              // (rows) f32, element stride s_s
                          long long s_s, long long rows, int wpr, int dy_bf16,
                          int period, long long rot_pairs) {
    __shared__ float red[8];
    __shared__ __align__(16) float tab_c[8][CODA_ROPE_TAB], tab_s[8][CODA_ROPE_TAB]; // (rows of the block, period) f32
    const int rpb = 8 / wpr, T = 32 * wpr;
    const int warp = threadIdx.x >> 5;
    const int t = (warp % wpr) * 32 + (threadIdx.x & 31);
    const long long n = P.off[3], nfull = n >> 3, tail0 = nfull << 3;
    const int esz = dy_bf16 ? 2 : 4;
    float *const rc = tab_c[warp / wpr], *const rs = tab_s[warp / wpr]; // (period) f32: this row's cos, sin
    for (long long r0 = (long long)blockIdx.x * rpb; r0 < rows; r0 += (long long)gridDim.x * rpb) {
        const long long i = r0 + warp / wpr;
        float acc = 0.0f;
        if (period > 0) {
            __syncthreads(); /* the previous rows' readers are done with the table */
            if (i < rows)
                for (int q = t; q < period; q += T) coda_rope_cos_sin(pos[i * ps] * freq[q], &rc[q], &rs[q]);
            __syncthreads();
        }
        if (i < rows) {
            const coda_bf16_t *yr = y + i * ys;  // (n) bf16: row i of y
            coda_bf16_t *zr = dz + i * dzs;      // (n) bf16: row i of dz
            const float pos_i = pos[i * ps];
            for (long long c = t; c < nfull; c += T) {
                const long long j0 = c << 3, p0 = c << 2;
                long long st, c0, c1;
                const void *part = coda_rope_part(&P, j0, &st, &c0, &c1);
                // chunk j0..j0+7 of dy where part holds all of it (else element loads)
                const char *dq = (const char *)part + (i * st + (j0 - c0)) * esz;
                const int vec = (j0 + 8 <= c1) & coda_aligned16(dq) & coda_aligned16(yr + j0) &
                                coda_aligned16(zr + j0) & coda_aligned16(freq + p0);
                float dv[8], yv[8], fv[4], zv[8];
                if (vec) {
                    if (dy_bf16) {
                        const uint4 h = *(const uint4 *)dq;
                        dv[0] = coda_lo(h.x), dv[1] = coda_hi(h.x), dv[2] = coda_lo(h.y), dv[3] = coda_hi(h.y);
                        dv[4] = coda_lo(h.z), dv[5] = coda_hi(h.z), dv[6] = coda_lo(h.w), dv[7] = coda_hi(h.w);
                    } else {
                        const float4 a = *(const float4 *)dq, b = *(const float4 *)(dq + 16);
                        dv[0] = a.x, dv[1] = a.y, dv[2] = a.z, dv[3] = a.w;
                        dv[4] = b.x, dv[5] = b.y, dv[6] = b.z, dv[7] = b.w;
                    }
                    const uint4 u = *(const uint4 *)(yr + j0);
                    const float4 f = *(const float4 *)(freq + p0);
                    yv[0] = coda_lo(u.x), yv[1] = coda_hi(u.x), yv[2] = coda_lo(u.y), yv[3] = coda_hi(u.y);
                    yv[4] = coda_lo(u.z), yv[5] = coda_hi(u.z), yv[6] = coda_lo(u.w), yv[7] = coda_hi(u.w);
                    fv[0] = f.x, fv[1] = f.y, fv[2] = f.z, fv[3] = f.w;
                } else {
                    for (int k = 0; k < 8; k++) dv[k] = coda_rope_dy(&P, dy_bf16, i, j0 + k), yv[k] = coda_bf(yr[j0 + k]);
                    for (int k = 0; k < 4; k++) fv[k] = freq[p0 + k];
                }
                if (p0 < rot_pairs) { /* period > 0: the 4 pairs' angles from the table */
                    const int q0 = (int)(p0 % period);
                    const float4 cv = *(const float4 *)(rc + q0), sv = *(const float4 *)(rs + q0);
                    const float cc[4] = {cv.x, cv.y, cv.z, cv.w}, ss[4] = {sv.x, sv.y, sv.z, sv.w};
                    for (int k = 0; k < 4; k++)
                        coda_rope_rotate(dv[2 * k], dv[2 * k + 1], yv[2 * k], yv[2 * k + 1], cc[k], ss[k], &acc,
                                         &zv[2 * k], &zv[2 * k + 1]);
                } else {
                    for (int k = 0; k < 4; k++)
                        coda_rope_pair(dv[2 * k], dv[2 * k + 1], yv[2 * k], yv[2 * k + 1], pos_i, fv[k], &acc,
                                       &zv[2 * k], &zv[2 * k + 1]);
                }
                if (vec) {
                    uint4 o;
                    o.x = coda_to_bf2(zv[0], zv[1]);
                    o.y = coda_to_bf2(zv[2], zv[3]);
                    o.z = coda_to_bf2(zv[4], zv[5]);
                    o.w = coda_to_bf2(zv[6], zv[7]);
                    *(uint4 *)(zr + j0) = o;
                } else {
                    for (int k = 0; k < 8; k++) zr[j0 + k] = coda_to_bf(zv[k]);
                }
            }
            if (tail0 < n && t == (int)(nfull % T)) {
                for (long long j = tail0; j < n; j += 2) {
                    float ze, zo;
                    const float de = coda_rope_dy(&P, dy_bf16, i, j), dd = coda_rope_dy(&P, dy_bf16, i, j + 1);
                    coda_rope_pair(de, dd, coda_bf(yr[j]), coda_bf(yr[j + 1]), pos_i, freq[j >> 1], &acc, &ze, &zo);
                    zr[j] = coda_to_bf(ze);
                    zr[j + 1] = coda_to_bf(zo);
                }
            }
        }
        const float tot = coda_row_sum(acc, wpr, red);
        if (i < rows && t == 0) s[i * s_s] = tot;
    }
}

/* out[i os] = in[i is] for i < n: f32 in, out f32 (a copy: the bits, NaN
 * payloads included) or bf16 (to_bf16 = 1: rounded to nearest even). */
extern "C" __global__ void __launch_bounds__(CODA_STEPS_THREADS)
coda_convert_vec_kernel(const float *in,  // (n) f32, element stride is
                        long long is,
                        void *out,        // (n) bf16 (to_bf16) or f32, element stride os
                        long long os, long long n, int to_bf16) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float v = in[i * is];
        if (to_bf16) ((coda_bf16_t *)out)[i * os] = coda_to_bf(v);
        else ((float *)out)[i * os] = v;
    }
}

/* The first index i with targets[i] outside [0, vocab) and not ignore_index,
 * into *bad by atomicMin; the host sets *bad to 0xffffffff (-1 as an i32:
 * none) before the launch. Indices are below 2^31, so they never meet the
 * "none" value, and the minimum does not depend on the order of the atomics.
 *   targets (n) i32, element stride ts; bad (1) u32. */
extern "C" __global__ void __launch_bounds__(CODA_STEPS_THREADS)
coda_check_targets_kernel(const int *targets,  // (n) i32, element stride ts
                          long long ts, long long n, long long vocab, int ignore_index,
                          unsigned *bad) {     // (1) u32: the first bad index, preset to 0xffffffff
    unsigned first = 0xffffffffu;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int v = targets[i * ts];
        if (v != ignore_index && (v < 0 || (long long)v >= vocab) && (unsigned)i < first) first = (unsigned)i;
    }
    /* one atomic per warp that saw a bad target, none otherwise (the usual case) */
    first = __reduce_min_sync(0xffffffffu, first);
    if ((threadIdx.x & 31) == 0 && first != 0xffffffffu) atomicMin(bad, first);
}
