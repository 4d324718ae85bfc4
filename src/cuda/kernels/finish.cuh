/* finish.cuh - the finishing steps on the GPU: combine tile partials.
 *
 * One thread per row, t = 0..T-1 in order, with the same float operations as
 * the CPU backend (src/core/finish.c) and FMA contraction off (--fmad=false),
 * so results are bitwise reproducible and equal to the CPU's for sums and
 * maxima (NaN where the CPU has NaN; a NaN's payload bits may differ).
 * Strides are in elements. op: 0 sum, 1 max, 2 sum (of squared partials). */

#define CODA_NEG_INF __int_as_float(0xff800000)

/* max that keeps a NaN (fmaxf drops it), as the CPU's nan_max: one
 * max.NaN instruction (sm_80+) where an explicit NaN test took four. The
 * NaN rule of coda.h section 7: a NaN partial gives a NaN result. */
static __device__ __forceinline__ float coda_max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

extern "C" __global__ void coda_finish_reduce_kernel(const float *part, long long ps0, long long ps1,
                                                     float *out, long long os0, long long rows,
                                                     long long T, int op) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    const float *p = part + i * ps0;
    float r;
    if (op == 1) {
        r = CODA_NEG_INF;
        for (long long t = 0; t < T; t++) r = coda_max_nan(r, p[t * ps1]);
    } else {
        r = 0.0f;
        for (long long t = 0; t < T; t++) r += p[t * ps1];
    }
    out[i * os0] = r;
}

extern "C" __global__ void coda_finish_rstd_kernel(const float *part, long long ps0, long long ps1,
                                                   float *rstd, long long os0, long long rows,
                                                   long long T, float d, float eps) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    const float *p = part + i * ps0;
    float s = 0.0f;
    for (long long t = 0; t < T; t++) s += p[t * ps1];
    rstd[i * os0] = 1.0f / sqrtf(s / d + eps);
}

/* partials (M, T, 3): (max, sum of exp(v - max), picked target value) */
extern "C" __global__ void coda_finish_lse_kernel(const float *part, long long ps0, long long ps1,
                                                  long long ps2, const int *targets, long long ts0,
                                                  int ignore_index, float *lse, long long ls0,
                                                  float *loss, long long os0, long long rows,
                                                  long long T) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    const float *p = part + i * ps0;
    float mx = CODA_NEG_INF, l = 0.0f, pk = 0.0f;
    for (long long t = 0; t < T; t++) mx = coda_max_nan(mx, p[t * ps1]);
    for (long long t = 0; t < T; t++) {
        float mt = p[t * ps1], lt = p[t * ps1 + ps2];
        /* as the CPU: 1 where mt == mx (never exp(inf - inf) = NaN: a row
         * of -inf tiles gives -inf, a +inf tile +inf); mx NaN: l NaN */
        l += lt * (mt == mx ? 1.0f : expf(mt - mx));
        pk += p[t * ps1 + 2 * ps2];
    }
    float v = mx + logf(l);
    lse[i * ls0] = v;
    loss[i * os0] = targets[i * ts0] == ignore_index ? 0.0f : v - pk;
}
