/* test_lm_loss_gpu.c - tests/test_lm_loss.c's checks of coda_lm_loss run on
 * CUDA tensors (the same float64 reference and the same 2x-bf16 rule), plus
 * shapes only the GPU runs in reasonable time and the GPU's own refusals.
 * Needs an sm_90a GPU. */
#pragma GCC diagnostic ignored "-Wunused-function" /* test_bad_input: the CPU's */
#include "gpu/cuda_check.h"
#define LM_TEST_CUDA 1
#include "../test_lm_loss.c"

/* Larger and odd shapes: a vocabulary that is not a multiple of the tile or
 * of 8, several chunks with a short last one, the tiling a big N gets, and
 * each of the rows kernel's block sizes (128 threads below V = 32768, 256
 * below 65536, 512 from there: lm_steps.c's rows_threads), Qwen's 151936. */
static void test_large(coda_context_t *ctx) {
    static const struct { int64_t m, d, v, chunk; } shapes[] = {
        {300, 64, 1000, 128}, {136, 128, 4099, 0}, {77, 256, 32003, 32}, {40, 64, 40009, 16}, {16, 64, 151936, 0}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        problem_t p = make_problem(51 + s, shapes[s].m, shapes[s].d, shapes[s].v, 0.35f, 5);
        coda_lm_loss_opts_t o;
        coda_lm_loss_opts_init(&o);
        o.chunk_rows = shapes[s].chunk;
        for (int variant = 0; variant < 2; variant++) {
            if (variant) {
                o.label_smoothing = 0.1f;
                o.z_loss = 1e-4f;
                o.softcap = 4.0f;
            }
            char what[96];
            snprintf(what, sizeof what, "GPU (%lld, %lld, %lld) chunk %lld %s", (long long)p.m, (long long)p.d,
                     (long long)p.v, (long long)o.chunk_rows, variant ? "all options" : "plain");
            check_against_reference(ctx, &p, &o, CODA_BF16, CODA_F32, what);
        }
        free_problem(&p);
    }
}

/* What only the GPU refuses: d not a multiple of 8, host memory. */
static void test_gpu_refusals(coda_context_t *ctx) {
    problem_t p = make_problem(61, 16, 12, 40, 0.5f, 0);
    coda_lm_loss_opts_t o;
    coda_lm_loss_opts_init(&o);
    result_t r = new_result(&p, CODA_F32, CODA_F32);
    CHECK_STATUS(run(ctx, &p, &o, &r, 1), CODA_ERR_SHAPE); /* d = 12 */
    CHECK(all_nan(r.loss, p.m) && all_nan(r.dx, p.m * p.d), "a refused call wrote an output");
    free_res(&r);
    free_problem(&p);

    p = make_problem(62, 16, 16, 40, 0.5f, 0);
    float loss[16];
    coda_tensor_t x = on_dev(mat(p.x, CODA_BF16, p.m, p.d)), w = on_dev(mat(p.w, CODA_BF16, p.v, p.d));
    coda_tensor_t t = on_dev(coda_tensor_1d(p.t, CODA_I32, p.m)), lt = on_dev(coda_tensor_1d(loss, CODA_F32, p.m));
    size_t bytes;
    REQUIRE_OK(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CUDA, p.m, p.d, p.v, &o, &bytes));
    void *ws;
    CUDA_OK(cudaMalloc(&ws, bytes));
    CHECK_STATUS(coda_lm_loss(ctx, &x, &w, &t, &o, &lt, NULL, NULL, NULL, ws, bytes, NULL), CODA_ERR_DEVICE);
    CUDA_OK(cudaFree(ws));
    free_problem(&p);
}

int main(void) {
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    test_inf_logit(ctx);
    test_options(ctx);
    test_chunks_and_modes(ctx);
    test_nan_and_targets(ctx);
    test_i64_targets(ctx);
    test_large(ctx);
    test_scale(ctx);
    test_gpu_refusals(ctx);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
