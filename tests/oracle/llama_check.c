/* llama_check.c - coda's layer against the reference layer (see llama_check.h). */
#include "oracle/llama_check.h"
#include "layer/llama.h"
#include "oracle/reference.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift64*: uniform in [-1, 1), never exactly 0 in practice */
static double uni(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    uint64_t x = *s * 0x2545F4914F6CDD1Dull;
    return (double)(x >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

/* ||a - ref|| / ||ref||; NaN in a gives INFINITY */
static double rel_err(const double *a, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        double d = a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Everything the check allocates, freed in one place. */
typedef struct {
    coda__ref_layer_t *ref64, *ref16;
    coda_llama_t *layer;
    void *mem[64];
    int n_mem;
    coda__llama_mem_t *dev;   /* device allocations (CUDA runs) */
    void *dmem[32];
    int n_dmem;
} arena_t;

static void *grab(arena_t *A, size_t bytes) {
    if (A->n_mem == 64) return NULL;
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p) A->mem[A->n_mem++] = p;
    return p;
}

static void arena_free(arena_t *A) {
    coda__ref_free(A->ref64);
    coda__ref_free(A->ref16);
    coda_llama_free(A->layer);
    for (int i = 0; i < A->n_mem; i++) free(A->mem[i]);
    for (int i = 0; i < A->n_dmem; i++) coda__llama_mem_free(A->dev, A->dmem[i]);
    coda__llama_mem_close(A->dev);
}

/* bf16 random array of n, uniform * scale + offset, and its double copy. */
static uint16_t *rand_bf16(arena_t *A, uint64_t *s, int64_t n, double scale, double offset, double *dbl) {
    uint16_t *p = grab(A, (size_t)n * 2);
    if (!p) return NULL;
    for (int64_t i = 0; i < n; i++) {
        p[i] = coda__f32_to_bf16((float)(uni(s) * scale + offset));
        if (dbl) dbl[i] = coda__bf16_to_f32(p[i]);
    }
    return p;
}

/* Row names of the gradients, in coda__ref_params order. */
static const char *const grad_names[CODA__REF_N_WEIGHTS] = {
    "dwq", "dwk", "dwv", "dwo", "dw_gate", "dw_up", "dw_down", "dg1", "dg2", "dgf", "dwlm",
};

/* A device copy of a contiguous host tensor (outputs too: their poison goes up). */
static coda_status_t mirror(arena_t *A, const coda_tensor_t *h, coda_tensor_t *dv) {
    if (A->n_dmem == 32) return coda__fail(CODA_ERR_INTERNAL, "coda__llama_check: too many device buffers");
    void *p;
    CODA_TRY(coda__llama_mem_alloc(A->dev, (size_t)coda_tensor_span_bytes(h), &p));
    A->dmem[A->n_dmem++] = p;
    *dv = *h;
    dv->data = p;
    dv->device = CODA_DEVICE_CUDA;
    dv->device_index = 0;
    return coda__llama_mem_copy(A->dev, h, dv, NULL);
}

static void add_row(coda__llama_check_t *out, const char *name, double err, double base) {
    coda__llama_check_row_t *r = &out->rows[out->n_rows++];
    r->name = name;
    r->err = err;
    r->base = base;
    r->bound = 2.0 * base + 1e-6;
    r->pass = err <= r->bound;
    if (!r->pass) out->all_pass = 0;
}

static coda_status_t run(arena_t *A, coda_context_t *ctx, const coda_llama_config_t *cfg, int64_t batch,
                         int64_t seq, const coda__llama_check_opts_t *o, coda__llama_check_t *out) {
    int64_t m = batch * seq, d = cfg->d, I = cfg->ffn, V = cfg->vocab;
    int64_t nq = cfg->n_heads * cfg->head_dim, nkv = cfg->n_kv_heads * cfg->head_dim;
    int use_loss = o->use_loss && V > 0;
    uint64_t s = o->seed * 0x9E3779B97F4A7C15ull + 12345;
    if (!use_loss && !o->use_dy)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda__llama_check: neither a loss nor dy");

    CODA_TRY(coda__ref_create(cfg, batch, seq, &A->ref64));
    coda__ref_layer_t *R = A->ref64;
    CODA_TRY(coda_llama_create(ctx, cfg, batch, seq, o->device, &A->layer));

    /* Weights in PyTorch's layout: scale 1/sqrt(fan_in) keeps activations O(1). */
    const struct { double *dst; int64_t rows, cols; double scale, offset; } spec[11] = {
        {R->w.wq, nq, d, 1.0 / sqrt((double)d), 0},    {R->w.wk, nkv, d, 1.0 / sqrt((double)d), 0},
        {R->w.wv, nkv, d, 1.0 / sqrt((double)d), 0},   {R->w.wo, d, nq, 1.0 / sqrt((double)nq), 0},
        {R->w.w_gate, I, d, 1.0 / sqrt((double)d), 0}, {R->w.w_up, I, d, 1.0 / sqrt((double)d), 0},
        {R->w.w_down, d, I, 1.0 / sqrt((double)I), 0}, {R->w.g1, d, 1, 0.2, 1.0},
        {R->w.g2, d, 1, 0.2, 1.0},                     {R->w.gf, d, 1, 0.2, 1.0},
        {R->w.wlm, V, d, 2.0 / sqrt((double)d), 0},
    };
    uint16_t *wb[11];
    for (int i = 0; i < 11; i++) {
        if (i >= 9 && V == 0) { wb[i] = NULL; continue; }
        wb[i] = rand_bf16(A, &s, spec[i].rows * spec[i].cols, spec[i].scale, spec[i].offset, spec[i].dst);
        if (!wb[i]) return coda__fail(CODA_ERR_NO_MEMORY, "coda__llama_check: out of memory");
    }
    uint16_t *xb = rand_bf16(A, &s, m * d, 1.0, 0, R->x);
    uint16_t *dyb = rand_bf16(A, &s, m * d, 1.0 / sqrt((double)d), 0, R->dy);
    int32_t *tg = grab(A, (size_t)m * 4);
    float *loss = grab(A, (size_t)m * 4);
    uint16_t *y = grab(A, (size_t)(m * d) * 2), *dx = grab(A, (size_t)(m * d) * 2);
    if (!xb || !dyb || !tg || !loss || !y || !dx) return coda__fail(CODA_ERR_NO_MEMORY, "coda__llama_check: out of memory");
    for (int64_t i = 0; i < m; i++) {
        int64_t t = (int64_t)((uni(&s) * 0.5 + 0.5) * (double)V);
        tg[i] = (int32_t)(t < V ? t : V - 1);
        if (o->ignore_every > 0 && i % o->ignore_every == o->ignore_every - 1) tg[i] = -100;
        if (R->targets) R->targets[i] = tg[i];
    }
    R->use_loss = use_loss;
    R->use_dy = o->use_dy;
    R->loss_scale = o->loss_scale;
    CODA_TRY(coda__ref_create(cfg, batch, seq, &A->ref16));
    CODA_TRY(coda__ref_copy_inputs(A->ref16, R));

    /* coda's layout */
    coda_llama_weights_t w, g;
    memset(&w, 0, sizeof w);
    memset(&g, 0, sizeof g);
    uint16_t *wqkv = grab(A, (size_t)((nq + 2 * nkv) * d) * 2), *wgu = grab(A, (size_t)(2 * I * d) * 2);
    if (!wqkv || !wgu) return coda__fail(CODA_ERR_NO_MEMORY, "coda__llama_check: out of memory");
    coda_tensor_t tq = coda_tensor_2d(wb[0], CODA_BF16, nq, d), tk = coda_tensor_2d(wb[1], CODA_BF16, nkv, d),
                  tv = coda_tensor_2d(wb[2], CODA_BF16, nkv, d), tg_ = coda_tensor_2d(wb[4], CODA_BF16, I, d),
                  tu = coda_tensor_2d(wb[5], CODA_BF16, I, d);
    w.wqkv = coda_tensor_2d(wqkv, CODA_BF16, nq + 2 * nkv, d);
    w.wgu = coda_tensor_2d(wgu, CODA_BF16, 2 * I, d);
    CODA_TRY(coda_llama_pack_qkv(cfg, &tq, &tk, &tv, &w.wqkv));
    CODA_TRY(coda_llama_pack_gate_up(cfg, &tg_, &tu, &w.wgu));
    w.wo = coda_tensor_2d(wb[3], CODA_BF16, d, nq);
    w.wd = coda_tensor_2d(wb[6], CODA_BF16, d, I);
    w.g1 = coda_tensor_1d(wb[7], CODA_BF16, d);
    w.g2 = coda_tensor_1d(wb[8], CODA_BF16, d);
    if (V > 0) {
        w.gf = coda_tensor_1d(wb[9], CODA_BF16, d);
        w.wlm = coda_tensor_2d(wb[10], CODA_BF16, V, d);
    }
    /* gradients, NaN-poisoned (0xffff is a NaN in bf16 and, doubled, in f32) */
    coda_dtype_t gd = o->grad_dtype == CODA_BF16 ? CODA_BF16 : CODA_F32;
    size_t es = coda_dtype_size(gd);
    const int64_t gshape[8][2] = {{d, 1}, {nq + 2 * nkv, d}, {d, nq}, {d, 1}, {2 * I, d}, {d, I}, {d, 1}, {V, d}};
    coda_tensor_t *gf_[8] = {&g.g1, &g.wqkv, &g.wo, &g.g2, &g.wgu, &g.wd, &g.gf, &g.wlm};
    for (int i = 0; i < (V > 0 ? 8 : 6); i++) {
        size_t bytes = (size_t)(gshape[i][0] * gshape[i][1]) * es;
        void *p = grab(A, bytes);
        if (!p) return coda__fail(CODA_ERR_NO_MEMORY, "coda__llama_check: out of memory");
        memset(p, 0xff, bytes);
        /* the norms' gains are vectors; a weight of one column (ffn = 1) stays a matrix */
        *gf_[i] = i == 0 || i == 3 || i == 6 ? coda_tensor_1d(p, gd, gshape[i][0])
                                             : coda_tensor_2d(p, gd, gshape[i][0], gshape[i][1]);
    }
    memset(y, 0xff, (size_t)(m * d) * 2);
    memset(dx, 0xff, (size_t)(m * d) * 2);
    for (int64_t i = 0; i < m; i++) loss[i] = NAN;

    coda_tensor_t tx = coda_tensor_2d(xb, CODA_BF16, m, d), ty = coda_tensor_2d(y, CODA_BF16, m, d);
    coda_tensor_t tdy = coda_tensor_2d(dyb, CODA_BF16, m, d), tdx = coda_tensor_2d(dx, CODA_BF16, m, d);
    coda_tensor_t ttg = coda_tensor_1d(tg, CODA_I32, m), tl = coda_tensor_1d(loss, CODA_F32, m);
    /* On CUDA: device copies of everything, outputs copied back after. */
    coda_llama_weights_t wr = w, gr = g;
    coda_tensor_t rx = tx, ry = ty, rdy = tdy, rdx = tdx, rtg = ttg, rl = tl;
    int nw = V > 0 ? 8 : 6;
    coda_tensor_t *wf[8] = {&w.g1, &w.wqkv, &w.wo, &w.g2, &w.wgu, &w.wd, &w.gf, &w.wlm};
    coda_tensor_t *wrf[8] = {&wr.g1, &wr.wqkv, &wr.wo, &wr.g2, &wr.wgu, &wr.wd, &wr.gf, &wr.wlm};
    coda_tensor_t *grf[8] = {&gr.g1, &gr.wqkv, &gr.wo, &gr.g2, &gr.wgu, &gr.wd, &gr.gf, &gr.wlm};
    if (o->device == CODA_DEVICE_CUDA) {
        CODA_TRY(coda__llama_mem_open(ctx, CODA_DEVICE_CUDA, 0, "llama_check", &A->dev));
        for (int i = 0; i < nw; i++) {
            CODA_TRY(mirror(A, wf[i], wrf[i]));
            CODA_TRY(mirror(A, gf_[i], grf[i]));
        }
        CODA_TRY(mirror(A, &tx, &rx));
        CODA_TRY(mirror(A, &ty, &ry));
        CODA_TRY(mirror(A, &tdy, &rdy));
        CODA_TRY(mirror(A, &tdx, &rdx));
        CODA_TRY(mirror(A, &ttg, &rtg));
        CODA_TRY(mirror(A, &tl, &rl));
        /* the uploads went to the default stream; the layer may run on another */
        CODA_TRY(coda__llama_mem_sync(A->dev, NULL));
    }
    /* times include the GPU finishing its work (synchronised) */
    double t0 = now_s();
    CODA_TRY(coda_llama_forward(A->layer, &wr, &rx, use_loss ? &rtg : NULL, &ry, use_loss ? &rl : NULL, o->stream));
    if (o->device == CODA_DEVICE_CUDA) CODA_TRY(coda__llama_mem_sync(A->dev, o->stream));
    double t1 = now_s();
    CODA_TRY(coda_llama_backward(A->layer, &wr, o->use_dy ? &rdy : NULL, o->loss_scale, &rdx, &gr, o->stream));
    if (o->device == CODA_DEVICE_CUDA) CODA_TRY(coda__llama_mem_sync(A->dev, o->stream));
    double t2 = now_s();
    if (o->device == CODA_DEVICE_CUDA) {
        CODA_TRY(coda__llama_mem_copy(A->dev, &ry, &ty, o->stream));
        CODA_TRY(coda__llama_mem_copy(A->dev, &rdx, &tdx, o->stream));
        CODA_TRY(coda__llama_mem_copy(A->dev, &rl, &tl, o->stream));
        for (int i = 0; i < nw; i++) CODA_TRY(coda__llama_mem_copy(A->dev, grf[i], gf_[i], o->stream));
    }
    out->t_forward = t1 - t0;
    out->t_backward = t2 - t1;

    CODA_TRY(coda__ref_forward(A->ref64, CODA__REF_F64));
    CODA_TRY(coda__ref_backward(A->ref64));
    CODA_TRY(coda__ref_forward(A->ref16, CODA__REF_BF16));
    CODA_TRY(coda__ref_backward(A->ref16));
    out->t_reference = now_s() - t2;

    /* Compare. coda's gradients back to PyTorch's layout first. */
    /* y (m, d), then every gradient in turn: the largest is (m, max(d, V))
     * or a weight ((nq + 2 nkv + 2 I) x d, or the head's V x d: a review
     * found that one past the end) */
    double *buf = grab(A, (size_t)(m * (d > V ? d : V) + (nq + 2 * nkv + 2 * I + V) * d + 16) * 8);
    void *unp = grab(A, (size_t)((nq + 2 * nkv + 2 * I) * d) * es);
    if (!buf || !unp) return coda__fail(CODA_ERR_NO_MEMORY, "coda__llama_check: out of memory");
    coda__ref_layer_t *F = A->ref64, *B = A->ref16;
    coda__ref_from_bf16(buf, y, m * d);
    add_row(out, "y", rel_err(buf, F->y, m * d), rel_err(B->y, F->y, m * d));
    if (use_loss) {
        for (int64_t i = 0; i < m; i++) buf[i] = loss[i];
        add_row(out, "loss", rel_err(buf, F->loss, m), rel_err(B->loss, F->loss, m));
    }
    coda__ref_from_bf16(buf, dx, m * d);
    add_row(out, "dx", rel_err(buf, F->dx, m * d), rel_err(B->dx, F->dx, m * d));

    /* unpack wqkv, wgu gradients into (wq | wk | wv | w_gate | w_up) */
    char *u = unp;
    coda_tensor_t uq = coda_tensor_2d(u, gd, nq, d);
    coda_tensor_t uk = coda_tensor_2d(u + (size_t)(nq * d) * es, gd, nkv, d);
    coda_tensor_t uv = coda_tensor_2d(u + (size_t)((nq + nkv) * d) * es, gd, nkv, d);
    coda_tensor_t ug = coda_tensor_2d(u + (size_t)((nq + 2 * nkv) * d) * es, gd, I, d);
    coda_tensor_t uu = coda_tensor_2d(u + (size_t)((nq + 2 * nkv + I) * d) * es, gd, I, d);
    CODA_TRY(coda_llama_unpack_qkv(cfg, &g.wqkv, &uq, &uk, &uv));
    CODA_TRY(coda_llama_unpack_gate_up(cfg, &g.wgu, &ug, &uu));
    const coda_tensor_t *mine[CODA__REF_N_WEIGHTS] = {&uq, &uk, &uv, &g.wo, &ug, &uu, &g.wd,
                                                      &g.g1, &g.g2, &g.gf, &g.wlm};
    coda__ref_param_t pf[CODA__REF_N_WEIGHTS], pb[CODA__REF_N_WEIGHTS];
    coda__ref_params(F, &F->grad, pf);
    coda__ref_params(B, &B->grad, pb);
    for (int i = 0; i < CODA__REF_N_WEIGHTS; i++) {
        if (!pf[i].data) continue;
        int64_t n = pf[i].rows * pf[i].cols;
        CODA_TRY(coda__ref_from_tensor(buf, mine[i], n));
        add_row(out, grad_names[i], rel_err(buf, pf[i].data, n), rel_err(pb[i].data, pf[i].data, n));
    }
    return CODA_OK;
}

coda_status_t coda__llama_check(coda_context_t *ctx, const coda_llama_config_t *cfg, int64_t batch,
                                int64_t seq, const coda__llama_check_opts_t *opts,
                                coda__llama_check_t *out) {
    if (!ctx || !cfg || !opts || !out)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda__llama_check: NULL argument");
    memset(out, 0, sizeof *out);
    out->all_pass = 1;
    arena_t A;
    memset(&A, 0, sizeof A);
    coda_status_t s = run(&A, ctx, cfg, batch, seq, opts, out);
    arena_free(&A);
    if (s != CODA_OK) out->all_pass = 0;
    return s;
}
