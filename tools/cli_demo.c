/* cli_demo.c - `coda demo`: a small LLaMA layer, forward and backward, run as
 * GEMM-epilogue programs and checked against the plain reference layer.
 *
 * Each output (y, the loss, dx, every weight gradient) is compared with the
 * float64 reference; the bound is the rule of docs/testing.md, twice the error of the
 * plain bf16 unfused computation plus 1e-6. */
#include "cli.h"
#include "oracle/llama_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int coda_cli_parse_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

const char coda_cli_demo_usage[] =
    "usage: coda demo [--device auto|cpu|cuda] [--seed N] [--batch B] [--seq S]\n"
    "  One LLaMA layer + LM head + cross-entropy, forward and backward through\n"
    "  the epilogue programs, checked against the unfused reference.\n"
    "  --device D  auto (default: CUDA if present, else the CPU), cpu or cuda\n"
    "  --seed N    random seed, 0..2^62 (default 1)\n"
    "  --batch B   sequences, 1..4096 (default 2)\n"
    "  --seq S     tokens per sequence, 1..4096 (default 64)\n"
    "exit status: 0 all outputs within tolerance, 1 one is not or a call\n"
    "failed, 2 bad usage\n";

/* Bad usage: the problem, then the usage, on stderr. */
static int demo_usage_error(const char *fmt, ...) CODA_PRINTF(1, 2);
static int demo_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("coda demo: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fputs(coda_cli_demo_usage, stderr);
    return 2;
}

int coda_cli_demo(int argc, char **argv) {
    coda_llama_config_t cfg = {.d = 256, .n_heads = 8, .n_kv_heads = 4, .head_dim = 32, .ffn = 688,
                               .vocab = 1000, .eps = 1e-5f, .rope_theta = 500000.0f};
    long long batch = 2, seq = 64, seed = 1;
    const char *dev = "auto";
    /* Options first, and only then a context: --help and bad usage must not
     * wait on (or fail for want of) a GPU. */
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i];
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help")) {
            fputs(coda_cli_demo_usage, stdout);
            return 0;
        }
        long long *dst = !strcmp(opt, "--seed") ? &seed : !strcmp(opt, "--batch") ? &batch
                       : !strcmp(opt, "--seq") ? &seq : NULL;
        if (!dst && strcmp(opt, "--device") != 0)
            return demo_usage_error("%s '%s'", opt[0] == '-' ? "unknown option" : "unexpected argument", opt);
        if (i + 1 == argc) return demo_usage_error("%s needs a value", opt);
        const char *val = argv[++i];
        if (!dst) {
            if (strcmp(val, "auto") && strcmp(val, "cpu") && strcmp(val, "cuda"))
                return demo_usage_error("--device takes auto, cpu or cuda, not '%s'", val);
            dev = val;
        } else if (!coda_cli_parse_int(val, dst == &seed ? 0 : 1, dst == &seed ? (1ll << 62) : 4096, dst)) {
            return demo_usage_error("%s takes an integer in %s, not '%s'", opt,
                                    dst == &seed ? "0..2^62" : "1..4096", val);
        }
    }
    coda_context_t *ctx = NULL;
    if (coda_context_create(NULL, &ctx) != CODA_OK) {
        fprintf(stderr, "coda demo: %s\n", coda_last_error());
        return 1;
    }
    /* Asked for CUDA where there is none: say so before printing a header
     * that names the CUDA backend. */
    if (!strcmp(dev, "cuda") && !coda_context_has_cuda(ctx)) {
        fprintf(stderr, "coda demo: --device cuda, but CUDA is unavailable here (see 'coda info'); "
                        "--device cpu runs on the CPU backend\n");
        coda_context_free(ctx);
        return 1;
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
        coda_context_free(ctx);
        return 1;
    }
    coda_context_free(ctx);
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
