/* bench_startup.c - how long a user's new epilogue program takes to start.
 *
 *   CODA_CACHE_DIR=/tmp/fresh bench_startup     first run: NVRTC compiles
 *   CODA_CACHE_DIR=/tmp/fresh bench_startup     second run: the disk cache
 *
 * A program written here as text (not a built-in, so nothing of it is in
 * the library) is parsed, verified and run once as a fused GEMM on the GPU
 * (M = N = K = 1024); host wall time of each step, the first launch's
 * (code generation + NVRTC or the disk cache + module load) and then a
 * second launch's (in-memory kernel). Prints "cache: miss" when the first
 * launch wrote a new cubin into CODA_CACHE_DIR, "cache: hit" when it found
 * one. The result is compared with the CPU backend running the same
 * program on the same data (relative error, and NaN-poisoned output), so
 * a fast start that computes nonsense fails (exit 1). Needs an sm_90a GPU. */
#include "harness.h"

#include <dirent.h>
#include <time.h>
#include "gpu/cuda_check.h"

#define SZ 1024

/* y = alpha * acc + res, and the row sums of y^2: a new user program */
static const char *const user_program =
    "in  res   tile bf16\n"
    "in  alpha scalar\n"
    "out y     tile bf16\n"
    "out ss    rowsum\n"
    "a  = acc\n"
    "s  = load alpha\n"
    "r  = load res\n"
    "t  = mul a s\n"
    "u  = add t r\n"
    "y1 = round_bf16 u\n"
    "store y y1\n"
    "q  = mul y1 y1\n"
    "reduce ss q\n";

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int count_cubins(const char *dir) {
    DIR *d = dir ? opendir(dir) : NULL;
    int n = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".cubin") != NULL;
    closedir(d);
    return n;
}

static void *to_device(const void *h, size_t bytes) {
    void *d;
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

int main(void) {
    const char *cache = getenv("CODA_CACHE_DIR");
    const int cubins_before = count_cubins(cache);
    double t0 = now_ms();
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "bench_startup: no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    double t1 = now_ms();
    coda_program_t *p;
    REQUIRE_OK(coda_program_parse(user_program, &p));
    double t2 = now_ms();

    /* operands: x (SZ, SZ), w (SZ, SZ) as y = x w^T, res (SZ, SZ) */
    const size_t nb = (size_t)SZ * SZ * 2;
    h_rng r = rng_new(7);
    uint16_t *hx = h_alloc(nb), *hw = h_alloc(nb), *hres = h_alloc(nb), *hy = h_alloc(nb), *cy = h_alloc(nb);
    rng_fill_bf16(&r, hx, (int64_t)SZ * SZ, 1.0f);
    rng_fill_bf16(&r, hw, (int64_t)SZ * SZ, 1.0f);
    rng_fill_bf16(&r, hres, (int64_t)SZ * SZ, 1.0f);
    poison_bf16(hy, (int64_t)SZ * SZ);
    coda_tiling_t tl;
    REQUIRE_OK(coda_choose_program_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, SZ, SZ, SZ, p, &tl));
    const int64_t nt = (SZ + tl.tile_n - 1) / tl.tile_n;
    float *hss = h_alloc((size_t)SZ * nt * 4), *css = h_alloc((size_t)SZ * nt * 4);
    poison_f32(hss, (int64_t)SZ * nt);

    coda_tensor_t x = coda_tensor_2d(to_device(hx, nb), CODA_BF16, SZ, SZ);
    coda_tensor_t w = coda_tensor_2d(to_device(hw, nb), CODA_BF16, SZ, SZ);
    coda_tensor_t res = coda_tensor_2d(to_device(hres, nb), CODA_BF16, SZ, SZ);
    coda_tensor_t y = coda_tensor_2d(to_device(hy, nb), CODA_BF16, SZ, SZ);
    coda_tensor_t ss = coda_tensor_2d(to_device(hss, (size_t)SZ * nt * 4), CODA_F32, SZ, nt);
    x.device = w.device = res.device = y.device = ss.device = CODA_DEVICE_CUDA;
    coda_binding_t b[] = {{"res", res, 0}, {"alpha", coda_tensor_1d(NULL, CODA_F32, 0), 0.75f}, {"y", y, 0}, {"ss", ss, 0}};

    double t3 = now_ms();
    REQUIRE_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &x, &w, p, b, 4, &tl, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    double t4 = now_ms();
    REQUIRE_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &x, &w, p, b, 4, &tl, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    double t5 = now_ms();
    const int cubins_after = count_cubins(cache);

    /* the CPU backend on the same data and tiling */
    coda_tensor_t cx = coda_tensor_2d(hx, CODA_BF16, SZ, SZ), cw = coda_tensor_2d(hw, CODA_BF16, SZ, SZ);
    coda_binding_t cb[] = {{"res", coda_tensor_2d(hres, CODA_BF16, SZ, SZ), 0}, {"alpha", coda_tensor_1d(NULL, CODA_F32, 0), 0.75f},
                           {"y", coda_tensor_2d(cy, CODA_BF16, SZ, SZ), 0},
                           {"ss", coda_tensor_2d(css, CODA_F32, SZ, nt), 0}};
    REQUIRE_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &cx, &cw, p, cb, 4, &tl, NULL));
    CUDA_OK(cudaMemcpy(hy, y.data, nb, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hss, ss.data, (size_t)SZ * nt * 4, cudaMemcpyDeviceToHost));
    double *ref = h_alloc((size_t)SZ * nt * 8);
    for (int64_t i = 0; i < (int64_t)SZ * nt; i++) ref[i] = css[i];
    const double e_ss = rel_err_f32(hss, ref, (int64_t)SZ * nt);
    free(ref);
    ref = h_alloc((size_t)SZ * SZ * 8);
    for (int64_t i = 0; i < (int64_t)SZ * SZ; i++) ref[i] = h_bf2f(cy[i]);
    const double e_y = rel_err_bf16(hy, ref, (int64_t)SZ * SZ);
    free(ref);

    printf("bench_startup: context %.1f ms, parse + verify %.2f ms, first fused GEMM %.1f ms "
           "(cache: %s), second %.2f ms; vs CPU backend: y %.1e, ss %.1e\n",
           t1 - t0, t2 - t1, t4 - t3, !cache ? "none" : cubins_after > cubins_before ? "miss" : "hit", t5 - t4,
           e_y, e_ss);
    const int ok = e_y <= 1e-2 && e_ss <= 1e-3; /* y: a bf16 ulp where the sums round apart; ss follows */
    if (!ok) printf("FAIL: the fused GEMM differs from the CPU backend\n");
    CUDA_OK(cudaFree(x.data));
    CUDA_OK(cudaFree(w.data));
    CUDA_OK(cudaFree(res.data));
    CUDA_OK(cudaFree(y.data));
    CUDA_OK(cudaFree(ss.data));
    free(hx), free(hw), free(hres), free(hy), free(cy), free(hss), free(css);
    coda_program_free(p);
    coda_context_free(ctx);
    return ok ? 0 : 1;
}
