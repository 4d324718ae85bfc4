/* test_attention.c - CPU causal GQA attention (src/layer/attention.c).
 *
 * Forward against a float64 attention on the same bf16 inputs (o within 2x the
 * error of rounding the float64 result to bf16, lse to 1e-5); backward against
 * a float64 analytic backward that is itself checked by central finite
 * differences of the float64 forward, plus a direct finite-difference check
 * of coda's dqkv; thread-count invariance (bitwise); bad arguments. */
#include "harness.h"
#include "layer/attention.h"

typedef struct {
    coda_llama_config_t cfg;
    int64_t batch, seq, m, nq, nkv, w;
} shape_t;

static shape_t mk(int64_t batch, int64_t seq, int64_t nh, int64_t nkvh, int64_t hd) {
    shape_t s;
    memset(&s, 0, sizeof s);
    s.cfg.n_heads = nh;
    s.cfg.n_kv_heads = nkvh;
    s.cfg.head_dim = hd;
    s.cfg.d = nh * hd;
    s.batch = batch;
    s.seq = seq;
    s.m = batch * seq;
    s.nq = nh * hd;
    s.nkv = nkvh * hd;
    s.w = s.nq + 2 * s.nkv;
    return s;
}

/* float64 forward: o (M, nq), lse (M, nh); x (M, w). */
static void ref_forward(const shape_t *s, const double *x, double *o, double *lse) {
    int64_t hd = s->cfg.head_dim, nh = s->cfg.n_heads, g = nh / s->cfg.n_kv_heads;
    double scale = 1.0 / sqrt((double)hd);
    double *p = h_alloc(sizeof(double) * (size_t)s->seq);
    for (int64_t i = 0; i < s->m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t r0 = i - i % s->seq, kvh = h / g;
            double mx = -INFINITY, l = 0;
            for (int64_t j = r0; j <= i; j++) {
                double d = 0;
                for (int64_t c = 0; c < hd; c++)
                    d += x[i * s->w + h * hd + c] * x[j * s->w + s->nq + kvh * hd + c];
                p[j - r0] = d * scale;
                if (p[j - r0] > mx) mx = p[j - r0];
            }
            for (int64_t j = r0; j <= i; j++) l += (p[j - r0] = exp(p[j - r0] - mx));
            for (int64_t c = 0; c < hd; c++) {
                double acc = 0;
                for (int64_t j = r0; j <= i; j++)
                    acc += p[j - r0] / l * x[j * s->w + s->nq + s->nkv + kvh * hd + c];
                o[i * s->nq + h * hd + c] = acc;
            }
            lse[i * nh + h] = mx + log(l);
        }
    free(p);
}

static double ref_objective(const shape_t *s, const double *x, const double *dout) {
    double *o = h_alloc(sizeof(double) * (size_t)(s->m * s->nq));
    double *lse = h_alloc(sizeof(double) * (size_t)(s->m * s->cfg.n_heads));
    ref_forward(s, x, o, lse);
    double f = 0;
    for (int64_t i = 0; i < s->m * s->nq; i++) f += o[i] * dout[i];
    free(o);
    free(lse);
    return f;
}

/* float64 analytic backward of sum(dout * o): dx (M, w). */
static void ref_backward(const shape_t *s, const double *x, const double *dout, double *dx) {
    int64_t hd = s->cfg.head_dim, nh = s->cfg.n_heads, g = nh / s->cfg.n_kv_heads;
    double scale = 1.0 / sqrt((double)hd);
    double *o = h_alloc(sizeof(double) * (size_t)(s->m * s->nq));
    double *lse = h_alloc(sizeof(double) * (size_t)(s->m * nh));
    ref_forward(s, x, o, lse);
    memset(dx, 0, sizeof(double) * (size_t)(s->m * s->w));
    for (int64_t i = 0; i < s->m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t r0 = i - i % s->seq, kvh = h / g;
            const double *q = x + i * s->w + h * hd, *dd = dout + i * s->nq + h * hd;
            double delta = 0;
            for (int64_t c = 0; c < hd; c++) delta += dd[c] * o[i * s->nq + h * hd + c];
            for (int64_t j = r0; j <= i; j++) {
                const double *k = x + j * s->w + s->nq + kvh * hd, *v = k + s->nkv;
                double sc = 0, dp = 0;
                for (int64_t c = 0; c < hd; c++) { sc += q[c] * k[c]; dp += dd[c] * v[c]; }
                double p = exp(sc * scale - lse[i * nh + h]), ds = p * (dp - delta);
                for (int64_t c = 0; c < hd; c++) {
                    dx[i * s->w + h * hd + c] += scale * ds * k[c];
                    dx[j * s->w + s->nq + kvh * hd + c] += scale * ds * q[c];
                    dx[j * s->w + s->nq + s->nkv + kvh * hd + c] += p * dd[c];
                }
            }
        }
    free(o);
    free(lse);
}

static void run_case(shape_t s, uint64_t seed) {
    h_rng r = rng_new(seed);
    int64_t nh = s.cfg.n_heads;
    uint16_t *qkv = h_alloc(2 * (size_t)(s.m * s.w));
    uint16_t *o = h_alloc(2 * (size_t)(s.m * s.nq)), *o3 = h_alloc(2 * (size_t)(s.m * s.nq));
    uint16_t *dout = h_alloc(2 * (size_t)(s.m * s.nq));
    float *lse = h_alloc(4 * (size_t)(s.m * nh)), *lse3 = h_alloc(4 * (size_t)(s.m * nh));
    float *dqkv = h_alloc(4 * (size_t)(s.m * s.w)), *dqkv3 = h_alloc(4 * (size_t)(s.m * s.w));
    double *x = h_alloc(8 * (size_t)(s.m * s.w)), *dd = h_alloc(8 * (size_t)(s.m * s.nq));
    double *ro = h_alloc(8 * (size_t)(s.m * s.nq)), *rlse = h_alloc(8 * (size_t)(s.m * nh));
    double *rdx = h_alloc(8 * (size_t)(s.m * s.w));
    /* scale 2.5: scores of order a few units, so the softmax is far from uniform */
    rng_fill_bf16(&r, qkv, s.m * s.w, 2.5f);
    rng_fill_bf16(&r, dout, s.m * s.nq, 1.0f);
    for (int64_t i = 0; i < s.m * s.w; i++) x[i] = h_bf2f(qkv[i]);
    for (int64_t i = 0; i < s.m * s.nq; i++) dd[i] = h_bf2f(dout[i]);
    poison_bf16(o, s.m * s.nq);
    poison_f32(lse, s.m * nh);
    poison_f32(dqkv, s.m * s.w);

    coda_tensor_t tq = coda_tensor_2d(qkv, CODA_BF16, s.m, s.w);
    coda_tensor_t to = coda_tensor_2d(o, CODA_BF16, s.m, s.nq);
    coda_tensor_t to3 = coda_tensor_2d(o3, CODA_BF16, s.m, s.nq);
    coda_tensor_t tl = coda_tensor_2d(lse, CODA_F32, s.m, nh);
    coda_tensor_t tl3 = coda_tensor_2d(lse3, CODA_F32, s.m, nh);
    coda_tensor_t tdo = coda_tensor_2d(dout, CODA_BF16, s.m, s.nq);
    coda_tensor_t tdq = coda_tensor_2d(dqkv, CODA_F32, s.m, s.w);
    coda_tensor_t tdq3 = coda_tensor_2d(dqkv3, CODA_F32, s.m, s.w);
    CHECK_OK(coda__attention_forward(&s.cfg, s.batch, s.seq, &tq, &to, &tl, 1));
    CHECK_OK(coda__attention_forward(&s.cfg, s.batch, s.seq, &tq, &to3, &tl3, 3));

    ref_forward(&s, x, ro, rlse);
    uint16_t *o_round = h_alloc(2 * (size_t)(s.m * s.nq));
    for (int64_t i = 0; i < s.m * s.nq; i++) o_round[i] = h_f2bf((float)ro[i]);
    double e_o = rel_err_bf16(o, ro, s.m * s.nq), e_base = rel_err_bf16(o_round, ro, s.m * s.nq);
    double e_lse = rel_err_f32(lse, rlse, s.m * nh);
    CHECK(within_tol(e_o, e_base), "o err %.3e vs bf16 rounding %.3e", e_o, e_base);
    CHECK(e_lse < 1e-5, "lse err %.3e", e_lse);
    CHECK(memcmp(o, o3, 2 * (size_t)(s.m * s.nq)) == 0, "o differs between 1 and 3 threads");
    CHECK(memcmp(lse, lse3, 4 * (size_t)(s.m * nh)) == 0, "lse differs between 1 and 3 threads");

    CHECK_OK(coda__attention_backward(&s.cfg, s.batch, s.seq, &tq, &to, &tl, &tdo, &tdq, 1));
    CHECK_OK(coda__attention_backward(&s.cfg, s.batch, s.seq, &tq, &to, &tl, &tdo, &tdq3, 3));
    CHECK(memcmp(dqkv, dqkv3, 4 * (size_t)(s.m * s.w)) == 0, "dqkv differs between 1 and 3 threads");
    ref_backward(&s, x, dd, rdx);
    double e_dx = rel_err_f32(dqkv, rdx, s.m * s.w);
    /* coda's D_i uses the bf16 o (as PyTorch does): error of order 2^-9 */
    CHECK(e_dx < 1e-2, "dqkv err %.3e", e_dx);

    /* The float64 analytic backward and coda's dqkv against central differences. */
    double rms = 0;
    for (int64_t i = 0; i < s.m * s.w; i++) rms += rdx[i] * rdx[i];
    rms = sqrt(rms / (double)(s.m * s.w));
    int bad_ref = 0, bad_coda = 0;
    double worst_ref = 0;
    for (int t = 0; t < 24; t++) {
        int64_t idx;
        if (t < 8) idx = (int64_t)((rng_uniform(&r) * 0.5f + 0.5f) * (float)s.m) * s.w +
                         (int64_t)((rng_uniform(&r) * 0.5f + 0.5f) * (float)s.nq);      /* q */
        else if (t < 16) idx = (int64_t)((rng_uniform(&r) * 0.5f + 0.5f) * (float)s.m) * s.w + s.nq +
                               (int64_t)((rng_uniform(&r) * 0.5f + 0.5f) * (float)s.nkv);  /* k */
        else idx = (int64_t)((rng_uniform(&r) * 0.5f + 0.5f) * (float)s.m) * s.w + s.nq + s.nkv +
                   (int64_t)((rng_uniform(&r) * 0.5f + 0.5f) * (float)s.nkv);              /* v */
        if (idx >= s.m * s.w) idx = s.m * s.w - 1;
        double h = 1e-5, keep = x[idx];
        x[idx] = keep + h;
        double fp = ref_objective(&s, x, dd);
        x[idx] = keep - h;
        double fm = ref_objective(&s, x, dd);
        x[idx] = keep;
        double fd = (fp - fm) / (2 * h);
        double er = fabs(fd - rdx[idx]);
        if (er > worst_ref) worst_ref = er;
        if (er > 1e-7 * (1 + fabs(fd))) bad_ref++;
        if (fabs(fd - dqkv[idx]) > 1e-2 * rms + 1e-2 * fabs(fd)) bad_coda++;
    }
    CHECK(bad_ref == 0, "%d float64 gradients disagree with finite differences (worst %.3e)",
          bad_ref, worst_ref);
    CHECK(bad_coda == 0, "%d coda gradients disagree with finite differences", bad_coda);
    printf("  batch %lld seq %lld heads %lld/%lld hd %lld: o err %.2e (bf16 rounding %.2e), lse %.2e, "
           "dqkv %.2e, fd worst %.1e\n",
           (long long)s.batch, (long long)s.seq, (long long)s.cfg.n_heads,
           (long long)s.cfg.n_kv_heads, (long long)s.cfg.head_dim, e_o, e_base, e_lse, e_dx, worst_ref);

    free(qkv); free(o); free(o3); free(dout); free(lse); free(lse3); free(dqkv); free(dqkv3);
    free(x); free(dd); free(ro); free(rlse); free(rdx); free(o_round);
}

static void bad_args(void) {
    shape_t s = mk(2, 5, 4, 2, 8);
    uint16_t *qkv = h_alloc(2 * (size_t)(s.m * s.w)), *o = h_alloc(2 * (size_t)(s.m * s.nq));
    uint16_t *dout = h_alloc(2 * (size_t)(s.m * s.nq));
    float *lse = h_alloc(4 * (size_t)(s.m * 4)), *dq = h_alloc(4 * (size_t)(s.m * s.w));
    h_rng r = rng_new(99);
    rng_fill_f32(&r, lse, s.m * 4, 1.0f);
    rng_fill_bf16(&r, qkv, s.m * s.w, 1.0f);
    rng_fill_bf16(&r, dout, s.m * s.nq, 1.0f);
    poison_bf16(o, s.m * s.nq);
    poison_f32(dq, s.m * s.w);
    coda_tensor_t tq = coda_tensor_2d(qkv, CODA_BF16, s.m, s.w);
    coda_tensor_t to = coda_tensor_2d(o, CODA_BF16, s.m, s.nq);
    coda_tensor_t tl = coda_tensor_2d(lse, CODA_F32, s.m, 4);
    coda_tensor_t tdo = coda_tensor_2d(dout, CODA_BF16, s.m, s.nq);
    coda_tensor_t tdq = coda_tensor_2d(dq, CODA_F32, s.m, s.w);

    CHECK_STATUS(coda__attention_forward(NULL, 2, 5, &tq, &to, &tl, 1), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__attention_forward(&s.cfg, 2, 5, NULL, &to, &tl, 1), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__attention_forward(&s.cfg, 2, 5, &tq, &to, &tl, 0), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__attention_forward(&s.cfg, 3, 5, &tq, &to, &tl, 1), CODA_ERR_SHAPE);
    CHECK_STATUS(coda__attention_forward(&s.cfg, 2, 0, &tq, &to, &tl, 1), CODA_ERR_SHAPE);
    coda_llama_config_t c = s.cfg;
    c.n_kv_heads = 3;
    CHECK_STATUS(coda__attention_forward(&c, 2, 5, &tq, &to, &tl, 1), CODA_ERR_SHAPE);
    c = s.cfg;
    c.head_dim = 7;
    CHECK_STATUS(coda__attention_forward(&c, 2, 5, &tq, &to, &tl, 1), CODA_ERR_SHAPE);
    coda_tensor_t bad = tq;
    bad.dtype = CODA_F32;
    bad.stride[0] = 4 * s.w;
    bad.stride[1] = 4;
    CHECK_STATUS(coda__attention_forward(&s.cfg, 2, 5, &bad, &to, &tl, 1), CODA_ERR_DTYPE);
    bad = tq;
    bad.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda__attention_forward(&s.cfg, 2, 5, &bad, &to, &tl, 1), CODA_ERR_DEVICE);
    bad = to;
    bad.data = qkv; /* output aliasing the input */
    CHECK_STATUS(coda__attention_forward(&s.cfg, 2, 5, &tq, &bad, &tl, 1), CODA_ERR_OVERLAP);
    bad = tl;
    bad.shape[1] = 2;
    bad.stride[0] = 8;
    CHECK_STATUS(coda__attention_forward(&s.cfg, 2, 5, &tq, &to, &bad, 1), CODA_ERR_SHAPE);
    int untouched = 1;
    for (int64_t i = 0; i < s.m * s.nq; i++) untouched &= o[i] == 0x7fc1;
    CHECK(untouched, "o was written by a failing call");

    CHECK_OK(coda__attention_forward(&s.cfg, 2, 5, &tq, &to, &tl, 2));
    CHECK_STATUS(coda__attention_backward(&s.cfg, 2, 5, &tq, &to, &tl, NULL, &tdq, 1),
                 CODA_ERR_INVALID_ARG);
    bad = tdq;
    bad.dtype = CODA_BF16;
    bad.stride[0] = 2 * s.w;
    bad.stride[1] = 2;
    CHECK_STATUS(coda__attention_backward(&s.cfg, 2, 5, &tq, &to, &tl, &tdo, &bad, 1), CODA_ERR_DTYPE);
    bad = tdq;
    bad.data = lse;
    bad.shape[0] = 1;
    bad.shape[1] = 4;
    bad.stride[0] = 16;
    CHECK_STATUS(coda__attention_backward(&s.cfg, 2, 5, &tq, &to, &tl, &tdo, &bad, 1), CODA_ERR_SHAPE);
    coda_tensor_t tdo_bad = tdo;
    tdo_bad.shape[0] = s.m - 1;
    CHECK_STATUS(coda__attention_backward(&s.cfg, 2, 5, &tq, &to, &tl, &tdo_bad, &tdq, 1),
                 CODA_ERR_SHAPE);
    untouched = 1;
    for (int64_t i = 0; i < s.m * s.w; i++) untouched &= isnan(dq[i]);
    CHECK(untouched, "dqkv was written by a failing call");
    free(qkv); free(o); free(dout); free(lse); free(dq);
}

/* A strided (padded) qkv and o give the same result as contiguous ones, and
 * more threads than (row, head) tasks change nothing. */
static void strided(void) {
    shape_t s = mk(1, 9, 2, 1, 4);
    int64_t pad = 8;
    uint16_t *qkv = h_alloc(2 * (size_t)(s.m * (s.w + pad))), *qc = h_alloc(2 * (size_t)(s.m * s.w));
    uint16_t *o = h_alloc(2 * (size_t)(s.m * (s.nq + pad))), *oc = h_alloc(2 * (size_t)(s.m * s.nq));
    float *lse = h_alloc(4 * (size_t)(s.m * 2));
    h_rng r = rng_new(5);
    rng_fill_bf16(&r, qkv, s.m * (s.w + pad), 2.0f);
    for (int64_t i = 0; i < s.m; i++) memcpy(qc + i * s.w, qkv + i * (s.w + pad), 2 * (size_t)s.w);
    coda_tensor_t tq = coda_tensor_2d(qkv, CODA_BF16, s.m, s.w);
    tq.stride[0] = 2 * (s.w + pad);
    coda_tensor_t to = coda_tensor_2d(o, CODA_BF16, s.m, s.nq);
    to.stride[0] = 2 * (s.nq + pad);
    coda_tensor_t tqc = coda_tensor_2d(qc, CODA_BF16, s.m, s.w);
    coda_tensor_t toc = coda_tensor_2d(oc, CODA_BF16, s.m, s.nq);
    coda_tensor_t tl = coda_tensor_2d(lse, CODA_F32, s.m, 2);
    CHECK_OK(coda__attention_forward(&s.cfg, 1, 9, &tq, &to, &tl, 2));
    CHECK_OK(coda__attention_forward(&s.cfg, 1, 9, &tqc, &toc, &tl, 50)); /* more threads than tasks */
    int same = 1;
    for (int64_t i = 0; i < s.m; i++) same &= memcmp(o + i * (s.nq + pad), oc + i * s.nq, 2 * (size_t)s.nq) == 0;
    CHECK(same, "strided and contiguous results differ");
    free(qkv); free(qc); free(o); free(oc); free(lse);
}

/* The public calls (coda.h section 11) on CPU tensors: the same bits as the
 * internal ones, no workspace needed, and their own refusals. */
static void public_api(void) {
    shape_t s = mk(2, 11, 4, 2, 6);
    coda_attention_shape_t sh = {2, 11, 4, 2, 6};
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    uint16_t *qkv = h_alloc(2 * (size_t)(s.m * s.w)), *dout = h_alloc(2 * (size_t)(s.m * s.nq));
    uint16_t *o1 = h_alloc(2 * (size_t)(s.m * s.nq)), *o2 = h_alloc(2 * (size_t)(s.m * s.nq));
    float *l1 = h_alloc(4 * (size_t)(s.m * 4)), *l2 = h_alloc(4 * (size_t)(s.m * 4));
    float *g1 = h_alloc(4 * (size_t)(s.m * s.w)), *g2 = h_alloc(4 * (size_t)(s.m * s.w));
    h_rng r = rng_new(9);
    rng_fill_bf16(&r, qkv, s.m * s.w, 1.5f);
    rng_fill_bf16(&r, dout, s.m * s.nq, 1.0f);
    coda_tensor_t tq = coda_tensor_2d(qkv, CODA_BF16, s.m, s.w), tdo = coda_tensor_2d(dout, CODA_BF16, s.m, s.nq);
    coda_tensor_t to1 = coda_tensor_2d(o1, CODA_BF16, s.m, s.nq), to2 = coda_tensor_2d(o2, CODA_BF16, s.m, s.nq);
    coda_tensor_t tl1 = coda_tensor_2d(l1, CODA_F32, s.m, 4), tl2 = coda_tensor_2d(l2, CODA_F32, s.m, 4);
    coda_tensor_t tg1 = coda_tensor_2d(g1, CODA_F32, s.m, s.w), tg2 = coda_tensor_2d(g2, CODA_F32, s.m, s.w);
    size_t bytes = 1;
    CHECK_OK(coda_attention_workspace_size(ctx, CODA_DEVICE_CPU, &sh, &bytes));
    CHECK(bytes == 0, "the CPU needs no workspace, got %zu bytes", bytes);
    {   /* a refused size query leaves *bytes as it was (a review found it zeroed) */
        coda_attention_shape_t odd = sh;
        odd.head_dim = 3;
        size_t keep = 12345;
        CHECK_STATUS(coda_attention_workspace_size(ctx, CODA_DEVICE_CPU, &odd, &keep), CODA_ERR_SHAPE);
        CHECK_STATUS(coda_attention_workspace_size(NULL, CODA_DEVICE_CPU, &sh, &keep), CODA_ERR_INVALID_ARG);
        CHECK_STATUS(coda_attention_workspace_size(ctx, (coda_device_t)7, &sh, &keep), CODA_ERR_INVALID_ARG);
        CHECK(keep == 12345, "a refused coda_attention_workspace_size wrote *bytes = %zu", keep);
    }
    CHECK_OK(coda_attention_forward(ctx, &sh, &tq, &to1, &tl1, NULL));
    CHECK_OK(coda_attention_backward(ctx, &sh, &tq, &to1, &tl1, &tdo, &tg1, NULL, 0, NULL));
    CHECK_OK(coda__attention_forward(&s.cfg, 2, 11, &tq, &to2, &tl2, 3));
    CHECK_OK(coda__attention_backward(&s.cfg, 2, 11, &tq, &to2, &tl2, &tdo, &tg2, 3));
    CHECK(!memcmp(o1, o2, 2 * (size_t)(s.m * s.nq)) && !memcmp(l1, l2, 4 * (size_t)(s.m * 4)) &&
              !memcmp(g1, g2, 4 * (size_t)(s.m * s.w)),
          "coda_attention_* and the CPU attention differ");

    poison_bf16(o1, s.m * s.nq);
    coda_attention_shape_t bad = sh;
    CHECK_STATUS(coda_attention_forward(NULL, &sh, &tq, &to1, &tl1, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_attention_forward(ctx, NULL, &tq, &to1, &tl1, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_attention_forward(ctx, &sh, NULL, &to1, &tl1, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, NULL, &tl1, NULL), CODA_ERR_INVALID_ARG);
    bad.n_kv_heads = 3;
    CHECK_STATUS(coda_attention_forward(ctx, &bad, &tq, &to1, &tl1, NULL), CODA_ERR_SHAPE);
    bad = sh;
    bad.seq = 10;
    CHECK_STATUS(coda_attention_forward(ctx, &bad, &tq, &to1, &tl1, NULL), CODA_ERR_SHAPE);
    bad = sh;
    bad.head_dim = 5;
    CHECK_STATUS(coda_attention_forward(ctx, &bad, &tq, &to1, &tl1, NULL), CODA_ERR_SHAPE);
    coda_tensor_t t = tq;
    t.device = CODA_DEVICE_CUDA;
#ifndef CODA_WITH_CUDA
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &t, &to1, &tl1, NULL), CODA_ERR_UNSUPPORTED);
#endif
    t = to1;
    t.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, &t, &tl1, NULL), CODA_ERR_DEVICE);
    t = tl1;
    t.dtype = CODA_BF16;
    t.stride[0] = 8, t.stride[1] = 2;
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, &to1, &t, NULL), CODA_ERR_DTYPE);
    t = to1;
    t.data = qkv;
    CHECK_STATUS(coda_attention_forward(ctx, &sh, &tq, &t, &tl1, NULL), CODA_ERR_OVERLAP);
    CHECK_STATUS(coda_attention_backward(ctx, &sh, &tq, &to2, &tl2, &tdo, &tg1, g2, 4 * (size_t)s.m, NULL),
                 CODA_OK); /* a workspace the CPU does not need is ignored */
    t = tg1;
    t.data = dout;
    t.shape[0] = 1;
    CHECK_STATUS(coda_attention_backward(ctx, &sh, &tq, &to2, &tl2, &tdo, &t, NULL, 0, NULL), CODA_ERR_SHAPE);
    int untouched = 1;
    for (int64_t i = 0; i < s.m * s.nq; i++) untouched &= o1[i] == 0x7fc1;
    CHECK(untouched, "a refused coda_attention_forward wrote o");
    coda_context_free(ctx);
    /* a context that asks for far more threads than the call can use: the
     * forward's scratch is sized by the workers it starts (at most 256), not
     * by the threads asked for (a review: 2^30 of them failed for memory) */
    coda_context_options_t many = {0};
    many.cpu_threads = 1 << 30;
    REQUIRE_OK(coda_context_create(&many, &ctx));
    CHECK_OK(coda_attention_forward(ctx, &sh, &tq, &to1, &tl1, NULL));
    CHECK(!memcmp(o1, o2, 2 * (size_t)(s.m * s.nq)) && !memcmp(l1, l2, 4 * (size_t)(s.m * 4)),
          "2^30 threads asked for: another result than 3 threads'");
    coda_context_free(ctx);
    free(qkv), free(dout), free(o1), free(o2), free(l1), free(l2), free(g1), free(g2);
}

int main(void) {
    run_case(mk(2, 7, 4, 2, 6), 1);   /* GQA, odd seq */
    run_case(mk(3, 5, 3, 3, 4), 2);   /* plain multi-head */
    run_case(mk(1, 13, 4, 1, 8), 3);  /* multi-query */
    run_case(mk(4, 1, 2, 1, 2), 4);   /* seq 1: softmax over one key */
    run_case(mk(2, 9, 4, 2, 20), 5);  /* head_dim 20: 8-wide partial sums plus a tail */
    run_case(mk(1, 33, 2, 1, 64), 6); /* LLaMA-like head_dim, longer sequence */
    bad_args();
    strided();
    public_api();
    TEST_MAIN_END();
}
