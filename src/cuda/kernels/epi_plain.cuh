/* epi_plain.cuh - the plain GEMM epilogue: C = alpha * acc + beta * C.
 *
 * Built with CODA_EPI_STORE_C = 1: the values the hook leaves in (v0, v1)
 * go to C through the mainloop's shared-memory + TMA store path.
 *
 * This is the reference user of the epilogue splice point (docs/gpu.md): an
 * epilogue defines struct coda_epi_params (passed to the kernel by value),
 * struct coda_epi_state (per thread, per tile), struct coda_epi_pre (row
 * values loaded before the tile's k-loop), and the hooks below.
 * beta == 0: C is not read (it may hold NaN). Columns come in adjacent pairs
 * (col, col + 1): a 4-byte bf16x2 or 8-byte float2 load. */

#ifndef CODA_PLAIN_SIMPLE
#define CODA_PLAIN_SIMPLE 0
#endif

struct coda_epi_params {
    void *c;            /* (M, N) bf16 or f32                          */
    long long ldc;      /* row stride in elements                       */
    float alpha, beta;
    int c_f32;          /* 1: C is f32, 0: bf16 (CODA_C_F32 decides the code) */
    int pad_;
};
static_assert(CODA_OFFSETOF(coda_epi_params, ldc) == 8 && CODA_OFFSETOF(coda_epi_params, alpha) == 16 &&
                  CODA_OFFSETOF(coda_epi_params, beta) == 20 && CODA_OFFSETOF(coda_epi_params, c_f32) == 24 &&
                  sizeof(coda_epi_params) == 32,
              "coda_epi_params (plain): the layout of plain_params_t (src/cuda/gemm.c)");

struct coda_epi_state { int unused_; };
struct coda_epi_pre { int unused_; }; /* no row vectors */
struct coda_epi_in { int unused_; }; /* nothing fetched ahead: C is read in the pair step */

static __device__ __forceinline__ void coda_epi_preload(const coda_epi_params &p, const coda_epi_tile &t,
                                                        coda_epi_pre &q) {}

static __device__ __forceinline__ void coda_epi_begin(const coda_epi_params &p, const coda_epi_tile &t,
                                                      coda_epi_state &s, const coda_epi_pre &q) {}

static __device__ __forceinline__ void coda_epi_fetch(const coda_epi_params &p,
                                                      const coda_epi_tile &t, int row, int col,
                                                      coda_epi_in &in) {}

/* A batch's pairs: rows row and row + 8, columns col0 + 8 jj (pair (jj, h)
 * into in[2 jj + h]). Generated epilogues read some inputs for the whole
 * batch at once here (ldmatrix); this one has nothing to fetch. */
static __device__ __forceinline__ void coda_epi_fetch_batch(const coda_epi_params &p,
                                                            const coda_epi_tile &t, int row, int col0,
                                                            coda_epi_in (&in)[2 * CODA_EPI_BATCH]) {}

/* beta * C(row, col .. col + 1) added to (v0, v1), inside the matrix. */
static __device__ __forceinline__ void coda_epi_plain_beta(const coda_epi_params &p, const coda_epi_tile &t,
                                                           int row, int col, float &v0, float &v1) {
    if (row >= t.m || col >= t.n) return;
    const bool two = col + 1 < t.n;
#if CODA_C_F32
    const float *c = (const float *)p.c + (long long)row * p.ldc + col;
    v0 += p.beta * c[0];
    if (two) v1 += p.beta * c[1];
#else
    const unsigned short *c = (const unsigned short *)p.c + (long long)row * p.ldc + col;
    if (two) {
        u32 old = *(const u32 *)c;
        v0 += p.beta * coda_bf16_lo(old);
        v1 += p.beta * coda_bf16_hi(old);
    } else {
        v0 += p.beta * coda_bf16_to_f32(c[0]);
    }
#endif
}

/* v0 = acc(row, col), v1 = acc(row, col + 1), replaced by what the main
 * output C gets (the mainloop stores it through shared memory and TMA, which
 * drops rows >= M and columns >= N). h: which of the thread's two rows
 * (row = t.row + 8h); j: the 8-column chunk (col = t.col + 8j). The test of
 * beta is the same in every thread (a uniform branch); the bounds tests
 * behind it are not, and cost a divergence region per pair, so they run only
 * when C is read. */
static __device__ __forceinline__ void coda_epi_pair(const coda_epi_params &p,
                                                     const coda_epi_tile &t, coda_epi_state &s,
                                                     int h, int j, int row, int col, float &v0,
                                                     float &v1, const coda_epi_in &in) {
    v0 *= p.alpha;
    v1 *= p.alpha;
#if !CODA_PLAIN_SIMPLE /* set when beta = 0: C is not read */
    if (p.beta != 0.0f) coda_epi_plain_beta(p, t, row, col, v0, v1);
#endif
}

/* C(row, col .. col + 1) = (v0, v1) for the columns from n16 on (the
 * mainloop's C store stops its tensor map there: the copy engine writes
 * whole 16-byte units) and inside the matrix. */
static __device__ __forceinline__ void coda_epi_store_tail(const coda_epi_params &p, const coda_epi_tile &t,
                                                           int n16, int row, int col, float v0, float v1) {
    if (row >= t.m) return;
#if CODA_C_F32
    float *c = (float *)p.c + (long long)row * p.ldc + col;
    if (col >= n16 && col < t.n) c[0] = v0;
    if (col + 1 >= n16 && col + 1 < t.n) c[1] = v1;
#else
    unsigned short *c = (unsigned short *)p.c + (long long)row * p.ldc + col;
    const u32 w = coda_pack_bf16x2(v0, v1);
    if (col >= n16 && col < t.n) c[0] = (unsigned short)(w & 0xffffu);
    if (col + 1 >= n16 && col + 1 < t.n) c[1] = (unsigned short)(w >> 16);
#endif
}

/* Staged tile inputs (generated epilogues): none here. */
struct coda_epi_vin { int unused_; };
static __device__ __forceinline__ void coda_epi_vload(const coda_epi_params &p, const coda_epi_tile &t,
                                                      int mh, int j0, coda_epi_vin &v) {}
static __device__ __forceinline__ void coda_epi_vput(const coda_epi_tile &t, const coda_epi_vin &v) {}

/* Generated epilogues write their staged tile outputs here; C goes through
 * the mainloop's own TMA store path instead. */
static __device__ __forceinline__ void coda_epi_flush(const coda_epi_params &p, coda_epi_state &s,
                                                     const coda_epi_tile &t, int mh, int j0,
                                                     const coda_store_maps &o) {}
#define CODA_EPI_TMA_STORES 0
static __device__ __forceinline__ void coda_epi_slab_wait(const coda_epi_tile &t) {}

static __device__ __forceinline__ void coda_epi_end(const coda_epi_params &p,
                                                    const coda_epi_tile &t, coda_epi_state &s) {}
