/* test_gemm_gpu.c - the CUDA GEMM against the CPU reference, every layout.
 *
 *   test_gemm_gpu          full suite (every tile configuration)
 *   test_gemm_gpu small    a few small shapes (for compute-sanitizer)
 *
 * Fresh random data for every case, outputs poisoned with NaN before the
 * run. The error versus a float64 reference must be within twice the error of
 * the CPU backend's (docs/testing.md). Needs an sm_90a GPU. */
#include "harness.h"

#include <pthread.h>

#include "gpu/cuda_check.h"
#include "cuda/backend.h" /* CODA_CUDA_GEMM_NCFG */
#include "tuning.h"


static coda_context_t *ctx;
static uint64_t seed = 1;
static const char *lname[3] = {"NT", "NN", "TN"};

/* Row length rounded up to 8 elements (16 bytes), at least 8: a (rows, 0)
 * operand still needs a positive stride. */
static int64_t round8(int64_t x) { return x > 0 ? (x + 7) / 8 * 8 : 8; }

/* float64 reference: ref = alpha * op(A) op(B) + beta * C0, from bf16 bits. */
static void reference(coda_layout_t layout, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                      int64_t lda, const uint16_t *b, int64_t ldb, const double *c0, double alpha,
                      double beta, double *ref) {
    double *row = h_alloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) row[j] = 0;
        for (int64_t p = 0; p < k; p++) {
            double av = layout == CODA_LAYOUT_TN ? h_bf2f(a[p * lda + i]) : h_bf2f(a[i * lda + p]);
            if (av == 0) continue;
            if (layout == CODA_LAYOUT_NT)
                for (int64_t j = 0; j < n; j++) row[j] += av * h_bf2f(b[j * ldb + p]);
            else
                for (int64_t j = 0; j < n; j++) row[j] += av * h_bf2f(b[p * ldb + j]);
        }
        for (int64_t j = 0; j < n; j++)
            ref[i * n + j] = alpha * row[j] + (beta != 0 ? beta * c0[i * n + j] : 0);
    }
    free(row);
}

/* One case: returns 1 if it passed. */
static int run_case(coda_layout_t layout, int64_t m, int64_t n, int64_t k, coda_dtype_t cdt,
                    float alpha, float beta, int cfg) {
    h_rng r = rng_new(seed++);
    /* Stored shapes; row strides padded to 16 bytes where the extent is not. */
    int64_t ar = layout == CODA_LAYOUT_TN ? k : m, ac = layout == CODA_LAYOUT_TN ? m : k;
    int64_t br = layout == CODA_LAYOUT_NT ? n : k, bc = layout == CODA_LAYOUT_NT ? k : n;
    int64_t lda = round8(ac), ldb = round8(bc);
    size_t esz = coda_dtype_size(cdt);
    int64_t ldc = cdt == CODA_F32 ? (n + 3) / 4 * 4 : round8(n);
    uint16_t *ha = h_alloc(2 * (size_t)(ar * lda)), *hb = h_alloc(2 * (size_t)(br * ldb));
    rng_fill_bf16(&r, ha, ar * lda, 1.0f);
    rng_fill_bf16(&r, hb, br * ldb, 1.0f);
    void *hc0 = h_alloc(esz * (size_t)(m * ldc)), *hc = h_alloc(esz * (size_t)(m * ldc));
    if (cdt == CODA_F32) rng_fill_f32(&r, hc0, m * ldc, 1.0f);
    else rng_fill_bf16(&r, hc0, m * ldc, 1.0f);
    if (beta == 0) { /* C must not be read: poison it */
        if (cdt == CODA_F32) poison_f32(hc0, m * ldc);
        else poison_bf16(hc0, m * ldc);
    }
    void *da, *db, *dc;
    CUDA_OK(cudaMalloc(&da, 2 * (size_t)(ar * lda) + 16));
    CUDA_OK(cudaMalloc(&db, 2 * (size_t)(br * ldb) + 16));
    CUDA_OK(cudaMalloc(&dc, esz * (size_t)(m * ldc) + 16));
    CUDA_OK(cudaMemcpy(da, ha, 2 * (size_t)(ar * lda), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, hb, 2 * (size_t)(br * ldb), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dc, hc0, esz * (size_t)(m * ldc), cudaMemcpyHostToDevice));

    coda_tensor_t A = coda_tensor_2d(da, CODA_BF16, ar, ac), B = coda_tensor_2d(db, CODA_BF16, br, bc);
    coda_tensor_t C = coda_tensor_2d(dc, cdt, m, n);
    A.stride[0] = 2 * lda;
    B.stride[0] = 2 * ldb;
    C.stride[0] = (int64_t)esz * ldc;
    A.device = B.device = C.device = CODA_DEVICE_CUDA;
    tune_cfg(ctx, cfg);
    coda_status_t s = coda_gemm(ctx, layout, &A, &B, &C, alpha, beta, NULL);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(hc, dc, esz * (size_t)(m * ldc), cudaMemcpyDeviceToHost));
    int same_bits = 1;
    if (beta == 0 && s == CODA_OK) { /* a second run gives the same bits (stream-K's sums too) */
        void *again = h_alloc(esz * (size_t)(m * ldc));
        CUDA_OK(cudaMemset(dc, 0xff, esz * (size_t)(m * ldc)));
        s = coda_gemm(ctx, layout, &A, &B, &C, alpha, beta, NULL);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(again, dc, esz * (size_t)(m * ldc), cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < m && same_bits; i++)
            same_bits = memcmp((char *)hc + esz * (size_t)(i * ldc), (char *)again + esz * (size_t)(i * ldc),
                               esz * (size_t)n) == 0;
        free(again);
    }
    tune_cfg(ctx, -1);

    /* CPU backend on the same data: the baseline error. */
    void *hcpu = h_alloc(esz * (size_t)(m * ldc));
    memcpy(hcpu, hc0, esz * (size_t)(m * ldc));
    coda_tensor_t Ah = A, Bh = B, Ch = C;
    Ah.data = ha; Bh.data = hb; Ch.data = hcpu;
    Ah.device = Bh.device = Ch.device = CODA_DEVICE_CPU;
    coda_status_t scpu = coda_gemm(ctx, layout, &Ah, &Bh, &Ch, alpha, beta, NULL);

    double *c0 = h_alloc(sizeof(double) * (size_t)(m * n)), *ref = h_alloc(sizeof(double) * (size_t)(m * n));
    float *out = h_alloc(sizeof(float) * (size_t)(m * n)), *cpu = h_alloc(sizeof(float) * (size_t)(m * n));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int64_t x = i * ldc + j;
            c0[i * n + j] = cdt == CODA_F32 ? ((float *)hc0)[x] : h_bf2f(((uint16_t *)hc0)[x]);
            out[i * n + j] = cdt == CODA_F32 ? ((float *)hc)[x] : h_bf2f(((uint16_t *)hc)[x]);
            cpu[i * n + j] = cdt == CODA_F32 ? ((float *)hcpu)[x] : h_bf2f(((uint16_t *)hcpu)[x]);
        }
    reference(layout, m, n, k, ha, lda, hb, ldb, c0, alpha, beta, ref);
    double err = rel_err_f32(out, ref, m * n), base = rel_err_f32(cpu, ref, m * n);
    /* f32 output: the CPU's error is f32 rounding alone; allow the tensor
     * cores' own f32 accumulation order 1e-5 on top. */
    double tol = 2 * base + (cdt == CODA_F32 ? 1e-5 : 1e-6);
    int ok = s == CODA_OK && scpu == CODA_OK && err <= tol && same_bits;
    CHECK(same_bits, "%s M=%lld N=%lld K=%lld cfg=%d: a second run gave different bits", lname[layout],
          (long long)m, (long long)n, (long long)k, cfg);
    CHECK(s == CODA_OK, "%s M=%lld N=%lld K=%lld: %s", lname[layout], (long long)m, (long long)n,
          (long long)k, coda_last_error());
    CHECK(scpu == CODA_OK, "CPU reference: %s", coda_last_error());
    CHECK(err <= tol, "%s M=%lld N=%lld K=%lld %s a=%g b=%g cfg=%d: err %.3g > tol %.3g (cpu %.3g)",
          lname[layout], (long long)m, (long long)n, (long long)k, coda_dtype_name(cdt), alpha, beta,
          cfg, err, tol, base);
    printf("%-2s M=%-6lld N=%-5lld K=%-5lld %-4s alpha=%-4g beta=%-4g cfg=%-2d%s err %.2e (cpu %.2e) %s\n",
           lname[layout], (long long)m, (long long)n, (long long)k, coda_dtype_name(cdt), alpha,
           beta, cfg,
           coda__get_tuning(ctx).streamk == CODA_STREAMK_ON      ? " stream-K"
           : coda__get_tuning(ctx).streamk == CODA_STREAMK_SPLIT ? " split tail"
                                                                 : "",
           err, base, ok ? "ok" : "FAIL");
    free(ha); free(hb); free(hc0); free(hc); free(hcpu); free(c0); free(ref); free(out); free(cpu);
    CUDA_OK(cudaFree(da));
    CUDA_OK(cudaFree(db));
    CUDA_OK(cudaFree(dc));
    return ok;
}

/* Bad arguments: clear errors, C untouched. */
static void bad_args(void) {
    void *da, *db, *dc;
    CUDA_OK(cudaMalloc(&da, 1 << 20));
    CUDA_OK(cudaMalloc(&db, 1 << 20));
    CUDA_OK(cudaMalloc(&dc, 1 << 20));
    CUDA_OK(cudaMemset(dc, 0x7f, 1 << 20));
    coda_tensor_t A = coda_tensor_2d(da, CODA_BF16, 64, 12), B = coda_tensor_2d(db, CODA_BF16, 64, 12);
    coda_tensor_t C = coda_tensor_2d(dc, CODA_BF16, 64, 64);
    A.device = B.device = C.device = CODA_DEVICE_CUDA;
    /* K = 12 with 16-byte rows (padded stride): K % 8 */
    A.stride[0] = B.stride[0] = 32;
    CHECK_STATUS(coda_gemm(ctx, CODA_LAYOUT_NT, &A, &B, &C, 1, 0, NULL), CODA_ERR_SHAPE);
    CHECK(strstr(coda_last_error(), "multiple of 8") != NULL, "K message: %s", coda_last_error());
    /* misaligned pointer */
    A = coda_tensor_2d((char *)da + 2, CODA_BF16, 64, 16);
    B = coda_tensor_2d(db, CODA_BF16, 64, 16);
    A.device = B.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_gemm(ctx, CODA_LAYOUT_NT, &A, &B, &C, 1, 0, NULL), CODA_ERR_STRIDE);
    CHECK(strstr(coda_last_error(), "aligned") != NULL, "align message: %s", coda_last_error());
    /* row stride not a multiple of 16 bytes */
    A = coda_tensor_2d(da, CODA_BF16, 64, 16);
    A.device = CODA_DEVICE_CUDA;
    A.stride[0] = 40;
    CHECK_STATUS(coda_gemm(ctx, CODA_LAYOUT_NT, &A, &B, &C, 1, 0, NULL), CODA_ERR_STRIDE);
    CHECK(strstr(coda_last_error(), "stride") != NULL, "stride message: %s", coda_last_error());
    /* NN with N = 60: B (K, 60) rows of 120 bytes */
    A = coda_tensor_2d(da, CODA_BF16, 64, 16);
    B = coda_tensor_2d(db, CODA_BF16, 16, 60);
    coda_tensor_t C60 = coda_tensor_2d(dc, CODA_BF16, 64, 60);
    C60.stride[0] = 128;
    A.device = B.device = C60.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_gemm(ctx, CODA_LAYOUT_NN, &A, &B, &C60, 1, 0, NULL), CODA_ERR_STRIDE);
    /* C misaligned */
    B = coda_tensor_2d(db, CODA_BF16, 64, 16);
    B.device = CODA_DEVICE_CUDA;
    coda_tensor_t Cm = coda_tensor_2d((char *)dc + 4, CODA_BF16, 64, 64);
    Cm.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_gemm(ctx, CODA_LAYOUT_NT, &A, &B, &Cm, 1, 0, NULL), CODA_ERR_STRIDE);
    /* a host pointer in a CUDA descriptor */
    static uint16_t host[64 * 16] __attribute__((aligned(16)));
    coda_tensor_t Ah = coda_tensor_2d(host, CODA_BF16, 64, 16);
    Ah.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_gemm(ctx, CODA_LAYOUT_NT, &Ah, &B, &C, 1, 0, NULL), CODA_ERR_DEVICE);
    /* f32 operands are CPU-only */
    coda_tensor_t Af = coda_tensor_2d(da, CODA_F32, 64, 16);
    Af.device = CODA_DEVICE_CUDA;
    coda_status_t s = coda_gemm(ctx, CODA_LAYOUT_NT, &Af, &B, &C, 1, 0, NULL);
    CHECK(s == CODA_ERR_DTYPE, "f32 operand on CUDA -> %s: %s", coda_status_name(s), coda_last_error());
    /* nothing was written */
    CUDA_OK(cudaDeviceSynchronize());
    unsigned char *h = h_alloc(1 << 20);
    CUDA_OK(cudaMemcpy(h, dc, 1 << 20, cudaMemcpyDeviceToHost));
    int untouched = 1;
    for (int i = 0; i < 1 << 20; i++) untouched &= h[i] == 0x7f;
    CHECK(untouched, "C untouched by failing calls");
    free(h);
    CUDA_OK(cudaFree(da));
    CUDA_OK(cudaFree(db));
    CUDA_OK(cudaFree(dc));
}

/* The split tail (src/cuda/gemm.c, coda__cuda_streamk_split) on
 * configuration 3 with the clusters capped, so that small problems have a
 * partial wave: each case is checked against float64 by run_case (and
 * run twice for the same bits), and its bits must differ from the GEMM
 * without stream-K (else the split did not run). The cases: 8 units on 6
 * clusters (S = 3), 2 x 49 k-blocks in ranges of 17, the last capped at
 * 13, one crossing from the first unit into the second; 9 units on 8 clusters
 * (S = 4), 64 k-blocks in 4 aligned ranges of 16, 4 clusters without a
 * range; 12 units on 8 clusters (S = 2), TN with f32 output and beta,
 * 4 x 33 k-blocks in ranges of 17. */
static void split_tail(void) {
    static const struct { coda_layout_t l; int64_t m, n, k; int clusters; coda_dtype_t c; float beta; } cases[] = {
        {CODA_LAYOUT_NT, 512, 1024, 3104, 6, CODA_BF16, 0.0f},
        {CODA_LAYOUT_NT, 768, 760, 4096, 8, CODA_BF16, 0.0f},
        {CODA_LAYOUT_TN, 1000, 520, 2104, 8, CODA_F32, 1.5f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t m = cases[c].m, n = cases[c].n, k = cases[c].k;
        tune_clusters(ctx, cases[c].clusters);
        tune_streamk(ctx, CODA_STREAMK_SPLIT);
        run_case(cases[c].l, m, n, k, cases[c].c, 1.0f, cases[c].beta, 3);
        /* did it run: the same operands with and without the split */
        h_rng r = rng_new(seed++);
        const int64_t ar = cases[c].l == CODA_LAYOUT_TN ? k : m, br = cases[c].l == CODA_LAYOUT_NT ? n : k;
        size_t abytes = 2 * (size_t)(m * k), bbytes = 2 * (size_t)(n * k), cbytes = 2 * (size_t)(m * n);
        uint16_t *ha = h_alloc(abytes), *hb = h_alloc(bbytes), *c1 = h_alloc(cbytes), *c2 = h_alloc(cbytes);
        rng_fill_bf16(&r, ha, m * k, 1.0f);
        rng_fill_bf16(&r, hb, n * k, 1.0f);
        void *da, *db, *dc;
        CUDA_OK(cudaMalloc(&da, abytes));
        CUDA_OK(cudaMalloc(&db, bbytes));
        CUDA_OK(cudaMalloc(&dc, cbytes));
        CUDA_OK(cudaMemcpy(da, ha, abytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(db, hb, bbytes, cudaMemcpyHostToDevice));
        coda_tensor_t A = coda_tensor_2d(da, CODA_BF16, ar, m * k / ar);
        coda_tensor_t B = coda_tensor_2d(db, CODA_BF16, br, n * k / br);
        coda_tensor_t C = coda_tensor_2d(dc, CODA_BF16, m, n);
        A.device = B.device = C.device = CODA_DEVICE_CUDA;
        tune_cfg(ctx, 3);
        CHECK_OK(coda_gemm(ctx, cases[c].l, &A, &B, &C, 1.0f, 0.0f, NULL));
        CUDA_OK(cudaMemcpy(c1, dc, cbytes, cudaMemcpyDeviceToHost));
        tune_streamk(ctx, CODA_STREAMK_OFF);
        CHECK_OK(coda_gemm(ctx, cases[c].l, &A, &B, &C, 1.0f, 0.0f, NULL));
        CUDA_OK(cudaMemcpy(c2, dc, cbytes, cudaMemcpyDeviceToHost));
        CHECK(memcmp(c1, c2, cbytes) != 0, "split tail, %lld x %lld x %lld on %d clusters: the same bits as "
              "without stream-K (did it run?)", (long long)m, (long long)n, (long long)k, cases[c].clusters);
        tune_cfg(ctx, -1);
        free(ha); free(hb); free(c1); free(c2);
        CUDA_OK(cudaFree(da));
        CUDA_OK(cudaFree(db));
        CUDA_OK(cudaFree(dc));
    }
    tune_streamk(ctx, CODA_STREAMK_AUTO);
    tune_clusters(ctx, 0);
}

/* The stream-K tests' common part: random A (m, k), B (n, k) bf16, nc
 * output buffers C (m, n) poisoned with 0xff, configuration 1 (128 x 128
 * tiles: a partial wave for stream-K) and what an NT GEMM gives on the
 * default stream alone, with stream-K forced on (want_sk) and off
 * (want_dp); stream-K is left on. */
enum { SK_MAX_C = 12 };
typedef struct {
    size_t cbytes;
    void *da, *db, *dc[SK_MAX_C];
    coda_tensor_t a, b, c[SK_MAX_C];
    int nc;
    uint16_t *got, *want_sk, *want_dp;
} sk_case_t;

static void sk_case_make(sk_case_t *t, int64_t m, int64_t n, int64_t k, int nc) {
    h_rng r = rng_new(seed++);
    size_t abytes = 2 * (size_t)(m * k), bbytes = 2 * (size_t)(n * k);
    uint16_t *ha = h_alloc(abytes), *hb = h_alloc(bbytes);
    t->cbytes = 2 * (size_t)(m * n);
    t->nc = nc;
    t->got = h_alloc(t->cbytes);
    t->want_sk = h_alloc(t->cbytes);
    t->want_dp = h_alloc(t->cbytes);
    rng_fill_bf16(&r, ha, m * k, 1.0f);
    rng_fill_bf16(&r, hb, n * k, 1.0f);
    CUDA_OK(cudaMalloc(&t->da, abytes));
    CUDA_OK(cudaMalloc(&t->db, bbytes));
    CUDA_OK(cudaMemcpy(t->da, ha, abytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(t->db, hb, bbytes, cudaMemcpyHostToDevice));
    free(ha);
    free(hb);
    t->a = coda_tensor_2d(t->da, CODA_BF16, m, k);
    t->b = coda_tensor_2d(t->db, CODA_BF16, n, k);
    t->a.device = t->b.device = CODA_DEVICE_CUDA;
    for (int i = 0; i < nc; i++) {
        CUDA_OK(cudaMalloc(&t->dc[i], t->cbytes));
        CUDA_OK(cudaMemset(t->dc[i], 0xff, t->cbytes));
        t->c[i] = coda_tensor_2d(t->dc[i], CODA_BF16, m, n);
        t->c[i].device = CODA_DEVICE_CUDA;
    }
    tune_cfg_str(ctx, "1");
    tune_streamk(ctx, CODA_STREAMK_OFF);
    CHECK_OK(coda_gemm(ctx, CODA_LAYOUT_NT, &t->a, &t->b, &t->c[0], 1.0f, 0.0f, NULL));
    CUDA_OK(cudaMemcpy(t->want_dp, t->dc[0], t->cbytes, cudaMemcpyDeviceToHost));
    tune_streamk(ctx, CODA_STREAMK_ON);
    CHECK_OK(coda_gemm(ctx, CODA_LAYOUT_NT, &t->a, &t->b, &t->c[0], 1.0f, 0.0f, NULL));
    CUDA_OK(cudaMemcpy(t->want_sk, t->dc[0], t->cbytes, cudaMemcpyDeviceToHost));
    CHECK(memcmp(t->want_sk, t->want_dp, t->cbytes) != 0, "stream-K forced on changed no bit (did it run?)");
    CUDA_OK(cudaMemset(t->dc[0], 0xff, t->cbytes));
}

static void sk_case_free(sk_case_t *t) {
    tune_streamk(ctx, CODA_STREAMK_AUTO);
    tune_cfg(ctx, -1);
    for (int i = 0; i < t->nc; i++) CUDA_OK(cudaFree(t->dc[i]));
    CUDA_OK(cudaFree(t->da));
    CUDA_OK(cudaFree(t->db));
    free(t->got);
    free(t->want_sk);
    free(t->want_dp);
}

/* Stream-K on more streams than there are workspaces (8): the GEMMs of
 * twelve streams, launched without waiting, twice over (the second round
 * finds every workspace idle and hands them to the new streams). Each
 * result is bit for bit the GEMM run alone on the default stream, with
 * stream-K (a workspace was free) or without (every one busy). */
static void many_streams(void) {
    enum { NS = 12 };
    sk_case_t t;
    sk_case_make(&t, 1500, 1800, 264, NS);
    int n_sk[2] = {0, 0}, n_dp[2] = {0, 0};
    for (int round = 0; round < 2; round++) {
        cudaStream_t st[NS];
        for (int i = 0; i < NS; i++) CUDA_OK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
        for (int i = 0; i < NS; i++) CHECK_OK(coda_gemm(ctx, CODA_LAYOUT_NT, &t.a, &t.b, &t.c[i], 1.0f, 0.0f, st[i]));
        CUDA_OK(cudaDeviceSynchronize());
        for (int i = 0; i < NS; i++) {
            CUDA_OK(cudaMemcpy(t.got, t.dc[i], t.cbytes, cudaMemcpyDeviceToHost));
            int sk = memcmp(t.got, t.want_sk, t.cbytes) == 0, dp = memcmp(t.got, t.want_dp, t.cbytes) == 0;
            CHECK(sk || dp, "stream %d of %d (round %d): neither the stream-K nor the plain result", i, NS, round);
            n_sk[round] += sk;
            n_dp[round] += dp;
            CUDA_OK(cudaMemset(t.dc[i], 0xff, t.cbytes));
            CUDA_OK(cudaStreamDestroy(st[i]));
        }
    }
    /* round 2 starts with 8 idle workspaces (plus the default stream's) */
    CHECK(n_sk[1] >= 8, "round 2: only %d of %d streams ran stream-K", n_sk[1], NS);
    printf("stream-K on %d streams: round 1 %d stream-K + %d without, round 2 %d + %d, each bit for bit\n", NS,
           n_sk[0], n_dp[0], n_sk[1], n_dp[1]);
    sk_case_free(&t);
}

/* Two host threads taking turns at the context (a mutex: coda.h's rule),
 * each launching stream-K GEMMs on its own per-thread default stream
 * without waiting, so that the two threads' GEMMs run at once. Both pass
 * the one handle cudaStreamPerThread, which names two streams: each must
 * get a stream-K workspace of its own (slots keyed by the handle shared
 * one, and an owner could add the other stream's partial sums, or wait
 * forever on a flag the other cleared: a review). Each thread's result is
 * bit for bit the stream-K GEMM alone (so stream-K ran on both), and right
 * after each of its GEMMs a workspace slot is keyed by its own stream's id
 * (cudaStreamGetId), the two ids differing: the check that fails at once
 * with slots keyed by the handle, however the two threads' GEMMs happen to
 * overlap. */
typedef struct {
    pthread_mutex_t *mu;
    const coda_tensor_t *a, *b;
    coda_tensor_t c;
    int reps;
    coda_status_t st;
    char why[256]; /* the worker's coda_last_error (it is per thread) */
    cudaError_t sync;
    unsigned long long id; /* this thread's per-thread stream's id */
    int unkeyed;           /* GEMMs after which no slot had that id */
} pts_job_t;

/* Is a stream-K workspace slot of device 0 keyed by stream id `id`? */
static int sk_slot_keyed(unsigned long long id) {
    coda_cuda_device_t *d;
    if (coda__cuda_device(ctx, 0, &d) != CODA_OK) return 0;
    for (int i = 0; i < CODA_CUDA_SK_STREAMS; i++)
        if (d->sk_ws[i].part && d->sk_ws[i].key == id) return 1;
    return 0;
}

static void *pts_worker(void *arg) {
    pts_job_t *j = arg;
    j->sync = cudaStreamGetId(cudaStreamPerThread, &j->id);
    for (int i = 0; i < j->reps && j->st == CODA_OK && j->sync == cudaSuccess; i++) {
        pthread_mutex_lock(j->mu);
        j->st = coda_gemm(ctx, CODA_LAYOUT_NT, j->a, j->b, &j->c, 1.0f, 0.0f, cudaStreamPerThread);
        if (j->st != CODA_OK) snprintf(j->why, sizeof j->why, "%s", coda_last_error());
        else j->unkeyed += !sk_slot_keyed(j->id);
        pthread_mutex_unlock(j->mu);
    }
    if (j->sync != cudaSuccess) return NULL;
    j->sync = cudaStreamSynchronize(cudaStreamPerThread);
    return NULL;
}

static void per_thread_streams(void) {
    sk_case_t t;
    sk_case_make(&t, 1500, 1800, 2056, 2);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pts_job_t job[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        job[i] = (pts_job_t){&mu, &t.a, &t.b, t.c[i], 40, CODA_OK, "", cudaSuccess, 0, 0};
        CHECK(pthread_create(&th[i], NULL, pts_worker, &job[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECK(job[i].st == CODA_OK, "per-thread stream, thread %d: %s: %s", i, coda_status_name(job[i].st),
              job[i].why);
        CHECK(job[i].sync == cudaSuccess, "per-thread stream, thread %d: %s", i, cudaGetErrorString(job[i].sync));
        CHECK(job[i].unkeyed == 0, "per-thread stream, thread %d: after %d of its %d GEMMs no stream-K slot had its "
              "stream's id %llu", i, job[i].unkeyed, job[i].reps, job[i].id);
        CUDA_OK(cudaMemcpy(t.got, t.dc[i], t.cbytes, cudaMemcpyDeviceToHost));
        CHECK(memcmp(t.got, t.want_sk, t.cbytes) == 0, "per-thread stream, thread %d: not the stream-K GEMM's bits",
              i);
    }
    CHECK(job[0].id != job[1].id, "the two threads' per-thread streams have one id, %llu", job[0].id);
    printf("stream-K on two threads' per-thread default streams, 40 GEMMs each at once: each bit for bit\n");
    sk_case_free(&t);
}

int main(int argc, char **argv) {
    int small = argc > 1 && strcmp(argv[1], "small") == 0;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    char desc[2048];
    REQUIRE_OK(coda_context_describe(ctx, desc, sizeof desc));
    printf("%s", desc);
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    if (small) {
        for (int l = 0; l < 3; l++) {
            run_case((coda_layout_t)l, 130, 264, 200, CODA_BF16, 1.0f, 0.0f, -1);
            run_case((coda_layout_t)l, 257, 136, 72, CODA_F32, 0.5f, 1.5f, 0);
            run_case((coda_layout_t)l, 300, 392, 136, CODA_BF16, 1.0f, 0.25f, 2);
            run_case((coda_layout_t)l, 700, 136, 520, CODA_F32, 1.0f, 0.0f, 3);
            /* ping-pong: several tiles per warpgroup */
            run_case((coda_layout_t)l, 1000, 392, 200, CODA_BF16, 1.0f, 0.0f, 4);
            run_case((coda_layout_t)l, 1000, 392, 136, CODA_F32, 0.5f, 1.5f, 5);
        }
        /* stream-K (one partial wave and a whole one shared out by k-blocks) */
        tune_streamk(ctx, CODA_STREAMK_ON);
        run_case(CODA_LAYOUT_NT, 1500, 1800, 264, CODA_BF16, 1.0f, 0.0f, 1);
        run_case(CODA_LAYOUT_TN, 4096, 1300, 520, CODA_F32, 0.5f, 1.5f, 3);
        tune_streamk(ctx, CODA_STREAMK_AUTO);
        split_tail();
        many_streams();
        per_thread_streams();
        bad_args();
        TEST_MAIN_END();
    }
    /* every layout, every configuration, M in {1, 127, 1000, 4096, 16384},
     * N and K not multiples of the tile (N odd where the layout allows) */
    static const int64_t shapes[][3] = {
        {1, 264, 136},    {127, 520, 1000}, {1000, 392, 264}, {4096, 520, 256},
        {16384, 264, 136}, {128, 256, 64},  {300, 200, 8},    {777, 1544, 520},
    };
    int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int cfg = -1; cfg < CODA_CUDA_GEMM_NCFG; cfg++)
        for (int l = 0; l < 3; l++)
            for (int i = 0; i < nshapes; i++) {
                if (cfg >= 0 && shapes[i][0] > 4096) continue; /* big M: default config only */
                run_case((coda_layout_t)l, shapes[i][0], shapes[i][1], shapes[i][2], CODA_BF16,
                         1.0f, 0.0f, cfg);
            }
    for (int l = 0; l < 3; l++) {
        /* f32 output, alpha/beta, odd N (NT: B is (N, K) so any N works) */
        run_case((coda_layout_t)l, 1000, 392, 264, CODA_F32, 1.0f, 0.0f, -1);
        run_case((coda_layout_t)l, 1000, 392, 264, CODA_F32, -0.5f, 2.0f, -1);
        run_case((coda_layout_t)l, 1000, 392, 264, CODA_BF16, 2.0f, -1.0f, -1);
        run_case((coda_layout_t)l, 1000, 392, 264, CODA_BF16, -0.5f, 0.0f, -1); /* alpha alone */
        run_case((coda_layout_t)l, 513, 1000, 1032, CODA_F32, 0.75f, 0.5f, 1);
    }
    /* stream-K, forced on: the last partial wave and one whole wave of units
     * are shared out by k-blocks (on 132 SMs: 144, 180 and 72 units of
     * configurations 0, 1 and 2/3, so no whole units first); odd N, K not a
     * multiple of 64, f32 output with beta, every layout. Then whole units
     * before the tail (144 tile pairs on 66 clusters: 66 whole), and the
     * default rule on a shape where it picks stream-K itself (1088 units of
     * configuration 1 on 132 SMs: 8.2 waves, 924 whole units). */
    tune_streamk(ctx, CODA_STREAMK_ON);
    for (int l = 0; l < 3; l++) {
        run_case((coda_layout_t)l, 1152, 4000, 264, CODA_BF16, 1.0f, 0.0f, 0);
        run_case((coda_layout_t)l, 1500, 1800, 264, CODA_BF16, 1.0f, 0.0f, 1);
        run_case((coda_layout_t)l, 2304, 2040, 264, CODA_BF16, 1.0f, 0.0f, 2);
        run_case((coda_layout_t)l, 2304, 2040, 264, CODA_F32, 0.5f, 1.5f, 3);
    }
    run_case(CODA_LAYOUT_NT, 1152, 4001, 264, CODA_BF16, 1.0f, 0.0f, 0);
    run_case(CODA_LAYOUT_TN, 4096, 2304, 264, CODA_BF16, 1.0f, 0.0f, 3);
    tune_streamk(ctx, CODA_STREAMK_AUTO);
    run_case(CODA_LAYOUT_NT, 4096, 4352, 200, CODA_BF16, 1.0f, 0.0f, 1);
    run_case(CODA_LAYOUT_NT, 1000, 13, 264, CODA_BF16, 1.0f, 0.5f, -1);
    run_case(CODA_LAYOUT_NT, 1000, 301, 264, CODA_F32, 1.0f, 0.0f, -1);
    run_case(CODA_LAYOUT_TN, 1, 8, 8, CODA_BF16, 1.0f, 0.0f, -1);
    split_tail();
    /* K = 0: C = beta C */
    run_case(CODA_LAYOUT_NT, 100, 64, 0, CODA_BF16, 1.0f, 0.5f, -1);
    run_case(CODA_LAYOUT_TN, 100, 64, 0, CODA_F32, 1.0f, 2.0f, -1);
    many_streams();
    per_thread_streams();
    bad_args();

    /* a second context with the same cache directory loads cubins from disk */
    coda_context_t *ctx2;
    REQUIRE_OK(coda_context_create(NULL, &ctx2));
    coda_context_t *keep = ctx;
    ctx = ctx2;
    run_case(CODA_LAYOUT_NT, 256, 256, 64, CODA_BF16, 1.0f, 0.0f, -1);
    ctx = keep;
    coda_context_free(ctx2);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
