/* bench_host.c - what a call costs the host on CUDA: the time from entering
 * a coda call to its return, the GPU idle before each call (the stream
 * drained), so no call waits for a full launch queue. This is the time that
 * decides small problems, where the GPU's work is shorter than the host's.
 *
 *   bench_host [M [K [V]]]      default 2048 2048 2048
 *
 * Rows (median of REPS calls, microseconds): cuBLAS's GEMM as the yardstick,
 * coda_gemm (NT, bf16; TN accumulating into f32 as a wgrad does), a fused
 * GEMM (the resid_add built-in), coda_scale, and coda_lm_loss forward only
 * and with both gradients. The results are not checked here (the tests
 * do that); every call's status is. Needs an sm_90a GPU. */
#include "harness.h"

#include <cublas_v2.h>
#include <time.h>
#include "gpu/cuda_check.h"

#define REPS 200

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One row: the median host time of `call` over REPS calls. */
#define HOST_ROW(name, call)                                                                     \
    do {                                                                                         \
        static double t_[REPS];                                                                  \
        for (int r_ = 0; r_ < REPS + 3; r_++) {                                                  \
            CUDA_OK(cudaDeviceSynchronize());                                                    \
            double t0_ = now_us();                                                               \
            call;                                                                                \
            if (r_ >= 3) t_[r_ - 3] = now_us() - t0_;                                            \
        }                                                                                        \
        CUDA_OK(cudaDeviceSynchronize());                                                        \
        qsort(t_, REPS, sizeof t_[0], cmp_double);                                               \
        printf("  %-44s %8.1f us (min %.1f)\n", name, t_[REPS / 2], t_[0]);                     \
    } while (0)

static void *dev_random_bf16(h_rng *r, int64_t n) {
    uint16_t *h = h_alloc(2 * (size_t)n);
    rng_fill_bf16(r, h, n, 1.0f);
    void *d;
    CUDA_OK(cudaMalloc(&d, 2 * (size_t)n));
    CUDA_OK(cudaMemcpy(d, h, 2 * (size_t)n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void *dev_zero(size_t bytes) {
    void *d;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemset(d, 0, bytes));
    return d;
}

int main(int argc, char **argv) {
    int64_t M = argc > 1 ? atoll(argv[1]) : 2048, K = argc > 2 ? atoll(argv[2]) : 2048;
    int64_t V = argc > 3 ? atoll(argv[3]) : M;
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "bench_host: no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    h_rng r = rng_new(11);
    void *x = dev_random_bf16(&r, M * K), *w = dev_random_bf16(&r, V * K), *res = dev_random_bf16(&r, M * V);
    void *y = dev_zero(2 * (size_t)(M * V)), *dx = dev_zero(2 * (size_t)(M * K)), *dw = dev_zero(4 * (size_t)(V * K));
    void *loss = dev_zero(4 * (size_t)M), *total = dev_zero(4), *s = dev_zero(4);
    int32_t *ht = malloc(4 * (size_t)M);
    for (int64_t i = 0; i < M; i++) {
        int64_t v = (int64_t)((rng_uniform(&r) + 1.0f) * 0.5f * (float)V);
        ht[i] = (int32_t)(v < V ? v : V - 1);
    }
    void *targets;
    CUDA_OK(cudaMalloc(&targets, 4 * (size_t)M));
    CUDA_OK(cudaMemcpy(targets, ht, 4 * (size_t)M, cudaMemcpyHostToDevice));
    float one = 1.0f;
    CUDA_OK(cudaMemcpy(s, &one, 4, cudaMemcpyHostToDevice));

    coda_tensor_t tx = coda_tensor_2d(x, CODA_BF16, M, K), tw = coda_tensor_2d(w, CODA_BF16, V, K);
    coda_tensor_t tres = coda_tensor_2d(res, CODA_BF16, M, V), ty = coda_tensor_2d(y, CODA_BF16, M, V);
    coda_tensor_t tdx = coda_tensor_2d(dx, CODA_BF16, M, K), tdw = coda_tensor_2d(dw, CODA_F32, V, K);
    coda_tensor_t tl = coda_tensor_1d(loss, CODA_F32, M), ttot = coda_tensor_1d(total, CODA_F32, 1);
    coda_tensor_t tt = coda_tensor_1d(targets, CODA_I32, M), ts = coda_tensor_1d(s, CODA_F32, 1);
    tx.device = tw.device = tres.device = ty.device = tdx.device = tdw.device = CODA_DEVICE_CUDA;
    tl.device = ttot.device = tt.device = ts.device = CODA_DEVICE_CUDA;

    coda_program_t *prog;
    REQUIRE_OK(coda_program_parse(coda_builtin_program("resid_add"), &prog));
    coda_binding_t b[2];
    memset(b, 0, sizeof b);
    b[0].name = "res";
    b[0].tensor = tres;
    b[1].name = "h";
    b[1].tensor = ty;
    coda_tiling_t tiling;
    REQUIRE_OK(coda_choose_program_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, M, V, K, prog, &tiling));

    size_t wsb;
    REQUIRE_OK(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CUDA, M, K, V, NULL, &wsb));
    void *ws = dev_zero(wsb);

    cublasHandle_t cb;
    if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench_host: cublasCreate failed\n");
        return 1;
    }
    float alpha = 1.0f, beta = 0.0f;
    printf("bench_host: host time a call, M %lld, K %lld, N = V %lld (median of %d, the GPU idle before each)\n",
           (long long)M, (long long)K, (long long)V, REPS);
    /* y (M, V) = x w^T in cuBLAS's column-major terms: y^T = w x^T */
    HOST_ROW("cuBLAS cublasGemmEx (bf16, y = x w^T)",
             if (cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)V, (int)M, (int)K, &alpha, w, CUDA_R_16BF, (int)K,
                              x, CUDA_R_16BF, (int)K, &beta, y, CUDA_R_16BF, (int)V, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "cublasGemmEx failed\n"); return 1; });
    HOST_ROW("coda_gemm NT (y = x w^T, bf16)", REQUIRE_OK(coda_gemm(ctx, CODA_LAYOUT_NT, &tx, &tw, &ty, 1, 0, NULL)));
    HOST_ROW("coda_gemm TN (dw += y^T x, f32)", REQUIRE_OK(coda_gemm(ctx, CODA_LAYOUT_TN, &ty, &tx, &tdw, 1, 1, NULL)));
    HOST_ROW("coda_gemm_epilogue NT resid_add",
             REQUIRE_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &tx, &tw, prog, b, 2, &tiling, NULL)));
    HOST_ROW("coda_scale (s = 1)", REQUIRE_OK(coda_scale(ctx, &tdw, &ts, NULL)));
    HOST_ROW("coda_lm_loss, loss only",
             REQUIRE_OK(coda_lm_loss(ctx, &tx, &tw, &tt, NULL, &tl, &ttot, NULL, NULL, ws, wsb, NULL)));
    HOST_ROW("coda_lm_loss, loss, dx and dw",
             REQUIRE_OK(coda_lm_loss(ctx, &tx, &tw, &tt, NULL, &tl, &ttot, &tdx, &tdw, ws, wsb, NULL)));
    cublasDestroy(cb);
    coda_program_free(prog);
    void *bufs[] = {x, w, res, y, dx, dw, loss, total, s, targets, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_OK(cudaFree(bufs[i]));
    free(ht);
    coda_context_free(ctx);
    return 0;
}
