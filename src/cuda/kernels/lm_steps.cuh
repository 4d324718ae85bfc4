/* lm_steps.cuh - coda_lm_loss's memory-bound steps on the GPU (src/cuda/lm_steps.c
 * launches them; what each computes: src/core/lm_steps.h; the CPU's loops,
 * the reference: src/layer/lm_loss_cpu.c):
 *
 *   coda_lm_targets_kernel count[0] = rows whose target is not ignore_index;
 *                          i64 targets narrowed to i32 on the way
 *   coda_lm_rows_kernel    per row of a chunk: lse from the epilogue's
 *                          partials, the loss, dz over the bf16 logits in place
 *   coda_lm_total_kernel   total[0] = sum of the losses (/ count for the mean)
 *   coda_scale_kernel      t *= s[0] (coda_scale: grad_output times the
 *                          gradients the forward call made)
 *
 * The rows kernel is the one that matters: one block per row (128 to 512
 * threads by V: lm_steps.c's rows_threads), the row's first vectors loaded
 * before its lse is reduced, one read and
 * one write of the row's V bf16 values as 16-byte vectors (the logits
 * buffer is the workspace's: 256-byte aligned base, rows a multiple of 16
 * bytes), a row's columns from V on never written. exp is the fast
 * ex2.approx (as the generated epilogues' exp), within rounding of the
 * CPU's expf for the arguments here (z - lse <= 0).
 *
 * Sums (the lse's partials, sum_j z_j, the losses) go in one fixed order per
 * launch shape: thread k takes elements k, k + T, ... in increasing order,
 * then a butterfly within each warp and the warps' sums in increasing order.
 * No atomics: bitwise reproducible run to run. NaN by IEEE arithmetic, and
 * max.NaN for the maxima (a NaN partial is never dropped). */

#define CODA_LM_THREADS 512
#define CODA_LM_WARPS (CODA_LM_THREADS / 32)
#define CODA_LM_BATCH 2 /* 16-byte vectors a thread per batch of the rows kernel (4 spills at 64 registers, ptxas's pick for 512 threads) */

typedef unsigned short coda_lm_bf16_t;

static __device__ __forceinline__ float lm_bf(unsigned short h) { return __int_as_float((int)((unsigned)h << 16)); }
static __device__ __forceinline__ unsigned short lm_to_bf(float f) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
static __device__ __forceinline__ unsigned lm_to_bf2(float lo, float hi) {
    unsigned u;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(hi), "f"(lo));
    return u;
}
static __device__ __forceinline__ float lm_max(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
/* e^x as ex2.approx.ftz alone (as the generated epilogues' exp): exp2f
 * adds a denormal path of a few instructions an element, and a result
 * below 2^-126 is within rounding of 0 beside the 1 / count it is scaled by */
static __device__ __forceinline__ float lm_exp(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}

/* Block-wide sum or max (op 0 / 1) of v, the same value returned to every
 * thread; `red` is CODA_LM_WARPS floats of shared memory. */
static __device__ __forceinline__ float lm_block_reduce(float v, int op, float *red) {
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = op ? lm_max(v, u) : v + u;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* red may still be read by the last reduction */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) r = op ? lm_max(r, red[w]) : r + red[w];
    return r;
}

extern "C" __global__ void __launch_bounds__(CODA_LM_THREADS)
coda_lm_targets_kernel(const void *targets, int i64, long long ts, long long m, int ignore, int bad, long long V,
                       int *t32, int *count) {
    /* one block; an integer count is exact in any order. i64: t32[i] is the
     * target if it is ignore or in [0, V), else bad (lm_steps.h) */
    __shared__ int ired[CODA_LM_WARPS];
    int n = 0;
    if (i64) {
        const long long *t = (const long long *)targets;
        for (long long i = threadIdx.x; i < m; i += blockDim.x) {
            const long long v = t[i * ts];
            const int o = v == (long long)ignore || (v >= 0 && v < V) ? (int)v : bad;
            t32[i] = o;
            n += o != ignore;
        }
    } else {
        const int *t = (const int *)targets;
        for (long long i = threadIdx.x; i < m; i += blockDim.x) n += t[i * ts] != ignore;
    }
    for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
    if ((threadIdx.x & 31) == 0) ired[threadIdx.x >> 5] = n;
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += ired[w];
        *count = s;
    }
}

extern "C" __global__ void __launch_bounds__(CODA_LM_THREADS)
coda_lm_total_kernel(const float *loss, long long ls, long long m, const int *count, int mean, float *total) {
    __shared__ float red[CODA_LM_WARPS];
    float s = 0.0f;
    for (long long i = threadIdx.x; i < m; i += blockDim.x) s += loss[i * ls];
    s = lm_block_reduce(s, 0, red);
    if (threadIdx.x == 0) *total = mean ? s / (float)*count : s;
}

/* z (rows, V) bf16, row stride zs elements (a multiple of 8), base 16-byte
 * aligned; part (rows, T, 3) f32 with element strides p0, p1, p2; targets
 * and loss with element strides ts, ls. */
extern "C" __global__ void __launch_bounds__(CODA_LM_THREADS)
coda_lm_rows_kernel(coda_lm_bf16_t *z, long long zs, const float *part, long long p0, long long p1, long long p2,
                    long long T, const int *targets, long long ts, const int *count, float *loss, long long ls,
                    long long rows, long long V, int ignore, float eps, float zc, float cap, float gscale,
                    int mean, int want) {
    __shared__ float red[CODA_LM_WARPS];
    const long long nvec = V / 8, tail0 = nvec * 8;
    const float s = mean ? gscale / (float)*count : gscale;
    for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
        coda_lm_bf16_t *zr = z + i * zs;
        uint4 *zv = (uint4 *)zr;
        const long long step = blockDim.x, batch = CODA_LM_BATCH * step;
        /* the first batch of the row's vectors is loaded before anything
         * else, so its latency hides behind the lse's reductions */
        uint4 q[CODA_LM_BATCH];
#pragma unroll
        for (int u = 0; u < CODA_LM_BATCH; u++) {
            const long long v = threadIdx.x + u * step;
            if (v < nvec) q[u] = zv[v];
        }
        const int t = targets[i * ts];
        if (t == ignore) {
            if (threadIdx.x == 0) loss[i * ls] = 0.0f;
            if (want) {
                for (long long v = threadIdx.x; v < nvec; v += blockDim.x) zv[v] = make_uint4(0, 0, 0, 0);
                for (long long j = tail0 + threadIdx.x; j < V; j += blockDim.x) zr[j] = 0;
            }
            continue;
        }
        /* lse from the partials: the max, then sum l_t exp(m_t - max) */
        const float *pr = part + i * p0;
        float mx = __int_as_float(0xff800000); /* -inf */
        for (long long k = threadIdx.x; k < T; k += blockDim.x) mx = lm_max(mx, pr[k * p1]);
        mx = lm_block_reduce(mx, 1, red);
        float l = 0.0f;
        for (long long k = threadIdx.x; k < T; k += blockDim.x) {
            float mt = pr[k * p1], lt = pr[k * p1 + p2];
            l += lt * (mt == mx ? 1.0f : lm_exp(mt - mx));
        }
        l = lm_block_reduce(l, 0, red);
        const float lse = mx + logf(l);
        const int in_range = t >= 0 && (long long)t < V;
        const float zt = in_range ? lm_bf(zr[t]) : __int_as_float(0x7fc00000);
        __syncthreads(); /* every thread has read z_t before any dz is written */

        /* the z-loss terms only where z_loss > 0: a +inf logit (lse = +inf)
         * then gives a +inf loss, not 0 * inf = NaN (coda.h section 7) */
        const float a = zc > 0.0f ? s * (1.0f + 2.0f * zc * lse) : s, hit = s * (1.0f - eps), base = s * eps / (float)V;
        const float icap = cap > 0.0f ? 1.0f / cap : 0.0f, nan = __int_as_float(0x7fc00000);
        float sum = 0.0f;
        /* a batch: CODA_LM_BATCH vectors a thread (elements in the same
         * increasing order per thread as one at a time: the same sums), the
         * next batch loaded before this one is stored (other addresses), so
         * loads stay in flight while the stores go out */
        for (long long b0 = 0; b0 < nvec; b0 += batch) {
            uint4 nx[CODA_LM_BATCH];
#pragma unroll
            for (int u = 0; u < CODA_LM_BATCH; u++) {
                const long long v = b0 + batch + threadIdx.x + u * step;
                if (v < nvec) nx[u] = zv[v];
            }
#pragma unroll
            for (int u = 0; u < CODA_LM_BATCH; u++) {
                const long long v = b0 + threadIdx.x + u * step;
                if (v >= nvec) continue;
                unsigned w[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
                const long long j0 = v * 8;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float z0 = lm_bf((unsigned short)(w[e] & 0xffffu)), z1 = lm_bf((unsigned short)(w[e] >> 16));
                    sum += z0;
                    sum += z1;
                    float g0 = a * lm_exp(z0 - lse) - (j0 + 2 * e == t ? hit : 0.0f) - base;
                    float g1 = a * lm_exp(z1 - lse) - (j0 + 2 * e + 1 == t ? hit : 0.0f) - base;
                    if (cap > 0.0f) {
                        float u0 = z0 * icap, u1 = z1 * icap;
                        g0 *= 1.0f - u0 * u0;
                        g1 *= 1.0f - u1 * u1;
                    }
                    w[e] = in_range ? lm_to_bf2(g0, g1) : lm_to_bf2(nan, nan);
                }
                if (want) zv[v] = make_uint4(w[0], w[1], w[2], w[3]);
            }
#pragma unroll
            for (int u = 0; u < CODA_LM_BATCH; u++) q[u] = nx[u];
        }
        for (long long j = tail0 + threadIdx.x; j < V; j += blockDim.x) {
            float zj = lm_bf(zr[j]);
            sum += zj;
            float g = a * lm_exp(zj - lse) - (j == t ? hit : 0.0f) - base;
            if (cap > 0.0f) {
                float u = zj * icap;
                g *= 1.0f - u * u;
            }
            if (want) zr[j] = lm_to_bf(in_range ? g : nan);
        }
        float lv = lse - (1.0f - eps) * zt + (zc > 0.0f ? zc * lse * lse : 0.0f);
        if (eps > 0.0f) {
            sum = lm_block_reduce(sum, 0, red);
            lv -= eps / (float)V * sum;
        }
        if (threadIdx.x == 0) loss[i * ls] = lv;
        __syncthreads(); /* red is reused by the next row */
    }
}

/* t *= s[0] rounded to t's dtype (coda_scale, src/api/scale.c): t (rows,
 * cols), f32 (f32 = 1) or bf16, row stride ld elements; vec = 1 when every
 * row is whole 16-byte vectors (base and ld aligned, cols a multiple of 4
 * f32 or 8 bf16), else element by element. Every thread reads s first, and
 * all stop when the rounded value is exactly 1: t is then not touched.
 * Block b takes segment b % segs of row b / segs, a segment being
 * CODA_SCALE_UNROLL units (vectors or elements) a thread; one f32 multiply
 * a product (no contraction), rounded once. */
#define CODA_SCALE_UNROLL 4

/* unit c of an f32 row: a float4 (vec) or one element */
static __device__ __forceinline__ void scale_unit_f32(float *row, long long c, int vec, float g) {
    if (!vec) {
        row[c] = __fmul_rn(row[c], g);
        return;
    }
    float4 v = ((float4 *)row)[c];
    v.x = __fmul_rn(v.x, g), v.y = __fmul_rn(v.y, g), v.z = __fmul_rn(v.z, g), v.w = __fmul_rn(v.w, g);
    ((float4 *)row)[c] = v;
}

/* unit c of a bf16 row: 8 values (vec) or one */
static __device__ __forceinline__ void scale_unit_bf16(coda_lm_bf16_t *row, long long c, int vec, float g) {
    if (!vec) {
        row[c] = lm_to_bf(__fmul_rn(lm_bf(row[c]), g));
        return;
    }
    uint4 q = ((uint4 *)row)[c];
    unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int e = 0; e < 4; e++)
        w[e] = lm_to_bf2(__fmul_rn(lm_bf((unsigned short)(w[e] & 0xffffu)), g),
                         __fmul_rn(lm_bf((unsigned short)(w[e] >> 16)), g));
    ((uint4 *)row)[c] = make_uint4(w[0], w[1], w[2], w[3]);
}

extern "C" __global__ void __launch_bounds__(CODA_LM_THREADS)
coda_scale_kernel(void *t, long long ld, long long rows, long long cols, int f32, int vec, const float *s) {
    float g = *s;
    if (!f32) g = lm_bf(lm_to_bf(g));
    if (g == 1.0f) return;
    const long long per = vec ? cols / (f32 ? 4 : 8) : cols; /* units a row */
    const long long seg = (long long)blockDim.x * CODA_SCALE_UNROLL, segs = (per + seg - 1) / seg;
    for (long long b = blockIdx.x; b < rows * segs; b += gridDim.x) {
        const long long r = b / segs, c0 = (b - r * segs) * seg + threadIdx.x;
#pragma unroll
        for (int k = 0; k < CODA_SCALE_UNROLL; k++) {
            const long long c = c0 + (long long)k * blockDim.x;
            if (c >= per) break;
            if (f32) scale_unit_f32((float *)t + r * ld, c, vec, g);
            else scale_unit_bf16((coda_lm_bf16_t *)t + r * ld, c, vec, g);
        }
    }
}
