/* cli_train.c - `coda train`: a small byte-level LLaMA trained on a text
 * file, written against the public API a C user has:
 *
 *   embedding      x = E[token] (bf16), here
 *   each block     coda_block_forward_pre, coda_attention_forward,
 *                  coda_block_forward_post (the last one with the final
 *                  norm's first half, g_next = gf: its epilogue gives y gf
 *                  and rstd(y) for the LM head)
 *   LM head        lmhead_lse, coda_finish_lse (the loss); backward:
 *                  lmhead_bwd, rmsnorm_bwd (dY, dgf), dWlm = dl^T b
 *   each block     coda_block_backward_post, coda_attention_backward,
 *                  coda_block_backward_pre, in reverse
 *   AdamW          on f32 master weights, bf16 copies for the GEMMs
 *
 * On a GPU (--device cuda, or auto where there is one and head_dim is 64
 * or 128, what the attention kernels take) every step above but the
 * embedding gather and AdamW runs on the device: the host gathers the
 * batch's embedding rows and keeps the f32 master weights and the AdamW
 * state, uploads the bf16 weights after each update and downloads the
 * gradients, the losses and dL/dx0 (small, for the byte-level models this
 * command trains). On the CPU backend the same calls run on host tensors.
 * Prints the loss and tokens per second. */
#include "cli.h"
#include "core/internal.h"
#include "layer/llama.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 256 /* bytes */
#define MAX_LAYERS 16

const char coda_cli_train_usage[] =
    "usage: coda train [--data FILE] [--steps N] [--layers L] [--d D] [--heads H]\n"
    "                  [--kv-heads K] [--ffn I] [--batch B] [--seq S] [--lr X]\n"
    "                  [--seed N] [--every N] [--device auto|cpu|cuda]\n"
    "  Train a byte-level LLaMA (vocabulary 256) on FILE with the split block\n"
    "  (coda.h section 9), coda's attention (section 11) between its halves,\n"
    "  the LM head and loss as epilogue programs, AdamW on the host; print the\n"
    "  loss and tokens per second every N steps.\n"
    "  --device     cuda: all but the embedding gather and AdamW on the GPU\n"
    "               (head_dim 64 or 128); auto (default): cuda where there is\n"
    "               a GPU and head_dim allows, else cpu\n"
    "  --data FILE  text to train on, at most 16 MiB (default\n"
    "               /usr/share/common-licenses/GPL-3)\n"
    "  --steps N    2..1000000 (default 100)     --every N  1..1000000 (default 10)\n"
    "  --layers L   1..16 (default 2)            --d D      8..4096 (default 64)\n"
    "  --heads H    1..256 (default 4)  --kv-heads K 1..256 (default 2; divides H);\n"
    "               head_dim = D/H, even\n"
    "  --ffn I      1..16384 (default 176)       --lr X     (default 0.003)\n"
    "  --batch B    1..256 (default 4)           --seq S    2..4096 (default 64)\n"
    "  --seed N     0..2^62 (default 1)\n"
    "exit status: 0 trained (the last steps' mean loss below the first's), 1 a\n"
    "call failed or the loss did not fall, 2 bad usage\n";

static int usage_error(const char *fmt, ...) CODA_PRINTF(1, 2);
static int usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("coda train: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fputs(coda_cli_train_usage, stderr);
    return 2;
}

/* ---- small helpers (bf16 conversion: core/internal.h, through attention.h) ---- */

typedef struct { uint64_t s; } rng_t;
static uint64_t rng_next(rng_t *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}
static float rng_normal(rng_t *r) { /* Box-Muller */
    double u = ((rng_next(r) >> 11) + 0.5) / 9007199254740992.0, v = ((rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Every buffer of the run, freed together. */
typedef struct { void **p; int n, cap; } pool_t;
static void *pool_alloc(pool_t *pl, size_t bytes) {
    if (pl->n == pl->cap) {
        int cap = pl->cap ? 2 * pl->cap : 64;
        void **p = realloc(pl->p, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        pl->p = p, pl->cap = cap;
    }
    void *q = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (q) {
        memset(q, 0, (bytes + 255) / 256 * 256);
        pl->p[pl->n++] = q;
    }
    return q;
}
static void pool_free(pool_t *pl) {
    for (int i = 0; i < pl->n; i++) free(pl->p[i]);
    free(pl->p);
}

/* A parameter: f32 master, its bf16 copy, gradient (f32) and AdamW moments
 * on the host; db and dg the bf16 copy and the gradient where the model runs
 * (on the CPU backend the same memory as b and g). */
typedef struct {
    int64_t rows, cols; /* cols 0: a vector */
    float *w, *g, *m, *v;
    uint16_t *b;
    void *db, *dg;
    coda_device_t dev;
} param_t;

static int param_new(pool_t *pl, param_t *p, int64_t rows, int64_t cols, rng_t *r, float scale, float one) {
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    p->rows = rows, p->cols = cols;
    p->w = pool_alloc(pl, n * 4), p->g = pool_alloc(pl, n * 4), p->m = pool_alloc(pl, n * 4);
    p->v = pool_alloc(pl, n * 4), p->b = pool_alloc(pl, n * 2);
    if (!p->w || !p->g || !p->m || !p->v || !p->b) return 0;
    for (size_t i = 0; i < n; i++) {
        p->w[i] = one + scale * rng_normal(r);
        p->b[i] = coda__f32_to_bf16(p->w[i]);
    }
    return 1;
}
static coda_tensor_t ptensor(const param_t *p, void *data, coda_dtype_t dt, coda_device_t dev) {
    coda_tensor_t t = p->cols ? coda_tensor_2d(data, dt, p->rows, p->cols) : coda_tensor_1d(data, dt, p->rows);
    t.device = dev;
    return t;
}
/* The bf16 weight and the gradient where the model runs, and on the host. */
static coda_tensor_t bf(const param_t *p) { return ptensor(p, p->db, CODA_BF16, p->dev); }
static coda_tensor_t grad(const param_t *p) { return ptensor(p, p->dg, CODA_F32, p->dev); }
static coda_tensor_t bf_host(const param_t *p) { return ptensor(p, p->b, CODA_BF16, CODA_DEVICE_CPU); }
static coda_tensor_t grad_host(const param_t *p) { return ptensor(p, p->g, CODA_F32, CODA_DEVICE_CPU); }
static void adamw(param_t *p, float lr, int t) {
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = p->cols ? 0.01f : 0.0f;
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    size_t n = (size_t)p->rows * (size_t)(p->cols ? p->cols : 1);
    for (size_t i = 0; i < n; i++) {
        float g = p->g[i];
        p->m[i] = b1 * p->m[i] + (1 - b1) * g;
        p->v[i] = b2 * p->v[i] + (1 - b2) * g * g;
        p->w[i] -= lr * ((p->m[i] / c1) / (sqrtf(p->v[i] / c2) + eps) + wd * p->w[i]);
        p->b[i] = coda__f32_to_bf16(p->w[i]);
    }
}

static coda_tensor_t t2(pool_t *pl, coda_dtype_t dt, int64_t r, int64_t c) {
    return coda_tensor_2d(pool_alloc(pl, (size_t)(r * c) * coda_dtype_size(dt)), dt, r, c);
}

/* Memory where the model runs: the device's (through the layer's memory
 * handle, as coda_llama does), zeroed, freed together. */
#define MAX_DEV_BUFS 512
typedef struct {
    coda__llama_mem_t *mem;
    coda_device_t dev;
    void *p[MAX_DEV_BUFS];
    int n, failed;
} dpool_t;
static void *dev_alloc(dpool_t *dp, size_t bytes) {
    void *p = NULL;
    if (dp->n == MAX_DEV_BUFS || coda__llama_mem_alloc(dp->mem, bytes ? bytes : 1, &p) != CODA_OK) {
        dp->failed = 1;
        return NULL;
    }
    dp->p[dp->n++] = p;
    return p;
}
static coda_tensor_t dev_tensor(dpool_t *dp, coda_dtype_t dt, int ndim, int64_t r, int64_t c, int64_t k) {
    int64_t n = r * (ndim > 1 ? c : 1) * (ndim > 2 ? k : 1);
    void *p = dev_alloc(dp, (size_t)n * coda_dtype_size(dt));
    coda_tensor_t t = ndim == 1 ? coda_tensor_1d(p, dt, r) : ndim == 2 ? coda_tensor_2d(p, dt, r, c)
                                                                      : coda_tensor_3d(p, dt, r, c, k);
    t.device = dp->dev;
    if (p && ndim < 3 && coda__llama_mem_zero(dp->mem, &t, NULL) != CODA_OK) dp->failed = 1;
    return t;
}
static coda_tensor_t d2(dpool_t *dp, coda_dtype_t dt, int64_t r, int64_t c) { return dev_tensor(dp, dt, 2, r, c, 0); }
static coda_tensor_t d1(dpool_t *dp, coda_dtype_t dt, int64_t n) { return dev_tensor(dp, dt, 1, n, 0, 0); }
static void dpool_free(dpool_t *dp) {
    for (int i = 0; i < dp->n; i++) coda__llama_mem_free(dp->mem, dp->p[i]);
    coda__llama_mem_close(dp->mem);
}
/* A parameter's copies where the model runs (the host's own on the CPU). */
static int param_place(dpool_t *dp, param_t *p) {
    size_t n = (size_t)p->rows * (size_t)(p->cols ? p->cols : 1);
    p->dev = dp->dev;
    if (dp->dev == CODA_DEVICE_CPU) {
        p->db = p->b, p->dg = p->g;
        return 1;
    }
    p->db = dev_alloc(dp, n * 2), p->dg = dev_alloc(dp, n * 4);
    return p->db && p->dg;
}

static coda_binding_t bt(const char *name, const coda_tensor_t *t) {
    coda_binding_t b;
    memset(&b, 0, sizeof b);
    b.name = name, b.tensor = *t;
    return b;
}
static coda_binding_t bs(const char *name, float v) {
    coda_binding_t b;
    memset(&b, 0, sizeof b);
    b.name = name, b.scalar = v;
    return b;
}

#define TRY(call)                                                                    \
    do {                                                                             \
        coda_status_t s_ = (call);                                                   \
        if (s_ != CODA_OK) {                                                         \
            fprintf(stderr, "coda train: %s: %s\n", #call, coda_last_error());        \
            goto out;                                                                \
        }                                                                            \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The partials' tensor program argument `name` needs for this GEMM. */
static coda_tensor_t partials(dpool_t *dp, const coda_program_t *p, const char *name, int64_t m, int64_t n,
                              const coda_tiling_t *tl) {
    int nd = 0;
    int64_t sh[3] = {0, 0, 0};
    coda_dtype_t dt = CODA_F32;
    coda_program_arg_shape(p, coda_program_find_arg(p, name), m, n, tl, &nd, sh, &dt);
    return dev_tensor(dp, dt, nd == 3 ? 3 : 2, sh[0], sh[1], sh[2]);
}

int coda_cli_train(int argc, char **argv) {
    const char *data_path = "/usr/share/common-licenses/GPL-3";
    long long steps = 100, layers = 2, d = 64, heads = 4, kv = 2, ffn = 176, batch = 4, seq = 64, seed = 1,
              every = 10;
    double lr = 3e-3;
    const char *device_name = "auto";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(coda_cli_train_usage, stdout);
            return 0;
        }
        static const char *const known[] = {"--data", "--steps", "--every", "--layers", "--d", "--heads",
                                             "--kv-heads", "--ffn", "--batch", "--seq", "--seed", "--lr",
                                             "--device"};
        int is_known = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) is_known |= !strcmp(a, known[k]);
        if (!is_known)
            return a[0] == '-' ? usage_error("unknown option '%s'", a) : usage_error("unexpected argument '%s'", a);
        if (i + 1 >= argc) return usage_error("%s needs a value", a);
        const char *v = argv[++i];
        int ok = 1;
        if (!strcmp(a, "--data")) data_path = v;
        else if (!strcmp(a, "--device")) ok = !strcmp(v, "auto") || !strcmp(v, "cpu") || !strcmp(v, "cuda"), device_name = v;
        /* 2 at least: the exit status compares the first steps' mean loss with the last's */
        else if (!strcmp(a, "--steps")) ok = coda_cli_parse_int(v, 2, 1000000, &steps);
        else if (!strcmp(a, "--every")) ok = coda_cli_parse_int(v, 1, 1000000, &every);
        else if (!strcmp(a, "--layers")) ok = coda_cli_parse_int(v, 1, MAX_LAYERS, &layers);
        else if (!strcmp(a, "--d")) ok = coda_cli_parse_int(v, 8, 4096, &d);
        else if (!strcmp(a, "--heads")) ok = coda_cli_parse_int(v, 1, 256, &heads);
        else if (!strcmp(a, "--kv-heads")) ok = coda_cli_parse_int(v, 1, 256, &kv);
        else if (!strcmp(a, "--ffn")) ok = coda_cli_parse_int(v, 1, 16384, &ffn);
        else if (!strcmp(a, "--batch")) ok = coda_cli_parse_int(v, 1, 256, &batch);
        else if (!strcmp(a, "--seq")) ok = coda_cli_parse_int(v, 2, 4096, &seq);
        else if (!strcmp(a, "--seed")) ok = coda_cli_parse_int(v, 0, (1ll << 62), &seed);
        else if (!strcmp(a, "--lr")) {
            char *end;
            lr = strtod(v, &end);
            ok = *v && !*end && lr > 0 && lr < 1;
        }
        if (!ok) return usage_error("bad value '%s' for %s", v, a);
    }
    if (d % heads || (d / heads) % 2 || heads % kv)
        return usage_error("--d %lld, --heads %lld, --kv-heads %lld: head_dim = d / heads must be a whole even "
                           "number and kv-heads must divide heads", d, heads, kv);

    FILE *f = fopen(data_path, "rb");
    if (!f) {
        fprintf(stderr, "coda train: cannot open %s: %s\n", data_path, strerror(errno));
        return 1;
    }
    static unsigned char text[1 << 24];
    errno = 0;
    size_t n_text = fread(text, 1, sizeof text, f);
    int read_err = ferror(f) ? (errno ? errno : EIO) : 0; /* a directory opens, then fails to read */
    int more = !read_err && n_text == sizeof text && fgetc(f) != EOF;
    fclose(f);
    if (read_err) {
        fprintf(stderr, "coda train: cannot read %s: %s\n", data_path, strerror(read_err));
        return 1;
    }
    if (more) { /* not cut silently: a review found the rest of a larger file never trained on */
        fprintf(stderr, "coda train: %s is larger than 16 MiB, the most train reads; give it a part of the file\n",
                data_path);
        return 1;
    }
    if (n_text < (size_t)seq + 2) {
        fprintf(stderr, "coda train: %s has %zu bytes, fewer than --seq + 2\n", data_path, n_text);
        return 1;
    }

    int rc = 1;
    pool_t pl = {0};
    dpool_t dp = {0};
    coda_context_t *ctx = NULL;
    coda_block_t *blk = NULL;
    coda_program_t *p_lse = NULL, *p_bwd = NULL, *p_rms = NULL;
    coda_llama_config_t cfg = {.d = d, .n_heads = heads, .n_kv_heads = kv, .head_dim = d / heads, .ffn = ffn,
                               .vocab = 0, .eps = 1e-5f, .rope_theta = 10000.0f};
    const int64_t M = batch * seq, nq = heads * (d / heads), nqkv = nq + 2 * kv * (d / heads), L = layers;
    rng_t r = {(uint64_t)seed * 0x9E3779B97F4A7C15ull + 7};
    TRY(coda_context_create(NULL, &ctx));
    const int hd_gpu = d / heads == 64 || d / heads == 128;
    coda_device_t dev = CODA_DEVICE_CPU;
    if (!strcmp(device_name, "cuda")) {
        if (!hd_gpu) {
            fprintf(stderr, "coda train: --device cuda needs head_dim = d / heads of 64 or 128 (got %lld)\n", d / heads);
            goto out;
        }
        dev = CODA_DEVICE_CUDA;
    } else if (!strcmp(device_name, "auto") && hd_gpu && coda_context_has_cuda(ctx)) {
        dev = CODA_DEVICE_CUDA;
    }
    TRY(coda__llama_mem_open(ctx, dev, 0, "coda train", &dp.mem));
    dp.dev = dev;
    TRY(coda_block_create(ctx, &cfg, dev, &blk));
    TRY(coda_program_parse(coda_builtin_program("lmhead_lse"), &p_lse));
    TRY(coda_program_parse(coda_builtin_program("lmhead_bwd"), &p_bwd));
    TRY(coda_program_parse(coda_builtin_program("rmsnorm_bwd"), &p_rms));

    /* parameters: embedding, per block g1 wqkv wo g2 wgu wd, final norm, LM head */
    param_t E, gf, wlm, P[MAX_LAYERS][6];
    int okp = param_new(&pl, &E, VOCAB, d, &r, 1.0f, 0.0f) && param_new(&pl, &gf, d, 0, &r, 0.0f, 1.0f) &&
              param_new(&pl, &wlm, VOCAB, d, &r, 1.0f / sqrtf((float)d), 0.0f);
    okp = okp && param_place(&dp, &E) && param_place(&dp, &gf) && param_place(&dp, &wlm);
    for (int64_t l = 0; okp && l < L; l++) {
        const int64_t rows[6] = {d, nqkv, d, d, 2 * ffn, d}, cols[6] = {0, d, nq, 0, d, ffn};
        for (int k = 0; okp && k < 6; k++)
            okp = param_new(&pl, &P[l][k], rows[k], cols[k], &r, cols[k] ? 1.0f / sqrtf((float)cols[k]) : 0.0f,
                            cols[k] ? 0.0f : 1.0f) && param_place(&dp, &P[l][k]);
    }
    if (!okp) {
        fprintf(stderr, "coda train: out of memory\n");
        goto out;
    }

    /* the host's side of a step: the batch's embedding rows, tokens,
     * targets, losses and dL/dx0 */
    coda_tensor_t hx0 = t2(&pl, CODA_BF16, M, d), htg = coda_tensor_1d(pool_alloc(&pl, (size_t)M * 4), CODA_I32, M);
    coda_tensor_t hloss = coda_tensor_1d(pool_alloc(&pl, (size_t)M * 4), CODA_F32, M), hdx = t2(&pl, CODA_BF16, M, d);
    coda_tensor_t hpos = coda_tensor_1d(pool_alloc(&pl, (size_t)M * 4), CODA_F32, M);
    int32_t *tok = pool_alloc(&pl, (size_t)M * 4);
    /* activations (each block's saved tensors) and scratch, where the model runs */
    size_t ws_bytes, aws_bytes;
    coda_attention_shape_t ash = {batch, seq, heads, kv, d / heads};
    /* one workspace for the calls a step makes; its one backward per
     * forward spends z (dz is written over it) */
    ws_bytes = 0;
    const coda_block_call_t calls[] = {CODA_BLOCK_FORWARD_PRE, CODA_BLOCK_FORWARD_POST,
                                       CODA_BLOCK_BACKWARD_POST_SPEND_Z, CODA_BLOCK_BACKWARD_PRE};
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        size_t n;
        TRY(coda_block_workspace_size(blk, calls[i], M, &n));
        if (n > ws_bytes) ws_bytes = n;
    }
    TRY(coda_attention_workspace_size(ctx, dev, &ash, &aws_bytes));
    void *ws = dev_alloc(&dp, ws_bytes), *aws = aws_bytes ? dev_alloc(&dp, aws_bytes) : NULL;
    coda_tensor_t X[MAX_LAYERS + 1], O[MAX_LAYERS], ALSE[MAX_LAYERS], pos = d1(&dp, CODA_F32, M);
    coda_block_acts_t A[MAX_LAYERS];
    memset(A, 0, sizeof A);
    for (int64_t l = 0; l <= L; l++) X[l] = d2(&dp, CODA_BF16, M, d);
    for (int64_t l = 0; l < L; l++) {
        O[l] = d2(&dp, CODA_BF16, M, nq), ALSE[l] = d2(&dp, CODA_F32, M, heads);
        A[l].r1 = d1(&dp, CODA_F32, M), A[l].qkv = d2(&dp, CODA_BF16, M, nqkv), A[l].h = d2(&dp, CODA_BF16, M, d);
        A[l].r2 = d1(&dp, CODA_F32, M), A[l].z = d2(&dp, CODA_BF16, M, 2 * ffn);
        A[l].spend_z = 1;
    }
    coda_tensor_t yg = d2(&dp, CODA_BF16, M, d), rf = d1(&dp, CODA_F32, M), tg = d1(&dp, CODA_I32, M);
    coda_tensor_t lse = d1(&dp, CODA_F32, M), loss = d1(&dp, CODA_F32, M), dl = d2(&dp, CODA_BF16, M, VOCAB);
    coda_tensor_t svec = d1(&dp, CODA_F32, M), zeros = d2(&dp, CODA_BF16, M, d), b = d2(&dp, CODA_BF16, M, d);
    coda_tensor_t dY = d2(&dp, CODA_BF16, M, d), dX = d2(&dp, CODA_BF16, M, d), dh = d2(&dp, CODA_BF16, M, d);
    coda_tensor_t dO = d2(&dp, CODA_BF16, M, nq), dqkv = d2(&dp, CODA_F32, M, nqkv);
    coda_tiling_t tl_lm, tl_dg;
    TRY(coda_choose_program_tiling(ctx, dev, CODA_LAYOUT_NT, M, VOCAB, d, p_bwd, &tl_lm));
    TRY(coda_choose_program_tiling(ctx, dev, CODA_LAYOUT_NN, M, d, VOCAB, p_rms, &tl_dg));
    coda_tensor_t lsep = partials(&dp, p_lse, "part", M, VOCAB, &tl_lm), sp = partials(&dp, p_bwd, "s", M, VOCAB, &tl_lm);
    coda_tensor_t dgp = partials(&dp, p_rms, "dg", M, d, &tl_dg), gfv = d1(&dp, CODA_F32, d);
    if (dp.failed || !ws || (aws_bytes && !aws) || !tok || !hx0.data || !htg.data || !hloss.data || !hdx.data ||
        !hpos.data) {
        fprintf(stderr, "coda train: out of memory: %s\n", coda_last_error());
        goto out;
    }
    for (int64_t i = 0; i < M; i++) ((float *)hpos.data)[i] = (float)(i % seq);
    TRY(coda__llama_mem_copy(dp.mem, &hpos, &pos, NULL));

    /* every parameter: the host's bf16 copy where the model runs */
    param_t *all[3 + 6 * MAX_LAYERS];
    int n_all = 0;
    all[n_all++] = &E, all[n_all++] = &gf, all[n_all++] = &wlm;
    for (int64_t l = 0; l < L; l++)
        for (int k = 0; k < 6; k++) all[n_all++] = &P[l][k];
    for (int i = 0; i < n_all; i++) {
        coda_tensor_t h = bf_host(all[i]), t = bf(all[i]);
        TRY(coda__llama_mem_copy(dp.mem, &h, &t, NULL));
    }

    printf("coda train: %s (%zu bytes), %lld blocks, d %lld, heads %lld/%lld x %lld, ffn %lld, %lld x %lld bytes "
           "a step, %s\n", data_path, n_text, (long long)L, d, heads, kv, d / heads, ffn, batch, seq,
           dev == CODA_DEVICE_CUDA ? "GPU (CUDA backend)" : "CPU backend");
    double t0 = now(), first = 0, last = 0, acc = 0;
    int64_t window = steps < 20 ? (steps + 1) / 2 : 10;
    for (int64_t step = 1; step <= steps; step++) {
        /* a batch of windows; the targets are the next bytes */
        for (int64_t bi = 0; bi < batch; bi++) {
            size_t at = (size_t)(rng_next(&r) % (n_text - (size_t)seq - 1));
            for (int64_t j = 0; j < seq; j++) {
                int32_t c = text[at + (size_t)j];
                tok[bi * seq + j] = c;
                ((int32_t *)htg.data)[bi * seq + j] = text[at + (size_t)j + 1];
                memcpy((uint16_t *)hx0.data + (bi * seq + j) * d, E.b + (size_t)c * (size_t)d, (size_t)d * 2);
            }
        }
        TRY(coda__llama_mem_copy(dp.mem, &hx0, &X[0], NULL));
        TRY(coda__llama_mem_copy(dp.mem, &htg, &tg, NULL));
        /* forward */
        coda_llama_weights_t W[MAX_LAYERS], G[MAX_LAYERS];
        for (int64_t l = 0; l < L; l++) {
            memset(&W[l], 0, sizeof W[l]), memset(&G[l], 0, sizeof G[l]);
            W[l].g1 = bf(&P[l][0]), W[l].wqkv = bf(&P[l][1]), W[l].wo = bf(&P[l][2]);
            W[l].g2 = bf(&P[l][3]), W[l].wgu = bf(&P[l][4]), W[l].wd = bf(&P[l][5]);
            G[l].g1 = grad(&P[l][0]), G[l].wqkv = grad(&P[l][1]), G[l].wo = grad(&P[l][2]);
            G[l].g2 = grad(&P[l][3]), G[l].wgu = grad(&P[l][4]), G[l].wd = grad(&P[l][5]);
        }
        coda_tensor_t gfb = bf(&gf), wlmb = bf(&wlm);
        for (int64_t l = 0; l < L; l++) {
            int lastl = l == L - 1;
            TRY(coda_block_forward_pre(blk, &W[l], &X[l], NULL, &pos, &A[l], ws, ws_bytes, NULL));
            TRY(coda_attention_forward(ctx, &ash, &A[l].qkv, &O[l], &ALSE[l], NULL));
            TRY(coda_block_forward_post(blk, &W[l], &X[l], &O[l], &A[l], &X[l + 1], lastl ? &gfb : NULL,
                                        lastl ? &yg : NULL, lastl ? &rf : NULL, ws, ws_bytes, NULL));
        }
        {   /* LM head and loss: the logits are never stored */
            coda_binding_t b3[] = {bt("r", &rf), bt("t", &tg), bt("part", &lsep)};
            TRY(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &yg, &wlmb, p_lse, b3, 3, &tl_lm, NULL));
            TRY(coda_finish_lse(ctx, &lsep, &tg, -100, &lse, &loss, NULL));
        }
        TRY(coda__llama_mem_copy(dp.mem, &loss, &hloss, NULL));
        double mean = 0;
        for (int64_t i = 0; i < M; i++) mean += ((float *)hloss.data)[i];
        mean /= (double)M;
        if (step <= window) first += mean / (double)window;
        if (step > steps - window) last += mean / (double)window;
        acc += mean;
        /* backward: the LM head recomputed, then the final norm */
        {
            coda_binding_t b6[] = {bt("r", &rf), bt("logz", &lse), bt("t", &tg), bs("scale", 1.0f / (float)M),
                                   bt("dl", &dl), bt("s", &sp)};
            TRY(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &yg, &wlmb, p_bwd, b6, 6, &tl_lm, NULL));
            TRY(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &sp, &svec, NULL));
            coda_binding_t b9[] = {bt("dres", &zeros), bt("x", &X[L]), bt("g", &gfb), bt("r", &rf), bt("s", &svec),
                                   bs("invd", 1.0f / (float)d), bt("dx", &dY), bt("b", &b), bt("dg", &dgp)};
            TRY(coda_gemm_epilogue(ctx, CODA_LAYOUT_NN, &dl, &wlmb, p_rms, b9, 9, &tl_dg, NULL));
            TRY(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &dgp, &gfv, NULL));
            coda_tensor_t gg = grad(&gf), gw = grad(&wlm);
            TRY(coda__llama_mem_copy(dp.mem, &gfv, &gg, NULL));
            TRY(coda_gemm(ctx, CODA_LAYOUT_TN, &dl, &b, &gw, 1.0f, 0.0f, NULL));
        }
        for (int64_t l = L - 1; l >= 0; l--) {
            TRY(coda_block_backward_post(blk, &W[l], &O[l], &A[l], &dY, &dO, &dh, &G[l], ws, ws_bytes, NULL));
            TRY(coda_attention_backward(ctx, &ash, &A[l].qkv, &O[l], &ALSE[l], &dO, &dqkv, aws, aws_bytes, NULL));
            TRY(coda_block_backward_pre(blk, &W[l], &X[l], &pos, &A[l], &dqkv, &dh, &dX, &G[l], ws, ws_bytes, NULL));
            coda_tensor_t t = dY;
            dY = dX, dX = t;
        }
        /* the gradients to the host (nothing to copy on the CPU backend) */
        TRY(coda__llama_mem_copy(dp.mem, &dY, &hdx, NULL));
        for (int i = 1; i < n_all; i++) {
            coda_tensor_t t = grad(all[i]), h = grad_host(all[i]);
            TRY(coda__llama_mem_copy(dp.mem, &t, &h, NULL));
        }
        /* the embedding's gradient: each token's row of dL/dx0 */
        memset(E.g, 0, (size_t)VOCAB * (size_t)d * 4);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < d; j++)
                E.g[(size_t)tok[i] * (size_t)d + (size_t)j] += coda__bf16_to_f32(((uint16_t *)hdx.data)[i * d + j]);
        for (int i = 0; i < n_all; i++) {
            adamw(all[i], (float)lr, (int)step);
            coda_tensor_t h = bf_host(all[i]), t = bf(all[i]);
            TRY(coda__llama_mem_copy(dp.mem, &h, &t, NULL));
        }
        if (step % every == 0 || step == steps) {
            double dt = now() - t0;
            const int64_t n_mean = step % every ? step % every : every; /* the steps since the last report */
            printf("step %6lld  loss %.4f  (mean of the last %lld: %.4f)  %.0f tokens/s\n", (long long)step, mean,
                   (long long)n_mean, acc / (double)n_mean, (double)(step * M) / dt);
            acc = 0;
        }
    }
    printf("loss %.4f -> %.4f (means of the first and last %lld steps), %.1f s\n", first, last, (long long)window,
           now() - t0);
    rc = last < first ? 0 : 1;
    if (rc) fprintf(stderr, "coda train: the loss did not fall\n");
out:
    coda_program_free(p_lse), coda_program_free(p_bwd), coda_program_free(p_rms);
    coda_block_free(blk);
    if (dp.mem) dpool_free(&dp);
    coda_context_free(ctx);
    pool_free(&pl);
    return rc;
}
