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
#include "gpu/guard_dev.h"
#include "tuning.h"


/* A descriptor that says CUDA but holds host memory, in each role a call
 * writes or reads: refused with CODA_ERR_DEVICE before anything runs, the
 * host bytes unchanged (only the driver can tell; the core checks cannot). */
static void host_pointer_faults(coda_context_t *ctx, h_rng *r) {
    enum { M = 64, N = 64, K = 64 };
    uint16_t *ha = malloc(M * K * 2), *hb = malloc(N * K * 2);
    uint16_t *host = malloc(M * N * 4), *before = malloc(M * N * 4);
    if (!ha || !hb || !host || !before) { fprintf(stderr, "FAIL: out of memory\n"); exit(1); }
    rng_fill_bf16(r, ha, M * K, 1.0f);
    rng_fill_bf16(r, hb, N * K, 1.0f);
    for (int i = 0; i < M * N * 2; i++) host[i] = (uint16_t)(0x5a5a + i);
    memcpy(before, host, M * N * 4);
    void *da = dev_alloc(M * K * 2), *db = dev_alloc(N * K * 2), *dc = dev_alloc(M * N * 4);
    dev_put(da, ha, M * K * 2);
    dev_put(db, hb, N * K * 2);
    coda_tensor_t A = coda_tensor_2d(da, CODA_BF16, M, K), B = coda_tensor_2d(db, CODA_BF16, N, K);
    coda_tensor_t C = coda_tensor_2d(dc, CODA_BF16, M, N), Ch = coda_tensor_2d(host, CODA_BF16, M, N);
    A.device = B.device = C.device = Ch.device = CODA_DEVICE_CUDA;

    /* plain GEMM: C in host memory */
    CHECK_STATUS(coda_gemm(ctx, CODA_LAYOUT_NT, &A, &B, &Ch, 1.0f, 0.0f, NULL), CODA_ERR_DEVICE);
    CHECK(memcmp(host, before, M * N * 4) == 0, "plain GEMM wrote host C it refused");

    /* fused GEMM: an input in host memory (the output is device memory and
     * must keep its bytes), then the output in host memory */
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse("program hostcheck\nin res tile bf16\nout h tile bf16\na = acc\n"
                                  "rv = load res\ns = add a rv\nstore h s\n", &p));
    dev_put(dc, before, M * N * 2);
    coda_binding_t b[2] = {{.name = "res", .tensor = Ch}, {.name = "h", .tensor = C}};
    coda_tiling_t tl = {0, 0};
    CHECK_OK(coda_choose_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, M, N, K, &tl));
    CHECK_STATUS(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &A, &B, p, b, 2, &tl, NULL), CODA_ERR_DEVICE);
    uint16_t *back = malloc(M * N * 2);
    if (!back) exit(1);
    dev_get(back, dc, M * N * 2);
    CHECK(memcmp(back, before, M * N * 2) == 0, "fused GEMM wrote its device output after refusing a host input");
    b[0].tensor = C, b[1].tensor = Ch;
    b[0].tensor.data = da; /* any device bytes will do as res: nothing may run */
    CHECK_STATUS(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &A, &B, p, b, 2, &tl, NULL), CODA_ERR_DEVICE);
    CHECK(memcmp(host, before, M * N * 4) == 0, "fused GEMM wrote host output it refused");
    coda_program_free(p);

    /* finishing steps: partials on the device, out / lse / loss on the host */
    coda_tensor_t P = coda_tensor_2d(dc, CODA_F32, M, 4), O = coda_tensor_1d(host, CODA_F32, M);
    P.device = O.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &P, &O, NULL), CODA_ERR_DEVICE);
    CHECK_STATUS(coda_finish_rstd(ctx, &P, 64, 1e-5f, &O, NULL), CODA_ERR_DEVICE);
    coda_tensor_t P3 = coda_tensor_3d(dc, CODA_F32, M, 2, 3), Tg = coda_tensor_1d(da, CODA_I32, M),
                  L = coda_tensor_1d(db, CODA_F32, M);
    P3.device = Tg.device = L.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_finish_lse(ctx, &P3, &Tg, -100, &L, &O, NULL), CODA_ERR_DEVICE);
    CHECK(memcmp(host, before, M * N * 4) == 0, "a finishing step wrote host memory it refused");
    /* and the lse tensor, written first, must be untouched when loss is refused */
    uint16_t *bb = malloc(N * K * 2);
    if (!bb) exit(1);
    dev_get(bb, db, N * K * 2);
    CHECK(memcmp(bb, hb, N * K * 2) == 0, "finish_lse wrote lse after refusing loss");
    free(bb), free(back), free(ha), free(hb), free(host), free(before);
    dev_free(da), dev_free(db), dev_free(dc);
}

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
        if (sk) tune_streamk(ctx, CODA_STREAMK_ON);
        for (int l = 0; l < 3; l++)
            for (int pc = 0; pc < G_NPLACES; pc++) {
                g_gemm_case(&E, &r, (coda_layout_t)l, sk ? 1500 : 300, sk ? 1801 : 131, 264, CODA_BF16, 1, 0,
                            (g_place_t)pc, (g_place_t)((pc + 1) % 4), (g_place_t)pc, 16, CODA_BF16);
                g_gemm_case(&E, &r, (coda_layout_t)l, sk ? 2304 : 129, sk ? 2043 : 77, 136, CODA_F32, 0.5f, 1.5f,
                            (g_place_t)((pc + 2) % 4), (g_place_t)pc, (g_place_t)pc, 16, CODA_BF16);
            }
        tune_streamk(ctx, CODA_STREAMK_AUTO);
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
    host_pointer_faults(ctx, &r);

    g_random(&E, &r, nrandom, texts, names, np);
    printf("test_guard_gpu: %d enumerated + %d random calls: %d ran and kept to their views, %d refused and "
           "changed nothing\n", enumerated, E.calls - enumerated, E.passed_ok, E.refused);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
