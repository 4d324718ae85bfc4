/* epi_plain.cuh - the plain GEMM epilogue: C = alpha * acc + beta * C.
 *
 * This is the reference user of the epilogue splice point (docs/gpu.md): an
 * epilogue defines struct coda_epi_params (passed to the kernel by value),
 * struct coda_epi_state (per thread, per tile), and the three hooks below.
 * beta == 0: C is not read (it may hold NaN). Columns come in adjacent pairs
 * (col, col + 1): a 4-byte bf16x2 or 8-byte float2 access. */

struct coda_epi_params {
    void *c;            /* (M, N) bf16 or f32                          */
    long long ldc;      /* row stride in elements                       */
    float alpha, beta;
    int c_f32;          /* 1: C is f32, 0: bf16                         */
    int pad_;
};

struct coda_epi_state { int unused_; };

static __device__ __forceinline__ void coda_epi_begin(const coda_epi_params &p,
                                                      const coda_epi_tile &t, coda_epi_state &s) {}

/* v0 = acc(row, col), v1 = acc(row, col + 1); h: which of the thread's two
 * rows (row = t.row + 8h), j: the 8-column chunk (col = t.col + 8j). */
static __device__ __forceinline__ void coda_epi_pair(const coda_epi_params &p,
                                                     const coda_epi_tile &t, coda_epi_state &s,
                                                     int h, int j, int row, int col, float v0,
                                                     float v1) {
    if (row >= t.m || col >= t.n) return;
    const bool two = col + 1 < t.n;
    v0 *= p.alpha;
    v1 *= p.alpha;
    if (p.c_f32) {
        float *c = (float *)p.c + (long long)row * p.ldc + col;
        if (p.beta != 0.0f) {
            v0 += p.beta * c[0];
            if (two) v1 += p.beta * c[1];
        }
        if (two) *(float2 *)c = make_float2(v0, v1);
        else c[0] = v0;
    } else {
        unsigned short *c = (unsigned short *)p.c + (long long)row * p.ldc + col;
        if (two) {
            if (p.beta != 0.0f) {
                u32 old = *(const u32 *)c;
                v0 += p.beta * coda_bf16_lo(old);
                v1 += p.beta * coda_bf16_hi(old);
            }
            *(u32 *)c = coda_pack_bf16x2(v0, v1);
        } else {
            if (p.beta != 0.0f) v0 += p.beta * coda_bf16_to_f32(c[0]);
            c[0] = coda_f32_to_bf16(v0);
        }
    }
}

static __device__ __forceinline__ void coda_epi_end(const coda_epi_params &p,
                                                    const coda_epi_tile &t, coda_epi_state &s) {}
