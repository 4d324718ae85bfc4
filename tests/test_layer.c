/* test_layer.c - the LLaMA layer (coda_llama_*) end to end against the plain
 * reference layer (tests/oracle/reference.c): y, loss, dx and every weight
 * gradient, each within 2 x (error of the bf16 unfused computation) + 1e-6 of
 * float64 (docs/testing.md). Also the pack helpers and bad arguments. */
#include "harness.h"
#include "oracle/llama_check.h"

static coda_llama_config_t small_cfg(void) {
    coda_llama_config_t c = {.d = 64, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .ffn = 160,
                             .vocab = 200, .eps = 1e-5f, .rope_theta = 10000.0f};
    return c;
}

/* ---- pack / unpack ---- */

static void test_pack(void) {
    coda_llama_config_t c = small_cfg();
    c.n_heads = 3; c.n_kv_heads = 1; c.head_dim = 8; c.d = 24; c.ffn = 40;
    int64_t d = c.d, nq = 24, nkv = 8, n = nq + 2 * nkv, I = c.ffn;
    h_rng r = rng_new(7);
    for (int dt = 0; dt < 2; dt++) {
        coda_dtype_t t = dt ? CODA_F32 : CODA_BF16;
        size_t es = dt ? 4 : 2;
        float *wq = h_alloc(nq * d * 4), *wk = h_alloc(nkv * d * 4), *wv = h_alloc(nkv * d * 4);
        float *wqkv = h_alloc(n * d * 4), *back = h_alloc(n * d * 4);
        rng_fill_f32(&r, wq, nq * d, 1); rng_fill_f32(&r, wk, nkv * d, 1); rng_fill_f32(&r, wv, nkv * d, 1);
        if (!dt) { /* reinterpret the buffers as bf16 with distinct values */
            uint16_t *q16 = (uint16_t *)wq, *k16 = (uint16_t *)wk, *v16 = (uint16_t *)wv;
            for (int64_t i = 0; i < nq * d; i++) q16[i] = h_f2bf((float)i + 1);
            for (int64_t i = 0; i < nkv * d; i++) k16[i] = h_f2bf((float)-i - 1), v16[i] = h_f2bf((float)i + 0.5f);
        }
        coda_tensor_t tq = coda_tensor_2d(wq, t, nq, d), tk = coda_tensor_2d(wk, t, nkv, d),
                      tv = coda_tensor_2d(wv, t, nkv, d), tw = coda_tensor_2d(wqkv, t, n, d);
        CHECK_OK(coda_llama_pack_qkv(&c, &tq, &tk, &tv, &tw));
        /* q head h, rotate-half pair i: rows (h*8+i, h*8+4+i) -> (h*8+2i, h*8+2i+1) */
        for (int64_t h = 0; h < 3; h++)
            for (int64_t i = 0; i < 4; i++) {
                CHECK(!memcmp((char *)wqkv + (h * 8 + 2 * i) * d * es, (char *)wq + (h * 8 + i) * d * es, d * es),
                      "q head %lld pair %lld even", (long long)h, (long long)i);
                CHECK(!memcmp((char *)wqkv + (h * 8 + 2 * i + 1) * d * es, (char *)wq + (h * 8 + 4 + i) * d * es, d * es),
                      "q head %lld pair %lld odd", (long long)h, (long long)i);
            }
        CHECK(!memcmp((char *)wqkv + (nq + 2) * d * es, (char *)wk + 1 * d * es, d * es), "k pair 1 even");
        CHECK(!memcmp((char *)wqkv + (nq + nkv) * d * es, wv, nkv * d * es), "v rows unchanged");
        /* unpack inverts pack */
        float *q2 = h_alloc(nq * d * 4), *k2 = h_alloc(nkv * d * 4), *v2 = h_alloc(nkv * d * 4);
        coda_tensor_t uq = coda_tensor_2d(q2, t, nq, d), uk = coda_tensor_2d(k2, t, nkv, d),
                      uv = coda_tensor_2d(v2, t, nkv, d);
        CHECK_OK(coda_llama_unpack_qkv(&c, &tw, &uq, &uk, &uv));
        CHECK(!memcmp(q2, wq, nq * d * es) && !memcmp(k2, wk, nkv * d * es) && !memcmp(v2, wv, nkv * d * es),
              "unpack(pack(w)) != w");
        /* gate/up */
        float *wg = h_alloc(I * d * 4), *wu = h_alloc(I * d * 4), *wgu = h_alloc(2 * I * d * 4);
        rng_fill_f32(&r, wg, I * d, 1); rng_fill_f32(&r, wu, I * d, 1);
        coda_tensor_t tg = coda_tensor_2d(wg, t, I, d), tu = coda_tensor_2d(wu, t, I, d),
                      tgu = coda_tensor_2d(wgu, t, 2 * I, d);
        CHECK_OK(coda_llama_pack_gate_up(&c, &tg, &tu, &tgu));
        CHECK(!memcmp((char *)wgu + 6 * d * es, (char *)wg + 3 * d * es, d * es), "wgu row 6 = gate 3");
        CHECK(!memcmp((char *)wgu + 7 * d * es, (char *)wu + 3 * d * es, d * es), "wgu row 7 = up 3");
        float *g2 = h_alloc(I * d * 4), *u2 = h_alloc(I * d * 4);
        coda_tensor_t ug = coda_tensor_2d(g2, t, I, d), uu = coda_tensor_2d(u2, t, I, d);
        CHECK_OK(coda_llama_unpack_gate_up(&c, &tgu, &ug, &uu));
        CHECK(!memcmp(g2, wg, I * d * es) && !memcmp(u2, wu, I * d * es), "unpack_gate_up(pack) != w");

        /* bad arguments: error, output untouched */
        memcpy(back, wqkv, n * d * es);
        coda_tensor_t bad = tq;
        bad.shape[0] = nq - 1;
        CHECK_STATUS(coda_llama_pack_qkv(&c, &bad, &tk, &tv, &tw), CODA_ERR_SHAPE);
        CHECK_STATUS(coda_llama_pack_qkv(NULL, &tq, &tk, &tv, &tw), CODA_ERR_INVALID_ARG);
        CHECK_STATUS(coda_llama_pack_qkv(&c, &tq, NULL, &tv, &tw), CODA_ERR_INVALID_ARG);
        bad = coda_tensor_2d(wk, dt ? CODA_BF16 : CODA_F32, nkv, d);
        CHECK_STATUS(coda_llama_pack_qkv(&c, &tq, &bad, &tv, &tw), CODA_ERR_DTYPE);
        bad = tv;
        bad.device = CODA_DEVICE_CUDA;
        CHECK_STATUS(coda_llama_pack_qkv(&c, &tq, &tk, &bad, &tw), CODA_ERR_DEVICE);
        coda_tensor_t alias = coda_tensor_2d(wq, t, n, d); /* output over an input */
        float *big = h_alloc(n * d * 4);
        memcpy(big, wq, nq * d * es);
        coda_tensor_t tqa = coda_tensor_2d(big, t, nq, d), outa = coda_tensor_2d(big, t, n, d);
        CHECK_STATUS(coda_llama_pack_qkv(&c, &tqa, &tk, &tv, &outa), CODA_ERR_OVERLAP);
        (void)alias;
        coda_llama_config_t odd = c;
        odd.head_dim = 7;
        CHECK_STATUS(coda_llama_pack_qkv(&odd, &tq, &tk, &tv, &tw), CODA_ERR_SHAPE);
        CHECK_STATUS(coda_llama_unpack_gate_up(&c, &tgu, &ug, &ug), CODA_ERR_OVERLAP);
        CHECK(!memcmp(back, wqkv, n * d * es), "failed pack modified its output");
        free(wq); free(wk); free(wv); free(wqkv); free(back); free(q2); free(k2); free(v2);
        free(wg); free(wu); free(wgu); free(g2); free(u2); free(big);
    }
}

/* ---- bad arguments of create / forward / backward ---- */

static void test_bad_args(coda_context_t *ctx) {
    coda_llama_config_t c = small_cfg();
    coda_llama_t *L = NULL;
    CHECK_STATUS(coda_llama_create(NULL, &c, 2, 7, CODA_DEVICE_CPU, &L), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_create(ctx, NULL, 2, 7, CODA_DEVICE_CPU, &L), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_create(ctx, &c, 0, 7, CODA_DEVICE_CPU, &L), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_llama_create(ctx, &c, 2, -1, CODA_DEVICE_CPU, &L), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_llama_create(ctx, &c, 2, 7, (coda_device_t)5, &L), CODA_ERR_INVALID_ARG);
    coda_llama_config_t b = c; b.head_dim = 15;
    CHECK_STATUS(coda_llama_create(ctx, &b, 2, 7, CODA_DEVICE_CPU, &L), CODA_ERR_SHAPE);
    b = c; b.n_kv_heads = 3;
    CHECK_STATUS(coda_llama_create(ctx, &b, 2, 7, CODA_DEVICE_CPU, &L), CODA_ERR_SHAPE);
    b = c; b.eps = 0;
    CHECK_STATUS(coda_llama_create(ctx, &b, 2, 7, CODA_DEVICE_CPU, &L), CODA_ERR_INVALID_ARG);
    b = c; b.vocab = -1;
    CHECK_STATUS(coda_llama_create(ctx, &b, 2, 7, CODA_DEVICE_CPU, &L), CODA_ERR_SHAPE);
    /* the loss picks targets as f32 column numbers: above 2^24 a review
     * found 16777217 scored as column 16777216 */
    b = c; b.vocab = CODA_LSE_MAX_COLS + 8;
    CHECK_STATUS(coda_llama_create(ctx, &b, 2, 7, CODA_DEVICE_CPU, &L), CODA_ERR_SHAPE);
    CHECK(strstr(coda_last_error(), "2^24") != NULL, "vocab refusal: %s", coda_last_error());
    /* what the layer's attention would refuse on every forward (a review
     * found create accepting them): more than 65536 heads, more than 2^30
     * tokens */
    b = c; b.d = 8; b.n_heads = 131072; b.n_kv_heads = 1; b.head_dim = 2; b.ffn = 8; b.vocab = 0;
    CHECK_STATUS(coda_llama_create(ctx, &b, 1, 2, CODA_DEVICE_CPU, &L), CODA_ERR_SHAPE);
    CHECK(strstr(coda_last_error(), "attention") != NULL, "create's refusal names the attention: %s", coda_last_error());
    CHECK_STATUS(coda_llama_create(ctx, &c, (int64_t)1 << 16, ((int64_t)1 << 14) + 1, CODA_DEVICE_CPU, &L),
                 CODA_ERR_SHAPE);
    CHECK(L == NULL, "failed create set *out");
    coda_llama_free(NULL);

    REQUIRE_OK(coda_llama_create(ctx, &c, 2, 7, CODA_DEVICE_CPU, &L));
    int64_t m = 14, d = c.d, n = 64 + 2 * 32, I = c.ffn, V = c.vocab;
    h_rng r = rng_new(3);
    uint16_t *wb = h_alloc((size_t)(n * d + d * 64 + 2 * I * d + d * I + V * d + 3 * d) * 2);
    rng_fill_bf16(&r, wb, n * d + d * 64 + 2 * I * d + d * I + V * d + 3 * d, 0.1f);
    coda_llama_weights_t w;
    uint16_t *p = wb;
    w.wqkv = coda_tensor_2d(p, CODA_BF16, n, d); p += n * d;
    w.wo = coda_tensor_2d(p, CODA_BF16, d, 64); p += d * 64;
    w.wgu = coda_tensor_2d(p, CODA_BF16, 2 * I, d); p += 2 * I * d;
    w.wd = coda_tensor_2d(p, CODA_BF16, d, I); p += d * I;
    w.wlm = coda_tensor_2d(p, CODA_BF16, V, d); p += V * d;
    w.g1 = coda_tensor_1d(p, CODA_BF16, d); p += d;
    w.g2 = coda_tensor_1d(p, CODA_BF16, d); p += d;
    w.gf = coda_tensor_1d(p, CODA_BF16, d);
    uint16_t *x = h_alloc(m * d * 2), *y = h_alloc(m * d * 2), *dx = h_alloc(m * d * 2);
    int32_t *tg = h_alloc(m * 4);
    float *loss = h_alloc(m * 4);
    rng_fill_bf16(&r, x, m * d, 1);
    for (int i = 0; i < m; i++) tg[i] = (i * 37) % (int)V;
    poison_bf16(y, m * d);
    poison_bf16(dx, m * d);
    poison_f32(loss, m);
    coda_tensor_t tx = coda_tensor_2d(x, CODA_BF16, m, d), ty = coda_tensor_2d(y, CODA_BF16, m, d),
                  tdx = coda_tensor_2d(dx, CODA_BF16, m, d), tt = coda_tensor_1d(tg, CODA_I32, m),
                  tl = coda_tensor_1d(loss, CODA_F32, m);

    CHECK_STATUS(coda_llama_backward(L, &w, &tx, 1.0f, &tdx, NULL, NULL), CODA_ERR_INVALID_ARG); /* no forward */
    CHECK_STATUS(coda_llama_forward(NULL, &w, &tx, &tt, &ty, &tl, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_forward(L, NULL, &tx, &tt, &ty, &tl, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_forward(L, &w, NULL, &tt, &ty, &tl, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, NULL, &tl, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, &ty, NULL, NULL), CODA_ERR_INVALID_ARG);
    coda_tensor_t bad = tx; bad.shape[0] = m - 1;
    CHECK_STATUS(coda_llama_forward(L, &w, &bad, &tt, &ty, &tl, NULL), CODA_ERR_SHAPE);
    bad = coda_tensor_2d(x, CODA_F32, m, d / 2);
    CHECK_STATUS(coda_llama_forward(L, &w, &bad, &tt, &ty, &tl, NULL), CODA_ERR_SHAPE);
    bad = coda_tensor_2d(x, CODA_F32, m / 2, d);
    CHECK_STATUS(coda_llama_forward(L, &w, &bad, &tt, &ty, &tl, NULL), CODA_ERR_SHAPE);
    bad = coda_tensor_2d(y, CODA_F32, m, d); /* y big enough as f32? no: only checked, never touched */
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, &bad, &tl, NULL), CODA_ERR_DTYPE);
    coda_llama_weights_t bw = w; bw.wo.shape[1] = 63;
    CHECK_STATUS(coda_llama_forward(L, &bw, &tx, &tt, &ty, &tl, NULL), CODA_ERR_SHAPE);
    bw = w; bw.g2 = coda_tensor_1d(w.g2.data, CODA_F32, d / 2);
    CHECK_STATUS(coda_llama_forward(L, &bw, &tx, &tt, &ty, &tl, NULL), CODA_ERR_SHAPE);
    bw = w; bw.g2 = coda_tensor_1d(w.wd.data, CODA_F32, d);
    CHECK_STATUS(coda_llama_forward(L, &bw, &tx, &tt, &ty, &tl, NULL), CODA_ERR_DTYPE);
    bw = w; bw.wlm.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_llama_forward(L, &bw, &tx, &tt, &ty, &tl, NULL), CODA_ERR_DEVICE);
    tg[5] = (int32_t)V;
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, &ty, &tl, NULL), CODA_ERR_INVALID_ARG);
    tg[5] = -1;
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, &ty, &tl, NULL), CODA_ERR_INVALID_ARG);
    tg[5] = -100;
    coda_tensor_t over = coda_tensor_2d(x, CODA_BF16, m, d);
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, &over, &tl, NULL), CODA_ERR_OVERLAP);
    over = coda_tensor_2d(w.wd.data, CODA_BF16, m, d); /* y over a weight */
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, &over, &tl, NULL), CODA_ERR_OVERLAP);
    coda_tensor_t lover = coda_tensor_1d(w.wo.data, CODA_F32, m);
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, &tt, &ty, &lover, NULL), CODA_ERR_OVERLAP);
    int untouched = 1;
    for (int64_t i = 0; i < m * d; i++) untouched &= y[i] == 0x7fc1;
    for (int64_t i = 0; i < m; i++) untouched &= isnan(loss[i]);
    CHECK(untouched, "a failed forward wrote y or loss");

    /* a good forward, then bad backward calls */
    CHECK_OK(coda_llama_forward(L, &w, &tx, &tt, &ty, &tl, NULL));
    CHECK(isfinite(h_bf2f(y[0])) && loss[5] == 0.0f && loss[4] > 0, "forward outputs y0 %g loss5 %g loss4 %g",
          h_bf2f(y[0]), loss[5], loss[4]);
    CHECK_STATUS(coda_llama_backward(L, &w, &tx, 1.0f, NULL, NULL, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_backward(L, &w, &tx, NAN, &tdx, NULL, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_llama_backward(L, &w, &tx, 1.0f, &tx, NULL, NULL), CODA_ERR_OVERLAP);
    coda_tensor_t dover = coda_tensor_2d(w.wgu.data, CODA_BF16, m, d); /* dx over a weight */
    CHECK_STATUS(coda_llama_backward(L, &w, &tx, 1.0f, &dover, NULL, NULL), CODA_ERR_OVERLAP);
    coda_llama_weights_t g = w; /* gradients over the weights: overlap */
    CHECK_STATUS(coda_llama_backward(L, &w, NULL, 1.0f, &tdx, &g, NULL), CODA_ERR_OVERLAP);
    g.wd = coda_tensor_2d(w.wd.data, CODA_I32, d, I / 2);
    CHECK_STATUS(coda_llama_backward(L, &w, NULL, 1.0f, &tdx, &g, NULL), CODA_ERR_SHAPE);
    g.wd = coda_tensor_2d(w.wd.data, CODA_I32, d, I);
    CHECK_STATUS(coda_llama_backward(L, &w, NULL, 1.0f, &tdx, &g, NULL), CODA_ERR_DTYPE);
    untouched = 1;
    for (int64_t i = 0; i < m * d; i++) untouched &= dx[i] == 0x7fc1;
    CHECK(untouched, "a failed backward wrote dx");
    CHECK_OK(coda_llama_backward(L, &w, NULL, 1.0f, &tdx, NULL, NULL)); /* loss only, no grads */
    int finite = 1;
    for (int64_t i = 0; i < m * d; i++) finite &= isfinite(h_bf2f(dx[i]));
    CHECK(finite, "dx not finite");
    /* forward without targets: no loss, then backward needs dy */
    CHECK_STATUS(coda_llama_forward(L, &w, &tx, NULL, &ty, &tl, NULL), CODA_ERR_INVALID_ARG);
    CHECK_OK(coda_llama_forward(L, &w, &tx, NULL, &ty, NULL, NULL));
    CHECK_STATUS(coda_llama_backward(L, &w, NULL, 1.0f, &tdx, NULL, NULL), CODA_ERR_INVALID_ARG);
    coda_llama_free(L);

    coda_llama_t *G = NULL;
    coda_status_t s = coda_llama_create(ctx, &c, 2, 7, CODA_DEVICE_CUDA, &G);
    CHECK(s == CODA_ERR_UNSUPPORTED || s == CODA_ERR_DEVICE || s == CODA_OK, "CUDA layer: %s", coda_status_name(s));
    coda_llama_free(G);
    free(wb); free(x); free(y); free(dx); free(tg); free(loss);
}

/* ---- strides, thread counts, repeated runs: bitwise the same results ---- */

typedef struct {
    uint16_t *y, *dx;
    float *loss, *g[8];
} run_out_t;

/* A 2-D tensor over a fresh buffer with `pad` extra elements per row. */
static coda_tensor_t padded(coda_dtype_t dt, int64_t rows, int64_t cols, int64_t pad) {
    size_t es = dt == CODA_BF16 ? 2 : 4;
    coda_tensor_t t = coda_tensor_2d(h_alloc((size_t)(rows * (cols + pad)) * es), dt, rows, cols);
    t.stride[0] = (cols + pad) * (int64_t)es;
    memset(t.data, 0xff, (size_t)(rows * (cols + pad)) * es);
    return t;
}

static void run_strided(coda_context_t *ctx, const coda_llama_config_t *c, const coda_llama_weights_t *w,
                        const uint16_t *x, const uint16_t *dy, const int32_t *tg, int64_t pad, run_out_t *out) {
    int64_t m = 14, d = c->d, V = c->vocab;
    coda_llama_t *L;
    REQUIRE_OK(coda_llama_create(ctx, c, 2, 7, CODA_DEVICE_CPU, &L));
    coda_tensor_t tx = padded(CODA_BF16, m, d, pad), tdy = padded(CODA_BF16, m, d, pad);
    coda_tensor_t ty = padded(CODA_BF16, m, d, pad), tdx = padded(CODA_BF16, m, d, pad);
    for (int64_t i = 0; i < m; i++) {
        memcpy((char *)tx.data + i * tx.stride[0], x + i * d, d * 2);
        memcpy((char *)tdy.data + i * tdy.stride[0], dy + i * d, d * 2);
    }
    coda_tensor_t tt = coda_tensor_1d((void *)tg, CODA_I32, m);
    float *loss = h_alloc(m * 4);
    coda_tensor_t tl = coda_tensor_1d(loss, CODA_F32, m);
    coda_llama_weights_t g;
    const coda_tensor_t *wf[8] = {&w->g1, &w->wqkv, &w->wo, &w->g2, &w->wgu, &w->wd, &w->gf, &w->wlm};
    coda_tensor_t *gf[8] = {&g.g1, &g.wqkv, &g.wo, &g.g2, &g.wgu, &g.wd, &g.gf, &g.wlm};
    for (int i = 0; i < 8; i++) {
        if (wf[i]->ndim == 1) {
            *gf[i] = coda_tensor_1d(h_alloc(wf[i]->shape[0] * 4), CODA_F32, wf[i]->shape[0]);
            poison_f32(gf[i]->data, wf[i]->shape[0]);
        } else {
            *gf[i] = padded(CODA_F32, wf[i]->shape[0], wf[i]->shape[1], pad);
        }
    }
    CHECK_OK(coda_llama_forward(L, w, &tx, &tt, &ty, &tl, NULL));
    CHECK_OK(coda_llama_backward(L, w, &tdy, 0.5f, &tdx, &g, NULL));
    out->y = h_alloc(m * d * 2);
    out->dx = h_alloc(m * d * 2);
    out->loss = loss;
    for (int64_t i = 0; i < m; i++) {
        memcpy(out->y + i * d, (char *)ty.data + i * ty.stride[0], d * 2);
        memcpy(out->dx + i * d, (char *)tdx.data + i * tdx.stride[0], d * 2);
    }
    for (int i = 0; i < 8; i++) {
        int64_t rows = gf[i]->shape[0], cols = gf[i]->ndim == 1 ? 1 : gf[i]->shape[1];
        out->g[i] = h_alloc(rows * cols * 4);
        for (int64_t r = 0; r < rows; r++)
            memcpy(out->g[i] + r * cols, (char *)gf[i]->data + r * gf[i]->stride[0], cols * 4);
        free(gf[i]->data);
    }
    (void)V;
    free(tx.data); free(tdy.data); free(ty.data); free(tdx.data);
    coda_llama_free(L);
}

static void test_strides_threads(coda_context_t *ctx2) {
    coda_llama_config_t c = small_cfg();
    int64_t m = 14, d = c.d, n = 64 + 2 * 32, I = c.ffn, V = c.vocab;
    h_rng r = rng_new(11);
    coda_llama_weights_t w;
    const int64_t shp[8][2] = {{d, 0}, {n, d}, {d, 64}, {d, 0}, {2 * I, d}, {d, I}, {d, 0}, {V, d}};
    coda_tensor_t *wf[8] = {&w.g1, &w.wqkv, &w.wo, &w.g2, &w.wgu, &w.wd, &w.gf, &w.wlm};
    for (int i = 0; i < 8; i++) {
        int64_t cnt = shp[i][0] * (shp[i][1] ? shp[i][1] : 1);
        uint16_t *p = h_alloc(cnt * 2);
        rng_fill_bf16(&r, p, cnt, shp[i][1] ? 0.15f : 1.0f);
        *wf[i] = shp[i][1] ? coda_tensor_2d(p, CODA_BF16, shp[i][0], shp[i][1]) : coda_tensor_1d(p, CODA_BF16, d);
    }
    uint16_t *x = h_alloc(m * d * 2), *dy = h_alloc(m * d * 2);
    rng_fill_bf16(&r, x, m * d, 1);
    rng_fill_bf16(&r, dy, m * d, 0.1f);
    int32_t tg[14];
    for (int i = 0; i < 14; i++) tg[i] = i == 3 ? -100 : (i * 71 + 5) % (int)V;

    coda_context_t *ctx1;
    coda_context_options_t o1 = {.cpu_threads = 1};
    REQUIRE_OK(coda_context_create(&o1, &ctx1));
    run_out_t a, b, e;
    run_strided(ctx2, &c, &w, x, dy, tg, 0, &a);
    run_strided(ctx2, &c, &w, x, dy, tg, 0, &e);
    run_strided(ctx1, &c, &w, x, dy, tg, 8, &b);
    int64_t gn[8] = {d, n * d, d * 64, d, 2 * I * d, d * I, d, V * d};
    int same_rep = !memcmp(a.y, e.y, m * d * 2) && !memcmp(a.dx, e.dx, m * d * 2) && !memcmp(a.loss, e.loss, m * 4);
    int same_str = !memcmp(a.y, b.y, m * d * 2) && !memcmp(a.dx, b.dx, m * d * 2) && !memcmp(a.loss, b.loss, m * 4);
    for (int i = 0; i < 8; i++) {
        same_rep &= !memcmp(a.g[i], e.g[i], gn[i] * 4);
        same_str &= !memcmp(a.g[i], b.g[i], gn[i] * 4);
        int finite = 1;
        for (int64_t j = 0; j < gn[i]; j++) finite &= isfinite(a.g[i][j]);
        CHECK(finite, "gradient %d has NaN/inf (unwritten?)", i);
    }
    CHECK(same_rep, "two identical runs differ (not reproducible)");
    CHECK(same_str, "padded strides + 1 thread differ from contiguous + 2 threads");
    CHECK(a.loss[3] == 0.0f && a.loss[4] > 0.0f, "loss[3] (ignored) %g, loss[4] %g", a.loss[3], a.loss[4]);
    printf("strides and threads: padded rows + 1 thread == contiguous + 2 threads, bitwise: %s; "
           "repeat run bitwise equal: %s\n", same_str ? "yes" : "NO", same_rep ? "yes" : "NO");
    run_out_t *all[3] = {&a, &b, &e};
    for (int k = 0; k < 3; k++) {
        free(all[k]->y); free(all[k]->dx); free(all[k]->loss);
        for (int i = 0; i < 8; i++) free(all[k]->g[i]);
    }
    for (int i = 0; i < 8; i++) free(wf[i]->data);
    free(x); free(dy);
    coda_context_free(ctx1);
}

/* ---- end to end against the reference ---- */

static void run_case(coda_context_t *ctx, const char *title, coda_llama_config_t c, int64_t batch, int64_t seq,
                     coda__llama_check_opts_t o) {
    coda__llama_check_t res;
    coda_status_t s = coda__llama_check(ctx, &c, batch, seq, &o, &res);
    CHECK(s == CODA_OK, "%s: %s: %s", title, coda_status_name(s), coda_last_error());
    if (s != CODA_OK) return;
    printf("%s: d %lld, heads %lld/%lld x %lld, ffn %lld, vocab %lld, M = %lld x %lld, "
           "loss %d dy %d scale %g, grads %s (fwd %.3f s, bwd %.3f s, reference %.3f s)\n",
           title, (long long)c.d, (long long)c.n_heads, (long long)c.n_kv_heads, (long long)c.head_dim,
           (long long)c.ffn, (long long)c.vocab, (long long)batch, (long long)seq, o.use_loss, o.use_dy,
           (double)o.loss_scale, coda_dtype_name(o.grad_dtype), res.t_forward, res.t_backward, res.t_reference);
    for (int i = 0; i < res.n_rows; i++) {
        const coda__llama_check_row_t *r = &res.rows[i];
        printf("  %-8s err %.3e  bf16 unfused %.3e  bound %.3e  %s\n", r->name, r->err, r->base, r->bound,
               r->pass ? "ok" : "FAIL");
        CHECK(r->pass, "%s: %s error %.3e > bound %.3e", title, r->name, r->err, r->bound);
        /* the baseline is 0 only where the truth is 0 (no loss: dgf, dwlm) */
        CHECK((r->base > 0 || r->err == 0) && r->base < 0.05, "%s: %s baseline error %.3e implausible", title,
              r->name, r->base);
    }
    int want = 3 + 7 + (o.use_loss && c.vocab > 0 ? 0 : -1) + (c.vocab > 0 ? 4 : 2);
    CHECK(res.n_rows == want, "%s: %d rows compared, expected %d", title, res.n_rows, want);
}

int main(void) {
    coda_context_t *ctx;
    coda_context_options_t opts = {.cpu_threads = 2};
    REQUIRE_OK(coda_context_create(&opts, &ctx));
    test_pack();
    test_bad_args(ctx);
    test_strides_threads(ctx);

    coda__llama_check_opts_t o = {.seed = 1, .use_loss = 1, .use_dy = 1, .loss_scale = 1.0f,
                                  .ignore_every = 5, .grad_dtype = CODA_F32};
    coda_llama_config_t c = small_cfg();
    run_case(ctx, "small, loss + dy", c, 2, 7, o);

    o.seed = 2; o.use_dy = 0; o.loss_scale = 0.37f; o.grad_dtype = CODA_BF16; o.ignore_every = 3;
    run_case(ctx, "small, loss only, bf16 grads", c, 2, 7, o);

    coda_llama_config_t nv = c;
    nv.vocab = 0; nv.n_kv_heads = 1; nv.ffn = 88; nv.rope_theta = 500000.0f;
    o.seed = 3; o.use_loss = 0; o.use_dy = 1; o.grad_dtype = CODA_F32;
    run_case(ctx, "no LM head (MQA), dy only", nv, 3, 5, o);

    o.seed = 5; o.use_loss = 0; o.use_dy = 1; o.grad_dtype = CODA_BF16;
    run_case(ctx, "LM head present, no targets, dy only", c, 1, 9, o);

    coda_llama_config_t big = c;
    /* d, N_qkv = 160, 2 ffn, vocab: none a multiple of the 128-wide default tile */
    big.d = 200; big.n_kv_heads = 5; big.ffn = 136; big.vocab = 328; big.head_dim = 8; big.n_heads = 10;
    o.seed = 4; o.use_loss = 1; o.use_dy = 1; o.loss_scale = 1.0f / 999; o.ignore_every = 11;
    o.grad_dtype = CODA_F32;
    run_case(ctx, "M = 999", big, 3, 333, o);

    /* the head's gradient (V x d) larger than every other weight's and than
     * (m, max(d, V)): the check's buffer was too small for it (a review: a
     * heap overflow in the oracle); ffn = 1: wd's gradient (d, 1) is a
     * matrix, not a gain vector */
    coda_llama_config_t wide = c;
    wide.d = 300; wide.n_heads = 5; wide.n_kv_heads = 5; wide.head_dim = 2; wide.ffn = 2; wide.vocab = 1000;
    o.seed = 6; o.loss_scale = 1.0f; o.ignore_every = 7;
    run_case(ctx, "V x d the largest gradient", wide, 3, 43, o);
    coda_llama_config_t f1 = c;
    f1.ffn = 1;
    o.seed = 7;
    run_case(ctx, "ffn = 1", f1, 2, 5, o);

    coda_context_free(ctx);
    TEST_MAIN_END();
}
