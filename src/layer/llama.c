/* llama.c - the whole layer of coda.h section 8: one LLaMA block (+ the
 * final norm, LM head and cross-entropy), forward and backward, with its
 * activations kept in the handle.
 *
 * It is the split block of block.c around coda's own attention
 * (coda_attention_*: the CUDA kernels on a CUDA layer with head_dim 64 or
 * 128, else the CPU's attention.c, on host copies for a CUDA layer), with
 * the LM head after it (docs/layer.md; M tokens):
 *   forward
 *     block pre    x -> r1, qkv                           (coda_block_forward_pre)
 *     attention    o, alse                                (coda_attention_forward)
 *     block post   x, o -> h, r2, z, y; with a loss also y gf, rf (the
 *                  final norm's first half, in the down projection's epilogue)
 *     LM head      lmhead_lse(yg Wlm^T; rf, targets)       -> lse, loss
 *   backward
 *     LM head      lmhead_bwd(yg Wlm^T)                    dl (M, V), sf
 *                  rmsnorm_bwd(dl Wlm; dres dy, x y, gf)   dY, b; dWlm = dl^T b
 *     block post   dY -> do, dh; dWo, dg2, dWgu, dWd       (coda_block_backward_post)
 *     attention    do -> dqkv (f32)                        (coda_attention_backward)
 *     block pre    dqkv, dh -> dx; dg1, dWqkv             (coda_block_backward_pre)
 *
 * On CUDA the block's calls need a multiple of 8 tokens (the weight
 * gradients contract over them): the handle's buffers have mp = M rounded
 * up to 8 rows, the extra rows zero. Zero rows stay zero or finite through
 * the chain (x = 0 gives xg = 0, qkv = 0, h = 0, y = 0; their targets are
 * ignored) and add nothing to any weight gradient, so the handle runs the
 * block on mp rows and hands the caller its M. */
#include "layer/block.h"
#include "core/context.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define IGNORE_INDEX (-100)
#define MAX_BUFS 48

/* The LM head's GEMMs, each with its tiling (sizes its partials). */
enum { G_LM, G_LM_DGRAD, G_COUNT };

typedef struct { coda_tensor_t d, h; } pair_t;

struct coda_llama {
    coda_context_t *ctx;
    coda_llama_config_t cfg;
    int64_t batch, seq, m;      /* m = batch * seq tokens                        */
    int64_t mp;                 /* rows the block runs on: m, or m rounded up to 8 on CUDA */
    coda_device_t device;
    int device_index;
    coda_block_t *block;
    coda_tiling_t tiling[G_COUNT];

    coda__llama_mem_t *mem;     /* allocations and copies on `device`              */
    struct { void *p; int host; } bufs[MAX_BUFS]; /* freed by coda_llama_free */
    int n_bufs;
    void *ws;                   /* the block's workspace                           */
    size_t ws_bytes;
    int dev_attn;               /* attention on the layer's device (else host copies) */
    coda_attention_shape_t ash; /* batch, seq, heads                               */
    void *aws;                  /* coda_attention_backward's workspace             */
    size_t aws_bytes;

    /* Buffers attention touches come in pairs: .d on the layer's device,
     * .h its host shadow for attention on the host (the same memory on a
     * CPU layer or with dev_attn). Device buffers have mp rows. */

    /* Saved by the forward pass for the backward pass. */
    coda_tensor_t x;            /* (mp, d) bf16   copy of the layer input          */
    coda_tensor_t pos;          /* (mp) f32       position of each token           */
    coda_block_acts_t acts;     /* r1, qkv, h, r2, z                              */
    pair_t qkv;                 /* (mp, nqkv) bf16 acts.qkv and its host shadow    */
    pair_t o;                   /* (mp, nq) bf16  attention output                 */
    coda_tensor_t alse;         /* (m, n_heads) f32 attention lse (where attention runs) */
    coda_tensor_t y;            /* (mp, d) bf16   layer output                     */
    coda_tensor_t yg;           /* (mp, d) bf16   y * gf (LM head)                 */
    coda_tensor_t rf;           /* (mp) f32       rstd of y (LM head)              */
    coda_tensor_t lse;          /* (mp) f32       logits' log-sum-exp (LM head)    */
    coda_tensor_t targets;      /* (mp) i32       copy of the targets, -100 past m */

    /* Scratch. */
    coda_tensor_t tcheck;       /* (m) i32        host copy of targets, checked    */
    coda_tensor_t lsep;         /* (mp, n_tiles, 3) f32 lse partials               */
    coda_tensor_t loss;         /* (mp) f32                                        */
    coda_tensor_t sp;           /* (mp, n_tiles) f32 row partials of lmhead_bwd    */
    coda_tensor_t svec;         /* (mp) f32       their sum                        */
    coda_tensor_t colp;         /* (d, m_tiles) f32 column partials (dgf)          */
    coda_tensor_t gvec;         /* (d) f32        the finished dgf                 */
    coda_tensor_t dl;           /* (mp, V) bf16   dL/dlogits                       */
    coda_tensor_t dres;         /* (mp, d) bf16   dy copied in, or zeros without one */
    coda_tensor_t b;            /* (mp, d) bf16   normalised y, for dWlm           */
    coda_tensor_t dY;           /* (mp, d) bf16   dL/dy, through both paths        */
    coda_tensor_t dh;           /* (mp, d) bf16   dL/dh                            */
    pair_t do_;                 /* (mp, nq) bf16  dL/do                            */
    pair_t dqkv;                /* (mp, nqkv) f32 attention input gradient         */
    coda_tensor_t dx;           /* (mp, d) bf16   dL/dx when mp > m                */

    int have_forward;           /* a forward pass saved its activations            */
    int have_loss;              /* ... and computed a loss                         */
};

/* ---- buffers ---- */

/* A zeroed buffer on the layer's device (host = 0) or on the host (host = 1). */
static coda_status_t alloc_tensor(coda_llama_t *L, coda_tensor_t *t, int host, coda_dtype_t dt, int ndim,
                                  int64_t d0, int64_t d1, int64_t d2) {
    if (L->n_bufs == MAX_BUFS) return coda__fail(CODA_ERR_INTERNAL, "coda_llama_create: too many buffers");
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    size_t bytes = (size_t)(n > 0 ? n : 1) * coda_dtype_size(dt);
    void *p = NULL;
    if (host) {
        p = calloc(1, (bytes + 255) / 256 * 256);
        if (!p) return coda__fail(CODA_ERR_NO_MEMORY, "coda_llama_create: out of memory (%zu bytes)", bytes);
    } else {
        CODA_TRY(coda__llama_mem_alloc(L->mem, bytes, &p));
    }
    L->bufs[L->n_bufs].p = p;
    L->bufs[L->n_bufs++].host = host;
    *t = ndim == 1 ? coda_tensor_1d(p, dt, d0) : ndim == 2 ? coda_tensor_2d(p, dt, d0, d1)
                                                           : coda_tensor_3d(p, dt, d0, d1, d2);
    if (!host) {
        t->device = L->device;
        t->device_index = L->device_index;
        CODA_TRY(coda__llama_mem_zero(L->mem, t, NULL));
    }
    return CODA_OK;
}
/* A device buffer of mp rows and its host shadow of m rows (the same
 * buffer on a CPU layer, where mp = m). */
static coda_status_t alloc_pair(coda_llama_t *L, pair_t *p, coda_dtype_t dt, int64_t cols) {
    CODA_TRY(alloc_tensor(L, &p->d, 0, dt, 2, L->mp, cols, 0));
    if (L->device == CODA_DEVICE_CPU || L->dev_attn) {
        p->h = p->d;
        return CODA_OK;
    }
    return alloc_tensor(L, &p->h, 1, dt, 2, L->m, cols, 0);
}
#define ALLOC1(t, dt, n) CODA_TRY(alloc_tensor(L, &(t), 0, dt, 1, n, 0, 0))
#define ALLOC2(t, dt, r, c) CODA_TRY(alloc_tensor(L, &(t), 0, dt, 2, r, c, 0))
#define HOST1(t, dt, n) CODA_TRY(alloc_tensor(L, &(t), 1, dt, 1, n, 0, 0))
#define HOST2(t, dt, r, c) CODA_TRY(alloc_tensor(L, &(t), 1, dt, 2, r, c, 0))
#define PAIR(p, dt, c) CODA_TRY(alloc_pair(L, &(p), dt, c))

/* The first m rows of a device buffer of mp rows. */
static coda_tensor_t rows_m(const coda_llama_t *L, const coda_tensor_t *t) {
    coda_tensor_t v = *t;
    v.shape[0] = L->m;
    return v;
}
/* Shadow <-> device, the first m rows (nothing where attention runs on
 * the layer's device). */
static coda_status_t down(coda_llama_t *L, pair_t *p, void *stream) {
    if (L->device == CODA_DEVICE_CPU || L->dev_attn) return CODA_OK;
    coda_tensor_t d = rows_m(L, &p->d);
    return coda__llama_mem_copy(L->mem, &d, &p->h, stream);
}
static coda_status_t up(coda_llama_t *L, pair_t *p, void *stream) {
    if (L->device == CODA_DEVICE_CPU || L->dev_attn) return CODA_OK;
    coda_tensor_t d = rows_m(L, &p->d);
    return coda__llama_mem_copy(L->mem, &p->h, &d, stream);
}


static coda_status_t lm_epilogue(coda_llama_t *L, int g, int p, coda_layout_t layout, const coda_tensor_t *a,
                                 const coda_tensor_t *b, const coda_binding_t *bs, int n, void *stream) {
    return coda_gemm_epilogue(L->ctx, layout, a, b, L->block->prog[p], bs, n, &L->tiling[g], stream);
}

/* ---- create / free ---- */

void coda_llama_free(coda_llama_t *L) {
    if (!L) return;
    for (int i = 0; i < L->n_bufs; i++) {
        if (L->bufs[i].host) free(L->bufs[i].p);
        else coda__llama_mem_free(L->mem, L->bufs[i].p);
    }
    coda__llama_mem_free(L->mem, L->ws);
    coda__llama_mem_free(L->mem, L->aws);
    coda__llama_mem_close(L->mem);
    coda_block_free(L->block);
    free(L);
}

static coda_status_t create(coda_llama_t *L) {
    const coda_llama_config_t *cfg = &L->cfg;
    int64_t m = L->m, mp = L->mp, d = cfg->d, I = cfg->ffn, V = cfg->vocab;
    const coda_block_t *B = L->block;
    CODA_TRY(coda_block_workspace_size(B, CODA_BLOCK_ANY, mp, &L->ws_bytes));
    CODA_TRY(coda__llama_mem_alloc(L->mem, L->ws_bytes, &L->ws));
    L->ash = (coda_attention_shape_t){L->batch, L->seq, cfg->n_heads, cfg->n_kv_heads, cfg->head_dim};
    L->dev_attn = L->device == CODA_DEVICE_CUDA && (cfg->head_dim == 64 || cfg->head_dim == 128);
    if (L->dev_attn) {
        CODA_TRY(coda_attention_workspace_size(L->ctx, L->device, &L->ash, &L->aws_bytes));
        CODA_TRY(coda__llama_mem_alloc(L->mem, L->aws_bytes, &L->aws));
    }

    ALLOC2(L->x, CODA_BF16, mp, d);
    ALLOC1(L->pos, CODA_F32, mp);
    ALLOC1(L->acts.r1, CODA_F32, mp);
    PAIR(L->qkv, CODA_BF16, B->nqkv);
    L->acts.qkv = L->qkv.d;
    ALLOC2(L->acts.h, CODA_BF16, mp, d);
    ALLOC1(L->acts.r2, CODA_F32, mp);
    ALLOC2(L->acts.z, CODA_BF16, mp, 2 * I);
    PAIR(L->o, CODA_BF16, B->nq);
    if (L->dev_attn) ALLOC2(L->alse, CODA_F32, m, cfg->n_heads);
    else HOST2(L->alse, CODA_F32, m, cfg->n_heads);
    ALLOC2(L->y, CODA_BF16, mp, d);
    ALLOC2(L->dY, CODA_BF16, mp, d);
    ALLOC2(L->dh, CODA_BF16, mp, d);
    PAIR(L->do_, CODA_BF16, B->nq);
    PAIR(L->dqkv, CODA_F32, B->nqkv);
    if (mp > m) ALLOC2(L->dx, CODA_BF16, mp, d);
    if (V > 0) {
        /* GEMM shapes (m, n, k) of the LM head; lmhead_bwd decides the
         * forward's tiling too (the same GEMM, so the same logits) */
        CODA_TRY(coda_choose_program_tiling(L->ctx, L->device, CODA_LAYOUT_NT, mp, V, d,
                                            B->prog[CODA__P_LM_BWD], &L->tiling[G_LM]));
        CODA_TRY(coda_choose_program_tiling(L->ctx, L->device, CODA_LAYOUT_NN, mp, d, V,
                                            B->prog[CODA__P_RMS_BWD], &L->tiling[G_LM_DGRAD]));
        for (int g = 0; g < G_COUNT; g++)
            if (L->tiling[g].tile_m <= 0 || L->tiling[g].tile_n <= 0)
                return coda__fail(CODA_ERR_INTERNAL, "coda_llama_create: backend chose tiling %dx%d",
                                  L->tiling[g].tile_m, L->tiling[g].tile_n);
        int64_t nt = coda__cdiv(V, L->tiling[G_LM].tile_n), mt = coda__cdiv(mp, L->tiling[G_LM_DGRAD].tile_m);
        ALLOC2(L->yg, CODA_BF16, mp, d);
        ALLOC1(L->rf, CODA_F32, mp);
        ALLOC1(L->lse, CODA_F32, mp);
        ALLOC1(L->loss, CODA_F32, mp);
        ALLOC1(L->targets, CODA_I32, mp);
        HOST1(L->tcheck, CODA_I32, m);
        CODA_TRY(alloc_tensor(L, &L->lsep, 0, CODA_F32, 3, mp, nt, 3));
        ALLOC2(L->sp, CODA_F32, mp, nt);
        ALLOC1(L->svec, CODA_F32, mp);
        ALLOC2(L->colp, CODA_F32, d, mt);
        ALLOC1(L->gvec, CODA_F32, d);
        ALLOC2(L->dl, CODA_BF16, mp, V);
        ALLOC2(L->dres, CODA_BF16, mp, d);
        ALLOC2(L->b, CODA_BF16, mp, d);
    }
    /* positions (i % seq, the padded rows 0) and ignored targets past m,
     * made here once, not in a step */
    float *pos = calloc((size_t)mp, sizeof(float));
    int32_t *tg = malloc((size_t)mp * sizeof(int32_t));
    coda_status_t s = pos && tg ? CODA_OK : coda__fail(CODA_ERR_NO_MEMORY, "coda_llama_create: out of memory");
    if (s == CODA_OK) {
        coda__llama_rope_pos(L->batch, L->seq, pos);
        coda_tensor_t hp = coda_tensor_1d(pos, CODA_F32, mp);
        s = coda__llama_mem_copy(L->mem, &hp, &L->pos, NULL);
    }
    if (s == CODA_OK && V > 0) {
        for (int64_t i = 0; i < mp; i++) tg[i] = IGNORE_INDEX;
        coda_tensor_t ht = coda_tensor_1d(tg, CODA_I32, mp);
        s = coda__llama_mem_copy(L->mem, &ht, &L->targets, NULL);
    }
    if (s == CODA_OK) s = coda__llama_mem_sync(L->mem, NULL);
    free(pos);
    free(tg);
    return s;
}

coda_status_t coda_llama_create(coda_context_t *ctx, const coda_llama_config_t *cfg, int64_t batch,
                                int64_t seq, coda_device_t device, coda_llama_t **out) {
    static const char fn[] = "coda_llama_create";
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    CODA_TRY(coda__llama_check_config(cfg, fn));
    if (batch <= 0 || seq <= 0 || batch > ((int64_t)1 << 31) / seq)
        return coda__fail(CODA_ERR_SHAPE, "%s: batch = %lld, seq = %lld: both must be positive and "
                          "batch * seq at most 2^31", fn, (long long)batch, (long long)seq);
    /* and within what its attention takes (batch * seq <= 2^30, at most
     * 65536 heads): else every forward would fail. The CPU's rules: on
     * CUDA a head_dim the kernels do not take runs on the host. */
    {
        coda_attention_shape_t as = {.batch = batch, .seq = seq, .n_heads = cfg->n_heads,
                                     .n_kv_heads = cfg->n_kv_heads, .head_dim = cfg->head_dim};
        size_t unused;
        coda_status_t a = coda_attention_workspace_size(ctx, CODA_DEVICE_CPU, &as, &unused);
        if (a != CODA_OK)
            return coda__fail(a, "%s: the layer's attention would refuse it (%s)", fn, coda_last_error());
    }
    coda_llama_t *L = calloc(1, sizeof *L);
    if (!L) return coda__fail(CODA_ERR_NO_MEMORY, "%s: out of memory", fn);
    L->ctx = ctx;
    L->cfg = *cfg;
    L->batch = batch;
    L->seq = seq;
    L->m = batch * seq;
    L->mp = device == CODA_DEVICE_CUDA ? (L->m + 7) / 8 * 8 : L->m;
    L->device = device;
    L->device_index = 0; /* CUDA: device 0 of the context */
    coda_status_t s = coda__block_create(ctx, cfg, device, 1, fn, &L->block);
    if (s == CODA_OK) s = coda__llama_mem_open(ctx, device, L->device_index, fn, &L->mem);
    if (s == CODA_OK) s = create(L);
    if (s != CODA_OK) {
        coda_llama_free(L);
        return s;
    }
    *out = L;
    return CODA_OK;
}

/* ---- argument checks ---- */

static const coda_dtype_t BF16[1] = {CODA_BF16};
static const coda_dtype_t F32[1] = {CODA_F32};
static const coda_dtype_t I32[1] = {CODA_I32};
static const coda_dtype_t GRAD[2] = {CODA_F32, CODA_BF16};

/* The weights a layer reads: the block's, and the LM head's when it has one. */
static unsigned weight_mask(const coda_llama_t *L) {
    return CODA__W_BLOCK | (L->cfg.vocab > 0 ? CODA__W_LM : 0u);
}

static coda_status_t check_arg(const coda_llama_t *L, const coda_tensor_t *t, const char *fn, const char *what,
                               int64_t rows, int64_t cols, const coda_dtype_t *dts, int n_dts) {
    return coda__block_check_arg(L->block, t, fn, what, rows, cols, dts, n_dts);
}

static coda_status_t check_weights(const coda_llama_t *L, const coda_llama_weights_t *w, const char *fn,
                                   const char *what, const coda_dtype_t *dts, int n_dts) {
    return coda__block_check_weights(L->block, w, weight_mask(L), fn, what, dts, n_dts);
}

/* The weights (or gradients) as device arguments: matrices 16-byte aligned
 * (GEMM operands, wgrad outputs), vectors `vec_align` (epilogue columns). */
static int weight_dev_args(const coda_llama_t *L, const coda_llama_weights_t *w, const char *what, int vec_align,
                           coda__dev_arg_t *a, char names[CODA__N_WEIGHTS][32]) {
    int n = 0;
    for (int i = 0; i < CODA__N_WEIGHTS; i++) {
        if (!(weight_mask(L) >> i & 1)) continue;
        int64_t rows, cols;
        coda__weight_shape(L->block, i, &rows, &cols);
        snprintf(names[n], 32, "%s->%s", what, coda__weight_name(i));
        a[n] = (coda__dev_arg_t){coda__weight(w, i), names[n], cols < 0 ? vec_align : 16};
        n++;
    }
    return n;
}

/* ---- forward ---- */

coda_status_t coda_llama_forward(coda_llama_t *L, const coda_llama_weights_t *w, const coda_tensor_t *x,
                                 const coda_tensor_t *targets, coda_tensor_t *y, coda_tensor_t *loss,
                                 void *stream) {
    static const char fn[] = "coda_llama_forward";
    if (!L) return coda__fail(CODA_ERR_INVALID_ARG, "%s: layer is NULL", fn);
    const coda_llama_config_t *cfg = &L->cfg;
    int64_t m = L->m, d = cfg->d, V = cfg->vocab;
    CODA_TRY(check_weights(L, w, fn, "w", BF16, 1));
    CODA_TRY(check_arg(L, x, fn, "x", m, d, BF16, 1));
    CODA_TRY(check_arg(L, y, fn, "y", m, d, BF16, 1));
    int with_loss = V > 0 && targets;
    if (targets && V == 0)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: targets given, but cfg->vocab is 0 (no LM head)", fn);
    if (with_loss) {
        CODA_TRY(check_arg(L, targets, fn, "targets", m, -1, I32, 1));
        CODA_TRY(check_arg(L, loss, fn, "loss", m, -1, F32, 1));
    } else if (loss) {
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: loss given, but no %s", fn,
                          V == 0 ? "LM head (cfg->vocab is 0)" : "targets");
    }
    {   /* the outputs apart from each other, the inputs and every weight */
        coda__named_t out[] = {{y, "y"}, {with_loss ? loss : NULL, "loss"}};
        coda__named_t in[] = {{x, "x"}, {with_loss ? targets : NULL, "targets"}};
        CODA_TRY(coda__block_check_apart(fn, out, 2, in, 2, w, weight_mask(L), NULL, 0));
    }
    if (with_loss) {
        /* Targets are checked on a host copy (they may live on the GPU):
         * this whole-layer call waits for the stream here, the split
         * block's calls (section 9) never do. */
        CODA_TRY(coda__llama_mem_copy(L->mem, targets, &L->tcheck, stream));
        const int32_t *t = L->tcheck.data;
        for (int64_t i = 0; i < m; i++)
            if (t[i] != IGNORE_INDEX && (t[i] < 0 || t[i] >= V))
                return coda__fail(CODA_ERR_INVALID_ARG, "%s: targets[%lld] = %d is outside 0..%lld "
                                  "(and not the ignore index -100)", fn, (long long)i, t[i], (long long)(V - 1));
    }
    {
        coda__dev_arg_t a[16];
        char names[CODA__N_WEIGHTS][32];
        int n = weight_dev_args(L, w, "w", 4, a, names);
        a[n++] = (coda__dev_arg_t){x, "x", 0};
        a[n++] = (coda__dev_arg_t){y, "y", 0};
        if (with_loss) a[n++] = (coda__dev_arg_t){targets, "targets", 0}, a[n++] = (coda__dev_arg_t){loss, "loss", 0};
        CODA_TRY(coda__block_check_on_device(L->block, fn, a, n));
    }

    /* From here on, any failure is the library's own; the saved state is invalid. */
    L->have_forward = 0;
    coda_tensor_t xm = rows_m(L, &L->x);
    CODA_TRY(coda__llama_mem_copy(L->mem, x, &xm, stream));
    CODA_TRY(coda_block_forward_pre(L->block, w, &L->x, NULL, &L->pos, &L->acts, L->ws, L->ws_bytes, stream));
    /* Attention where it runs (the CPU's on host copies of a CUDA layer
     * whose head_dim the kernels do not take). */
    CODA_TRY(down(L, &L->qkv, stream));
    {
        coda_tensor_t q = rows_m(L, L->dev_attn ? &L->qkv.d : &L->qkv.h), o = rows_m(L, L->dev_attn ? &L->o.d : &L->o.h);
        CODA_TRY(coda_attention_forward(L->ctx, &L->ash, &q, &o, &L->alse, stream));
    }
    CODA_TRY(up(L, &L->o, stream));
    CODA_TRY(coda_block_forward_post(L->block, w, &L->x, &L->o.d, &L->acts, &L->y, with_loss ? &w->gf : NULL,
                                     with_loss ? &L->yg : NULL, with_loss ? &L->rf : NULL, L->ws, L->ws_bytes,
                                     stream));
    if (with_loss) {   /* LM head + online log-sum-exp; the logits are never stored */
        coda_tensor_t tm = rows_m(L, &L->targets);
        CODA_TRY(coda__llama_mem_copy(L->mem, &L->tcheck, &tm, stream));
        coda_binding_t bs[] = {coda__bind("r", &L->rf), coda__bind("t", &L->targets), coda__bind("part", &L->lsep)};
        CODA_TRY(lm_epilogue(L, G_LM, CODA__P_LSE, CODA_LAYOUT_NT, &L->yg, &w->wlm, bs, 3, stream));
        CODA_TRY(coda_finish_lse(L->ctx, &L->lsep, &L->targets, IGNORE_INDEX, &L->lse, &L->loss, stream));
    }
    /* Outputs last, so a failure above leaves the caller's tensors untouched. */
    coda_tensor_t ym = rows_m(L, &L->y);
    CODA_TRY(coda__llama_mem_copy(L->mem, &ym, y, stream));
    if (with_loss) {
        coda_tensor_t lm = rows_m(L, &L->loss);
        CODA_TRY(coda__llama_mem_copy(L->mem, &lm, loss, stream));
    }
    L->have_forward = 1;
    L->have_loss = with_loss;
    return CODA_OK;
}

/* ---- backward ---- */

coda_status_t coda_llama_backward(coda_llama_t *L, const coda_llama_weights_t *w, const coda_tensor_t *dy,
                                  float loss_scale, coda_tensor_t *dx, coda_llama_weights_t *grads,
                                  void *stream) {
    static const char fn[] = "coda_llama_backward";
    if (!L) return coda__fail(CODA_ERR_INVALID_ARG, "%s: layer is NULL", fn);
    const coda_llama_config_t *cfg = &L->cfg;
    int64_t m = L->m, d = cfg->d;
    if (!L->have_forward)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: no forward pass has saved activations yet", fn);
    CODA_TRY(check_weights(L, w, fn, "w", BF16, 1));
    if (dy) CODA_TRY(check_arg(L, dy, fn, "dy", m, d, BF16, 1));
    if (!dy && !L->have_loss)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: dy is NULL and the last forward pass computed "
                          "no loss: nothing to differentiate", fn);
    if (L->have_loss && !isfinite(loss_scale))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: loss_scale is not finite", fn);
    CODA_TRY(check_arg(L, dx, fn, "dx", m, d, BF16, 1));
    if (grads) CODA_TRY(check_weights(L, grads, fn, "grads", GRAD, 2));
    {   /* dx and the gradients apart from dy, the weights and each other */
        coda__named_t out[] = {{dx, "dx"}};
        coda__named_t in[] = {{dy, "dy"}};
        CODA_TRY(coda__block_check_apart(fn, out, 1, in, 1, w, weight_mask(L), grads, weight_mask(L)));
    }
    {
        coda__dev_arg_t a[24];
        char names[CODA__N_WEIGHTS][32], gnames[CODA__N_WEIGHTS][32];
        int n = weight_dev_args(L, w, "w", 4, a, names);
        if (grads) n += weight_dev_args(L, grads, "grads", 0, a + n, gnames);
        a[n++] = (coda__dev_arg_t){dx, "dx", 4};
        if (dy) a[n++] = (coda__dev_arg_t){dy, "dy", 4};
        CODA_TRY(coda__block_check_on_device(L->block, fn, a, n));
    }

    /* dY: dL/dy through both paths (mp, d) bf16 */
    if (L->have_loss) {
        /* LM head recomputed: dlogits and the final norm's statistic sf. */
        coda_binding_t bs[] = {coda__bind("r", &L->rf), coda__bind("logz", &L->lse), coda__bind("t", &L->targets),
                               coda__bind_scalar("scale", loss_scale), coda__bind("dl", &L->dl), coda__bind("s", &L->sp)};
        CODA_TRY(lm_epilogue(L, G_LM, CODA__P_LM_BWD, CODA_LAYOUT_NT, &L->yg, &w->wlm, bs, 6, stream));
        CODA_TRY(coda_finish_reduce(L->ctx, CODA_REDUCE_SUM, &L->sp, &L->svec, stream));
        /* the residual path's gradient: dy, or zeros without one */
        if (dy) {
            coda_tensor_t dm = rows_m(L, &L->dres);
            CODA_TRY(coda__llama_mem_copy(L->mem, dy, &dm, stream));
        } else {
            CODA_TRY(coda__llama_mem_zero(L->mem, &L->dres, stream));
        }
        coda_binding_t nb[] = {coda__bind("dres", &L->dres), coda__bind("x", &L->y),   coda__bind("g", &w->gf),
                               coda__bind("r", &L->rf),      coda__bind("s", &L->svec), coda__bind_scalar("invd", 1.0f / (float)d),
                               coda__bind("dx", &L->dY),     coda__bind("b", &L->b),   coda__bind("dg", &L->colp)};
        CODA_TRY(lm_epilogue(L, G_LM_DGRAD, CODA__P_RMS_BWD, CODA_LAYOUT_NN, &L->dl, &w->wlm, nb, 9, stream));
        if (grads) {
            CODA_TRY(coda_finish_reduce(L->ctx, CODA_REDUCE_SUM, &L->colp, &L->gvec, stream));
            CODA_TRY(coda__layer_convert_vec(L->block, &L->gvec, &grads->gf, stream));
            CODA_TRY(coda_gemm(L->ctx, CODA_LAYOUT_TN, &L->dl, &L->b, &grads->wlm, 1.0f, 0.0f, stream));
        }
    } else {
        coda_tensor_t dm = rows_m(L, &L->dY);
        CODA_TRY(coda__llama_mem_copy(L->mem, dy, &dm, stream));
    }
    CODA_TRY(coda_block_backward_post(L->block, w, &L->o.d, &L->acts, &L->dY, &L->do_.d, &L->dh, grads, L->ws,
                                      L->ws_bytes, stream));
    /* Attention backward where the forward ran (on the host: qkv, o and the
     * attention lse are the forward's host copies). */
    CODA_TRY(down(L, &L->do_, stream));
    {
        const int dv = L->dev_attn;
        coda_tensor_t q = rows_m(L, dv ? &L->qkv.d : &L->qkv.h), o = rows_m(L, dv ? &L->o.d : &L->o.h);
        coda_tensor_t g = rows_m(L, dv ? &L->do_.d : &L->do_.h), dq = rows_m(L, dv ? &L->dqkv.d : &L->dqkv.h);
        CODA_TRY(coda_attention_backward(L->ctx, &L->ash, &q, &o, &L->alse, &g, &dq, L->aws, L->aws_bytes, stream));
    }
    CODA_TRY(up(L, &L->dqkv, stream));
    /* dx last: into the caller's tensor, or through a buffer of mp rows */
    coda_tensor_t *dxo = L->mp > m ? &L->dx : dx;
    CODA_TRY(coda_block_backward_pre(L->block, w, &L->x, &L->pos, &L->acts, &L->dqkv.d, &L->dh, dxo, grads, L->ws,
                                     L->ws_bytes, stream));
    if (L->mp > m) {
        coda_tensor_t dm = rows_m(L, &L->dx);
        CODA_TRY(coda__llama_mem_copy(L->mem, &dm, dx, stream));
    }
    if (grads && cfg->vocab > 0 && !L->have_loss) {
        /* No loss in the forward pass: the LM head did not take part. */
        CODA_TRY(coda__llama_mem_zero(L->mem, &grads->gf, stream));
        CODA_TRY(coda__llama_mem_zero(L->mem, &grads->wlm, stream));
    }
    return coda__llama_mem_sync(L->mem, stream);
}
