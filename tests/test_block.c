/* test_block.c - the block split at attention (coda.h section 9) on the CPU:
 *   - two forwards in flight (different token counts, each with its own
 *     activations), their backwards in reverse order, each bit for bit equal
 *     to the whole layer (coda_llama_*, checked against the reference layer
 *     by test_layer) run on that micro-batch alone;
 *   - dqkv in bf16 as an attention library gives it, close to the f32 path;
 *   - the next block's norm from this block's down projection (g_next):
 *     qkv and r1 as the block's own prologue makes them;
 *   - bad input (workspace too small or misaligned, shapes, overlap, NULL)
 *     refused with nothing written. */
#include "harness.h"
#include "layer/attention.h"
#include "layer/llama.h"

static const coda_llama_config_t CFG = {.d = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .ffn = 96,
                                        .vocab = 0, .eps = 1e-5f, .rope_theta = 10000.0f};
#define NQ 64
#define NQKV 128
#define NKV 32 /* n_kv_heads head_dim */

/* A random bf16 (or zero f32) matrix of its own allocation. */
static coda_tensor_t mat(h_rng *r, coda_dtype_t dt, int64_t rows, int64_t cols, float scale) {
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    void *p = h_alloc(n * 4 + 256);
    if (dt == CODA_BF16)
        for (size_t i = 0; i < n; i++) ((uint16_t *)p)[i] = h_f2bf(scale * (2 * rng_uniform(r) - 1));
    else
        memset(p, 0, n * 4);
    return cols ? coda_tensor_2d(p, dt, rows, cols) : coda_tensor_1d(p, dt, rows);
}

/* A zeroed bf16 matrix. */
static coda_tensor_t zbf(int64_t rows, int64_t cols) {
    return coda_tensor_2d(h_alloc((size_t)(rows * cols) * 2 + 256), CODA_BF16, rows, cols);
}

static coda_llama_weights_t weights(h_rng *r, coda_dtype_t dt) {
    coda_llama_weights_t w;
    memset(&w, 0, sizeof w);
    float s = dt == CODA_BF16 ? 1.0f : 0.0f;
    w.g1 = mat(r, dt, CFG.d, 0, 0);
    w.g2 = mat(r, dt, CFG.d, 0, 0);
    if (dt == CODA_BF16) /* norm weights around 1 */
        for (int64_t i = 0; i < CFG.d; i++) {
            ((uint16_t *)w.g1.data)[i] = h_f2bf(1 + 0.2f * (2 * rng_uniform(r) - 1));
            ((uint16_t *)w.g2.data)[i] = h_f2bf(1 + 0.2f * (2 * rng_uniform(r) - 1));
        }
    w.wqkv = mat(r, dt, NQKV, CFG.d, 0.2f * s);
    w.wo = mat(r, dt, CFG.d, NQ, 0.2f * s);
    w.wgu = mat(r, dt, 2 * CFG.ffn, CFG.d, 0.2f * s);
    w.wd = mat(r, dt, CFG.d, CFG.ffn, 0.2f * s);
    return w;
}
static void free_weights(coda_llama_weights_t *w) {
    free(w->g1.data); free(w->g2.data); free(w->wqkv.data); free(w->wo.data); free(w->wgu.data); free(w->wd.data);
}

static int same(const coda_tensor_t *a, const coda_tensor_t *b) {
    return coda_tensor_span_bytes(a) == coda_tensor_span_bytes(b) &&
           memcmp(a->data, b->data, (size_t)coda_tensor_span_bytes(a)) == 0;
}
static int same_grads(const coda_llama_weights_t *a, const coda_llama_weights_t *b) {
    return same(&a->g1, &b->g1) && same(&a->wqkv, &b->wqkv) && same(&a->wo, &b->wo) && same(&a->g2, &b->g2) &&
           same(&a->wgu, &b->wgu) && same(&a->wd, &b->wd);
}

/* One micro-batch: its input, saved activations and results. */
typedef struct {
    int64_t batch, seq, m;
    coda_tensor_t x, pos, o, alse, y, dy, do_, dh, dqkv, dx;
    coda_block_acts_t acts;
    coda_llama_weights_t grads;
} mb_t;

static mb_t mb_new(h_rng *r, int64_t batch, int64_t seq) {
    mb_t b;
    memset(&b, 0, sizeof b);
    b.batch = batch, b.seq = seq, b.m = batch * seq;
    int64_t m = b.m, d = CFG.d;
    b.x = mat(r, CODA_BF16, m, d, 1.0f);
    b.pos = mat(r, CODA_F32, m, 0, 0);
    for (int64_t i = 0; i < m; i++) ((float *)b.pos.data)[i] = (float)(i % seq);
    b.o = zbf(m, NQ);
    b.alse = mat(r, CODA_F32, m, CFG.n_heads, 0);
    b.y = zbf(m, d);
    b.dy = mat(r, CODA_BF16, m, d, 1.0f);
    b.do_ = zbf(m, NQ);
    b.dh = zbf(m, d);
    b.dqkv = mat(r, CODA_F32, m, NQKV, 0);
    b.dx = zbf(m, d);
    b.acts.r1 = mat(r, CODA_F32, m, 0, 0);
    b.acts.qkv = zbf(m, NQKV);
    b.acts.h = zbf(m, d);
    b.acts.r2 = mat(r, CODA_F32, m, 0, 0);
    b.acts.z = zbf(m, 2 * CFG.ffn);
    b.grads = weights(r, CODA_F32);
    return b;
}
static void mb_free(mb_t *b) {
    coda_tensor_t *t[] = {&b->x, &b->pos, &b->o, &b->alse, &b->y, &b->dy, &b->do_, &b->dh, &b->dqkv, &b->dx,
                          &b->acts.r1, &b->acts.qkv, &b->acts.h, &b->acts.r2, &b->acts.z};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) free(t[i]->data);
    free_weights(&b->grads);
}

static void *ws_alloc(size_t bytes) { return aligned_alloc(256, (bytes + 255) / 256 * 256); }

static void forward(coda_block_t *B, const coda_llama_weights_t *w, mb_t *b, void *ws, size_t wsb) {
    CHECK_OK(coda_block_forward_pre(B, w, &b->x, NULL, &b->pos, &b->acts, ws, wsb, NULL));
    CHECK_OK(coda__attention_forward(&CFG, b->batch, b->seq, &b->acts.qkv, &b->o, &b->alse, 2));
    CHECK_OK(coda_block_forward_post(B, w, &b->x, &b->o, &b->acts, &b->y, NULL, NULL, NULL, ws, wsb, NULL));
}
static void backward(coda_block_t *B, const coda_llama_weights_t *w, mb_t *b, void *ws, size_t wsb) {
    CHECK_OK(coda_block_backward_post(B, w, &b->o, &b->acts, &b->dy, &b->do_, &b->dh, &b->grads, ws, wsb, NULL));
    CHECK_OK(coda__attention_backward(&CFG, b->batch, b->seq, &b->acts.qkv, &b->o, &b->alse, &b->do_, &b->dqkv, 2));
    CHECK_OK(coda_block_backward_pre(B, w, &b->x, &b->pos, &b->acts, &b->dqkv, &b->dh, &b->dx, &b->grads, ws, wsb,
                                     NULL));
}

static double rel_diff_bf16(const coda_tensor_t *a, const coda_tensor_t *b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < a->shape[0]; i++)
        for (int64_t j = 0; j < a->shape[1]; j++) {
            double u = h_bf2f(*(uint16_t *)((char *)a->data + i * a->stride[0] + 2 * j));
            double v = h_bf2f(*(uint16_t *)((char *)b->data + i * b->stride[0] + 2 * j));
            num += (u - v) * (u - v), den += v * v;
        }
    return sqrt(num / (den > 0 ? den : 1));
}

int main(void) {
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    h_rng r = rng_new(11);
    coda_llama_weights_t w = weights(&r, CODA_BF16);
    coda_block_t *B;
    REQUIRE_OK(coda_block_create(ctx, &CFG, CODA_DEVICE_CPU, &B));

    /* ---- two forwards in flight, backwards in reverse order ---- */
    mb_t a = mb_new(&r, 2, 5), b = mb_new(&r, 1, 7);
    size_t wsb = 0;
    CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_ANY, a.m, &wsb));
    CHECK(wsb > 0, "a workspace of %zu bytes", wsb);
    void *ws = ws_alloc(wsb);
    forward(B, &w, &a, ws, wsb);
    forward(B, &w, &b, ws, wsb);
    backward(B, &w, &b, ws, wsb);
    backward(B, &w, &a, ws, wsb);

    mb_t *mbs[2] = {&a, &b};
    for (int k = 0; k < 2; k++) { /* the whole layer on each micro-batch alone */
        mb_t *u = mbs[k];
        coda_llama_t *L;
        REQUIRE_OK(coda_llama_create(ctx, &CFG, u->batch, u->seq, CODA_DEVICE_CPU, &L));
        mb_t ref = mb_new(&r, u->batch, u->seq);
        CHECK_OK(coda_llama_forward(L, &w, &u->x, NULL, &ref.y, NULL, NULL));
        CHECK_OK(coda_llama_backward(L, &w, &u->dy, 1.0f, &ref.dx, &ref.grads, NULL));
        CHECK(same(&u->y, &ref.y), "micro-batch %d: y differs from the whole layer's", k);
        CHECK(same(&u->dx, &ref.dx), "micro-batch %d: dx differs from the whole layer's", k);
        CHECK(same_grads(&u->grads, &ref.grads), "micro-batch %d: a weight gradient differs", k);
        mb_free(&ref);
        coda_llama_free(L);
    }

    /* ---- a forward that does not save z (inference), a backward that spends z ---- */
    {
        mb_t s = mb_new(&r, 2, 5);
        coda_tensor_t z_own = s.acts.z;
        memset(&s.acts.z, 0, sizeof s.acts.z);
        CHECK_OK(coda_block_forward_post(B, &w, &a.x, &a.o, &s.acts, &s.y, NULL, NULL, NULL, ws, wsb, NULL));
        CHECK(same(&s.y, &a.y), "y of a forward without z differs from the training forward's");
        CHECK(same(&s.acts.h, &a.acts.h), "h of a forward without z differs");
        /* its backward is refused, nothing written */
        size_t do_bytes = (size_t)(s.m * NQ * 2);
        memset(s.do_.data, 0x5a, do_bytes);
        CHECK_STATUS(coda_block_backward_post(B, &w, &a.o, &s.acts, &a.dy, &s.do_, &s.dh, NULL, ws, wsb, NULL),
                     CODA_ERR_INVALID_ARG);
        int untouched = 1;
        for (size_t i = 0; i < do_bytes; i++) untouched &= ((unsigned char *)s.do_.data)[i] == 0x5a;
        CHECK(untouched, "a refused backward_post (z not saved) wrote into do_");
        s.acts.z = z_own;

        /* spend_z: the same bits as reading z, in less workspace */
        size_t ws_read, ws_spend, zbytes = (size_t)(a.m * 2 * CFG.ffn * 2);
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_BACKWARD_POST, a.m, &ws_read));
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_BACKWARD_POST_SPEND_Z, a.m, &ws_spend));
        CHECK(ws_spend + zbytes <= ws_read, "backward_post's workspace: %zu spending z, %zu reading it", ws_spend,
              ws_read);
        coda_block_acts_t sp = a.acts;
        sp.z = z_own;
        memcpy(sp.z.data, a.acts.z.data, zbytes);
        sp.spend_z = 1;
        CHECK_STATUS(coda_block_backward_post(B, &w, &a.o, &a.acts, &a.dy, &s.do_, &s.dh, &s.grads, ws, ws_spend,
                                              NULL),
                     CODA_ERR_SHAPE); /* reading z needs the larger workspace */
        CHECK_OK(coda_block_backward_post(B, &w, &a.o, &sp, &a.dy, &s.do_, &s.dh, &s.grads, ws, ws_spend, NULL));
        CHECK(same(&s.do_, &a.do_) && same(&s.dh, &a.dh), "do_ or dh with z spent differs from z read");
        CHECK(same(&s.grads.wo, &a.grads.wo) && same(&s.grads.g2, &a.grads.g2) &&
                  same(&s.grads.wgu, &a.grads.wgu) && same(&s.grads.wd, &a.grads.wd),
              "a weight gradient with z spent differs from z read");
        mb_free(&s);
    }

    /* ---- c kept from the forward (acts->c): the same bits, less workspace ---- */
    {
        mb_t s = mb_new(&r, 2, 5);
        memcpy(s.x.data, a.x.data, (size_t)coda_tensor_span_bytes(&a.x));
        memcpy(s.o.data, a.o.data, (size_t)coda_tensor_span_bytes(&a.o));
        memcpy(s.dy.data, a.dy.data, (size_t)coda_tensor_span_bytes(&a.dy));
        coda_tensor_t c = zbf(s.m, CFG.ffn);
        memset(c.data, 0x5a, (size_t)coda_tensor_span_bytes(&c));
        s.acts.c = c;
        size_t ws_fwd, ws_fkept, c_bytes = (size_t)(s.m * CFG.ffn * 2);
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_FORWARD_POST, s.m, &ws_fwd));
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_FORWARD_POST_KEPT_C, s.m, &ws_fkept));
        CHECK(ws_fkept + c_bytes <= ws_fwd, "forward_post's workspace: %zu, %zu keeping c (%zu bytes)", ws_fwd,
              ws_fkept, c_bytes);
        CHECK_STATUS(coda_block_forward_post(B, &w, &s.x, &s.o, &s.acts, &s.y, NULL, NULL, NULL, ws, ws_fkept - 1,
                                             NULL),
                     CODA_ERR_SHAPE);
        CHECK_OK(coda_block_forward_post(B, &w, &s.x, &s.o, &s.acts, &s.y, NULL, NULL, NULL, ws, ws_fkept, NULL));
        CHECK(same(&s.y, &a.y) && same(&s.acts.h, &a.acts.h) && same(&s.acts.z, &a.acts.z),
              "y, h or z of a forward keeping c differs");
        /* c is silu(gate) * up of the saved z, rounded to bf16 */
        int c_right = 1;
        for (int64_t i = 0; i < s.m && c_right; i++)
            for (int64_t j = 0; j < CFG.ffn; j++) {
                const uint16_t *zr = (const uint16_t *)((char *)s.acts.z.data + i * s.acts.z.stride[0]);
                float g = h_bf2f(zr[2 * j]), u = h_bf2f(zr[2 * j + 1]);
                float want = g / (1.0f + expf(-g)) * u;
                float got = h_bf2f(((const uint16_t *)((char *)c.data + i * c.stride[0]))[j]);
                if (fabsf(got - want) > 1e-2f * fabsf(want) + 1e-6f) {
                    CHECK(0, "kept c[%lld][%lld] = %g, silu(g) u = %g", (long long)i, (long long)j, got, want);
                    c_right = 0;
                    break;
                }
            }
        size_t ws_read, ws_kept, ws_both;
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_BACKWARD_POST, s.m, &ws_read));
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_BACKWARD_POST_KEPT_C, s.m, &ws_kept));
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_BACKWARD_POST_SPEND_Z_KEPT_C, s.m, &ws_both));
        /* c (M, I) shared its slot with b (M, d): I - d fewer columns */
        size_t saved = (size_t)(s.m * (CFG.ffn - CFG.d) * 2);
        CHECK(CFG.ffn > CFG.d && ws_kept + saved <= ws_read && ws_both < ws_kept,
              "backward_post's workspace: %zu, %zu keeping c, %zu also spending z", ws_read, ws_kept, ws_both);
        CHECK_OK(coda_block_backward_post(B, &w, &s.o, &s.acts, &s.dy, &s.do_, &s.dh, &s.grads, ws, ws_kept, NULL));
        CHECK(same(&s.do_, &a.do_) && same(&s.dh, &a.dh), "do_ or dh with c kept differs from c recomputed");
        CHECK(same(&s.grads.wo, &a.grads.wo) && same(&s.grads.g2, &a.grads.g2) && same(&s.grads.wgu, &a.grads.wgu) &&
                  same(&s.grads.wd, &a.grads.wd),
              "a weight gradient with c kept differs from c recomputed");
        /* with z spent too, in the smaller workspace */
        coda_block_acts_t sz = s.acts;
        sz.spend_z = 1;
        memset(s.dh.data, 0, (size_t)coda_tensor_span_bytes(&s.dh));
        memset(s.grads.wd.data, 0, (size_t)coda_tensor_span_bytes(&s.grads.wd));
        memset(s.grads.wgu.data, 0, (size_t)coda_tensor_span_bytes(&s.grads.wgu));
        CHECK_OK(coda_block_backward_post(B, &w, &s.o, &sz, &s.dy, &s.do_, &s.dh, &s.grads, ws, ws_both, NULL));
        CHECK(same(&s.dh, &a.dh) && same(&s.grads.wd, &a.grads.wd) && same(&s.grads.wgu, &a.grads.wgu),
              "dh, dwd or dwgu with c kept and z spent differs");
        memcpy(s.acts.z.data, a.acts.z.data, (size_t)coda_tensor_span_bytes(&a.acts.z));
        /* bad kept c: refused, nothing written */
        size_t y_bytes = (size_t)coda_tensor_span_bytes(&s.y), h_bytes = (size_t)coda_tensor_span_bytes(&s.acts.h);
        unsigned char *y_was = malloc(y_bytes), *h_was = malloc(h_bytes), *c_was = malloc(c_bytes);
        if (!y_was || !h_was || !c_was) exit(1);
        memcpy(y_was, s.y.data, y_bytes), memcpy(h_was, s.acts.h.data, h_bytes), memcpy(c_was, c.data, c_bytes);
        coda_block_acts_t bad = s.acts;
        bad.c.shape[1] = CFG.ffn - 2;
        memset(s.dh.data, 0x5a, (size_t)coda_tensor_span_bytes(&s.dh));
        CHECK_STATUS(coda_block_backward_post(B, &w, &s.o, &bad, &s.dy, &s.do_, &s.dh, NULL, ws, ws_read, NULL),
                     CODA_ERR_SHAPE);
        CHECK_STATUS(coda_block_forward_post(B, &w, &s.x, &s.o, &bad, &s.y, NULL, NULL, NULL, ws, wsb, NULL),
                     CODA_ERR_SHAPE);
        bad = s.acts;
        bad.c.data = (char *)s.acts.z.data + 64; /* over z */
        CHECK_STATUS(coda_block_forward_post(B, &w, &s.x, &s.o, &bad, &s.y, NULL, NULL, NULL, ws, wsb, NULL),
                     CODA_ERR_OVERLAP);
        bad.c.data = (char *)s.dh.data; /* an output of backward_post's, read as c */
        CHECK_STATUS(coda_block_backward_post(B, &w, &s.o, &bad, &s.dy, &s.do_, &s.dh, NULL, ws, ws_read, NULL),
                     CODA_ERR_OVERLAP);
        int untouched = 1;
        for (size_t i = 0; i < (size_t)coda_tensor_span_bytes(&s.dh); i++)
            untouched &= ((unsigned char *)s.dh.data)[i] == 0x5a;
        CHECK(untouched, "a refused backward_post (bad kept c) wrote into dh");
        CHECK(same(&s.acts.z, &a.acts.z) && !memcmp(y_was, s.y.data, y_bytes) &&
                  !memcmp(h_was, s.acts.h.data, h_bytes) && !memcmp(c_was, c.data, c_bytes),
              "a refused forward_post (bad kept c) wrote into z, y, h or c");
        free(y_was), free(h_was), free(c_was);
        free(c.data);
        mb_free(&s);
    }

    /* ---- do_ NULL: the O projection's backward left to the caller ---- */
    {
        mb_t s = mb_new(&r, 2, 5);
        size_t wo_bytes = (size_t)(CFG.d * NQ * 4);
        memset(s.grads.wo.data, 0x5a, wo_bytes);
        coda_context_t *cctx;
        CHECK_OK(coda_context_create(NULL, &cctx));
        /* o and grads->wo are not looked at: bad ones change nothing */
        coda_llama_weights_t g = s.grads;
        g.wo.shape[0] = 3;
        CHECK_OK(coda_block_backward_post(B, &w, NULL, &a.acts, &a.dy, NULL, &s.dh, &g, ws, wsb, NULL));
        CHECK(same(&s.dh, &a.dh), "dh without the O projection's backward differs");
        CHECK(same(&s.grads.g2, &a.grads.g2) && same(&s.grads.wgu, &a.grads.wgu) && same(&s.grads.wd, &a.grads.wd),
              "g2, wgu or wd without the O projection's backward differ");
        int untouched = 1;
        for (size_t i = 0; i < wo_bytes; i++) untouched &= ((unsigned char *)s.grads.wo.data)[i] == 0x5a;
        CHECK(untouched, "backward_post with do_ NULL wrote grads->wo");
        /* the caller's two GEMMs: the call's bits */
        CHECK_OK(coda_gemm(cctx, CODA_LAYOUT_NN, &s.dh, &w.wo, &s.do_, 1.0f, 0.0f, NULL));
        CHECK_OK(coda_gemm(cctx, CODA_LAYOUT_TN, &s.dh, &a.o, &s.grads.wo, 1.0f, 0.0f, NULL));
        CHECK(same(&s.do_, &a.do_), "do_ = dh wo by coda_gemm differs from backward_post's");
        CHECK(same(&s.grads.wo, &a.grads.wo), "dwo = dh^T o by coda_gemm differs from backward_post's");
        coda_context_free(cctx);
        mb_free(&s);
    }

    /* ---- dqkv in bf16 ---- */
    {
        coda_tensor_t d16 = zbf(a.m, NQKV), dx16 = zbf(a.m, CFG.d);
        for (int64_t i = 0; i < a.m * NQKV; i++) ((uint16_t *)d16.data)[i] = h_f2bf(((float *)a.dqkv.data)[i]);
        coda_llama_weights_t g16 = weights(&r, CODA_F32);
        CHECK_OK(coda_block_backward_pre(B, &w, &a.x, &a.pos, &a.acts, &d16, &a.dh, &dx16, &g16, ws, wsb, NULL));
        double e = rel_diff_bf16(&dx16, &a.dx);
        CHECK(e < 1e-2, "dx from a bf16 dqkv: %.3g from the f32 one's", e);
        free(d16.data), free(dx16.data), free_weights(&g16);
    }

    /* ---- dqkv as three tensors (coda_block_backward_pre_split): the same bits ---- */
    {
        const int64_t w3[3] = {NQ, NKV, NKV};
        coda_tensor_t parts[3], dxs = zbf(a.m, CFG.d);
        for (int q = 0, off = 0; q < 3; off += (int)w3[q], q++) { /* each its own buffer, padded rows */
            parts[q] = coda_tensor_2d(malloc((size_t)(a.m * (w3[q] + 2)) * 4), CODA_F32, a.m, w3[q]);
            parts[q].stride[0] = (w3[q] + 2) * 4;
            for (int64_t i = 0; i < a.m; i++)
                memcpy((char *)parts[q].data + i * parts[q].stride[0], (float *)a.dqkv.data + i * NQKV + off,
                       (size_t)w3[q] * 4);
        }
        coda_llama_weights_t gs = weights(&r, CODA_F32);
        CHECK_OK(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &parts[0], &parts[1], &parts[2], &a.dh,
                                               &dxs, &gs, ws, wsb, NULL));
        CHECK(same(&dxs, &a.dx), "dx from dq, dk, dv differs from dx from dqkv");
        CHECK(same(&gs.g1, &a.grads.g1) && same(&gs.wqkv, &a.grads.wqkv), "g1 or wqkv grads from dq, dk, dv differ");
        /* refused, nothing written */
        memset(dxs.data, 0x5a, (size_t)(a.m * CFG.d) * 2);
        coda_tensor_t t = parts[1];
        t.shape[1] = NKV - 2;
        CHECK_STATUS(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &parts[0], &t, &parts[2], &a.dh,
                                                   &dxs, &gs, ws, wsb, NULL), CODA_ERR_SHAPE);
        CHECK(strstr(coda_last_error(), "dk") != NULL, "narrow dk: %s", coda_last_error());
        t = coda_tensor_2d(parts[2].data, CODA_BF16, a.m, NKV);
        t.stride[0] = parts[2].stride[0];
        CHECK_STATUS(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &parts[0], &parts[1], &t, &a.dh,
                                                   &dxs, &gs, ws, wsb, NULL), CODA_ERR_DTYPE);
        CHECK(strstr(coda_last_error(), "one dtype") != NULL, "mixed dtypes: %s", coda_last_error());
        CHECK_STATUS(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &parts[0], NULL, &parts[2], &a.dh,
                                                   &dxs, &gs, ws, wsb, NULL), CODA_ERR_INVALID_ARG);
        t = coda_tensor_2d(parts[0].data, CODA_BF16, a.m, CFG.d);
        t.stride[0] = parts[0].stride[0];
        CHECK_STATUS(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &parts[0], &parts[1], &parts[2],
                                                   &a.dh, &t, &gs, ws, wsb, NULL), CODA_ERR_OVERLAP);
        CHECK(strstr(coda_last_error(), "dx overlaps dq") != NULL, "dx over dq: %s", coda_last_error());
        t = parts[2];
        t.shape[0] = a.m - 1;
        CHECK_STATUS(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &parts[0], &parts[1], &t, &a.dh,
                                                   &dxs, &gs, ws, wsb, NULL), CODA_ERR_SHAPE);
        CHECK(strstr(coda_last_error(), "dv") != NULL, "short dv: %s", coda_last_error());
        coda_llama_weights_t gbad = gs;
        gbad.g1 = coda_tensor_1d(parts[1].data, CODA_F32, CFG.d); /* the gradient written over dk */
        CHECK_STATUS(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &parts[0], &parts[1], &parts[2],
                                                   &a.dh, &dxs, &gbad, ws, wsb, NULL), CODA_ERR_OVERLAP);
        CHECK(strstr(coda_last_error(), "grads->g1 overlaps dk") != NULL, "g1 over dk: %s", coda_last_error());
        int untouched = 1;
        for (int64_t i = 0; i < a.m * CFG.d * 2; i++) untouched &= ((unsigned char *)dxs.data)[i] == 0x5a;
        CHECK(untouched, "a refused backward_pre_split wrote dx");
        /* bf16 parts: the bits of a bf16 dqkv */
        coda_tensor_t d16 = zbf(a.m, NQKV), dx16 = zbf(a.m, CFG.d), dxp = zbf(a.m, CFG.d), p16[3];
        for (int64_t i = 0; i < a.m * NQKV; i++) ((uint16_t *)d16.data)[i] = h_f2bf(((float *)a.dqkv.data)[i]);
        for (int q = 0, off = 0; q < 3; off += (int)w3[q], q++) {
            p16[q] = zbf(a.m, w3[q]);
            for (int64_t i = 0; i < a.m; i++)
                memcpy((uint16_t *)p16[q].data + i * w3[q], (uint16_t *)d16.data + i * NQKV + off, (size_t)w3[q] * 2);
        }
        coda_llama_weights_t g16 = weights(&r, CODA_BF16), gp = weights(&r, CODA_BF16);
        CHECK_OK(coda_block_backward_pre(B, &w, &a.x, &a.pos, &a.acts, &d16, &a.dh, &dx16, &g16, ws, wsb, NULL));
        CHECK_OK(coda_block_backward_pre_split(B, &w, &a.x, &a.pos, &a.acts, &p16[0], &p16[1], &p16[2], &a.dh, &dxp,
                                               &gp, ws, wsb, NULL));
        CHECK(same(&dx16, &dxp) && same(&g16.g1, &gp.g1) && same(&g16.wqkv, &gp.wqkv),
              "bf16 dq, dk, dv give other bits than a bf16 dqkv");
        for (int q = 0; q < 3; q++) free(parts[q].data), free(p16[q].data);
        free(dxs.data), free(d16.data), free(dx16.data), free(dxp.data);
        free_weights(&gs), free_weights(&g16), free_weights(&gp);
    }

    /* ---- the next block's norm from this block's down projection ---- */
    {
        coda_llama_weights_t w2 = weights(&r, CODA_BF16);
        mb_t n1 = mb_new(&r, 2, 5), n2 = mb_new(&r, 2, 5);
        coda_tensor_t yg = zbf(a.m, CFG.d), rn = mat(&r, CODA_F32, a.m, 0, 0);
        CHECK_OK(coda_block_forward_post(B, &w, &a.x, &a.o, &n1.acts, &n1.y, &w2.g1, &yg, &rn, ws, wsb, NULL));
        CHECK(same(&n1.y, &a.y), "y with g_next differs from y without");
        coda_tensor_t r1_own = n2.acts.r1;
        n2.acts.r1 = rn; /* this block's r1 is the previous block's r_next */
        CHECK_OK(coda_block_forward_pre(B, &w2, &n1.y, &yg, &a.pos, &n2.acts, ws, wsb, NULL));
        CHECK_OK(coda_block_forward_pre(B, &w2, &n1.y, NULL, &a.pos, &n1.acts, ws, wsb, NULL));
        double er = 0;
        for (int64_t i = 0; i < a.m; i++) {
            double u = ((float *)rn.data)[i], v = ((float *)n1.acts.r1.data)[i];
            er = fmax(er, fabs(u - v) / fabs(v));
        }
        CHECK(er < 1e-5, "r_next vs the prologue's r1: %.3g", er);
        double eq = rel_diff_bf16(&n2.acts.qkv, &n1.acts.qkv);
        CHECK(eq < 4e-3, "qkv from the fused norm: %.3g from the prologue's", eq);
        n2.acts.r1 = r1_own; /* its own again, for mb_free */
        free(yg.data), free(rn.data);
        mb_free(&n1), mb_free(&n2), free_weights(&w2);
    }

    /* ---- bad input: refused, nothing written ---- */
    {
        mb_t c = mb_new(&r, 2, 5);
        memset(c.acts.qkv.data, 0x7b, (size_t)(c.m * NQKV * 2));
        memset(c.y.data, 0x7b, (size_t)(c.m * CFG.d * 2));
        coda_tensor_t qkv0 = mat(&r, CODA_F32, c.m, NQKV, 0), y0 = mat(&r, CODA_F32, c.m, CFG.d, 0);
        memcpy(qkv0.data, c.acts.qkv.data, (size_t)(c.m * NQKV * 2));
        memcpy(y0.data, c.y.data, (size_t)(c.m * CFG.d * 2));
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, &c.acts, ws, 1024, NULL), CODA_ERR_SHAPE);
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, &c.acts, (char *)ws + 16, wsb - 16, NULL),
                     CODA_ERR_STRIDE);
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, &c.acts, NULL, wsb, NULL), CODA_ERR_INVALID_ARG);
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, NULL, ws, wsb, NULL), CODA_ERR_INVALID_ARG);
        CHECK_STATUS(coda_block_forward_pre(NULL, &w, &c.x, NULL, &c.pos, &c.acts, ws, wsb, NULL), CODA_ERR_INVALID_ARG);
        coda_block_acts_t bad = c.acts;
        bad.qkv.shape[1] = NQKV - 2;
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, &bad, ws, wsb, NULL), CODA_ERR_SHAPE);
        bad = c.acts;
        bad.qkv = c.x; /* qkv over the input */
        bad.qkv.shape[1] = NQKV;
        bad.qkv.stride[0] = 2 * NQKV;
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, &bad, ws, wsb, NULL), CODA_ERR_OVERLAP);
        coda_tensor_t pos_i = c.pos;
        pos_i.dtype = CODA_I32;
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &pos_i, &c.acts, ws, wsb, NULL), CODA_ERR_DTYPE);
        CHECK_STATUS(coda_block_forward_post(B, &w, &c.x, &c.o, &c.acts, &c.x, NULL, NULL, NULL, ws, wsb, NULL),
                     CODA_ERR_OVERLAP);
        CHECK_STATUS(coda_block_forward_post(B, &w, &c.x, &c.o, &c.acts, &c.y, &w.g2, NULL, NULL, ws, wsb, NULL),
                     CODA_ERR_INVALID_ARG);
        coda_llama_weights_t gbad = c.grads;
        gbad.wd = w.wd; /* a gradient over a weight */
        gbad.wd.dtype = CODA_BF16;
        CHECK_STATUS(coda_block_backward_post(B, &w, &a.o, &a.acts, &a.dy, &c.do_, &c.dh, &gbad, ws, wsb, NULL),
                     CODA_ERR_OVERLAP);
        CHECK_STATUS(coda_block_backward_post(B, &w, &a.o, &a.acts, &a.dy, &c.do_, &c.do_, NULL, ws, wsb, NULL),
                     CODA_ERR_OVERLAP); /* dh over do_ (d = nq here) */
        /* spend_z writes dz over z: z is then an output, apart from every
         * input and weight (a review found o and w->g2 inside z accepted
         * and overwritten); read only, z may share memory with inputs */
        {
            coda_block_acts_t sz = a.acts;
            sz.spend_z = 1;
            coda_tensor_t o_in_z = sz.z; /* the first nq columns of z's rows */
            o_in_z.shape[1] = NQ;
            size_t zb = (size_t)(a.m * 2 * CFG.ffn * 2);
            void *z0 = malloc(zb);
            memcpy(z0, sz.z.data, zb);
            CHECK_STATUS(coda_block_backward_post(B, &w, &o_in_z, &sz, &a.dy, &c.do_, &c.dh, NULL, ws, wsb, NULL),
                         CODA_ERR_OVERLAP);
            CHECK(strstr(coda_last_error(), "acts->z") != NULL, "spend_z over o: %s", coda_last_error());
            coda_llama_weights_t wz = w;
            wz.g2 = coda_tensor_1d(sz.z.data, CODA_BF16, CFG.d); /* g2 inside z */
            CHECK_STATUS(coda_block_backward_post(B, &wz, &a.o, &sz, &a.dy, &c.do_, &c.dh, NULL, ws, wsb, NULL),
                         CODA_ERR_OVERLAP);
            CHECK(!memcmp(z0, sz.z.data, zb), "a refused spend_z call wrote z");
            free(z0);
        }
        /* a workspace over an input or a weight: refused, nothing written */
        {
            size_t need;
            CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_FORWARD_PRE, c.m, &need));
            void *big = aligned_alloc(256, (need + 255) / 256 * 256 + (size_t)(c.m * CFG.d * 2) + 256);
            memset(big, 0x3c, (size_t)(c.m * CFG.d * 2));
            coda_tensor_t xin = coda_tensor_2d(big, CODA_BF16, c.m, CFG.d); /* x at the workspace's start */
            void *copy = malloc((size_t)(c.m * CFG.d * 2));
            memcpy(copy, big, (size_t)(c.m * CFG.d * 2));
            CHECK_STATUS(coda_block_forward_pre(B, &w, &xin, NULL, &c.pos, &c.acts, big, need, NULL), CODA_ERR_OVERLAP);
            CHECK(!memcmp(copy, big, (size_t)(c.m * CFG.d * 2)), "a workspace over x: x changed");
            coda_llama_weights_t wbad = w;
            wbad.g1.data = big; /* g1 inside the workspace */
            CHECK_STATUS(coda_block_forward_pre(B, &wbad, &c.x, NULL, &c.pos, &c.acts, big, need, NULL),
                         CODA_ERR_OVERLAP);
            free(copy), free(big);
        }
        CHECK(!memcmp(qkv0.data, c.acts.qkv.data, (size_t)(c.m * NQKV * 2)) &&
                  !memcmp(y0.data, c.y.data, (size_t)(c.m * CFG.d * 2)),
              "a refused call wrote into qkv or y");
        size_t sz;
        CHECK_STATUS(coda_block_workspace_size(B, CODA_BLOCK_ANY, -1, &sz), CODA_ERR_SHAPE);
        CHECK_STATUS(coda_block_workspace_size(NULL, CODA_BLOCK_ANY, 8, &sz), CODA_ERR_INVALID_ARG);
        CHECK_STATUS(coda_block_workspace_size(B, (coda_block_call_t)(CODA_BLOCK_FORWARD_POST_KEPT_C + 1), 8,
                                               &sz),
                     CODA_ERR_INVALID_ARG);
        {   /* sizes past 2^56 bytes are refused, not wrapped (a review: at m = 2^31 and a 2^31-wide FFN, dz's
             * 2^64 bytes wrapped to 0 and backward_post's size read as spend_z's) */
            coda_llama_config_t wide = {.d = 8, .n_heads = 1, .n_kv_heads = 1, .head_dim = 2,
                                        .ffn = (int64_t)1 << 31, .vocab = 0, .eps = 1e-5f, .rope_theta = 1e4f};
            coda_block_t *BW = NULL;
            REQUIRE_OK(coda_block_create(ctx, &wide, CODA_DEVICE_CPU, &BW));
            size_t s20 = 0, s31 = 7;
            CHECK_OK(coda_block_workspace_size(BW, CODA_BLOCK_BACKWARD_POST, (int64_t)1 << 20, &s20));
            CHECK(s20 >= ((size_t)1 << 53), "m = 2^20, ffn 2^31: backward_post needs dz's 2^53 bytes, got %zu", s20);
            CHECK_STATUS(coda_block_workspace_size(BW, CODA_BLOCK_BACKWARD_POST, (int64_t)1 << 31, &s31),
                         CODA_ERR_SHAPE);
            CHECK(s31 == 7, "a refused size query wrote *bytes");
            coda_block_free(BW);
        }
        size_t most = 0, each;
        for (int k = 0; k <= CODA_BLOCK_FORWARD_POST_KEPT_C; k++) {
            CHECK_OK(coda_block_workspace_size(B, (coda_block_call_t)k, a.m, &each));
            most = each > most ? each : most;
            /* each call runs in exactly its own size */
        }
        CHECK(most == wsb, "the largest call's workspace %zu is not CODA_BLOCK_ANY's %zu", most, wsb);
        CHECK_OK(coda_block_workspace_size(B, CODA_BLOCK_FORWARD_PRE, c.m, &each));
        CHECK_OK(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, &c.acts, ws, each, NULL));
        CHECK_STATUS(coda_block_forward_pre(B, &w, &c.x, NULL, &c.pos, &c.acts, ws, each - 1, NULL), CODA_ERR_SHAPE);
        coda_block_t *B2 = NULL;
        coda_llama_config_t bc = CFG;
        bc.head_dim = 15;
        CHECK_STATUS(coda_block_create(ctx, &bc, CODA_DEVICE_CPU, &B2), CODA_ERR_SHAPE);
        CHECK(B2 == NULL, "a refused create left a block");
        /* a qkv projection past CODA_LLAMA_MAX_QKV is refused before its
         * RoPE table is made (2^30 heads once built a 12 GiB table and the
         * OS killed the process); 2^24 exactly is taken by the check */
        bc = CFG;
        bc.n_heads = bc.n_kv_heads = (int64_t)1 << 30, bc.head_dim = 2;
        CHECK_STATUS(coda_block_create(ctx, &bc, CODA_DEVICE_CPU, &B2), CODA_ERR_SHAPE);
        CHECK(B2 == NULL && strstr(coda_last_error(), "CODA_LLAMA_MAX_QKV"), "2^30 heads: %s", coda_last_error());
        bc.n_heads = bc.n_kv_heads = ((int64_t)1 << 23) / 3 + 1; /* 3 x 2796203 x 2 = 2^24 + 2 */
        CHECK_STATUS(coda_block_create(ctx, &bc, CODA_DEVICE_CPU, &B2), CODA_ERR_SHAPE);
        bc.n_heads = 2, bc.n_kv_heads = 1, bc.head_dim = (int64_t)1 << 22; /* (2 + 2) x 2^22 = 2^24: taken */
        CHECK_STATUS(coda__llama_check_config(&bc, "test"), CODA_OK);
        bc.head_dim += 2; /* 2^24 + 8 */
        CHECK_STATUS(coda__llama_check_config(&bc, "test"), CODA_ERR_SHAPE);
        CHECK_STATUS(coda_block_create(ctx, &CFG, (coda_device_t)7, &B2), CODA_ERR_INVALID_ARG);
        /* cfg->vocab is not the block's: any vocab passes the CUDA checks
         * (without a GPU the create then fails on the device, not the shape) */
        coda_llama_config_t cv = CFG;
        /* ... nor checked at all (a review found vocab past 2^24 or < 0 refused) */
        const int64_t vocabs[] = {-1, ((int64_t)1 << 24) + 1};
        for (int i = 0; i < 2; i++) {
            cv.vocab = vocabs[i];
            CHECK_OK(coda_block_create(ctx, &cv, CODA_DEVICE_CPU, &B2));
            coda_block_free(B2);
            B2 = NULL;
        }
        cv.vocab = 50257;
        coda_status_t sv = coda_block_create(ctx, &cv, CODA_DEVICE_CUDA, &B2);
        CHECK(sv == CODA_OK || sv == CODA_ERR_DEVICE || sv == CODA_ERR_UNSUPPORTED, /* no GPU; no CUDA backend */
              "a CUDA block with vocab 50257: %s: %s", coda_status_name(sv),
              coda_last_error());
        coda_block_free(B2);
        B2 = NULL;
        cv = CFG;
        cv.d = 60, cv.head_dim = 16, cv.n_heads = 4; /* d not a multiple of 8: a GEMM's contraction */
        CHECK_STATUS(coda_block_create(ctx, &cv, CODA_DEVICE_CUDA, &B2), CODA_ERR_SHAPE);
        free(qkv0.data), free(y0.data);
        mb_free(&c);
    }
    coda_block_free(NULL);
    mb_free(&a), mb_free(&b), free(ws), free_weights(&w);
    coda_block_free(B);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
