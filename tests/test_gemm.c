/* test_gemm.c - coda_gemm on the CPU backend against a float64 reference.
 *
 * Every layout, M in {1, 7, 127, 128, 1000}, N and K multiples of 8 that are
 * not multiples of the 128 tile plus odd ones and K = 0, alpha/beta, bf16 and
 * f32 outputs, f32 inputs, padded row strides (padding must stay untouched),
 * beta = 0 with NaN in C, and bitwise-equal results for 1, 2 and 3 threads. */
#include "harness.h"

#include <time.h>

/* A matrix with a padded row stride: rows x cols elements of dtype, each row
 * `pad` elements longer than needed; padding filled with a guard pattern. */
typedef struct mat {
    void *buf;
    coda_tensor_t t;
    int64_t bytes;
} mat_t;

static mat_t mat_new(coda_dtype_t dt, int64_t rows, int64_t cols, int64_t pad) {
    mat_t m;
    int64_t es = (int64_t)coda_dtype_size(dt), ld = cols + pad;
    if (ld == 0) ld = 1; /* a (rows, 0) matrix still needs a positive row stride */
    m.bytes = (rows * ld + 1) * es;
    m.buf = h_alloc((size_t)m.bytes);
    memset(m.buf, 0xA5, (size_t)m.bytes);
    m.t = coda_tensor_2d(m.buf, dt, rows, cols);
    m.t.stride[0] = ld * es;
    return m;
}
static double mat_get(const mat_t *m, int64_t i, int64_t j) {
    const char *p = (const char *)m->t.data + i * m->t.stride[0] + j * m->t.stride[1];
    if (m->t.dtype == CODA_BF16) return h_bf2f(*(const uint16_t *)p);
    return *(const float *)p;
}
static void mat_set(mat_t *m, int64_t i, int64_t j, float v) {
    char *p = (char *)m->t.data + i * m->t.stride[0] + j * m->t.stride[1];
    if (m->t.dtype == CODA_BF16) *(uint16_t *)p = h_f2bf(v);
    else *(float *)p = v;
}
static void mat_fill(mat_t *m, h_rng *r, float scale) {
    for (int64_t i = 0; i < m->t.shape[0]; i++)
        for (int64_t j = 0; j < m->t.shape[1]; j++) mat_set(m, i, j, rng_uniform(r) * scale);
}
static void mat_poison(mat_t *m) {
    for (int64_t i = 0; i < m->t.shape[0]; i++)
        for (int64_t j = 0; j < m->t.shape[1]; j++) mat_set(m, i, j, NAN);
}
/* The guard bytes between rows are 0xA5, as set by mat_new. */
static int mat_guard_ok(const mat_t *m) {
    int64_t es = (int64_t)coda_dtype_size(m->t.dtype), rowb = m->t.shape[1] * es;
    const unsigned char *p = m->buf;
    for (int64_t i = 0; i < m->t.shape[0]; i++)
        for (int64_t b = rowb; b < m->t.stride[0]; b++)
            if (p[i * m->t.stride[0] + b] != 0xA5) return 0;
    int64_t end = (m->t.shape[0] - 1) * m->t.stride[0] + rowb;
    if (m->t.shape[0] == 0) end = 0;
    for (int64_t b = end; b < m->bytes; b++)
        if (p[b] != 0xA5) return 0;
    return 1;
}

static coda_context_t *ctx_threads(int n) {
    coda_context_options_t o = {n, NULL};
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(&o, &ctx));
    return ctx;
}

typedef struct cfg {
    coda_layout_t layout;
    int64_t m, n, k;
    coda_dtype_t in_dt, out_dt;
    float alpha, beta;
    int pad;
} cfg_t;

static const char *lname(coda_layout_t l) { return l == CODA_LAYOUT_NT ? "NT" : l == CODA_LAYOUT_NN ? "NN" : "TN"; }

/* Runs one case; returns 1 if every check passed. */
static int run_case(coda_context_t *ctx, const cfg_t *c, uint64_t seed) {
    h_rng r = rng_new(seed);
    int64_t M = c->m, N = c->n, K = c->k;
    int64_t ar = c->layout == CODA_LAYOUT_TN ? K : M, ac = c->layout == CODA_LAYOUT_TN ? M : K;
    int64_t br = c->layout == CODA_LAYOUT_NT ? N : K, bc = c->layout == CODA_LAYOUT_NT ? K : N;
    mat_t A = mat_new(c->in_dt, ar, ac, c->pad), B = mat_new(c->in_dt, br, bc, c->pad * 3);
    mat_t C = mat_new(c->out_dt, M, N, c->pad * 2);
    mat_fill(&A, &r, 1.0f);
    mat_fill(&B, &r, 1.0f);
    if (c->beta == 0.0f) mat_poison(&C);
    else mat_fill(&C, &r, 1.0f);
    double *ref = h_alloc((size_t)(M * N + 1) * sizeof(double));
    double *bound = h_alloc((size_t)(M * N + 1) * sizeof(double));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = c->layout == CODA_LAYOUT_TN ? mat_get(&A, k, i) : mat_get(&A, i, k);
                double b = c->layout == CODA_LAYOUT_NT ? mat_get(&B, j, k) : mat_get(&B, k, j);
                s += a * b;
                sa += fabs(a * b);
            }
            double c0 = c->beta != 0.0f ? mat_get(&C, i, j) : 0.0;
            ref[i * N + j] = c->alpha * s + c->beta * c0;
            /* f32 summation over K terms, then the alpha/beta update, then the
             * output rounding (bf16: half an ulp, 2^-9 relative). */
            bound[i * N + j] = (K + 4) * 1.2e-7 * (fabs(c->alpha) * sa + fabs(c->beta * c0)) +
                               (c->out_dt == CODA_BF16 ? fabs(ref[i * N + j]) * (1.0 / 256) : 0) + 1e-30;
        }
    CHECK_OK(coda_gemm(ctx, c->layout, &A.t, &B.t, &C.t, c->alpha, c->beta, NULL));
    int64_t bad = 0, worst_i = -1;
    double worst = 0;
    for (int64_t i = 0; i < M * N; i++) {
        double o = mat_get(&C, i / N, i % N), e = fabs(o - ref[i]);
        if (!(e <= bound[i])) {
            bad++;
            if (!(e <= worst)) { worst = e; worst_i = i; }
        }
    }
    int ok = 1;
    CHECK(bad == 0,
          "%s M=%lld N=%lld K=%lld in=%s out=%s alpha=%g beta=%g pad=%d: %lld bad, worst at %lld: %g vs %g",
          lname(c->layout), (long long)M, (long long)N, (long long)K, coda_dtype_name(c->in_dt),
          coda_dtype_name(c->out_dt), c->alpha, c->beta, c->pad, (long long)bad, (long long)worst_i,
          worst_i >= 0 ? mat_get(&C, worst_i / N, worst_i % N) : 0.0, worst_i >= 0 ? ref[worst_i] : 0.0);
    ok &= bad == 0;
    int g = mat_guard_ok(&A) && mat_guard_ok(&B) && mat_guard_ok(&C);
    CHECK(g, "%s M=%lld N=%lld K=%lld: padding bytes changed", lname(c->layout), (long long)M,
          (long long)N, (long long)K);
    ok &= g;
    free(ref); free(bound); free(A.buf); free(B.buf); free(C.buf);
    return ok;
}

/* Same inputs, 1, 2 and 3 threads: identical bytes. */
static void check_thread_invariance(coda_layout_t layout) {
    int64_t M = 1000, N = 264, K = 200;
    h_rng r = rng_new(77 + layout);
    int64_t ar = layout == CODA_LAYOUT_TN ? K : M, ac = layout == CODA_LAYOUT_TN ? M : K;
    int64_t br = layout == CODA_LAYOUT_NT ? N : K, bc = layout == CODA_LAYOUT_NT ? K : N;
    mat_t A = mat_new(CODA_BF16, ar, ac, 0), B = mat_new(CODA_BF16, br, bc, 0);
    mat_fill(&A, &r, 1.0f);
    mat_fill(&B, &r, 1.0f);
    float *out[3];
    for (int t = 0; t < 3; t++) {
        coda_context_t *ctx = ctx_threads(t + 1);
        out[t] = h_alloc((size_t)(M * N) * sizeof(float));
        poison_f32(out[t], M * N);
        coda_tensor_t C = coda_tensor_2d(out[t], CODA_F32, M, N);
        CHECK_OK(coda_gemm(ctx, layout, &A.t, &B.t, &C, 1.0f, 0.0f, NULL));
        coda_context_free(ctx);
    }
    CHECK(memcmp(out[0], out[1], (size_t)(M * N) * 4) == 0, "%s: 1 and 2 threads differ", lname(layout));
    CHECK(memcmp(out[0], out[2], (size_t)(M * N) * 4) == 0, "%s: 1 and 3 threads differ", lname(layout));
    for (int t = 0; t < 3; t++) free(out[t]);
    free(A.buf); free(B.buf);
}

static void time_1024(coda_context_t *ctx) {
    int64_t n = 1024;
    h_rng r = rng_new(5);
    uint16_t *a = h_alloc((size_t)(n * n) * 2), *b = h_alloc((size_t)(n * n) * 2);
    float *c = h_alloc((size_t)(n * n) * 4);
    rng_fill_bf16(&r, a, n * n, 1.0f);
    rng_fill_bf16(&r, b, n * n, 1.0f);
    coda_tensor_t A = coda_tensor_2d(a, CODA_BF16, n, n), B = coda_tensor_2d(b, CODA_BF16, n, n),
                  C = coda_tensor_2d(c, CODA_F32, n, n);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(coda_gemm(ctx, CODA_LAYOUT_NT, &A, &B, &C, 1.0f, 0.0f, NULL));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("gemm 1024^3 NT bf16->f32: %.3f s (%.2f GFLOP/s)\n", s, 2.0 * n * n * n / s * 1e-9);
    /* spot-check a few elements against float64 */
    int bad = 0;
    for (int q = 0; q < 16; q++) {
        int64_t i = (q * 389) % n, j = (q * 631 + 7) % n;
        double ref = 0, sa = 0;
        for (int64_t k = 0; k < n; k++) {
            double p = (double)h_bf2f(a[i * n + k]) * h_bf2f(b[j * n + k]);
            ref += p; sa += fabs(p);
        }
        bad += !(fabs(c[i * n + j] - ref) <= 1030 * 1.2e-7 * sa);
    }
    CHECK(bad == 0, "1024^3: %d of 16 spot checks off", bad);
    free(a); free(b); free(c);
}

int main(void) {
    coda_context_t *ctx = ctx_threads(2);
    const coda_layout_t layouts[3] = {CODA_LAYOUT_NT, CODA_LAYOUT_NN, CODA_LAYOUT_TN};
    const int64_t ms[5] = {1, 7, 127, 128, 1000};
    const int64_t nk[][2] = {{72, 200}, {264, 40}, {136, 8}, {5, 3}, {1, 1}, {33, 0}};
    int n_cases = 0, n_ok = 0;
    uint64_t seed = 1;
    for (int l = 0; l < 3; l++)
        for (int mi = 0; mi < 5; mi++)
            for (int q = 0; q < 6; q++) {
                cfg_t c = {layouts[l], ms[mi], nk[q][0], nk[q][1], CODA_BF16, CODA_F32, 1.0f, 0.0f, 0};
                /* vary the other parameters across the grid */
                int v = (mi + q + l) % 4;
                if (v == 1) { c.out_dt = CODA_BF16; }
                if (v == 2) { c.alpha = 0.75f; c.beta = -1.25f; c.pad = 8; }
                if (v == 3) { c.out_dt = CODA_BF16; c.alpha = -2.0f; c.beta = 0.5f; c.pad = 3; }
                n_ok += run_case(ctx, &c, seed++);
                n_cases++;
            }
    /* f32 inputs (CPU only), and beta = 0 with padded strides and NaN in C */
    for (int l = 0; l < 3; l++) {
        cfg_t c = {layouts[l], 127, 72, 136, CODA_F32, CODA_F32, 1.5f, 0.0f, 5};
        n_ok += run_case(ctx, &c, seed++);
        cfg_t d = {layouts[l], 1000, 136, 264, CODA_F32, CODA_BF16, 1.0f, 1.0f, 1};
        n_ok += run_case(ctx, &d, seed++);
        n_cases += 2;
    }
    printf("gemm cases: %d of %d passed\n", n_ok, n_cases);
    for (int l = 0; l < 3; l++) check_thread_invariance(layouts[l]);
    time_1024(ctx);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
