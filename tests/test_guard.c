/* test_guard.c - every entry point on the CPU backend through guarded views
 * (tests/guard_cases.h): outputs inside larger blocks of sentinel bytes,
 * with padded rows, column slices and offset base pointers; inputs checked
 * unchanged; results bit for bit those of the same call on contiguous
 * tensors; failing calls change nothing. Then a randomized API test.
 *
 *   test_guard            the enumerated cases, then 400 random calls
 *   test_guard N          N random calls */
#include "guard_cases.h"
#include "class_programs.h"

static void *host_alloc(size_t n) { return h_alloc(n); }
static void host_put(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
static const g_mem_t host_mem = {CODA_DEVICE_CPU, host_alloc, free, host_put, host_put};

int main(int argc, char **argv) {
    int nrandom = argc > 1 ? atoi(argv[1]) : 400;
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    g_env_t E = {.ctx = ctx, .mem = &host_mem, .tol_bf16 = 0, .tol_f32 = 0, .tol_layer = 0, .align = 2,
                 .verbose = getenv("CODA_TEST_VERBOSE") != NULL};
    h_rng r = rng_new(2026);

    /* plain GEMM: every layout, every placement of C, odd extents */
    for (int l = 0; l < 3; l++)
        for (int pc = 0; pc < G_NPLACES; pc++) {
            g_gemm_case(&E, &r, (coda_layout_t)l, 37, 13, 21, CODA_BF16, 1.0f, 0.0f, (g_place_t)((pc + 1) % 4),
                        (g_place_t)((pc + 2) % 4), (g_place_t)pc, 2, CODA_BF16);
            g_gemm_case(&E, &r, (coda_layout_t)l, 5, 1, 9, CODA_F32, 2.0f, 0.5f, (g_place_t)pc, (g_place_t)pc,
                        (g_place_t)pc, 4, CODA_F32);
        }
    /* fused GEMM: the layer's programs and one per primitive class */
    const char *texts[64], *names[64];
    int np = 0;
    for (const char *const *b = coda_builtin_program_names(); *b && np < 48; b++)
        names[np] = *b, texts[np++] = coda_builtin_program(*b);
    for (int i = 0; i < N_PRIMITIVE; i++) names[np] = "class", texts[np++] = primitive_programs[i];
    for (int i = 0; i < np; i++)
        for (int l = 0; l < 3; l++) g_fused_case(&E, &r, names[i], texts[i], (coda_layout_t)l, 29, 22, 19, NULL, 0, 0);
    /* finishing steps */
    for (int f = 0; f < 5; f++)
        for (int pl = 0; pl < G_NPLACES; pl++) g_finish_case(&E, &r, f, 33, 1 + f, (g_place_t)pl, (g_place_t)pl);
    /* the layer */
    coda_llama_config_t c = {.d = 16, .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .ffn = 24, .vocab = 40,
                             .eps = 1e-5f, .rope_theta = 10000.0f};
    for (int pl = 0; pl < G_NPLACES; pl++) g_layer_case(&E, &r, c, 2, 5, (g_place_t)pl, pl % 2 == 0, 0);
    int enumerated = E.calls;

    g_random(&E, &r, nrandom, texts, names, np);
    printf("test_guard: %d enumerated + %d random calls: %d ran and kept to their views, %d refused and "
           "changed nothing\n", enumerated, E.calls - enumerated, E.passed_ok, E.refused);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
