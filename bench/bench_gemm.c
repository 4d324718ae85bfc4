/* bench_gemm.c - coda's CUDA GEMM against cuBLAS, in the same process.
 *
 *   bench_gemm             square shapes and the LLaMA-3-8B layer GEMMs
 *   bench_gemm sweep       also time every tile configuration (the pick table)
 *   bench_gemm variants    configurations side by side, each against cuBLAS
 *                          run by run (CODA_VARIANTS="3- 3s 3p": cfg 3 without
 *                          stream-K, with the tail forced, with the split tail
 *                          forced; CODA_BENCH_ONLY: see main)
 *   CODA_BENCH_ONLY=sq2048.NT bench_gemm   only the shapes whose "name.layout"
 *                          contains that text (quick A/B runs, Nsight Compute)
 *
 * bf16 inputs, f32 accumulation, bf16 output. CUDA events around each run,
 * 10 warm-up runs, median of 50 timed runs, coda and cuBLAS interleaved run
 * by run (same clocks for both); input sets rotated when one set fits in L2. Random inputs (never zeros). Each shape's coda output is
 * checked against cuBLAS's (relative norm error on a sample of rows). */
#include "harness.h"

#include <cublas_v2.h>
#include "gpu/cuda_check.h"
#include "cuda/backend.h" /* CODA_CUDA_GEMM_NCFG */
#include "tuning.h"

#define CUBLAS_OK(call)                                                                   \
    do {                                                                                  \
        cublasStatus_t s_ = (call);                                                       \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "FATAL %s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__,    \
                    #call, (int)s_);                                                      \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define WARMUP 10
#define RUNS 50
#define MAX_SETS 8

static coda_context_t *ctx;
static cublasHandle_t blas;
static uint16_t *noise; /* 16M random bf16 values, tiled into device buffers */
#define NOISE_N (16 << 20)

static void *dev_random(size_t elems) {
    void *p;
    CUDA_OK(cudaMalloc(&p, elems * 2));
    for (size_t off = 0; off < elems; off += NOISE_N) {
        size_t n = elems - off < NOISE_N ? elems - off : NOISE_N;
        /* shift the source so tiles differ */
        size_t shift = (off / NOISE_N * 7919) % (NOISE_N / 2);
        if (n > NOISE_N - shift) shift = 0;
        CUDA_OK(cudaMemcpy((uint16_t *)p + off, noise + shift, n * 2, cudaMemcpyHostToDevice));
    }
    return p;
}

typedef struct {
    const char *name;
    coda_layout_t layout;
    int64_t m, n, k;
} shape_t;

typedef struct {
    void *a[MAX_SETS], *b[MAX_SETS], *c[MAX_SETS];
    int sets;
} bufs_t;

static void run_coda(const shape_t *s, bufs_t *bf, int i) {
    int64_t ar = s->layout == CODA_LAYOUT_TN ? s->k : s->m, ac = s->layout == CODA_LAYOUT_TN ? s->m : s->k;
    int64_t br = s->layout == CODA_LAYOUT_NT ? s->n : s->k, bc = s->layout == CODA_LAYOUT_NT ? s->k : s->n;
    coda_tensor_t A = coda_tensor_2d(bf->a[i], CODA_BF16, ar, ac);
    coda_tensor_t B = coda_tensor_2d(bf->b[i], CODA_BF16, br, bc);
    coda_tensor_t C = coda_tensor_2d(bf->c[i], CODA_BF16, s->m, s->n);
    A.device = B.device = C.device = CODA_DEVICE_CUDA;
    coda_status_t st = coda_gemm(ctx, s->layout, &A, &B, &C, 1.0f, 0.0f, NULL);
    if (st != CODA_OK) {
        fprintf(stderr, "FATAL coda_gemm %s: %s\n", s->name, coda_last_error());
        exit(1);
    }
}

/* Row-major C (M, N) = op(A) op(B) is column-major C^T (N, M) = op(B)^T op(A)^T. */
static void run_cublas(const shape_t *s, bufs_t *bf, int i) {
    const float one = 1.0f, zero = 0.0f;
    int m = (int)s->m, n = (int)s->n, k = (int)s->k;
    cublasOperation_t opb, opa;
    int ldb, lda;
    switch (s->layout) {
    case CODA_LAYOUT_NT: opb = CUBLAS_OP_T; ldb = k; opa = CUBLAS_OP_N; lda = k; break;
    case CODA_LAYOUT_NN: opb = CUBLAS_OP_N; ldb = n; opa = CUBLAS_OP_N; lda = k; break;
    default: opb = CUBLAS_OP_N; ldb = n; opa = CUBLAS_OP_T; lda = m; break;
    }
    CUBLAS_OK(cublasGemmEx(blas, opb, opa, n, m, k, &one, bf->b[i], CUDA_R_16BF, ldb, bf->a[i],
                           CUDA_R_16BF, lda, &zero, bf->c[i], CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
}

static int cmp_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return a < b ? -1 : a > b;
}

/* Median milliseconds of RUNS runs, rotating input sets. */
static float time_it(void (*fn)(const shape_t *, bufs_t *, int), const shape_t *s, bufs_t *bf) {
    cudaEvent_t e0[RUNS], e1[RUNS];
    for (int r = 0; r < RUNS; r++) {
        CUDA_OK(cudaEventCreate(&e0[r]));
        CUDA_OK(cudaEventCreate(&e1[r]));
    }
    for (int r = 0; r < WARMUP; r++) fn(s, bf, r % bf->sets);
    CUDA_OK(cudaDeviceSynchronize());
    for (int r = 0; r < RUNS; r++) {
        CUDA_OK(cudaEventRecord(e0[r], NULL));
        fn(s, bf, r % bf->sets);
        CUDA_OK(cudaEventRecord(e1[r], NULL));
    }
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    float ms[RUNS];
    for (int r = 0; r < RUNS; r++) {
        CUDA_OK(cudaEventElapsedTime(&ms[r], e0[r], e1[r]));
        CUDA_OK(cudaEventDestroy(e0[r]));
        CUDA_OK(cudaEventDestroy(e1[r]));
    }
    qsort(ms, RUNS, sizeof ms[0], cmp_float);
    return ms[RUNS / 2];
}

/* Median milliseconds of coda and cuBLAS, RUNS runs each, interleaved
 * (coda, cuBLAS, coda, ...) so that both see the same clocks: the H200's
 * clocks drop under sustained load, and back-to-back blocks of runs would
 * favour whichever goes first. */
static void time_pair(const shape_t *s, bufs_t *bf, float *t_coda, float *t_blas) {
    cudaEvent_t ev[4][RUNS];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < RUNS; r++) CUDA_OK(cudaEventCreate(&ev[i][r]));
    for (int r = 0; r < WARMUP; r++) {
        run_coda(s, bf, r % bf->sets);
        run_cublas(s, bf, r % bf->sets);
    }
    CUDA_OK(cudaDeviceSynchronize());
    for (int r = 0; r < RUNS; r++) {
        CUDA_OK(cudaEventRecord(ev[0][r], NULL));
        run_coda(s, bf, r % bf->sets);
        CUDA_OK(cudaEventRecord(ev[1][r], NULL));
        CUDA_OK(cudaEventRecord(ev[2][r], NULL));
        run_cublas(s, bf, r % bf->sets);
        CUDA_OK(cudaEventRecord(ev[3][r], NULL));
    }
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    float a[RUNS], b[RUNS];
    for (int r = 0; r < RUNS; r++) {
        CUDA_OK(cudaEventElapsedTime(&a[r], ev[0][r], ev[1][r]));
        CUDA_OK(cudaEventElapsedTime(&b[r], ev[2][r], ev[3][r]));
    }
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < RUNS; r++) CUDA_OK(cudaEventDestroy(ev[i][r]));
    qsort(a, RUNS, sizeof a[0], cmp_float);
    qsort(b, RUNS, sizeof b[0], cmp_float);
    *t_coda = a[RUNS / 2];
    *t_blas = b[RUNS / 2];
}

/* coda vs cuBLAS output on the first and last 64 rows. */
static double check(const shape_t *s, bufs_t *bf) {
    int64_t rows = s->m < 128 ? s->m : 128;
    size_t n = (size_t)(rows * s->n);
    uint16_t *x = h_alloc(n * 2), *y = h_alloc(n * 2);
    double *ref = h_alloc(n * sizeof(double));
    float *out = h_alloc(n * sizeof(float));
    int64_t half = rows / 2, tail0 = s->m - (rows - half);
    run_coda(s, bf, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(x, bf->c[0], (size_t)(half * s->n) * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(x + half * s->n, (uint16_t *)bf->c[0] + tail0 * s->n,
                       (size_t)((rows - half) * s->n) * 2, cudaMemcpyDeviceToHost));
    run_cublas(s, bf, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(y, bf->c[0], (size_t)(half * s->n) * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(y + half * s->n, (uint16_t *)bf->c[0] + tail0 * s->n,
                       (size_t)((rows - half) * s->n) * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        ref[i] = h_bf2f(y[i]);
        out[i] = h_bf2f(x[i]);
    }
    double e = rel_err_f32(out, ref, (int64_t)n);
    free(x); free(y); free(ref); free(out);
    return e;
}

int main(int argc, char **argv) {
    int sweep = argc > 1 && strcmp(argv[1], "sweep") == 0;
    int variants = argc > 1 && strcmp(argv[1], "variants") == 0;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    char desc[2048];
    REQUIRE_OK(coda_context_describe(ctx, desc, sizeof desc));
    printf("%s", desc);
    CUBLAS_OK(cublasCreate(&blas));
    noise = h_alloc((size_t)NOISE_N * 2);
    h_rng r = rng_new(42);
    rng_fill_bf16(&r, noise, NOISE_N, 1.0f);

    /* LLaMA-3-8B, M = 16384 tokens: d 4096, qkv 6144, ffn 14336 (gate/up 28672). */
    const int64_t T = 16384;
    shape_t shapes[] = {
        {"sq2048", CODA_LAYOUT_NT, 2048, 2048, 2048}, {"sq2048", CODA_LAYOUT_NN, 2048, 2048, 2048},
        {"sq2048", CODA_LAYOUT_TN, 2048, 2048, 2048}, {"sq4096", CODA_LAYOUT_NT, 4096, 4096, 4096},
        {"sq4096", CODA_LAYOUT_NN, 4096, 4096, 4096}, {"sq4096", CODA_LAYOUT_TN, 4096, 4096, 4096},
        {"sq8192", CODA_LAYOUT_NT, 8192, 8192, 8192}, {"sq8192", CODA_LAYOUT_NN, 8192, 8192, 8192},
        {"sq8192", CODA_LAYOUT_TN, 8192, 8192, 8192},
        /* a projection's three GEMMs: y = x w^T (T x n x k), its dgrad
         * dx = dy w (T x k x n) and its wgrad dw = dy^T x (n x k x T) */
#define PROJ(name, n, k) {name ".fwd", CODA_LAYOUT_NT, T, n, k}, {name ".dgrad", CODA_LAYOUT_NN, T, k, n}, \
                         {name ".wgrad", CODA_LAYOUT_TN, n, k, T}
        /* LLaMA-3-8B's (d 4096, qkv 6144, ffn 14336) */
        PROJ("qkv", 6144, 4096), PROJ("o", 4096, 4096), PROJ("gu", 28672, 4096), PROJ("down", 4096, 14336),
        /* LLaMA-3-70B's weight gradients (d 8192, qkv 10240, ffn 28672):
         * only where CODA_BENCH_ONLY names them ("70b") */
        {"70b.qkv.wgrad", CODA_LAYOUT_TN, 10240, 8192, T}, {"70b.o.wgrad", CODA_LAYOUT_TN, 8192, 8192, T},
        {"70b.gu.wgrad", CODA_LAYOUT_TN, 57344, 8192, T}, {"70b.down.wgrad", CODA_LAYOUT_TN, 8192, 28672, T},
        /* LLaMA-3-1B's twelve (d 2048, qkv 3072, ffn 8192): only where
         * CODA_BENCH_ONLY names them ("1b") */
        PROJ("1b.qkv", 3072, 2048), PROJ("1b.o", 2048, 2048), PROJ("1b.gu", 16384, 2048), PROJ("1b.down", 2048, 8192),
#undef PROJ
    };
    const char *lname[3] = {"NT", "NN", "TN"};
    int ns = (int)(sizeof shapes / sizeof shapes[0]);
    if (variants) {
        /* configurations side by side, each interleaved run by run with
         * cuBLAS: CODA_VARIANTS="3 2" (digits, default "3 0"), on the
         * shapes CODA_BENCH_ONLY matches (default sq2048.NT, qkv.fwd,
         * o.fwd); CODA_DEBUG_OPTS applies to every configuration */
        const char *cfgs = getenv("CODA_VARIANTS") ? getenv("CODA_VARIANTS") : "3 0";
        const char *want = getenv("CODA_BENCH_ONLY");
        for (int i = 0; i < ns; i++) {
            shape_t *s = &shapes[i];
            char full[40];
            snprintf(full, sizeof full, "%s.%s", s->name, lname[s->layout]);
            if (want ? !strstr(full, want) : (i != 0 && i != 9 && i != 12)) continue;
            size_t ea = (size_t)(s->m * s->k), eb = (size_t)(s->n * s->k), ec = (size_t)(s->m * s->n);
            bufs_t bf;
            bf.sets = 1;
            bf.a[0] = dev_random(ea);
            bf.b[0] = dev_random(eb);
            CUDA_OK(cudaMalloc(&bf.c[0], ec * 2));
            double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
            printf("%-11s %s", s->name, lname[s->layout]);
            for (const char *c = cfgs; *c; c++) {
                if (*c < '0' || *c >= '0' + CODA_CUDA_GEMM_NCFG) continue;
                char v[2] = {*c, 0};
                tune_cfg_str(ctx, v);
                /* a digit followed by 's': stream-K forced on; by 'p': the
                 * split tail forced; by '-': off */
                const char *sk = c[1] == 's' ? "s" : c[1] == 'p' ? "p" : c[1] == '-' ? "-" : NULL;
                if (sk)
                    tune_streamk(ctx, *sk == 's'   ? CODA_STREAMK_ON
                                      : *sk == 'p' ? CODA_STREAMK_SPLIT
                                                   : CODA_STREAMK_OFF);
                float tc, tb;
                time_pair(s, &bf, &tc, &tb);
                double e = check(s, &bf);
                printf("   cfg %s%s %6.1f (cuBLAS %6.1f) %.3f%s", v, sk ? sk : "",
                       flop / (tc * 1e-3) / 1e12, flop / (tb * 1e-3) / 1e12, tb / tc,
                       e < 1e-2 ? "" : " MISMATCH");
                tune_streamk(ctx, CODA_STREAMK_AUTO);
            }
            printf("\n");
            tune_cfg(ctx, -1);
            fflush(stdout);
            CUDA_OK(cudaFree(bf.a[0]));
            CUDA_OK(cudaFree(bf.b[0]));
            CUDA_OK(cudaFree(bf.c[0]));
        }
        return 0;
    }
    float ratios[64];
    double tot_coda = 0, tot_blas = 0;
    printf("\n%-11s %-2s %6s %6s %6s  %9s %9s %6s  %s\n", "shape", "ly", "M", "N", "K",
           "coda TF/s", "cuBLAS", "ratio", "check");
    const char *only = getenv("CODA_BENCH_ONLY");
    int nrun = 0;
    for (int i = 0; i < ns; i++) {
        shape_t *s = &shapes[i];
        char full[40];
        snprintf(full, sizeof full, "%s.%s", s->name, lname[s->layout]);
        if (only ? !strstr(full, only) : !strncmp(full, "70b.", 4) || !strncmp(full, "1b.", 3)) continue;
        size_t ea = (size_t)(s->m * s->k), eb = (size_t)(s->n * s->k), ec = (size_t)(s->m * s->n);
        size_t bytes = 2 * (ea + eb + ec);
        bufs_t bf;
        /* rotate sets when one fits in L2 (50 MB): 200 MB of inputs in all */
        bf.sets = bytes < ((size_t)100 << 20) ? (int)(((size_t)200 << 20) / bytes) : 1;
        if (bf.sets > MAX_SETS) bf.sets = MAX_SETS;
        if (bf.sets < 1) bf.sets = 1;
        for (int j = 0; j < bf.sets; j++) {
            bf.a[j] = dev_random(ea);
            bf.b[j] = dev_random(eb);
            CUDA_OK(cudaMalloc(&bf.c[j], ec * 2));
        }
        double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
        double err = check(s, &bf);
        float tc, tb;
        time_pair(s, &bf, &tc, &tb);
        double fc = flop / (tc * 1e-3) / 1e12, fb = flop / (tb * 1e-3) / 1e12;
        ratios[nrun++] = (float)(fc / fb);
        tot_coda += tc;
        tot_blas += tb;
        printf("%-14s %-2s %6lld %6lld %6lld  %9.1f %9.1f %6.3f  %.1e%s\n", s->name,
               lname[s->layout], (long long)s->m, (long long)s->n, (long long)s->k, fc, fb,
               ratios[nrun - 1], err, err < 1e-2 ? "" : " MISMATCH");
        if (sweep) {
            printf("    default: %9.1f TF/s\n", fc);
            for (int cfg = 0; cfg < CODA_CUDA_GEMM_NCFG; cfg++) {
                char v[2] = {(char)('0' + cfg), 0};
                tune_cfg_str(ctx, v);
                float t = time_it(run_coda, s, &bf);
                printf("    cfg %d: %9.1f TF/s\n", cfg, flop / (t * 1e-3) / 1e12);
            }
            /* the cluster configs with a fixed number of clusters */
            static const char *fixed[] = {"64"};
            for (int f = 0; f < 1; f++) {
                tune_cfg_str(ctx, "2");
                tune_clusters(ctx, atoi(fixed[f]));
                float t = time_it(run_coda, s, &bf);
                printf("    cfg 2 x%s: %9.1f TF/s\n", fixed[f], flop / (t * 1e-3) / 1e12);
            }
            tune_clusters(ctx, 0);
            tune_cfg(ctx, -1);
        }
        fflush(stdout);
        for (int j = 0; j < bf.sets; j++) {
            CUDA_OK(cudaFree(bf.a[j]));
            CUDA_OK(cudaFree(bf.b[j]));
            CUDA_OK(cudaFree(bf.c[j]));
        }
    }
    float sorted[64];
    ns = nrun;
    if (!ns) {
        fprintf(stderr, "no shape matches CODA_BENCH_ONLY=%s\n", only ? only : "");
        return 1;
    }
    memcpy(sorted, ratios, sizeof(float) * (size_t)ns);
    qsort(sorted, (size_t)ns, sizeof(float), cmp_float);
    printf("\nratio coda/cuBLAS: median %.3f, min %.3f, max %.3f; sum of medians: coda %.2f ms, "
           "cuBLAS %.2f ms\n",
           sorted[ns / 2], sorted[0], sorted[ns - 1], tot_coda, tot_blas);
    cublasDestroy(blas);
    coda_context_free(ctx);
    free(noise);
    return 0;
}
