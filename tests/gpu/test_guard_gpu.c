/* test_guard_gpu.c - every GPU entry point through guarded views
 * (tests/guard_cases.h): each output sits inside a larger device allocation
 * of sentinel bytes (before, after, and in the row padding between rows),
 * views are padded, column slices of wider matrices or offset from their
 * allocation; every input must be unchanged after the call, every output
 * match the CPU backend run on contiguous copies, and every failing call
 * change nothing. Then a randomized API test.
 *
 *   test_guard_gpu           enumerated cases, then 600 random calls
 *   test_guard_gpu small     a few of each (for compute-sanitizer)
 *   test_guard_gpu N         N random calls after the enumerated cases
 * Needs an sm_90a GPU. */
#include "guard_cases.h"
#include "class_programs.h"
#include "gpu/cuda_check.h"

static void *dev_alloc(size_t n) {
    void *p;
    CUDA_OK(cudaMalloc(&p, n));
    return p;
}
static void dev_free(void *p) { CUDA_OK(cudaFree(p)); }
static void dev_put(void *dst, const void *src, size_t n) {
    CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}
static void dev_get(void *dst, const void *src, size_t n) {
    CUDA_OK(cudaDeviceSynchronize()); /* a kernel's fault shows here, not as wrong bytes */
    CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}
static const g_mem_t dev_mem = {CODA_DEVICE_CUDA, dev_alloc, dev_free, dev_put, dev_get};

int main(int argc, char **argv) {
    int small = argc > 1 && strcmp(argv[1], "small") == 0;
    int nrandom = small ? 40 : argc > 1 ? atoi(argv[1]) : 600;
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "FAIL: no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    g_env_t E = {.ctx = ctx, .mem = &dev_mem, .tol_bf16 = 1e-2, .tol_f32 = 2e-3, .tol_layer = 5e-2, .align = 16,
                 .verbose = getenv("CODA_TEST_VERBOSE") != NULL};
    h_rng r = rng_new(2027);

    /* plain GEMM: the shapes that wrote into C's row padding (issue 18),
     * with C tight, padded, a column slice and offset */
    static const struct { int l; int64_t m, n, k; coda_dtype_t c; float a, b; } found[] = {
        {0, 1023, 255, 3000, CODA_F32, 1, 0}, {1, 127, 1, 16, CODA_BF16, 2, 0.5f}, {2, 64, 257, 8, CODA_BF16, 1, 0},
        {0, 1025, 2049, 64, CODA_BF16, 1, 0}, {0, 16, 1, 8, CODA_F32, 1, 0},      {2, 7, 127, 1000, CODA_BF16, 1, 0},
    };
    int nfound = small ? 2 : (int)(sizeof found / sizeof found[0]);
    for (int i = 0; i < nfound; i++)
        for (int pc = 0; pc < G_NPLACES; pc++)
            g_gemm_case(&E, &r, (coda_layout_t)found[i].l, found[i].m, found[i].n, found[i].k, found[i].c, found[i].a,
                        found[i].b, (g_place_t)((pc + 1) % 4), (g_place_t)((pc + 3) % 4), (g_place_t)pc, 16, CODA_BF16);
    /* every layout and placement; then stream-K forced (the tail's owner
     * stores C after adding the contributors' partials) */
    for (int sk = 0; sk < (small ? 1 : 2); sk++) {
        if (sk) setenv("CODA_STREAMK", "1", 1);
        for (int l = 0; l < 3; l++)
            for (int pc = 0; pc < G_NPLACES; pc++) {
                g_gemm_case(&E, &r, (coda_layout_t)l, sk ? 1500 : 300, sk ? 1801 : 131, 264, CODA_BF16, 1, 0,
                            (g_place_t)pc, (g_place_t)((pc + 1) % 4), (g_place_t)pc, 16, CODA_BF16);
                g_gemm_case(&E, &r, (coda_layout_t)l, sk ? 2304 : 129, sk ? 2043 : 77, 136, CODA_F32, 0.5f, 1.5f,
                            (g_place_t)((pc + 2) % 4), (g_place_t)pc, (g_place_t)pc, 16, CODA_BF16);
            }
        unsetenv("CODA_STREAMK");
    }

    /* fused GEMM: the layer's programs and one per primitive class, every
     * layout; tile and column arguments 16-byte aligned (N16 and ring
     * forms) and 8-byte aligned (even-N form) */
    const char *texts[64], *names[64];
    int np = 0;
    for (const char *const *b = coda_builtin_program_names(); *b && np < 48; b++)
        names[np] = *b, texts[np++] = coda_builtin_program(*b);
    for (int i = 0; i < N_PRIMITIVE; i++) names[np] = "class", texts[np++] = primitive_programs[i];
    for (int i = 0; i < np; i++)
        for (int l = 0; l < (small ? 1 : 3); l++)
            for (int al = 8; al <= 16; al += 8) {
                g_fused_case(&E, &r, names[i], texts[i], (coda_layout_t)l, 129, 266, 72, NULL, al, 0);
                if (small) continue;
                g_fused_case(&E, &r, names[i], texts[i], (coda_layout_t)l, 7, 22, 16, NULL, al, 0);
                /* N a multiple of 16: the N16 form (16-byte vectors, TMA
                 * stores); on a big problem the ring form (TMA loads) */
                g_fused_case(&E, &r, names[i], texts[i], (coda_layout_t)l, 300, 272, 64, NULL, al, 0);
                if (l == 0) g_fused_case(&E, &r, names[i], texts[i], (coda_layout_t)l, 2000, 2064, 64, NULL, al, 0);
            }
    /* finishing steps */
    for (int f = 0; f < 5; f++)
        for (int pl = 0; pl < G_NPLACES; pl++) g_finish_case(&E, &r, f, 333, 1 + 2 * f, (g_place_t)pl, (g_place_t)pl);
    /* the layer, forward and backward */
    coda_llama_config_t c = {.d = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .ffn = 160, .vocab = 200,
                             .eps = 1e-5f, .rope_theta = 10000.0f};
    for (int pl = 0; pl < G_NPLACES; pl++) g_layer_case(&E, &r, c, 2, 7, (g_place_t)pl, pl % 2 == 0, 0);
    g_layer_case(&E, &r, c, 2, 7, G_TIGHT, 1, 1); /* a gradient the GPU cannot write: refused up front */
    int enumerated = E.calls;

    g_random(&E, &r, nrandom, texts, names, np);
    printf("test_guard_gpu: %d enumerated + %d random calls: %d ran and kept to their views, %d refused and "
           "changed nothing\n", enumerated, E.calls - enumerated, E.passed_ok, E.refused);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
