/* cpu_gemm.c - the CPU reference GEMM: C = alpha op(A) op(B) + beta C.
 *
 * Blocked for cache: panels of A (MB x KB) and B (KB x NB) are converted to f32
 * first (bf16 or f32 inputs), then a 4 x 16 register block of C accumulates
 * over the panel's k. Every element of C is one f32 sum over k = 0..K-1 in
 * increasing order, whatever block or thread computes it, so results are
 * bitwise reproducible and independent of the thread count. (C11 builds
 * default to -ffp-contract=off in GCC, so no fused multiply-adds sneak in.)
 */
#include "cpu/cpu.h"

#define MB 64   /* rows of C per block (multiple of 4)       */
#define NB 128  /* columns of C per block (multiple of 16)   */
#define KB 256  /* depth of one packed panel                 */

/* scratch layout: apack (MB x KB) | bpack (KB x NB) | cblk (MB x NB) */
size_t coda__cpu_gemm_scratch_floats(void) { return (size_t)MB * KB + (size_t)KB * NB + (size_t)MB * NB; }

static inline float load_elem(const char *p, coda_dtype_t dt) {
    return dt == CODA_BF16 ? coda__bf16_to_f32(*(const uint16_t *)p) : *(const float *)p;
}

/* Where op(A)(i, k) and op(B)(k, j) live: base + i*si + k*sk, base + k*sk + j*sj. */
typedef struct operand {
    const char *base;
    coda_dtype_t dt;
    int64_t s_outer, s_inner; /* byte steps along (i or k) and (k or j) */
} operand_t;

static operand_t view_a(coda_layout_t layout, const coda_tensor_t *a) {
    operand_t o = {a->data, a->dtype, a->stride[0], a->stride[1]};
    if (layout == CODA_LAYOUT_TN) { o.s_outer = a->stride[1]; o.s_inner = a->stride[0]; }
    return o; /* (i, k) */
}
static operand_t view_b(coda_layout_t layout, const coda_tensor_t *b) {
    operand_t o = {b->data, b->dtype, b->stride[0], b->stride[1]};
    if (layout == CODA_LAYOUT_NT) { o.s_outer = b->stride[1]; o.s_inner = b->stride[0]; }
    return o; /* (k, j) */
}

/* apack: rows in groups of 4, [g][kk][r] = A(i0 + 4g + r, k0 + kk); rows past
 * mb are zero so the kernel can always work on 4 rows. */
static void pack_a(const operand_t *A, int64_t i0, int mb, int64_t k0, int kb, float *ap) {
    int mb4 = (mb + 3) & ~3;
    for (int i = 0; i < mb4; i++) {
        float *dst = ap + (size_t)(i >> 2) * kb * 4 + (i & 3);
        if (i >= mb) {
            for (int kk = 0; kk < kb; kk++) dst[kk * 4] = 0.0f;
            continue;
        }
        const char *src = A->base + (i0 + i) * A->s_outer + k0 * A->s_inner;
        if (A->dt == CODA_BF16)
            for (int kk = 0; kk < kb; kk++)
                dst[kk * 4] = coda__bf16_to_f32(*(const uint16_t *)(src + kk * A->s_inner));
        else
            for (int kk = 0; kk < kb; kk++) dst[kk * 4] = *(const float *)(src + kk * A->s_inner);
    }
}

/* bpack: [kk][jj] = B(k0 + kk, j0 + jj), row length NB, zero from nb up to nb16. */
static void pack_b(const operand_t *B, int64_t k0, int kb, int64_t j0, int nb, int nb16, float *bp) {
    for (int kk = 0; kk < kb; kk++) {
        float *dst = bp + (size_t)kk * NB;
        const char *src = B->base + (k0 + kk) * B->s_outer + j0 * B->s_inner;
        for (int jj = 0; jj < nb; jj++) dst[jj] = load_elem(src + jj * B->s_inner, B->dt);
        for (int jj = nb; jj < nb16; jj++) dst[jj] = 0.0f;
    }
}

/* cblk (mb4, NB) += apack . bpack over kb, 4 x 16 blocks held in registers. */
static void kernel(const float *restrict ap, const float *restrict bp, float *restrict cblk, int mb,
                   int nb16, int kb) {
    for (int g = 0; g < (mb + 3) / 4; g++) {
        const float *a = ap + (size_t)g * kb * 4;
        for (int j0 = 0; j0 < nb16; j0 += 16) {
            float c[4][16];
            for (int r = 0; r < 4; r++)
                for (int j = 0; j < 16; j++) c[r][j] = cblk[(size_t)(4 * g + r) * NB + j0 + j];
            for (int kk = 0; kk < kb; kk++) {
                const float *b = bp + (size_t)kk * NB + j0;
                for (int r = 0; r < 4; r++) {
                    float ar = a[kk * 4 + r];
                    for (int j = 0; j < 16; j++) c[r][j] += ar * b[j];
                }
            }
            for (int r = 0; r < 4; r++)
                for (int j = 0; j < 16; j++) cblk[(size_t)(4 * g + r) * NB + j0 + j] = c[r][j];
        }
    }
}

void coda__cpu_gemm_block(coda_layout_t layout, const coda_tensor_t *a, const coda_tensor_t *b,
                          int64_t i0, int64_t mb, int64_t j0, int64_t nb, float *acc,
                          int64_t ldacc, float *scratch) {
    int64_t m = 0, n = 0, k = 0;
    coda__gemm_extents(layout, a, b, &m, &n, &k);
    operand_t A = view_a(layout, a), B = view_b(layout, b);
    float *ap = scratch, *bp = ap + (size_t)MB * KB, *cblk = bp + (size_t)KB * NB;
    for (int64_t jb = 0; jb < nb; jb += NB) {
        int nbw = (int)(nb - jb < NB ? nb - jb : NB);
        int nb16 = (nbw + 15) & ~15;
        for (int64_t ib = 0; ib < mb; ib += MB) {
            int mbw = (int)(mb - ib < MB ? mb - ib : MB);
            int mb4 = (mbw + 3) & ~3;
            for (int r = 0; r < mb4; r++)
                for (int j = 0; j < nb16; j++) cblk[(size_t)r * NB + j] = 0.0f;
            for (int64_t kb0 = 0; kb0 < k; kb0 += KB) {
                int kbw = (int)(k - kb0 < KB ? k - kb0 : KB);
                pack_a(&A, i0 + ib, mbw, kb0, kbw, ap);
                pack_b(&B, kb0, kbw, j0 + jb, nbw, nb16, bp);
                kernel(ap, bp, cblk, mbw, nb16, kbw);
            }
            for (int r = 0; r < mbw; r++)
                for (int j = 0; j < nbw; j++) acc[(ib + r) * ldacc + jb + j] = cblk[(size_t)r * NB + j];
        }
    }
}

/* ---- coda__cpu_gemm: C = alpha acc + beta C over MB x NB blocks of C ---- */

typedef struct gemm_job {
    coda_layout_t layout;
    const coda_tensor_t *a, *b;
    coda_tensor_t *c;
    float alpha, beta;
    int64_t m, n, n_jblocks;
} gemm_job_t;

static void gemm_task(void *arg, int64_t task, float *scratch) {
    const gemm_job_t *g = arg;
    int64_t i0 = (task / g->n_jblocks) * MB, j0 = (task % g->n_jblocks) * NB;
    int64_t mb = g->m - i0 < MB ? g->m - i0 : MB, nb = g->n - j0 < NB ? g->n - j0 : NB;
    float *acc = scratch + coda__cpu_gemm_scratch_floats(); /* (MB, NB) */
    coda__cpu_gemm_block(g->layout, g->a, g->b, i0, mb, j0, nb, acc, NB, scratch);
    for (int64_t i = 0; i < mb; i++) {
        for (int64_t j = 0; j < nb; j++) {
            void *p = coda__at2(g->c, i0 + i, j0 + j);
            float v = g->alpha * acc[i * NB + j];
            if (g->beta != 0.0f) v += g->beta * coda__load_f32(p, g->c->dtype);
            coda__store_f32(p, g->c->dtype, v);
        }
    }
}

coda_status_t coda__cpu_gemm(coda_context_t *ctx, coda_layout_t layout, const coda_tensor_t *a,
                             const coda_tensor_t *b, coda_tensor_t *c, float alpha, float beta) {
    gemm_job_t g = {layout, a, b, c, alpha, beta, 0, 0, 0};
    int64_t k = 0;
    coda__gemm_extents(layout, a, b, &g.m, &g.n, &k);
    if (g.m == 0 || g.n == 0) return CODA_OK;
    g.n_jblocks = coda__cdiv(g.n, NB);
    int64_t n_tasks = coda__cdiv(g.m, MB) * g.n_jblocks;
    /* Starting threads costs tens of microseconds: not worth it for tiny products. */
    int threads = (double)g.m * (double)g.n * (double)(k + 1) < 1e6 ? 1 : ctx->cpu_threads;
    return coda__cpu_parallel(threads, n_tasks, coda__cpu_gemm_scratch_floats() + (size_t)MB * NB,
                              gemm_task, &g);
}
