/* finish.cuh - the finishing steps on the GPU: combine tile partials.
 *
 * A thread per row combines t = 0..T-1 in order, with the same float
 * operations as the CPU backend (src/api/finish.c) and FMA contraction off
 * (--fmad=false), so results are bitwise reproducible and equal to the
 * CPU's for sums and maxima (NaN where the CPU has NaN; a NaN's payload bits
 * may differ).
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

/* coda_finish_reduce_kernel: a block of 256 threads takes FIN_ROWS rows and
 * reads their partials FIN_COLS at a time into shared memory, every thread
 * loading (consecutive partials of a row are consecutive threads: 128-byte
 * reads where the partials of a row are contiguous); then thread i < FIN_ROWS
 * combines row i's staged partials in order t = 0, 1, ... A thread a row,
 * loading its own partials one by one (the first form), kept one load in
 * flight a thread, and few threads (the 1B block's column partials, 2048
 * rows x 128: 64 warps on the whole GPU): the 1B block's three reductions
 * took 45 us a step together, 27 staged (bench/RESULTS.md, stop 61). The
 * order of the additions, and so every bit, is unchanged. */
#define FIN_ROWS 64 /* src/cuda/finish_gpu.c's FIN_ROWS, its grid: the same number */
#define FIN_COLS 64
#define FIN_THREADS 256
#define FIN_LOADS (FIN_ROWS * FIN_COLS / FIN_THREADS) /* a thread's loads a chunk */

extern "C" __global__ void __launch_bounds__(FIN_THREADS)
coda_finish_reduce_kernel(const float *part,  // (rows, T) f32, element strides ps0, ps1
                          long long ps0, long long ps1,
                          float *out,         // (rows) f32, element stride os0
                          long long os0, long long rows, long long T, int op) {
    __shared__ float tile[FIN_ROWS][FIN_COLS + 1]; /* + 1: row i's reader hits bank (i + t) % 32 */
    const long long r0 = (long long)blockIdx.x * FIN_ROWS;
    const int nr = (int)(rows - r0 < FIN_ROWS ? rows - r0 : FIN_ROWS);
    const int me = threadIdx.x;
    float r = op == 1 ? CODA_NEG_INF : 0.0f;
    for (long long t0 = 0; t0 < T; t0 += FIN_COLS) {
        const int nc = (int)(T - t0 < FIN_COLS ? T - t0 : FIN_COLS);
        float v[FIN_LOADS];
#pragma unroll
        for (int j = 0; j < FIN_LOADS; j++) { /* every load issued before the first store waits on one */
            const int k = me + j * FIN_THREADS, i = k / FIN_COLS, t = k % FIN_COLS;
            v[j] = i < nr && t < nc ? part[(r0 + i) * ps0 + (t0 + t) * ps1] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < FIN_LOADS; j++) {
            const int k = me + j * FIN_THREADS;
            tile[k / FIN_COLS][k % FIN_COLS] = v[j];
        }
        __syncthreads();
        if (me < nr) { /* unrolled: the shared loads go ahead of the additions they feed */
            if (op == 1) {
#pragma unroll 16
                for (int t = 0; t < nc; t++) r = coda_max_nan(r, tile[me][t]);
            } else {
#pragma unroll 16
                for (int t = 0; t < nc; t++) r += tile[me][t];
            }
        }
        __syncthreads(); /* the next chunk's stores wait for this chunk's readers */
    }
    if (me < nr) out[(r0 + me) * os0] = r;
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
