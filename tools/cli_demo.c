/* cli_demo.c - `coda demo`: a small LLaMA layer, forward and backward, run as
 * GEMM-epilogue programs and checked against the plain reference layer.
 *
 * Each output (y, the loss, dx, every weight gradient) is compared with the
 * float64 reference; the bound is DESIGN.md's rule, twice the error of the
 * plain bf16 unfused computation plus 1e-6. */
#include "cli.h"
#include "layer/llama_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int coda_cli_demo(coda_context_t *ctx, int argc, char **argv) {
    coda_llama_config_t cfg = {.d = 256, .n_heads = 8, .n_kv_heads = 4, .head_dim = 32, .ffn = 688,
                               .vocab = 1000, .eps = 1e-5f, .rope_theta = 500000.0f};
    long long batch = 2, seq = 64, seed = 1;
    const char *dev = "auto";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc &&
            (!strcmp(argv[i + 1], "auto") || !strcmp(argv[i + 1], "cpu") || !strcmp(argv[i + 1], "cuda"))) {
            dev = argv[++i];
            continue;
        }
        long long *dst = !strcmp(argv[i], "--seed") ? &seed : !strcmp(argv[i], "--batch") ? &batch
                       : !strcmp(argv[i], "--seq") ? &seq : NULL;
        if (!dst || i + 1 == argc || !parse_int(argv[i + 1], dst == &seed ? 0 : 1, dst == &seed ? (1ll << 62) : 4096, dst)) {
            fprintf(stderr, "usage: coda demo [--device auto|cpu|cuda] [--seed N] [--batch B (1..4096)] "
                            "[--seq S (1..4096)]\n");
            return 2;
        }
        i++;
    }
    /* auto: the GPU when there is one (its GEMMs and epilogues; attention and
     * the other non-GEMM steps still run on the CPU), else the CPU backend. */
    coda_device_t device = !strcmp(dev, "cuda") || (!strcmp(dev, "auto") && coda_context_has_cuda(ctx))
                               ? CODA_DEVICE_CUDA : CODA_DEVICE_CPU;
    const char *backend = device == CODA_DEVICE_CUDA ? "CUDA (GEMMs + epilogues; attention on the CPU)"
                                                     : "CPU reference backend";
    printf("coda demo: one LLaMA layer + LM head + cross-entropy, forward and backward\n"
           "  d %lld, heads %lld (kv %lld) x %lld, ffn %lld, vocab %lld, batch %lld x seq %lld, seed %lld\n"
           "  backend: %s\n  checked against the unfused reference (float64 and bf16)\n\n",
           (long long)cfg.d, (long long)cfg.n_heads, (long long)cfg.n_kv_heads, (long long)cfg.head_dim,
           (long long)cfg.ffn, (long long)cfg.vocab, batch, seq, seed, backend);

    coda__llama_check_opts_t o = {.seed = (uint64_t)seed, .use_loss = 1, .use_dy = 1, .loss_scale = 1.0f / (float)(batch * seq),
                                  .ignore_every = 7, .grad_dtype = CODA_F32};
    o.device = device;
    coda__llama_check_t r;
    coda_status_t s = coda__llama_check(ctx, &cfg, batch, seq, &o, &r);
    if (s != CODA_OK && device == CODA_DEVICE_CUDA && !strcmp(dev, "auto")) {
        printf("  CUDA run failed (%s: %s); running on the CPU backend instead\n\n", coda_status_name(s),
               coda_last_error());
        backend = "CPU reference backend";
        o.device = CODA_DEVICE_CPU;
        s = coda__llama_check(ctx, &cfg, batch, seq, &o, &r);
    }
    if (s != CODA_OK) {
        fprintf(stderr, "coda demo: %s: %s\n", coda_status_name(s), coda_last_error());
        return 1;
    }
    printf("  %-8s  %-12s  %-12s  %-12s  %s\n", "output", "rel. error", "bf16 plain", "bound", "");
    for (int i = 0; i < r.n_rows; i++)
        printf("  %-8s  %.3e     %.3e     %.3e     %s\n", r.rows[i].name, r.rows[i].err, r.rows[i].base,
               r.rows[i].bound, r.rows[i].pass ? "pass" : "FAIL");
    printf("\n  time: forward %.1f ms, backward %.1f ms (coda, %s); reference %.1f ms\n",
           1e3 * r.t_forward, 1e3 * r.t_backward, backend, 1e3 * r.t_reference);
    printf("  rel. error = ||out - f64|| / ||f64||; bound = 2 x (bf16 plain error) + 1e-6\n");
    printf("%s\n", r.all_pass ? "demo: all outputs within tolerance" : "demo: FAILED");
    return r.all_pass ? 0 : 1;
}
