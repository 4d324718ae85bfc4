/* finish.cuh - the finishing steps on the GPU: combine tile partials.
 *
 * One thread per row, t = 0..T-1 in order, with the same float operations as
 * the CPU backend (src/core/finish.c) and FMA contraction off (--fmad=false),
 * so results are bitwise reproducible and equal to the CPU's for sums.
 * Strides are in elements. op: 0 sum, 1 max, 2 sum (of squared partials). */

#define CODA_NAN __int_as_float(0x7fc00000)
#define CODA_NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void coda_finish_reduce_kernel(const float *part, long long ps0, long long ps1,
                                                     float *out, long long os0, long long rows,
                                                     long long T, int op) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    const float *p = part + i * ps0;
    float r;
    if (op == 1) {
        r = CODA_NEG_INF;
        for (long long t = 0; t < T; t++) {
            float x = p[t * ps1];
            r = (x != x || r != r) ? CODA_NAN : fmaxf(r, x);
        }
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
    for (long long t = 0; t < T; t++) {
        float x = p[t * ps1];
        mx = (x != x || mx != mx) ? CODA_NAN : fmaxf(mx, x);
    }
    for (long long t = 0; t < T; t++) {
        float mt = p[t * ps1], lt = p[t * ps1 + ps2];
        l += lt * (mt == mx ? 1.0f : expf(mt - mx));
        pk += p[t * ps1 + 2 * ps2];
    }
    float v = mx + logf(l);
    lse[i * ls0] = v;
    loss[i * os0] = targets[i * ts0] == ignore_index ? 0.0f : v - pk;
}
