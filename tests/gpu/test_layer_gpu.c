/* test_layer_gpu.c - the LLaMA layer on CUDA (its GEMMs, epilogue programs,
 * finishing steps and, for head_dim 64 and 128, attention on the GPU; for
 * other head_dims attention on the CPU through host copies) against the
 * plain reference layer: y, loss, dx and
 * every weight gradient within 2 x (bf16 unfused error) + 1e-6 of float64.
 * Also the CPU layer on the same data, for comparison. Needs an sm_90a GPU. */
#include "harness.h"
#include "oracle/llama_check.h"

#include <cuda_runtime_api.h>

static void run_case(coda_context_t *ctx, const char *title, coda_llama_config_t c, int64_t batch, int64_t seq,
                     coda__llama_check_opts_t o) {
    coda__llama_check_t gpu, cpu;
    o.device = CODA_DEVICE_CUDA;
    coda_status_t s = coda__llama_check(ctx, &c, batch, seq, &o, &gpu);
    CHECK(s == CODA_OK, "%s: CUDA: %s: %s", title, coda_status_name(s), coda_last_error());
    if (s != CODA_OK) return;
    o.device = CODA_DEVICE_CPU;
    s = coda__llama_check(ctx, &c, batch, seq, &o, &cpu);
    CHECK(s == CODA_OK, "%s: CPU: %s: %s", title, coda_status_name(s), coda_last_error());
    printf("%s: d %lld, heads %lld/%lld x %lld, ffn %lld, vocab %lld, M = %lld x %lld "
           "(CUDA fwd %.1f ms, bwd %.1f ms)\n",
           title, (long long)c.d, (long long)c.n_heads, (long long)c.n_kv_heads, (long long)c.head_dim,
           (long long)c.ffn, (long long)c.vocab, (long long)batch, (long long)seq, 1e3 * gpu.t_forward,
           1e3 * gpu.t_backward);
    for (int i = 0; i < gpu.n_rows; i++) {
        const coda__llama_check_row_t *r = &gpu.rows[i];
        printf("  %-8s cuda %.3e  cpu %.3e  bf16 unfused %.3e  bound %.3e  %s\n", r->name, r->err,
               s == CODA_OK ? cpu.rows[i].err : NAN, r->base, r->bound, r->pass ? "ok" : "FAIL");
        CHECK(r->pass, "%s: %s error %.3e > bound %.3e", title, r->name, r->err, r->bound);
    }
}

int main(void) {
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "FAIL: no CUDA device: %s\n", coda_last_error());
        return 1;
    }
    coda_llama_config_t c = {.d = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .ffn = 160,
                             .vocab = 200, .eps = 1e-5f, .rope_theta = 10000.0f};
    coda__llama_check_opts_t o = {.seed = 1, .use_loss = 1, .use_dy = 1, .loss_scale = 1.0f,
                                  .ignore_every = 5, .grad_dtype = CODA_F32};
    run_case(ctx, "small, loss + dy", c, 2, 7, o);

    coda_llama_config_t nv = c;
    nv.vocab = 0; nv.n_kv_heads = 1; nv.ffn = 88;
    o.seed = 3; o.use_loss = 0; o.grad_dtype = CODA_BF16;
    run_case(ctx, "no LM head (MQA), dy only, bf16 grads", nv, 3, 5, o);

    coda_llama_config_t big = c;
    big.d = 200; big.n_kv_heads = 5; big.ffn = 136; big.vocab = 328; big.head_dim = 8; big.n_heads = 10;
    o.seed = 4; o.use_loss = 1; o.use_dy = 0; o.loss_scale = 1.0f / 999; o.ignore_every = 11;
    o.grad_dtype = CODA_F32;
    run_case(ctx, "M = 999, loss only", big, 3, 333, o);

    coda_llama_config_t demo = {.d = 256, .n_heads = 8, .n_kv_heads = 4, .head_dim = 32, .ffn = 688,
                                .vocab = 1000, .eps = 1e-5f, .rope_theta = 500000.0f};
    o.seed = 5; o.use_dy = 1; o.loss_scale = 1.0f / 128;
    run_case(ctx, "demo shape", demo, 2, 64, o);

    /* head_dim 64 and 128: the whole layer on the GPU (coda_attention's kernels) */
    coda_llama_config_t h64 = {.d = 256, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64, .ffn = 344,
                               .vocab = 520, .eps = 1e-5f, .rope_theta = 500000.0f};
    o.seed = 7; o.use_dy = 1; o.loss_scale = 1.0f / 154;
    run_case(ctx, "head_dim 64, attention on the GPU", h64, 2, 77, o);
    coda_llama_config_t h128 = h64;
    h128.n_heads = 2; h128.n_kv_heads = 1; h128.head_dim = 128;
    o.seed = 8; o.use_dy = 0; o.loss_scale = 1.0f / 131;
    run_case(ctx, "head_dim 128 (MQA), attention on the GPU, M = 131", h128, 1, 131, o);

    /* a non-blocking stream (as PyTorch side streams are): the layer's copies
     * and fills must be ordered on it, not on the default stream */
    cudaStream_t side;
    if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "FATAL: cudaStreamCreateWithFlags failed\n");
        return 1;
    }
    o.seed = 6;
    o.stream = side;
    run_case(ctx, "demo shape, non-blocking stream", demo, 2, 64, o);
    cudaStreamDestroy(side);

    coda_context_free(ctx);
    TEST_MAIN_END();
}
