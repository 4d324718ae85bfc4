/* llama.c - one LLaMA block (+ optional final norm, LM head, cross-entropy),
 * forward and backward, as a chain of GEMMs with epilogue programs.
 *
 * Everything that is a GEMM runs through the public calls (coda_gemm,
 * coda_gemm_epilogue with the built-in programs of programs.c,
 * coda_finish_*), so the same chain runs on any backend that implements
 * them. The non-GEMM steps (norm prologue, attention, RoPE backward, tiny
 * vector copies) are CPU functions for now (llama_cpu.c, attention.c); on a
 * CUDA layer they run on host copies ("shadows") of the buffers they touch,
 * moved with llama_mem.c, until they have GPU kernels.
 *
 * The chain (docs/layer.md; M tokens, N_qkv = nq + 2 nkv):
 *   forward
 *     prologue     xg = x g1, ss1 = rowsum x^2            -> r1
 *     QKV          qkv_rope(xg Wqkv^T)                     qkv (M, N_qkv)
 *     attention    o, alse
 *     O-proj       resid_norm(o Wo^T; res x, g2)           h, hg, ss2 -> r2
 *     gate/up      gateup_swiglu_train(hg Wgu^T; r2)       z (M, 2I), c (M, I)
 *     down         resid_norm(c Wd^T; res h, gf)           y, yg, ssf -> rf
 *                  (resid_add when there is no loss to compute)
 *     LM head      lmhead_lse(yg Wlm^T; rf, targets)       -> lse, loss
 *   backward
 *     LM head      lmhead_bwd(yg Wlm^T)                    dl (M, V), sf
 *                  rmsnorm_bwd(dl Wlm; dres dy, x y, gf)   dY, b; dWlm = dl^T b
 *     down dgrad   swiglu_bwd(dY Wd; z)                    dz (M, 2I), c, s2; dWd = dY^T c
 *     gate/up      rmsnorm_bwd(dz Wgu; dres dY, x h, g2)   dh, b; dWgu = dz^T b
 *     O dgrad      do = dh Wo                              dWo = dh^T o
 *     attention    dqkv (f32)
 *     RoPE bwd     dzq = R^T dqkv, s1
 *     QKV dgrad    rmsnorm_bwd(dzq Wqkv; dres dh, x x, g1) dx, b; dWqkv = dzq^T b
 */
#include "layer/llama.h"
#include "core/context.h"
#include "layer/attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define IGNORE_INDEX (-100)
#define MAX_BUFS 96

/* The built-in programs the layer runs, parsed once per layer. */
enum { P_RESID_NORM, P_RESID_ADD, P_QKV, P_GATEUP, P_LSE, P_LM_BWD, P_SWIGLU_BWD, P_RMS_BWD, P_COUNT };
static const char *const prog_names[P_COUNT] = {
    "resid_norm", "resid_add", "qkv_rope", "gateup_swiglu_train",
    "lmhead_lse", "lmhead_bwd", "swiglu_bwd", "rmsnorm_bwd",
};

/* The epilogue GEMMs, each with its tiling (sizes its partials). */
enum { G_QKV, G_O, G_GU, G_DOWN, G_LM, G_LM_DGRAD, G_DOWN_DGRAD, G_GU_DGRAD, G_QKV_DGRAD, G_COUNT };

typedef struct { coda_tensor_t d, h; } pair_t;

struct coda_llama {
    coda_context_t *ctx;
    coda_llama_config_t cfg;
    int64_t batch, seq, m;      /* m = batch * seq tokens                  */
    int64_t mp;                 /* m rounded up to 8: rows of wgrad operands */
    int64_t nq, nkv, nqkv;      /* widths of q, k (= v) and the qkv block  */
    coda_device_t device;
    coda_program_t *prog[P_COUNT];
    coda_tiling_t tiling[G_COUNT];

    coda__llama_mem_t *mem;     /* allocations and copies on `device`       */
    int device_index;
    struct { void *p; int host; } bufs[MAX_BUFS]; /* freed by coda_llama_free */
    int n_bufs;

    /* Buffers the CPU steps touch come in pairs: .d on the layer's device,
     * .h its host shadow (the same memory on a CPU layer). */

    /* Saved by the forward pass for the backward pass. */
    pair_t x;                   /* (M, d) bf16   copy of the layer input       */
    coda_tensor_t r1;           /* (M) f32       rstd of x                     */
    pair_t pos;                 /* (M) f32       position of each token        */
    pair_t freq;                /* (nqkv/2) f32  RoPE frequency per column pair */
    pair_t qkv;                 /* (M, nqkv) bf16 roped q, k and v             */
    pair_t o;                   /* (M, nq) bf16  attention output              */
    coda_tensor_t alse;         /* (M, n_heads) f32 attention lse (host)       */
    coda_tensor_t h;            /* (M, d) bf16   residual stream after attention */
    coda_tensor_t r2;           /* (M) f32       rstd of h                     */
    coda_tensor_t z;            /* (M, 2I) bf16  gate/up pre-activation        */
    coda_tensor_t y;            /* (M, d) bf16   layer output                  */
    coda_tensor_t yg;           /* (M, d) bf16   y * gf (LM head)              */
    coda_tensor_t rf;           /* (M) f32       rstd of y (LM head)           */
    coda_tensor_t lse;          /* (M) f32       logits' log-sum-exp (LM head) */
    pair_t targets;             /* (M) i32       copy of the targets (LM head) */

    /* Scratch. */
    pair_t xg;                  /* (M, d) bf16   x * g1; zeros in the backward */
    pair_t ss1;                 /* (M, 1) f32    sum of squares of x           */
    coda_tensor_t g1h;          /* (d) bf16      host copy of g1 (CUDA layer)  */
    coda_tensor_t tcheck;       /* (M) i32       host copy of targets, checked */
    coda_tensor_t gtmp;         /* (d) f32/bf16  host gradient vector staging  */
    coda_tensor_t hg;           /* (M, d) bf16   h * g2                        */
    coda_tensor_t c;            /* (M, I) bf16   SwiGLU output                 */
    coda_tensor_t rowp[G_COUNT];/* (M, n_tiles) f32 row partials per GEMM      */
    coda_tensor_t colp[G_COUNT];/* (d, m_tiles) f32 column partials per GEMM   */
    coda_tensor_t lsep;         /* (M, n_tiles, 3) f32 lse partials            */
    coda_tensor_t loss;         /* (M) f32                                     */
    pair_t svec;                /* (M) f32 a finished row statistic            */
    pair_t gvec;                /* (d) f32 a finished norm-weight gradient     */
    coda_tensor_t dl;           /* (M, V) bf16   dL/dlogits                    */
    coda_tensor_t dY;           /* (M, d) bf16   dL/dy, through both paths     */
    coda_tensor_t b;            /* (M, d) bf16   normalised input, for wgrads  */
    coda_tensor_t dz;           /* (M, 2I) bf16  gate/up gradient              */
    coda_tensor_t dh;           /* (M, d) bf16   dL/dh                         */
    pair_t do_;                 /* (M, nq) bf16  dL/do                         */
    coda_tensor_t dqkv;         /* (M, nqkv) f32 attention input gradient (host) */
    pair_t dzq;                 /* (M, nqkv) bf16 gradient before RoPE         */

    int have_forward;           /* a forward pass saved its activations        */
    int have_loss;              /* ... and computed a loss                     */
};

/* ---- small helpers ---- */

/* A buffer on the layer's device (host = 0) or on the host (host = 1). */
static coda_status_t alloc_tensor(coda_llama_t *L, coda_tensor_t *t, int host, coda_dtype_t dt, int ndim,
                                  int64_t d0, int64_t d1, int64_t d2) {
    if (L->n_bufs == MAX_BUFS) return coda__fail(CODA_ERR_INTERNAL, "coda_llama_create: too many buffers");
    int64_t n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
    size_t bytes = (size_t)(n > 0 ? n : 1) * coda_dtype_size(dt);
    void *p = NULL;
    if (host) {
        p = aligned_alloc(256, (bytes + 255) / 256 * 256);
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
    }
    return CODA_OK;
}
/* A weight-gradient operand: allocated with mp rows, the rows past m zeroed
 * once, the tensor a view of the first m rows. The wgrad GEMMs contract over
 * all mp rows (wgrad_rows), so their K is a multiple of 8, as the GPU's
 * 16-byte copies need; the zero rows add nothing. */
static coda_status_t alloc_padded(coda_llama_t *L, coda_tensor_t *t, coda_dtype_t dt, int64_t cols) {
    CODA_TRY(alloc_tensor(L, t, 0, dt, 2, L->mp, cols, 0));
    CODA_TRY(coda__llama_mem_zero(L->mem, t, NULL));
    t->shape[0] = L->m;
    return CODA_OK;
}
static coda_tensor_t wgrad_rows(const coda_llama_t *L, const coda_tensor_t *t) {
    coda_tensor_t v = *t;
    v.shape[0] = L->mp;
    return v;
}
/* A device buffer and its host shadow (the same buffer on a CPU layer);
 * padded: the device buffer is a wgrad operand (alloc_padded). */
static coda_status_t alloc_pair(coda_llama_t *L, pair_t *p, coda_dtype_t dt, int ndim, int64_t d0, int64_t d1,
                                int padded) {
    if (padded) CODA_TRY(alloc_padded(L, &p->d, dt, d1));
    else CODA_TRY(alloc_tensor(L, &p->d, 0, dt, ndim, d0, d1, 0));
    if (L->device == CODA_DEVICE_CPU) {
        p->h = p->d;
        return CODA_OK;
    }
    return alloc_tensor(L, &p->h, 1, dt, ndim, d0, d1, 0);
}
#define ALLOC1(t, dt, n) CODA_TRY(alloc_tensor(L, &(t), 0, dt, 1, n, 0, 0))
#define PADDED(t, dt, c) CODA_TRY(alloc_padded(L, &(t), dt, c))
#define ALLOC2(t, dt, r, c) CODA_TRY(alloc_tensor(L, &(t), 0, dt, 2, r, c, 0))
#define HOST1(t, dt, n) CODA_TRY(alloc_tensor(L, &(t), 1, dt, 1, n, 0, 0))
#define HOST2(t, dt, r, c) CODA_TRY(alloc_tensor(L, &(t), 1, dt, 2, r, c, 0))
#define PAIR1(p, dt, n) CODA_TRY(alloc_pair(L, &(p), dt, 1, n, 0, 0))
#define PAIR2(p, dt, r, c) CODA_TRY(alloc_pair(L, &(p), dt, 2, r, c, 0))
#define PAIR2_PADDED(p, dt, c) CODA_TRY(alloc_pair(L, &(p), dt, 2, L->m, c, 1))

/* Shadow <-> device (nothing on a CPU layer). */
static coda_status_t down(coda_llama_t *L, pair_t *p, void *stream) {
    return coda__llama_mem_copy(L->mem, &p->d, &p->h, stream);
}
static coda_status_t up(coda_llama_t *L, pair_t *p, void *stream) {
    return coda__llama_mem_copy(L->mem, &p->h, &p->d, stream);
}

static coda_binding_t bind(const char *name, const coda_tensor_t *t) {
    coda_binding_t b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.tensor = *t;
    return b;
}
static coda_binding_t bind_scalar(const char *name, float v) {
    coda_binding_t b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.scalar = v;
    return b;
}

static coda_status_t epilogue(coda_llama_t *L, int g, int p, coda_layout_t layout,
                              const coda_tensor_t *a, const coda_tensor_t *b,
                              const coda_binding_t *bs, int n, void *stream) {
    return coda_gemm_epilogue(L->ctx, layout, a, b, L->prog[p], bs, n, &L->tiling[g], stream);
}

/* ---- create / free ---- */

void coda_llama_free(coda_llama_t *L) {
    if (!L) return;
    for (int i = 0; i < P_COUNT; i++) coda_program_free(L->prog[i]);
    for (int i = 0; i < L->n_bufs; i++) {
        if (L->bufs[i].host) free(L->bufs[i].p);
        else coda__llama_mem_free(L->mem, L->bufs[i].p);
    }
    coda__llama_mem_close(L->mem);
    free(L);
}

static coda_status_t create(coda_llama_t *L) {
    const coda_llama_config_t *cfg = &L->cfg;
    int64_t m = L->m, d = cfg->d, I = cfg->ffn, V = cfg->vocab;
    for (int i = 0; i < P_COUNT; i++) {
        const char *text = coda_builtin_program(prog_names[i]);
        if (!text) return coda__fail(CODA_ERR_INTERNAL, "coda_llama_create: no built-in program %s", prog_names[i]);
        if (coda_program_parse(text, &L->prog[i]) != CODA_OK) {
            char why[256]; /* the message buffer is reused by coda__fail */
            snprintf(why, sizeof why, "%s", coda_last_error());
            return coda__fail(CODA_ERR_INTERNAL, "coda_llama_create: built-in program %s: %s",
                              prog_names[i], why);
        }
    }
    /* GEMM shapes (m, n, k) of the epilogue GEMMs. */
    const struct { coda_layout_t layout; int64_t n, k; } gs[G_COUNT] = {
        [G_QKV] = {CODA_LAYOUT_NT, L->nqkv, d},     [G_O] = {CODA_LAYOUT_NT, d, L->nq},
        [G_GU] = {CODA_LAYOUT_NT, 2 * I, d},        [G_DOWN] = {CODA_LAYOUT_NT, d, I},
        [G_LM] = {CODA_LAYOUT_NT, V, d},            [G_LM_DGRAD] = {CODA_LAYOUT_NN, d, V},
        [G_DOWN_DGRAD] = {CODA_LAYOUT_NN, I, d},    [G_GU_DGRAD] = {CODA_LAYOUT_NN, d, 2 * I},
        [G_QKV_DGRAD] = {CODA_LAYOUT_NN, d, L->nqkv},
    };
    /* The program that decides each GEMM's tiling (and so, on CUDA, its
     * schedule); the others run on the same GEMM are as light or lighter. */
    static const int decides[G_COUNT] = {
        [G_QKV] = P_QKV,          [G_O] = P_RESID_NORM,        [G_GU] = P_GATEUP,
        [G_DOWN] = P_RESID_NORM,  [G_LM] = P_LM_BWD,           [G_LM_DGRAD] = P_RMS_BWD,
        [G_DOWN_DGRAD] = P_SWIGLU_BWD, [G_GU_DGRAD] = P_RMS_BWD, [G_QKV_DGRAD] = P_RMS_BWD,
    };
    for (int g = 0; g < G_COUNT; g++) {
        if (gs[g].n == 0 || gs[g].k == 0) continue; /* no LM head */
        CODA_TRY(coda_choose_program_tiling(L->ctx, L->device, gs[g].layout, m, gs[g].n, gs[g].k,
                                            L->prog[decides[g]], &L->tiling[g]));
        if (L->tiling[g].tile_m <= 0 || L->tiling[g].tile_n <= 0)
            return coda__fail(CODA_ERR_INTERNAL, "coda_llama_create: backend chose tiling %dx%d",
                              L->tiling[g].tile_m, L->tiling[g].tile_n);
        int64_t nt = coda__cdiv(gs[g].n, L->tiling[g].tile_n);
        int64_t mt = coda__cdiv(m, L->tiling[g].tile_m);
        ALLOC2(L->rowp[g], CODA_F32, m, nt);
        ALLOC2(L->colp[g], CODA_F32, d, mt);
    }

    PAIR2(L->x, CODA_BF16, m, d);
    ALLOC1(L->r1, CODA_F32, m);
    PAIR1(L->pos, CODA_F32, m);
    PAIR1(L->freq, CODA_F32, L->nqkv / 2);
    PAIR2(L->qkv, CODA_BF16, m, L->nqkv);
    PAIR2_PADDED(L->o, CODA_BF16, L->nq);
    HOST2(L->alse, CODA_F32, m, cfg->n_heads);
    ALLOC2(L->h, CODA_BF16, m, d);
    ALLOC1(L->r2, CODA_F32, m);
    ALLOC2(L->z, CODA_BF16, m, 2 * I);
    ALLOC2(L->y, CODA_BF16, m, d);
    PAIR2(L->xg, CODA_BF16, m, d);
    PAIR2(L->ss1, CODA_F32, m, 1);
    HOST1(L->g1h, CODA_BF16, d);
    HOST1(L->gtmp, CODA_F32, d);
    ALLOC2(L->hg, CODA_BF16, m, d);
    PADDED(L->c, CODA_BF16, I);
    PAIR1(L->svec, CODA_F32, m);
    PAIR1(L->gvec, CODA_F32, d);
    PADDED(L->dY, CODA_BF16, d);
    PADDED(L->b, CODA_BF16, d);
    PADDED(L->dz, CODA_BF16, 2 * I);
    PADDED(L->dh, CODA_BF16, d);
    PAIR2(L->do_, CODA_BF16, m, L->nq);
    HOST2(L->dqkv, CODA_F32, m, L->nqkv);
    PAIR2_PADDED(L->dzq, CODA_BF16, L->nqkv);
    if (V > 0) {
        ALLOC2(L->yg, CODA_BF16, m, d);
        ALLOC1(L->rf, CODA_F32, m);
        ALLOC1(L->lse, CODA_F32, m);
        ALLOC1(L->loss, CODA_F32, m);
        PAIR1(L->targets, CODA_I32, m);
        HOST1(L->tcheck, CODA_I32, m);
        CODA_TRY(alloc_tensor(L, &L->lsep, 0, CODA_F32, 3, m, coda__cdiv(V, L->tiling[G_LM].tile_n), 3));
        PADDED(L->dl, CODA_BF16, V);
    }
    coda__llama_rope_tables(cfg, L->batch, L->seq, L->pos.h.data, L->freq.h.data);
    CODA_TRY(up(L, &L->pos, NULL));
    CODA_TRY(up(L, &L->freq, NULL));
    return CODA_OK;
}

coda_status_t coda_llama_create(coda_context_t *ctx, const coda_llama_config_t *cfg, int64_t batch,
                                int64_t seq, coda_device_t device, coda_llama_t **out) {
    static const char fn[] = "coda_llama_create";
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    CODA_TRY(coda__llama_check_config(cfg, fn));
    if (batch <= 0 || seq <= 0 || batch > ((int64_t)1 << 31) / seq)
        return coda__fail(CODA_ERR_SHAPE, "%s: batch = %lld, seq = %lld: both must be positive and "
                          "batch * seq at most 2^31", fn, (long long)batch, (long long)seq);
    if (device != CODA_DEVICE_CPU && device != CODA_DEVICE_CUDA)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: device %d is neither CPU (0) nor CUDA (1)", fn, (int)device);
    if (device == CODA_DEVICE_CUDA) {
        /* Every extent that is some GEMM's contraction (forward or dgrad)
         * must be a multiple of 8 on the GPU (16-byte rows for the copy
         * engine): refuse now rather than in the first backward. */
        const struct { const char *name; int64_t v; } k[] = {
            {"d", cfg->d}, {"n_heads * head_dim", cfg->n_heads * cfg->head_dim},
            {"(n_heads + 2 n_kv_heads) * head_dim", (cfg->n_heads + 2 * cfg->n_kv_heads) * cfg->head_dim},
            {"ffn", cfg->ffn}, {"vocab", cfg->vocab}};
        for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
            if (k[i].v % 8 != 0)
                return coda__fail(CODA_ERR_SHAPE, "%s: %s = %lld: on CUDA it must be a multiple of 8 "
                                  "(a GEMM contracts over it)", fn, k[i].name, (long long)k[i].v);
    }
    coda_llama_t *L = calloc(1, sizeof *L);
    if (!L) return coda__fail(CODA_ERR_NO_MEMORY, "%s: out of memory", fn);
    L->ctx = ctx;
    L->cfg = *cfg;
    L->batch = batch;
    L->seq = seq;
    L->m = batch * seq;
    L->mp = (L->m + 7) / 8 * 8;
    L->nq = cfg->n_heads * cfg->head_dim;
    L->nkv = cfg->n_kv_heads * cfg->head_dim;
    L->nqkv = L->nq + 2 * L->nkv;
    L->device = device;
    L->device_index = 0; /* CUDA: device 0 of the context */
    coda_status_t s = coda__llama_mem_open(ctx, device, L->device_index, &L->mem);
    if (s != CODA_OK) {
        free(L);
        return s;
    }
    s = create(L);
    if (s != CODA_OK) {
        coda_llama_free(L);
        return s;
    }
    *out = L;
    return CODA_OK;
}

/* ---- argument checks ---- */

/* t is (rows, cols) [cols < 0: 1-D (rows)] of dtype dt on the layer's device. */
static coda_status_t check_arg(const coda_llama_t *L, const coda_tensor_t *t, const char *fn,
                               const char *what, int64_t rows, int64_t cols, const coda_dtype_t *dts,
                               int n_dts) {
    char name[96];
    snprintf(name, sizeof name, "%s: %s", fn, what);
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s is NULL", name);
    int64_t shape[2] = {rows, cols};
    CODA_TRY(coda__check_shape(t, name, cols < 0 ? 1 : 2, shape));
    CODA_TRY(coda__check_dtype(t, name, dts, n_dts));
    if (t->device != L->device)
        return coda__fail(CODA_ERR_DEVICE, "%s is on the %s, the layer on the %s", name,
                          t->device == CODA_DEVICE_CPU ? "CPU" : "GPU",
                          L->device == CODA_DEVICE_CPU ? "CPU" : "GPU");
    if (t->device == CODA_DEVICE_CUDA && t->device_index != L->device_index)
        return coda__fail(CODA_ERR_DEVICE, "%s is on cuda:%d, the layer on cuda:%d", name, t->device_index,
                          L->device_index);
    return CODA_OK;
}

static const coda_dtype_t BF16[1] = {CODA_BF16};
static const coda_dtype_t F32[1] = {CODA_F32};
static const coda_dtype_t I32[1] = {CODA_I32};
static const coda_dtype_t GRAD[2] = {CODA_F32, CODA_BF16};

/* The weight (or gradient) tensors: name, extents (cols < 0: a vector). */
typedef struct { const char *name; int64_t rows, cols; } wshape_t;
static int weight_shapes(const coda_llama_t *L, wshape_t ws[8]) {
    const coda_llama_config_t *c = &L->cfg;
    int n = 0;
    ws[n++] = (wshape_t){"g1", c->d, -1};
    ws[n++] = (wshape_t){"wqkv", L->nqkv, c->d};
    ws[n++] = (wshape_t){"wo", c->d, L->nq};
    ws[n++] = (wshape_t){"g2", c->d, -1};
    ws[n++] = (wshape_t){"wgu", 2 * c->ffn, c->d};
    ws[n++] = (wshape_t){"wd", c->d, c->ffn};
    if (c->vocab > 0) {
        ws[n++] = (wshape_t){"gf", c->d, -1};
        ws[n++] = (wshape_t){"wlm", c->vocab, c->d};
    }
    return n;
}
/* Field i of a weights struct, in weight_shapes order. */
static coda_tensor_t *weight_field(coda_llama_weights_t *w, int i) {
    coda_tensor_t *f[8] = {&w->g1, &w->wqkv, &w->wo, &w->g2, &w->wgu, &w->wd, &w->gf, &w->wlm};
    return f[i];
}

static coda_status_t check_weights(const coda_llama_t *L, const coda_llama_weights_t *w,
                                   const char *fn, const char *what, const coda_dtype_t *dts, int n_dts) {
    if (!w) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
    wshape_t ws[8];
    int n = weight_shapes(L, ws);
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s->%s", what, ws[i].name);
        CODA_TRY(check_arg(L, weight_field((coda_llama_weights_t *)w, i), fn, name, ws[i].rows,
                           ws[i].cols, dts, n_dts));
    }
    return CODA_OK;
}

/* An output must not share bytes with any weight (it is written while they are read). */
static coda_status_t check_apart_weights(const coda_llama_t *L, const coda_tensor_t *t, const char *fn,
                                         const char *what, const coda_llama_weights_t *w) {
    wshape_t ws[8];
    int n = weight_shapes(L, ws);
    for (int i = 0; i < n; i++)
        if (coda__tensors_overlap(t, weight_field((coda_llama_weights_t *)w, i)))
            return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps w->%s", fn, what, ws[i].name);
    return CODA_OK;
}

/* On CUDA, what the GPU steps need of the caller's tensors, checked before
 * anything is written, so that a call that fails changes nothing: every
 * tensor's data on the layer's device (not host memory the descriptor calls
 * CUDA), GEMM operands and wgrad outputs (weight and gradient matrices)
 * with 16-byte aligned bases and rows (the copy engine), and the tensors
 * the epilogues read or write pair by pair (norm weights, dx, dy) aligned
 * to a bf16 pair. */
typedef struct { const coda_tensor_t *t; const char *name; int align; } dev_arg_t;

static coda_status_t check_on_device(const coda_llama_t *L, const char *fn, const dev_arg_t *a, int n) {
    if (L->device != CODA_DEVICE_CUDA) return CODA_OK;
    const coda_tensor_t *ts[40];
    const char *names[40];
    for (int i = 0; i < n && i < 40; i++) {
        const coda_tensor_t *t = a[i].t;
        ts[i] = t;
        names[i] = a[i].name;
        if (!t || !a[i].align) continue;
        if ((uintptr_t)t->data % (uintptr_t)a[i].align != 0 || (t->ndim == 2 && t->stride[0] % a[i].align != 0))
            return coda__fail(CODA_ERR_STRIDE, "%s: %s: base %p and row stride %lld bytes must be multiples of %d "
                              "on the GPU", fn, a[i].name, t->data, (long long)t->stride[0], a[i].align);
    }
#ifdef CODA_WITH_CUDA
    coda_status_t s = coda__cuda_check_pointers(L->ctx, L->device_index, ts, names, n < 40 ? n : 40);
    if (s != CODA_OK) {
        char why[200]; /* the message buffer is reused by coda__fail */
        snprintf(why, sizeof why, "%s", coda_last_error());
        return coda__fail(s, "%s: %s", fn, why);
    }
#endif
    return CODA_OK;
}

/* The weights (or gradients) as device arguments: matrices 16-byte aligned
 * (GEMM operands, wgrad outputs), vectors `vec_align` (epilogue columns). */
static int weight_dev_args(const coda_llama_t *L, const coda_llama_weights_t *w, const char *what, int vec_align,
                           dev_arg_t *a, char names[8][32]) {
    wshape_t ws[8];
    int n = weight_shapes(L, ws);
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 32, "%s->%s", what, ws[i].name);
        a[i] = (dev_arg_t){weight_field((coda_llama_weights_t *)w, i), names[i], ws[i].cols < 0 ? vec_align : 16};
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
        if (coda__tensors_overlap(loss, x) || coda__tensors_overlap(loss, targets) ||
            coda__tensors_overlap(loss, y))
            return coda__fail(CODA_ERR_OVERLAP, "%s: loss overlaps x, targets or y", fn);
    } else if (loss) {
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: loss given, but no %s", fn,
                          V == 0 ? "LM head (cfg->vocab is 0)" : "targets");
    }
    if (coda__tensors_overlap(y, x)) return coda__fail(CODA_ERR_OVERLAP, "%s: y overlaps x", fn);
    if (with_loss && coda__tensors_overlap(y, targets))
        return coda__fail(CODA_ERR_OVERLAP, "%s: y overlaps targets", fn);
    CODA_TRY(check_apart_weights(L, y, fn, "y", w));
    if (with_loss) {
        CODA_TRY(check_apart_weights(L, loss, fn, "loss", w));
        /* Targets are checked on a host copy (they may live on the GPU). */
        CODA_TRY(coda__llama_mem_copy(L->mem, targets, &L->tcheck, stream));
        const int32_t *t = L->tcheck.data;
        for (int64_t i = 0; i < m; i++)
            if (t[i] != IGNORE_INDEX && (t[i] < 0 || t[i] >= V))
                return coda__fail(CODA_ERR_INVALID_ARG, "%s: targets[%lld] = %d is outside 0..%lld "
                                  "(and not the ignore index -100)", fn, (long long)i, t[i], (long long)(V - 1));
    }

    {
        dev_arg_t a[16];
        char names[8][32];
        int n = weight_dev_args(L, w, "w", 4, a, names);
        a[n++] = (dev_arg_t){x, "x", 0};
        a[n++] = (dev_arg_t){y, "y", 0};
        if (with_loss) a[n++] = (dev_arg_t){targets, "targets", 0}, a[n++] = (dev_arg_t){loss, "loss", 0};
        CODA_TRY(check_on_device(L, fn, a, n));
    }

    /* From here on, any failure is the library's own; the saved state is invalid. */
    L->have_forward = 0;
    CODA_TRY(coda__llama_mem_copy(L->mem, x, &L->x.d, stream));

    /* RMSNorm prologue of the QKV GEMM, on the CPU. GPU kernel goes here (or:
     * the embedding gather or the previous layer's down-projection epilogue
     * emits x*g1 and the sum-of-squares partials). */
    const coda_tensor_t *g1 = &w->g1;
    if (L->device != CODA_DEVICE_CPU) {
        CODA_TRY(coda__llama_mem_copy(L->mem, &w->g1, &L->g1h, stream));
        g1 = &L->g1h;
    }
    CODA_TRY(down(L, &L->x, stream));
    coda__llama_norm_prologue(&L->x.h, g1, &L->xg.h, &L->ss1.h);
    CODA_TRY(up(L, &L->xg, stream));
    CODA_TRY(up(L, &L->ss1, stream));
    CODA_TRY(coda_finish_rstd(L->ctx, &L->ss1.d, d, cfg->eps, &L->r1, stream));

    {   /* QKV + r1 + RoPE */
        coda_binding_t bs[] = {bind("r", &L->r1), bind("pos", &L->pos.d), bind("freq", &L->freq.d),
                               bind("qkv", &L->qkv.d)};
        CODA_TRY(epilogue(L, G_QKV, P_QKV, CODA_LAYOUT_NT, &L->xg.d, &w->wqkv, bs, 4, stream));
    }
    /* Attention on the CPU (GPU kernel goes here). */
    CODA_TRY(down(L, &L->qkv, stream));
    CODA_TRY(coda__attention_forward(cfg, L->batch, L->seq, &L->qkv.h, &L->o.h, &L->alse, L->ctx->cpu_threads));
    CODA_TRY(up(L, &L->o, stream));
    {   /* O-proj + residual + FFN norm partials */
        coda_tensor_t ss = L->rowp[G_O];
        coda_binding_t bs[] = {bind("res", &L->x.d), bind("g", &w->g2), bind("h", &L->h),
                               bind("hg", &L->hg), bind("ss", &ss)};
        CODA_TRY(epilogue(L, G_O, P_RESID_NORM, CODA_LAYOUT_NT, &L->o.d, &w->wo, bs, 5, stream));
        CODA_TRY(coda_finish_rstd(L->ctx, &ss, d, cfg->eps, &L->r2, stream));
    }
    {   /* gate/up + r2 + SwiGLU, saving z */
        coda_binding_t bs[] = {bind("r", &L->r2), bind("z", &L->z), bind("c", &L->c)};
        CODA_TRY(epilogue(L, G_GU, P_GATEUP, CODA_LAYOUT_NT, &L->hg, &w->wgu, bs, 3, stream));
    }
    if (with_loss) {   /* down + residual + final norm partials */
        coda_tensor_t ss = L->rowp[G_DOWN];
        coda_binding_t bs[] = {bind("res", &L->h), bind("g", &w->gf), bind("h", &L->y),
                               bind("hg", &L->yg), bind("ss", &ss)};
        CODA_TRY(epilogue(L, G_DOWN, P_RESID_NORM, CODA_LAYOUT_NT, &L->c, &w->wd, bs, 5, stream));
        CODA_TRY(coda_finish_rstd(L->ctx, &ss, d, cfg->eps, &L->rf, stream));
    } else {
        coda_binding_t bs[] = {bind("res", &L->h), bind("h", &L->y)};
        CODA_TRY(epilogue(L, G_DOWN, P_RESID_ADD, CODA_LAYOUT_NT, &L->c, &w->wd, bs, 2, stream));
    }
    if (with_loss) {   /* LM head + online log-sum-exp; the logits are never stored */
        CODA_TRY(coda__llama_mem_copy(L->mem, &L->tcheck, &L->targets.d, stream));
        coda_binding_t bs[] = {bind("r", &L->rf), bind("t", &L->targets.d), bind("part", &L->lsep)};
        CODA_TRY(epilogue(L, G_LM, P_LSE, CODA_LAYOUT_NT, &L->yg, &w->wlm, bs, 3, stream));
        CODA_TRY(coda_finish_lse(L->ctx, &L->lsep, &L->targets.d, IGNORE_INDEX, &L->lse, &L->loss, stream));
    }
    /* Outputs last, so a failure above leaves the caller's tensors untouched. */
    CODA_TRY(coda__llama_mem_copy(L->mem, &L->y, y, stream));
    if (with_loss) CODA_TRY(coda__llama_mem_copy(L->mem, &L->loss, loss, stream));
    L->have_forward = 1;
    L->have_loss = with_loss;
    return CODA_OK;
}

/* ---- backward ---- */

/* dW = a^T b over the padded token rows (plain TN GEMM). */
static coda_status_t wgrad(coda_llama_t *L, const coda_tensor_t *a, const coda_tensor_t *b, coda_tensor_t *dw,
                           void *stream) {
    coda_tensor_t ap = wgrad_rows(L, a), bp = wgrad_rows(L, b);
    return coda_gemm(L->ctx, CODA_LAYOUT_TN, &ap, &bp, dw, 1.0f, 0.0f, stream);
}

/* A finished norm-weight gradient (gvec, f32 on the device) into gout (f32
 * or bf16, on the device). */
static coda_status_t store_gvec(coda_llama_t *L, coda_tensor_t *gout, void *stream) {
    CODA_TRY(down(L, &L->gvec, stream));
    if (L->device == CODA_DEVICE_CPU) {
        coda__llama_copy_vec(L->gvec.h.data, gout);
        return CODA_OK;
    }
    coda_tensor_t tmp = coda_tensor_1d(L->gtmp.data, gout->dtype, L->cfg.d);
    coda__llama_copy_vec(L->gvec.h.data, &tmp);
    return coda__llama_mem_copy(L->mem, &tmp, gout, stream);
}

/* rmsnorm_bwd on acc = a b (dgrad GEMM g): dx, b = r x gw, and the weight's
 * gradient into gout (may be NULL). */
static coda_status_t norm_backward(coda_llama_t *L, int g, const coda_tensor_t *a, const coda_tensor_t *wmat,
                                   const coda_tensor_t *dres, const coda_tensor_t *x,
                                   const coda_tensor_t *gw, const coda_tensor_t *r,
                                   const coda_tensor_t *s, coda_tensor_t *dx, coda_tensor_t *gout,
                                   void *stream) {
    coda_binding_t bs[] = {bind("dres", dres), bind("x", x),   bind("g", gw),
                           bind("r", r),       bind("s", s),   bind_scalar("invd", 1.0f / (float)L->cfg.d),
                           bind("dx", dx),     bind("b", &L->b), bind("dg", &L->colp[g])};
    CODA_TRY(epilogue(L, g, P_RMS_BWD, CODA_LAYOUT_NN, a, wmat, bs, 9, stream));
    if (gout) {
        CODA_TRY(coda_finish_reduce(L->ctx, CODA_REDUCE_SUM, &L->colp[g], &L->gvec.d, stream));
        CODA_TRY(store_gvec(L, gout, stream));
    }
    return CODA_OK;
}

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
    if (dy && coda__tensors_overlap(dx, dy)) return coda__fail(CODA_ERR_OVERLAP, "%s: dx overlaps dy", fn);
    CODA_TRY(check_apart_weights(L, dx, fn, "dx", w));
    wshape_t ws[8];
    int nw = weight_shapes(L, ws);
    if (grads) {
        CODA_TRY(check_weights(L, grads, fn, "grads", GRAD, 2));
        for (int i = 0; i < nw; i++) {
            const coda_tensor_t *gi = weight_field(grads, i);
            if (coda__tensors_overlap(gi, dx) || (dy && coda__tensors_overlap(gi, dy)))
                return coda__fail(CODA_ERR_OVERLAP, "%s: grads->%s overlaps dx or dy", fn, ws[i].name);
            for (int j = 0; j < nw; j++)
                if (coda__tensors_overlap(gi, weight_field((coda_llama_weights_t *)w, j)) ||
                    (j < i && coda__tensors_overlap(gi, weight_field(grads, j))))
                    return coda__fail(CODA_ERR_OVERLAP, "%s: grads->%s overlaps a weight or another gradient",
                                      fn, ws[i].name);
        }
    }

    {
        dev_arg_t a[24];
        char names[8][32], gnames[8][32];
        int n = weight_dev_args(L, w, "w", 4, a, names);
        if (grads) n += weight_dev_args(L, grads, "grads", 0, a + n, gnames);
        a[n++] = (dev_arg_t){dx, "dx", 4};
        if (dy) a[n++] = (dev_arg_t){dy, "dy", 4};
        CODA_TRY(check_on_device(L, fn, a, n));
    }

    /* dY: dL/dy through both paths (M, d) bf16; dy itself is copied in when
     * there is no loss, as dY is a (padded) wgrad operand. */
    const coda_tensor_t *dY = &L->dY;
    if (!L->have_loss) CODA_TRY(coda__llama_mem_copy(L->mem, dy, &L->dY, stream));
    if (L->have_loss) {
        /* LM head recomputed: dlogits and the final norm's statistic sf. */
        coda_tensor_t sp = L->rowp[G_LM];
        coda_binding_t bs[] = {bind("r", &L->rf), bind("logz", &L->lse), bind("t", &L->targets.d),
                               bind_scalar("scale", loss_scale), bind("dl", &L->dl), bind("s", &sp)};
        CODA_TRY(epilogue(L, G_LM, P_LM_BWD, CODA_LAYOUT_NT, &L->yg, &w->wlm, bs, 6, stream));
        CODA_TRY(coda_finish_reduce(L->ctx, CODA_REDUCE_SUM, &sp, &L->svec.d, stream));
        const coda_tensor_t *dres = dy;
        if (!dres) { /* no gradient from above: the residual path carries zeros */
            CODA_TRY(coda__llama_mem_zero(L->mem, &L->xg.d, stream));
            dres = &L->xg.d;
        }
        CODA_TRY(norm_backward(L, G_LM_DGRAD, &L->dl, &w->wlm, dres, &L->y, &w->gf, &L->rf, &L->svec.d,
                               &L->dY, grads ? &grads->gf : NULL, stream));
        if (grads) CODA_TRY(wgrad(L, &L->dl, &L->b, &grads->wlm, stream));
    }
    {   /* down dgrad + SwiGLU backward: dz, c recomputed, s2 */
        coda_tensor_t sp = L->rowp[G_DOWN_DGRAD];
        coda_binding_t bs[] = {bind("z", &L->z), bind("dz", &L->dz), bind("c", &L->c), bind("s", &sp)};
        CODA_TRY(epilogue(L, G_DOWN_DGRAD, P_SWIGLU_BWD, CODA_LAYOUT_NN, dY, &w->wd, bs, 4, stream));
        CODA_TRY(coda_finish_reduce(L->ctx, CODA_REDUCE_SUM, &sp, &L->svec.d, stream));
        if (grads) CODA_TRY(wgrad(L, dY, &L->c, &grads->wd, stream));
    }
    /* gate/up dgrad + FFN RMSNorm backward: dh */
    CODA_TRY(norm_backward(L, G_GU_DGRAD, &L->dz, &w->wgu, dY, &L->h, &w->g2, &L->r2, &L->svec.d, &L->dh,
                           grads ? &grads->g2 : NULL, stream));
    if (grads) CODA_TRY(wgrad(L, &L->dz, &L->b, &grads->wgu, stream));

    /* O dgrad and wgrad: plain GEMMs. */
    CODA_TRY(coda_gemm(L->ctx, CODA_LAYOUT_NN, &L->dh, &w->wo, &L->do_.d, 1.0f, 0.0f, stream));
    if (grads) CODA_TRY(wgrad(L, &L->dh, &L->o.d, &grads->wo, stream));

    /* Attention backward, then the RoPE backward and s1, on the CPU (GPU
     * kernels go here; the RoPE backward could be the attention backward's
     * epilogue). qkv, o and the attention lse are the forward's host copies. */
    CODA_TRY(down(L, &L->do_, stream));
    CODA_TRY(coda__attention_backward(cfg, L->batch, L->seq, &L->qkv.h, &L->o.h, &L->alse, &L->do_.h, &L->dqkv,
                                      L->ctx->cpu_threads));
    coda__llama_rope_backward(&L->dqkv, &L->qkv.h, L->pos.h.data, L->freq.h.data, &L->dzq.h, L->svec.h.data);
    CODA_TRY(up(L, &L->dzq, stream));
    CODA_TRY(up(L, &L->svec, stream));

    /* QKV dgrad + attention RMSNorm backward: dx, written last. */
    CODA_TRY(norm_backward(L, G_QKV_DGRAD, &L->dzq.d, &w->wqkv, &L->dh, &L->x.d, &w->g1, &L->r1, &L->svec.d, dx,
                           grads ? &grads->g1 : NULL, stream));
    if (grads) CODA_TRY(wgrad(L, &L->dzq.d, &L->b, &grads->wqkv, stream));
    if (grads && cfg->vocab > 0 && !L->have_loss) {
        /* No loss in the forward pass: the LM head did not take part. */
        CODA_TRY(coda__llama_mem_zero(L->mem, &grads->gf, stream));
        CODA_TRY(coda__llama_mem_zero(L->mem, &grads->wlm, stream));
    }
    return coda__llama_mem_sync(L->mem, stream);
}
