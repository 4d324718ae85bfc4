/* block.c - one LLaMA block (no LM head), split at attention, with the
 * activations in the caller's tensors and scratch in a caller's workspace
 * (coda.h section 9; docs/layer.md).
 *
 *   forward_pre    prologue   xg = x g1, ss1 = rowsum x^2 -> r1   (skipped when
 *                             the caller brings xg and r1 from the block before)
 *                  QKV        qkv_rope(xg Wqkv^T; r1, pos)   qkv (M, nqkv)
 *   [attention: the caller's]                                 o (M, nq)
 *   forward_post   O-proj     resid_norm(o Wo^T; res x, g2)   h, hg, ss2 -> r2
 *                  gate/up    gateup_swiglu_train(hg Wgu^T; r2)  z, c
 *                             (gateup_swiglu, c alone, when z is not saved)
 *                  down       resid_add(c Wd^T; res h)        y
 *                             or resid_norm with the next norm's weight: y, y g, -> r
 *   backward_post  down dgrad swiglu_bwd(dy Wd; z)            dz, c, s2; dWd = dy^T c
 *                             (dz over z when acts->spend_z; swiglu_bwd_kept,
 *                             no c, when acts->c was kept from the forward)
 *                  gate/up    rmsnorm_bwd(dz Wgu; dres dy, x h, g2)  dh, b; dWgu = dz^T b
 *                  O dgrad    do = dh Wo                      dWo = dh^T o
 *   [attention backward: the caller's]                        dqkv (M, nqkv)
 *   backward_pre   RoPE bwd   dzq = R^T dqkv, s1 = rowsum(qkv * dqkv)
 *                  QKV dgrad  rmsnorm_bwd(dzq Wqkv; dres dh, x x, g1)  dx, b; dWqkv = dzq^T b
 *
 * Every step is a call of the public GEMM machinery or a layer step
 * (layer_steps: the CPU loops of llama_cpu.c, or the backend's kernels on
 * CUDA), so the chain is the same on every backend. */
#include "layer/block.h"
#include "core/context.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const char *const coda__llama_prog_names[CODA__P_COUNT] = {
    [CODA__P_RESID_NORM] = "resid_norm", [CODA__P_RESID_ADD] = "resid_add",   [CODA__P_QKV] = "qkv_rope",
    [CODA__P_GATEUP] = "gateup_swiglu_train", [CODA__P_LSE] = "lmhead_lse", [CODA__P_LM_BWD] = "lmhead_bwd",
    [CODA__P_SWIGLU_BWD] = "swiglu_bwd", [CODA__P_RMS_BWD] = "rmsnorm_bwd",
    [CODA__P_GATEUP_INFER] = "gateup_swiglu", [CODA__P_SWIGLU_BWD_KEPT] = "swiglu_bwd_kept",
};

/* ---- the workspace: one byte buffer, carved per call ---- */

/* Carves tensors out of a buffer from `base` at 256-byte boundaries,
 * counting the bytes in `used`; nothing is touched, so the size query and
 * the calls (which check `used` before writing) run the same carving. */
typedef struct {
    char *base; /* NULL: count only */
    size_t used;
    coda_device_t device;
    int device_index;
    int too_big; /* a piece past 2^56 bytes (the tensor limit): the sizes would wrap */
} arena_t;

#define ARENA_MAX ((size_t)1 << 56)

static coda_tensor_t carve(arena_t *a, coda_dtype_t dt, int64_t rows, int64_t cols /* 0: 1-D */) {
    size_t n, bytes;
    /* checked: at m = 2^31 with a 2^31-wide FFN, dz's bytes wrapped to 0 (a review) */
    if (__builtin_mul_overflow((size_t)rows, (size_t)(cols ? cols : 1), &n) ||
        __builtin_mul_overflow(n, coda_dtype_size(dt), &bytes) || bytes > ARENA_MAX || a->used > ARENA_MAX)
        a->too_big = 1, bytes = 0;
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (bytes + 255) / 256 * 256;
    coda_tensor_t t = cols ? coda_tensor_2d(p, dt, rows, cols) : coda_tensor_1d(p, dt, rows);
    t.device = a->device;
    t.device_index = a->device_index;
    return t;
}

/* The GEMMs of the block, each with its tiling for the call's M. */
enum { G_QKV, G_O, G_GU, G_DOWN, G_DOWN_DGRAD, G_GU_DGRAD, G_QKV_DGRAD, G_COUNT };

/* kept_c: the down dgrad runs swiglu_bwd_kept (acts->c kept), tiled for it */
static coda_status_t tilings(const coda_block_t *B, int64_t m, int kept_c, coda_tiling_t tl[G_COUNT]) {
    const coda_llama_config_t *c = &B->cfg;
    int64_t d = c->d, I = c->ffn;
    const struct { coda_layout_t layout; int64_t n, k; int prog; } gs[G_COUNT] = {
        [G_QKV] = {CODA_LAYOUT_NT, B->nqkv, d, CODA__P_QKV},
        [G_O] = {CODA_LAYOUT_NT, d, B->nq, CODA__P_RESID_NORM},
        [G_GU] = {CODA_LAYOUT_NT, 2 * I, d, CODA__P_GATEUP},
        [G_DOWN] = {CODA_LAYOUT_NT, d, I, CODA__P_RESID_NORM},
        [G_DOWN_DGRAD] = {CODA_LAYOUT_NN, I, d, kept_c ? CODA__P_SWIGLU_BWD_KEPT : CODA__P_SWIGLU_BWD},
        [G_GU_DGRAD] = {CODA_LAYOUT_NN, d, 2 * I, CODA__P_RMS_BWD},
        [G_QKV_DGRAD] = {CODA_LAYOUT_NN, d, B->nqkv, CODA__P_RMS_BWD},
    };
    for (int g = 0; g < G_COUNT; g++) {
        CODA_TRY(coda_choose_program_tiling(B->ctx, B->device, gs[g].layout, m, gs[g].n, gs[g].k,
                                            B->prog[gs[g].prog], &tl[g]));
        if (tl[g].tile_m <= 0 || tl[g].tile_n <= 0)
            return coda__fail(CODA_ERR_INTERNAL, "block: the backend chose tiling %dx%d", tl[g].tile_m, tl[g].tile_n);
    }
    return CODA_OK;
}

/* Row partials (M, n tiles) and column partials (d, m tiles) of GEMM g. */
static coda_tensor_t rowparts(arena_t *a, int64_t m, int64_t n, coda_tiling_t tl) {
    return carve(a, CODA_F32, m, coda__cdiv(n, tl.tile_n));
}
static coda_tensor_t colparts(arena_t *a, int64_t m, int64_t n, coda_tiling_t tl) {
    return carve(a, CODA_F32, n, coda__cdiv(m, tl.tile_m));
}

/* Scratch of each call, carved in one place so that the size query and the
 * calls agree. */
typedef struct {
    coda_tiling_t tl[G_COUNT];
    coda_tensor_t xg, ss1;                        /* forward_pre */
    coda_tensor_t hg, c, ss_o, ss_down;           /* forward_post */
    coda_tensor_t dz, b, s_down, svec, gvec, dg;  /* backward_post */
    coda_tensor_t dzq, s1, dg1, gvec1;            /* backward_pre */
} scratch_t;

enum {
    CALL_FWD_PRE = CODA_BLOCK_FORWARD_PRE, CALL_FWD_POST = CODA_BLOCK_FORWARD_POST,
    CALL_BWD_POST = CODA_BLOCK_BACKWARD_POST, CALL_BWD_PRE = CODA_BLOCK_BACKWARD_PRE,
    CALL_BWD_POST_SPEND_Z = CODA_BLOCK_BACKWARD_POST_SPEND_Z, CALL_BWD_POST_KEPT_C = CODA_BLOCK_BACKWARD_POST_KEPT_C,
    CALL_BWD_POST_SPEND_Z_KEPT_C = CODA_BLOCK_BACKWARD_POST_SPEND_Z_KEPT_C,
    CALL_FWD_POST_KEPT_C = CODA_BLOCK_FORWARD_POST_KEPT_C, CALL_LAST = CALL_FWD_POST_KEPT_C
};

/* backward_post's form for these activations */
static int bwd_post_call(const coda_block_acts_t *acts) {
    if (acts->c.data) return acts->spend_z ? CALL_BWD_POST_SPEND_Z_KEPT_C : CALL_BWD_POST_KEPT_C;
    return acts->spend_z ? CALL_BWD_POST_SPEND_Z : CALL_BWD_POST;
}

static coda_status_t layout(const coda_block_t *B, int call, int64_t m, arena_t *a, scratch_t *s) {
    const coda_llama_config_t *c = &B->cfg;
    int64_t d = c->d, I = c->ffn;
    memset(s, 0, sizeof *s);
    /* backward_post's forms: z spent (dz over it), c kept (the caller's) */
    int spend = call == CALL_BWD_POST_SPEND_Z || call == CALL_BWD_POST_SPEND_Z_KEPT_C;
    int kept = call == CALL_BWD_POST_KEPT_C || call == CALL_BWD_POST_SPEND_Z_KEPT_C;
    CODA_TRY(tilings(B, m, kept, s->tl));
    switch (call) {
    case CALL_FWD_PRE:
        s->xg = carve(a, CODA_BF16, m, d);
        s->ss1 = carve(a, CODA_F32, m, 1);
        break;
    case CALL_FWD_POST:
    case CALL_FWD_POST_KEPT_C: /* a kept c is the caller's */
        s->hg = carve(a, CODA_BF16, m, d);
        if (call == CALL_FWD_POST) s->c = carve(a, CODA_BF16, m, I);
        s->ss_o = rowparts(a, m, d, s->tl[G_O]);
        s->ss_down = rowparts(a, m, d, s->tl[G_DOWN]);
        break;
    case CALL_BWD_POST:
    case CALL_BWD_POST_SPEND_Z:
    case CALL_BWD_POST_KEPT_C:
    case CALL_BWD_POST_SPEND_Z_KEPT_C: { /* dz over acts->z when it is spent (the call sets s->dz) */
        if (!spend) s->dz = carve(a, CODA_BF16, m, 2 * I);
        /* b over c: c is last read by dWd's GEMM, b first written by the
         * gate/up dgrad after it (one stream); a kept c is the caller's */
        size_t at = a->used;
        if (!kept) s->c = carve(a, CODA_BF16, m, I);
        size_t after_c = a->used;
        a->used = at;
        s->b = carve(a, CODA_BF16, m, d);
        if (a->used < after_c) a->used = after_c;
        s->s_down = rowparts(a, m, I, s->tl[G_DOWN_DGRAD]);
        s->svec = carve(a, CODA_F32, m, 0);
        s->dg = colparts(a, m, d, s->tl[G_GU_DGRAD]);
        s->gvec = carve(a, CODA_F32, d, 0);
        break;
    }
    case CALL_BWD_PRE:
        s->dzq = carve(a, CODA_BF16, m, B->nqkv);
        s->b = carve(a, CODA_BF16, m, d);
        s->s1 = carve(a, CODA_F32, m, 0);
        s->dg1 = colparts(a, m, d, s->tl[G_QKV_DGRAD]);
        s->gvec1 = carve(a, CODA_F32, d, 0);
        break;
    }
    return CODA_OK;
}

coda_status_t coda_block_workspace_size(const coda_block_t *B, coda_block_call_t which, int64_t m, size_t *bytes) {
    if (!B || !bytes) return coda__fail(CODA_ERR_INVALID_ARG, "coda_block_workspace_size: NULL argument");
    if (which < CODA_BLOCK_ANY || which > (coda_block_call_t)CALL_LAST)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_block_workspace_size: call %d is not a coda_block_call_t",
                          (int)which);
    if (m < 0 || m > ((int64_t)1 << 31))
        return coda__fail(CODA_ERR_SHAPE, "coda_block_workspace_size: m = %lld is outside 0..2^31", (long long)m);
    size_t most = 0;
    for (int call = CALL_FWD_PRE; call <= CALL_LAST; call++) {
        if (which != CODA_BLOCK_ANY && call != (int)which) continue;
        arena_t a = {NULL, 0, B->device, B->device_index, 0};
        scratch_t s;
        CODA_TRY(layout(B, call, m, &a, &s));
        if (a.too_big)
            return coda__fail(CODA_ERR_SHAPE, "coda_block_workspace_size: m = %lld needs tensors past 2^56 bytes",
                              (long long)m);
        if (a.used > most) most = a.used;
    }
    *bytes = most;
    return CODA_OK;
}

/* The scratch of `call` in the caller's workspace, checked before anything
 * is written: large enough, aligned, apart from every argument (args) and,
 * on CUDA, the block's device memory. */
static coda_status_t scratch(const coda_block_t *B, const char *fn, int call, int64_t m, void *ws, size_t ws_bytes,
                             const coda__dev_arg_t *args, int n_args, scratch_t *s) {
    arena_t a = {ws, 0, B->device, B->device_index, 0};
    CODA_TRY(layout(B, call, m, &a, s));
    if (a.too_big) return coda__fail(CODA_ERR_SHAPE, "%s: m = %lld needs tensors past 2^56 bytes", fn, (long long)m);
    if (a.used > ws_bytes)
        return coda__fail(CODA_ERR_SHAPE, "%s: workspace of %zu bytes, this call needs %zu "
                          "(coda_block_workspace_size)", fn, ws_bytes, a.used);
    if (!ws && a.used) return coda__fail(CODA_ERR_INVALID_ARG, "%s: workspace is NULL", fn);
    if ((uintptr_t)ws % 256 != 0)
        return coda__fail(CODA_ERR_STRIDE, "%s: workspace %p is not 256-byte aligned", fn, ws);
    if (a.used) {
        coda_tensor_t wt = coda_tensor_1d(ws, CODA_F32, (int64_t)(a.used / 4));
        wt.device = B->device;
        wt.device_index = B->device_index;
        for (int i = 0; i < n_args; i++)
            if (args[i].t && coda__tensors_overlap(&wt, args[i].t))
                return coda__fail(CODA_ERR_OVERLAP, "%s: the workspace overlaps %s", fn, args[i].name);
        coda__dev_arg_t wa = {&wt, "workspace", 0};
        CODA_TRY(coda__block_check_on_device(B, fn, &wa, 1));
    }
    return CODA_OK;
}

/* ---- create / free ---- */

void coda_block_free(coda_block_t *B) {
    if (!B) return;
    for (int i = 0; i < CODA__P_COUNT; i++) coda_program_free(B->prog[i]);
    coda__llama_mem_free(B->mem, B->freq.data);
    coda__llama_mem_close(B->mem);
    free(B);
}

coda_status_t coda__block_create(coda_context_t *ctx, const coda_llama_config_t *cfg, coda_device_t device,
                                 int with_vocab, const char *fn, coda_block_t **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "%s: out is NULL", fn);
    *out = NULL;
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!cfg) return coda__fail(CODA_ERR_INVALID_ARG, "%s: cfg is NULL", fn);
    /* the block's own calls ignore cfg->vocab (coda.h section 9): check the
     * rest of cfg only (a review found a vocab past 2^24 refused) */
    coda_llama_config_t checked = *cfg;
    if (!with_vocab) checked.vocab = 0;
    CODA_TRY(coda__llama_check_config(&checked, fn));
    if (device != CODA_DEVICE_CPU && device != CODA_DEVICE_CUDA)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: device %d is neither CPU (0) nor CUDA (1)", fn, (int)device);
    if (device == CODA_DEVICE_CUDA) {
        /* Every extent that is some GEMM's contraction (forward or dgrad)
         * must be a multiple of 8 on the GPU (16-byte rows for the copy
         * engine): refuse now rather than in the first backward. */
        const struct { const char *name; int64_t v; } k[] = {
            {"d", cfg->d}, {"n_heads * head_dim", cfg->n_heads * cfg->head_dim},
            {"(n_heads + 2 n_kv_heads) * head_dim", (cfg->n_heads + 2 * cfg->n_kv_heads) * cfg->head_dim},
            {"ffn", cfg->ffn}, {"vocab", with_vocab ? cfg->vocab : 0}};
        for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
            if (k[i].v % 8 != 0)
                return coda__fail(CODA_ERR_SHAPE, "%s: %s = %lld: on CUDA it must be a multiple of 8 "
                                  "(a GEMM contracts over it)", fn, k[i].name, (long long)k[i].v);
    }
    coda_block_t *B = calloc(1, sizeof *B);
    if (!B) return coda__fail(CODA_ERR_NO_MEMORY, "%s: out of memory", fn);
    B->ctx = ctx;
    B->cfg = *cfg;
    B->nq = cfg->n_heads * cfg->head_dim;
    B->nkv = cfg->n_kv_heads * cfg->head_dim;
    B->nqkv = B->nq + 2 * B->nkv;
    B->device = device;
    B->device_index = 0; /* CUDA: device 0 of the context */
    coda_status_t s = coda__llama_mem_open(ctx, device, B->device_index, fn, &B->mem);
    if (s != CODA_OK) {
        free(B);
        return s;
    }
    for (int i = 0; s == CODA_OK && i < CODA__P_COUNT; i++) {
        const char *text = coda_builtin_program(coda__llama_prog_names[i]);
        if (!text) {
            s = coda__fail(CODA_ERR_INTERNAL, "%s: no built-in program %s", fn, coda__llama_prog_names[i]);
        } else if (coda_program_parse(text, &B->prog[i]) != CODA_OK) {
            s = coda__fail(CODA_ERR_INTERNAL, "%s: built-in program %s: %s", fn, coda__llama_prog_names[i],
                           coda_last_error());
        }
    }
    /* the RoPE frequency of each column pair, made once on the host and
     * copied to the block's device here, not in a step */
    float *freq = s == CODA_OK ? malloc((size_t)(B->nqkv / 2 + 1) * sizeof(float)) : NULL;
    if (s == CODA_OK && !freq) s = coda__fail(CODA_ERR_NO_MEMORY, "%s: out of memory", fn);
    void *dev = NULL;
    if (s == CODA_OK) s = coda__llama_mem_alloc(B->mem, (size_t)(B->nqkv / 2 + 1) * sizeof(float), &dev);
    if (s == CODA_OK) {
        coda__llama_rope_freq(cfg, freq);
        coda_tensor_t h = coda_tensor_1d(freq, CODA_F32, B->nqkv / 2);
        B->freq = h;
        B->freq.data = dev;
        B->freq.device = device;
        s = coda__llama_mem_copy(B->mem, &h, &B->freq, NULL);
        if (s == CODA_OK) s = coda__llama_mem_sync(B->mem, NULL);
    } else if (dev) {
        coda__llama_mem_free(B->mem, dev);
    }
    free(freq);
    if (s != CODA_OK) {
        coda_block_free(B);
        return s;
    }
    *out = B;
    return CODA_OK;
}

coda_status_t coda_block_create(coda_context_t *ctx, const coda_llama_config_t *cfg, coda_device_t device,
                                coda_block_t **out) {
    return coda__block_create(ctx, cfg, device, 0, "coda_block_create", out); /* cfg->vocab is not the block's */
}

/* ---- argument checks ---- */

static const coda_dtype_t BF16[1] = {CODA_BF16};
static const coda_dtype_t F32[1] = {CODA_F32};
static const coda_dtype_t GRAD[2] = {CODA_F32, CODA_BF16}; /* weight gradients, dqkv */

coda_status_t coda__block_check_arg(const coda_block_t *B, const coda_tensor_t *t, const char *fn, const char *what,
                               int64_t rows, int64_t cols, const coda_dtype_t *dts, int n_dts) {
    char name[96];
    snprintf(name, sizeof name, "%s: %s", fn, what);
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s is NULL", name);
    int64_t shape[2] = {rows, cols};
    CODA_TRY(coda__check_shape(t, name, cols < 0 ? 1 : 2, shape));
    CODA_TRY(coda__check_dtype(t, name, dts, n_dts));
    if (t->device != B->device)
        return coda__fail(CODA_ERR_DEVICE, "%s is on the %s, the block on the %s", name,
                          t->device == CODA_DEVICE_CPU ? "CPU" : "GPU", B->device == CODA_DEVICE_CPU ? "CPU" : "GPU");
    if (t->device == CODA_DEVICE_CUDA && t->device_index != B->device_index)
        return coda__fail(CODA_ERR_DEVICE, "%s is on cuda:%d, the block on cuda:%d", name, t->device_index,
                          B->device_index);
    return CODA_OK;
}

/* The fields of coda_llama_weights_t, in order: the block's six, then the
 * LM head's two (the whole layer's). */
static const char *const weight_names[CODA__N_WEIGHTS] = {"g1", "wqkv", "wo", "g2", "wgu", "wd", "gf", "wlm"};

const char *coda__weight_name(int i) { return weight_names[i]; }

const coda_tensor_t *coda__weight(const coda_llama_weights_t *w, int i) {
    const coda_tensor_t *f[CODA__N_WEIGHTS] = {&w->g1, &w->wqkv, &w->wo, &w->g2, &w->wgu, &w->wd, &w->gf, &w->wlm};
    return f[i];
}

void coda__weight_shape(const coda_block_t *B, int i, int64_t *rows, int64_t *cols) {
    const coda_llama_config_t *c = &B->cfg;
    const int64_t r[CODA__N_WEIGHTS] = {c->d, B->nqkv, c->d, c->d, 2 * c->ffn, c->d, c->d, c->vocab};
    const int64_t k[CODA__N_WEIGHTS] = {-1, c->d, B->nq, -1, c->d, c->ffn, -1, c->d};
    *rows = r[i];
    *cols = k[i];
}

coda_status_t coda__block_check_weights(const coda_block_t *B, const coda_llama_weights_t *w, unsigned mask,
                                        const char *fn, const char *what, const coda_dtype_t *dts, int n_dts) {
    if (!w) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
    for (int i = 0; i < CODA__N_WEIGHTS; i++) {
        if (!(mask >> i & 1)) continue;
        char name[64];
        int64_t rows, cols;
        coda__weight_shape(B, i, &rows, &cols);
        snprintf(name, sizeof name, "%s->%s", what, weight_names[i]);
        CODA_TRY(coda__block_check_arg(B, coda__weight(w, i), fn, name, rows, cols, dts, n_dts));
    }
    return CODA_OK;
}

coda_status_t coda__block_check_apart(const char *fn, const coda__named_t *out, int n_out, const coda__named_t *in,
                                      int n_in, const coda_llama_weights_t *w, unsigned wmask,
                                      const coda_llama_weights_t *grads, unsigned gmask) {
    for (int i = 0; i < n_out; i++) {
        if (!out[i].t) continue;
        for (int j = 0; j < i; j++)
            if (out[j].t && coda__tensors_overlap(out[i].t, out[j].t))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps %s", fn, out[i].name, out[j].name);
        for (int j = 0; j < n_in; j++)
            if (in[j].t && coda__tensors_overlap(out[i].t, in[j].t))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps %s", fn, out[i].name, in[j].name);
        for (int k = 0; k < CODA__N_WEIGHTS; k++) {
            if ((wmask >> k & 1) && coda__tensors_overlap(out[i].t, coda__weight(w, k)))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps w->%s", fn, out[i].name, weight_names[k]);
            if (grads && (gmask >> k & 1) && coda__tensors_overlap(out[i].t, coda__weight(grads, k)))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps grads->%s", fn, out[i].name, weight_names[k]);
        }
    }
    if (grads)
        for (int k = 0; k < CODA__N_WEIGHTS; k++) {
            if (!(gmask >> k & 1)) continue;
            for (int j = 0; j < n_in; j++)
                if (in[j].t && coda__tensors_overlap(coda__weight(grads, k), in[j].t))
                    return coda__fail(CODA_ERR_OVERLAP, "%s: grads->%s overlaps %s", fn, weight_names[k], in[j].name);
            for (int j = 0; j < CODA__N_WEIGHTS; j++)
                if (((wmask >> j & 1) && coda__tensors_overlap(coda__weight(grads, k), coda__weight(w, j))) ||
                    (j < k && (gmask >> j & 1) && coda__tensors_overlap(coda__weight(grads, k), coda__weight(grads, j))))
                    return coda__fail(CODA_ERR_OVERLAP, "%s: grads->%s overlaps a weight or another gradient", fn,
                                      weight_names[k]);
        }
    return CODA_OK;
}

coda_status_t coda__block_check_on_device(const coda_block_t *B, const char *fn, const coda__dev_arg_t *a, int n) {
    if (B->device != CODA_DEVICE_CUDA) return CODA_OK;
    const coda_tensor_t *ts[32];
    const char *names[32];
    if (n > 32) return coda__fail(CODA_ERR_INTERNAL, "%s: %d device arguments", fn, n);
    for (int i = 0; i < n; i++) {
        const coda_tensor_t *t = a[i].t;
        ts[i] = t;
        names[i] = a[i].name;
        if (!t || !a[i].align) continue;
        if ((uintptr_t)t->data % (uintptr_t)a[i].align != 0 || (t->ndim == 2 && t->stride[0] % a[i].align != 0))
            return coda__fail(CODA_ERR_STRIDE, "%s: %s: base %p and row stride %lld bytes must be multiples of %d "
                              "on the GPU", fn, a[i].name, t->data, (long long)t->stride[0], a[i].align);
    }
#ifdef CODA_WITH_CUDA
    coda_status_t s = coda__cuda_check_pointers(B->ctx, B->device_index, ts, names, n);
    if (s != CODA_OK) return coda__fail(s, "%s: %s", fn, coda_last_error());
#else
    (void)ts;
    (void)names;
#endif
    return CODA_OK;
}

/* Tokens of a call, from x: positive, below 2^31, a multiple of 8 on CUDA
 * (the weight-gradient GEMMs contract over tokens, in 16-byte rows). */
static coda_status_t check_m(const coda_block_t *B, const char *fn, const coda_tensor_t *x, const char *name,
                             int64_t *m) {
    if (!x) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %s is NULL", fn, name);
    CODA_TRY(coda__check_tensor(x, name));
    if (x->ndim != 2) return coda__fail(CODA_ERR_SHAPE, "%s: %s has %d dims, expected 2 (M, d)", fn, name, x->ndim);
    *m = x->shape[0];
    if (*m <= 0 || *m > ((int64_t)1 << 31))
        return coda__fail(CODA_ERR_SHAPE, "%s: M = %lld tokens: must be 1..2^31", fn, (long long)*m);
    if (B->device == CODA_DEVICE_CUDA && *m % 8 != 0)
        return coda__fail(CODA_ERR_SHAPE, "%s: M = %lld tokens: on CUDA a multiple of 8 (the weight gradients "
                          "contract over tokens)", fn, (long long)*m);
    return CODA_OK;
}

/* ---- the steps ---- */

static coda_status_t epilogue(const coda_block_t *B, const scratch_t *s, int g, int p, coda_layout_t layout,
                              const coda_tensor_t *a, const coda_tensor_t *b, const coda_binding_t *bs, int n,
                              void *stream) {
    return coda_gemm_epilogue(B->ctx, layout, a, b, B->prog[p], bs, n, &s->tl[g], stream);
}

/* rmsnorm_bwd on acc = a w (dgrad GEMM g): dx, b = r x gw, dg partials;
 * the weight's gradient into gout (may be NULL) through gvec (f32). */
static coda_status_t norm_backward(const coda_block_t *B, const scratch_t *s, int g, const coda_tensor_t *a,
                                   const coda_tensor_t *w, const coda_tensor_t *dres, const coda_tensor_t *x,
                                   const coda_tensor_t *gw, const coda_tensor_t *r, const coda_tensor_t *stat,
                                   const coda_tensor_t *b, const coda_tensor_t *dg, const coda_tensor_t *gvec,
                                   coda_tensor_t *dx, coda_tensor_t *gout, void *stream) {
    coda_binding_t bs[] = {coda__bind("dres", dres), coda__bind("x", x),   coda__bind("g", gw),
                           coda__bind("r", r),       coda__bind("s", stat), coda__bind_scalar("invd", 1.0f / (float)B->cfg.d),
                           coda__bind("dx", dx),     coda__bind("b", b),   coda__bind("dg", dg)};
    CODA_TRY(epilogue(B, s, g, CODA__P_RMS_BWD, CODA_LAYOUT_NN, a, w, bs, 9, stream));
    if (!gout) return CODA_OK;
    CODA_TRY(coda_finish_reduce(B->ctx, CODA_REDUCE_SUM, dg, (coda_tensor_t *)gvec, stream));
    return coda__layer_convert_vec(B, gvec, gout, stream);
}

static coda_status_t wgrad(const coda_block_t *B, const coda_tensor_t *a, const coda_tensor_t *b, coda_tensor_t *dw,
                           void *stream) {
    return coda_gemm(B->ctx, CODA_LAYOUT_TN, a, b, dw, 1.0f, 0.0f, stream);
}

/* ---- forward ---- */

/* the weights each half reads and whose gradients it writes: wo g2 wgu wd,
 * and g1 wqkv (bit i for field i, coda__weight); wo's alone */
#define POST_GRADS 0x3cu
#define PRE_GRADS 0x03u
#define WO_GRAD 0x04u

/* What both pre halves read, checked in one order: the block, acts, M
 * from x, the weights g1 and wqkv, x (and xg, the forward's optional
 * normalised input), pos, acts->r1 and acts->qkv. */
static coda_status_t check_pre_inputs(const coda_block_t *B, const char *fn, const coda_llama_weights_t *w,
                                      const coda_tensor_t *x, const coda_tensor_t *xg, const coda_tensor_t *pos,
                                      const coda_block_acts_t *acts, int64_t *m) {
    if (!B) return coda__fail(CODA_ERR_INVALID_ARG, "%s: block is NULL", fn);
    if (!acts) return coda__fail(CODA_ERR_INVALID_ARG, "%s: acts is NULL", fn);
    CODA_TRY(check_m(B, fn, x, "x", m));
    CODA_TRY(coda__block_check_weights(B, w, PRE_GRADS, fn, "w", BF16, 1));
    CODA_TRY(coda__block_check_arg(B, x, fn, "x", *m, B->cfg.d, BF16, 1));
    if (xg) CODA_TRY(coda__block_check_arg(B, xg, fn, "xg", *m, B->cfg.d, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, pos, fn, "pos", *m, -1, F32, 1));
    CODA_TRY(coda__block_check_arg(B, &acts->r1, fn, "acts->r1", *m, -1, F32, 1));
    return coda__block_check_arg(B, &acts->qkv, fn, "acts->qkv", *m, B->nqkv, BF16, 1);
}

coda_status_t coda_block_forward_pre(coda_block_t *B, const coda_llama_weights_t *w, const coda_tensor_t *x,
                                     const coda_tensor_t *xg, const coda_tensor_t *pos, coda_block_acts_t *acts,
                                     void *ws, size_t ws_bytes, void *stream) {
    static const char fn[] = "coda_block_forward_pre";
    int64_t m;
    CODA_TRY(check_pre_inputs(B, fn, w, x, xg, pos, acts, &m));
    const int64_t d = B->cfg.d;
    coda__named_t out[] = {{&acts->qkv, "acts->qkv"}, {xg ? NULL : &acts->r1, "acts->r1"}};
    coda__named_t in[] = {{x, "x"}, {xg, "xg"}, {pos, "pos"}, {xg ? &acts->r1 : NULL, "acts->r1"}};
    CODA_TRY(coda__block_check_apart(fn, out, 2, in, 4, w, CODA__W_BLOCK, NULL, 0));
    coda__dev_arg_t da[] = {{&w->g1, "w->g1", 2}, {&w->wqkv, "w->wqkv", 16}, {x, "x", 4}, {xg, "xg", 16},
                      {pos, "pos", 4}, {&acts->r1, "acts->r1", 4}, {&acts->qkv, "acts->qkv", 4}};
    CODA_TRY(coda__block_check_on_device(B, fn, da, 7));
    scratch_t s;
    CODA_TRY(scratch(B, fn, CALL_FWD_PRE, m, ws, ws_bytes, da, 7, &s));

    if (!xg) { /* the RMSNorm prologue: xg = x g1 and r1 */
        CODA_TRY(coda__layer_norm_prologue(B, x, &w->g1, &s.xg, &s.ss1, stream));
        CODA_TRY(coda_finish_rstd(B->ctx, &s.ss1, d, B->cfg.eps, &acts->r1, stream));
        xg = &s.xg;
    }
    /* QKV + r1 + RoPE */
    coda_binding_t bs[] = {coda__bind("r", &acts->r1), coda__bind("pos", pos), coda__bind("freq", &B->freq), coda__bind("qkv", &acts->qkv)};
    return epilogue(B, &s, G_QKV, CODA__P_QKV, CODA_LAYOUT_NT, xg, &w->wqkv, bs, 4, stream);
}

coda_status_t coda_block_forward_post(coda_block_t *B, const coda_llama_weights_t *w, const coda_tensor_t *x,
                                      const coda_tensor_t *o, coda_block_acts_t *acts, coda_tensor_t *y,
                                      const coda_tensor_t *g_next, coda_tensor_t *y_g, coda_tensor_t *r_next,
                                      void *ws, size_t ws_bytes, void *stream) {
    static const char fn[] = "coda_block_forward_post";
    if (!B) return coda__fail(CODA_ERR_INVALID_ARG, "%s: block is NULL", fn);
    if (!acts) return coda__fail(CODA_ERR_INVALID_ARG, "%s: acts is NULL", fn);
    int64_t m, d = B->cfg.d, I = B->cfg.ffn;
    CODA_TRY(check_m(B, fn, x, "x", &m));
    CODA_TRY(coda__block_check_weights(B, w, POST_GRADS, fn, "w", BF16, 1));
    CODA_TRY(coda__block_check_arg(B, x, fn, "x", m, d, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, o, fn, "o", m, B->nq, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, &acts->h, fn, "acts->h", m, d, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, &acts->r2, fn, "acts->r2", m, -1, F32, 1));
    const coda_tensor_t *z = acts->z.data ? &acts->z : NULL; /* NULL: inference, z not saved */
    if (z) CODA_TRY(coda__block_check_arg(B, z, fn, "acts->z", m, 2 * I, BF16, 1));
    const coda_tensor_t *kc = acts->c.data ? &acts->c : NULL; /* NULL: c in the workspace */
    if (kc) CODA_TRY(coda__block_check_arg(B, kc, fn, "acts->c", m, I, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, y, fn, "y", m, d, BF16, 1));
    if ((g_next != NULL) != (y_g != NULL) || (g_next != NULL) != (r_next != NULL))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: g_next, y_g and r_next come together (all or none)", fn);
    if (g_next) {
        CODA_TRY(coda__block_check_arg(B, g_next, fn, "g_next", d, -1, BF16, 1));
        CODA_TRY(coda__block_check_arg(B, y_g, fn, "y_g", m, d, BF16, 1));
        CODA_TRY(coda__block_check_arg(B, r_next, fn, "r_next", m, -1, F32, 1));
    }
    coda__named_t out[] = {{&acts->h, "acts->h"}, {&acts->r2, "acts->r2"}, {z, "acts->z"}, {y, "y"},
                     {y_g, "y_g"}, {r_next, "r_next"}, {kc, "acts->c"}};
    coda__named_t in[] = {{x, "x"}, {o, "o"}, {g_next, "g_next"}};
    CODA_TRY(coda__block_check_apart(fn, out, 7, in, 3, w, CODA__W_BLOCK, NULL, 0));
    /* c is the down projection's A operand (TMA: 16-byte rows) */
    coda__dev_arg_t da[] = {{&w->wo, "w->wo", 16}, {&w->g2, "w->g2", 4}, {&w->wgu, "w->wgu", 16}, {&w->wd, "w->wd", 16},
                      {x, "x", 4}, {o, "o", 16}, {&acts->h, "acts->h", 16}, {&acts->r2, "acts->r2", 4},
                      {z, "acts->z", 4}, {y, "y", 4}, {g_next, "g_next", 4}, {y_g, "y_g", 16},
                      {r_next, "r_next", 4}, {kc, "acts->c", 16}};
    CODA_TRY(coda__block_check_on_device(B, fn, da, 14));
    scratch_t s;
    CODA_TRY(scratch(B, fn, kc ? CALL_FWD_POST_KEPT_C : CALL_FWD_POST, m, ws, ws_bytes, da, 14, &s));
    if (kc) s.c = *kc; /* the caller keeps c for the backward */

    {   /* O-proj + residual + FFN norm partials */
        coda_binding_t bs[] = {coda__bind("res", x), coda__bind("g", &w->g2), coda__bind("h", &acts->h), coda__bind("hg", &s.hg),
                               coda__bind("ss", &s.ss_o)};
        CODA_TRY(epilogue(B, &s, G_O, CODA__P_RESID_NORM, CODA_LAYOUT_NT, o, &w->wo, bs, 5, stream));
        CODA_TRY(coda_finish_rstd(B->ctx, &s.ss_o, d, B->cfg.eps, &acts->r2, stream));
    }
    if (z) { /* gate/up + r2 + SwiGLU, saving z */
        coda_binding_t bs[] = {coda__bind("r", &acts->r2), coda__bind("z", z), coda__bind("c", &s.c)};
        CODA_TRY(epilogue(B, &s, G_GU, CODA__P_GATEUP, CODA_LAYOUT_NT, &s.hg, &w->wgu, bs, 3, stream));
    } else { /* the same without z: the same c, bit for bit */
        coda_binding_t bs[] = {coda__bind("r", &acts->r2), coda__bind("c", &s.c)};
        CODA_TRY(epilogue(B, &s, G_GU, CODA__P_GATEUP_INFER, CODA_LAYOUT_NT, &s.hg, &w->wgu, bs, 2, stream));
    }
    if (g_next) { /* down + residual + the next RMSNorm's first half */
        coda_binding_t bs[] = {coda__bind("res", &acts->h), coda__bind("g", g_next), coda__bind("h", y), coda__bind("hg", y_g),
                               coda__bind("ss", &s.ss_down)};
        CODA_TRY(epilogue(B, &s, G_DOWN, CODA__P_RESID_NORM, CODA_LAYOUT_NT, &s.c, &w->wd, bs, 5, stream));
        return coda_finish_rstd(B->ctx, &s.ss_down, d, B->cfg.eps, r_next, stream);
    }
    coda_binding_t bs[] = {coda__bind("res", &acts->h), coda__bind("h", y)};
    return epilogue(B, &s, G_DOWN, CODA__P_RESID_ADD, CODA_LAYOUT_NT, &s.c, &w->wd, bs, 2, stream);
}

/* ---- backward ---- */


coda_status_t coda_block_backward_post(coda_block_t *B, const coda_llama_weights_t *w, const coda_tensor_t *o,
                                       const coda_block_acts_t *acts, const coda_tensor_t *dy, coda_tensor_t *do_,
                                       coda_tensor_t *dh, coda_llama_weights_t *grads, void *ws, size_t ws_bytes,
                                       void *stream) {
    static const char fn[] = "coda_block_backward_post";
    if (!B) return coda__fail(CODA_ERR_INVALID_ARG, "%s: block is NULL", fn);
    if (!acts) return coda__fail(CODA_ERR_INVALID_ARG, "%s: acts is NULL", fn);
    int64_t m, d = B->cfg.d, I = B->cfg.ffn;
    /* do_ NULL: the O projection's backward is the caller's (grads->wo and o unused) */
    const unsigned gmask = do_ ? POST_GRADS : POST_GRADS & ~WO_GRAD;
    CODA_TRY(check_m(B, fn, dy, "dy", &m));
    CODA_TRY(coda__block_check_weights(B, w, POST_GRADS, fn, "w", BF16, 1));
    if (do_) CODA_TRY(coda__block_check_arg(B, o, fn, "o", m, B->nq, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, &acts->h, fn, "acts->h", m, d, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, &acts->r2, fn, "acts->r2", m, -1, F32, 1));
    if (!acts->z.data)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: acts->z is empty: its forward_post did not save it "
                          "(a forward for inference has no backward)", fn);
    CODA_TRY(coda__block_check_arg(B, &acts->z, fn, "acts->z", m, 2 * I, BF16, 1));
    const coda_tensor_t *kc = acts->c.data ? &acts->c : NULL; /* kept from the forward: read, not recomputed */
    if (kc) CODA_TRY(coda__block_check_arg(B, kc, fn, "acts->c", m, I, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, dy, fn, "dy", m, d, BF16, 1));
    if (do_) CODA_TRY(coda__block_check_arg(B, do_, fn, "do_", m, B->nq, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, dh, fn, "dh", m, d, BF16, 1));
    if (grads) CODA_TRY(coda__block_check_weights(B, grads, gmask, fn, "grads", GRAD, 2));
    const coda_tensor_t *o_in = do_ ? o : NULL;
    /* with spend_z, z is written (dz over it): checked as an output, apart
     * from every input, weight and gradient */
    const coda_tensor_t *z_out = acts->spend_z ? &acts->z : NULL, *z_in = acts->spend_z ? NULL : &acts->z;
    coda__named_t out[] = {{do_, "do_"}, {dh, "dh"}, {z_out, "acts->z (spend_z)"}};
    coda__named_t in[] = {{o_in, "o"}, {&acts->h, "acts->h"}, {&acts->r2, "acts->r2"}, {z_in, "acts->z"}, {dy, "dy"},
                          {kc, "acts->c"}};
    CODA_TRY(coda__block_check_apart(fn, out, 3, in, 6, w, CODA__W_BLOCK, grads, gmask));
    coda__dev_arg_t da[] = {{&w->wo, "w->wo", 16}, {&w->g2, "w->g2", 4}, {&w->wgu, "w->wgu", 16},
                      {&w->wd, "w->wd", 16}, {o_in, "o", 16}, {&acts->h, "acts->h", 4},
                      {&acts->r2, "acts->r2", 4}, {&acts->z, "acts->z", 16}, {dy, "dy", 16},
                      {do_, "do_", 16}, {dh, "dh", 16},
                      {grads && do_ ? &grads->wo : NULL, "grads->wo", 16}, {grads ? &grads->g2 : NULL, "grads->g2", 0},
                      {grads ? &grads->wgu : NULL, "grads->wgu", 16}, {grads ? &grads->wd : NULL, "grads->wd", 16},
                      {kc, "acts->c", 16}};
    CODA_TRY(coda__block_check_on_device(B, fn, da, 16));
    scratch_t s;
    CODA_TRY(scratch(B, fn, bwd_post_call(acts), m, ws, ws_bytes, da, 16, &s));
    if (acts->spend_z) s.dz = acts->z; /* in place: each z element is read before its dz overwrites it */

    if (kc) { /* down dgrad + SwiGLU backward: dz, s2; c kept from the forward */
        s.c = *kc;
        coda_binding_t bs[] = {coda__bind("z", &acts->z), coda__bind("dz", &s.dz), coda__bind("s", &s.s_down)};
        CODA_TRY(epilogue(B, &s, G_DOWN_DGRAD, CODA__P_SWIGLU_BWD_KEPT, CODA_LAYOUT_NN, dy, &w->wd, bs, 3, stream));
    } else { /* the same, with c recomputed */
        coda_binding_t bs[] = {coda__bind("z", &acts->z), coda__bind("dz", &s.dz), coda__bind("c", &s.c), coda__bind("s", &s.s_down)};
        CODA_TRY(epilogue(B, &s, G_DOWN_DGRAD, CODA__P_SWIGLU_BWD, CODA_LAYOUT_NN, dy, &w->wd, bs, 4, stream));
    }
    CODA_TRY(coda_finish_reduce(B->ctx, CODA_REDUCE_SUM, &s.s_down, &s.svec, stream));
    if (grads) CODA_TRY(wgrad(B, dy, &s.c, &grads->wd, stream)); /* c: kept or recomputed */
    /* gate/up dgrad + FFN RMSNorm backward: dh */
    CODA_TRY(norm_backward(B, &s, G_GU_DGRAD, &s.dz, &w->wgu, dy, &acts->h, &w->g2, &acts->r2, &s.svec, &s.b, &s.dg,
                           &s.gvec, dh, grads ? &grads->g2 : NULL, stream));
    if (grads) CODA_TRY(wgrad(B, &s.dz, &s.b, &grads->wgu, stream));
    if (!do_) return CODA_OK;
    /* O dgrad and wgrad: plain GEMMs */
    CODA_TRY(coda_gemm(B->ctx, CODA_LAYOUT_NN, dh, &w->wo, do_, 1.0f, 0.0f, stream));
    if (grads) CODA_TRY(wgrad(B, dh, o, &grads->wo, stream));
    return CODA_OK;
}

/* backward_pre with dqkv given as n_d parts side by side (1: dqkv; 3: dq,
 * dk, dv), named in messages by names[]. */
static coda_status_t backward_pre(coda_block_t *B, const char *fn, const coda_llama_weights_t *w,
                                  const coda_tensor_t *x, const coda_tensor_t *pos, const coda_block_acts_t *acts,
                                  const coda_tensor_t *const *dparts, const char *const *names, int n_d,
                                  const coda_tensor_t *dh, coda_tensor_t *dx, coda_llama_weights_t *grads, void *ws,
                                  size_t ws_bytes, void *stream) {
    int64_t m;
    CODA_TRY(check_pre_inputs(B, fn, w, x, NULL, pos, acts, &m));
    const int64_t d = B->cfg.d;
    const int64_t widths[3] = {n_d == 1 ? B->nqkv : B->nq, B->nkv, B->nkv};
    coda_tensor_t dy[3];
    for (int q = 0; q < n_d; q++) {
        CODA_TRY(coda__block_check_arg(B, dparts[q], fn, names[q], m, widths[q], GRAD, 2));
        if (dparts[q]->dtype != dparts[0]->dtype)
            return coda__fail(CODA_ERR_DTYPE, "%s: %s is %s, %s %s: the three must be of one dtype", fn, names[q],
                              coda_dtype_name(dparts[q]->dtype), names[0], coda_dtype_name(dparts[0]->dtype));
        dy[q] = *dparts[q];
    }
    CODA_TRY(coda__block_check_arg(B, dh, fn, "dh", m, d, BF16, 1));
    CODA_TRY(coda__block_check_arg(B, dx, fn, "dx", m, d, BF16, 1));
    if (grads) CODA_TRY(coda__block_check_weights(B, grads, PRE_GRADS, fn, "grads", GRAD, 2));
    coda__named_t out[] = {{dx, "dx"}};
    coda__named_t in[8] = {{x, "x"}, {pos, "pos"}, {&acts->r1, "acts->r1"}, {&acts->qkv, "acts->qkv"}, {dh, "dh"}};
    for (int q = 0; q < n_d; q++) in[5 + q] = (coda__named_t){dparts[q], names[q]};
    CODA_TRY(coda__block_check_apart(fn, out, 1, in, 5 + n_d, w, CODA__W_BLOCK, grads, PRE_GRADS));
    coda__dev_arg_t da[13] = {{&w->g1, "w->g1", 4}, {&w->wqkv, "w->wqkv", 16}, {x, "x", 4}, {pos, "pos", 4},
                      {&acts->r1, "acts->r1", 4}, {&acts->qkv, "acts->qkv", 4}, {dh, "dh", 4},
                      {dx, "dx", 4}, {grads ? &grads->g1 : NULL, "grads->g1", 0},
                      {grads ? &grads->wqkv : NULL, "grads->wqkv", 16}};
    for (int q = 0; q < n_d; q++) da[10 + q] = (coda__dev_arg_t){dparts[q], names[q], 4};
    CODA_TRY(coda__block_check_on_device(B, fn, da, 10 + n_d));
    scratch_t s;
    CODA_TRY(scratch(B, fn, CALL_BWD_PRE, m, ws, ws_bytes, da, 10 + n_d, &s));

    /* RoPE backward and the QKV RMSNorm statistic s1 = sum y dqkv */
    CODA_TRY(coda__layer_rope_backward(B, dy, n_d, &acts->qkv, pos, &B->freq, &s.dzq, &s.s1, stream));
    /* QKV dgrad + attention RMSNorm backward: dx */
    CODA_TRY(norm_backward(B, &s, G_QKV_DGRAD, &s.dzq, &w->wqkv, dh, x, &w->g1, &acts->r1, &s.s1, &s.b, &s.dg1,
                           &s.gvec1, dx, grads ? &grads->g1 : NULL, stream));
    if (grads) CODA_TRY(wgrad(B, &s.dzq, &s.b, &grads->wqkv, stream));
    return CODA_OK;
}

coda_status_t coda_block_backward_pre(coda_block_t *B, const coda_llama_weights_t *w, const coda_tensor_t *x,
                                      const coda_tensor_t *pos, const coda_block_acts_t *acts,
                                      const coda_tensor_t *dqkv, const coda_tensor_t *dh, coda_tensor_t *dx,
                                      coda_llama_weights_t *grads, void *ws, size_t ws_bytes, void *stream) {
    static const char *const names[1] = {"dqkv"};
    const coda_tensor_t *parts[1] = {dqkv};
    return backward_pre(B, "coda_block_backward_pre", w, x, pos, acts, parts, names, 1, dh, dx, grads, ws, ws_bytes,
                        stream);
}

coda_status_t coda_block_backward_pre_split(coda_block_t *B, const coda_llama_weights_t *w, const coda_tensor_t *x,
                                            const coda_tensor_t *pos, const coda_block_acts_t *acts,
                                            const coda_tensor_t *dq, const coda_tensor_t *dk, const coda_tensor_t *dv,
                                            const coda_tensor_t *dh, coda_tensor_t *dx, coda_llama_weights_t *grads,
                                            void *ws, size_t ws_bytes, void *stream) {
    static const char *const names[3] = {"dq", "dk", "dv"};
    const coda_tensor_t *parts[3] = {dq, dk, dv};
    return backward_pre(B, "coda_block_backward_pre_split", w, x, pos, acts, parts, names, 3, dh, dx, grads, ws,
                        ws_bytes, stream);
}
