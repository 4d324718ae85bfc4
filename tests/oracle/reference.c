/* reference.c - the plain unfused reference layer (see reference.h).
 *
 * Written for obviousness, not speed: every tensor of the layer is a dense
 * double array, every product a triple loop, every backward step the textbook
 * derivative. One rounding function rd() is the only difference between the
 * two modes: the identity in float64 mode, round-to-bf16 in bf16 mode, applied
 * exactly where PyTorch bf16 eager code materialises a bf16 tensor.
 */
#include "oracle/reference.h"

#include <math.h>
#include <stdlib.h>

/* ---- rounding ---- */

static _Thread_local int g_round; /* set per call from the layer's mode */

static double rd(double v) {
    if (!g_round) return v;
    return (double)coda__round_bf16((float)v);
}
static void rd_all(double *p, int64_t n) {
    if (g_round)
        for (int64_t i = 0; i < n; i++) p[i] = rd(p[i]);
}

/* ---- dense products (row-major), results rounded once per element ---- */

/* sum_t a[t] b[t] in float64; four partial sums only so that the compiler
 * can overlap the additions (a few times faster, same float64 accuracy). */
static double dotd(const double *a, const double *b, int64_t n) {
    double p0 = 0, p1 = 0, p2 = 0, p3 = 0;
    int64_t t = 0;
    for (; t + 4 <= n; t += 4) {
        p0 += a[t] * b[t];
        p1 += a[t + 1] * b[t + 1];
        p2 += a[t + 2] * b[t + 2];
        p3 += a[t + 3] * b[t + 3];
    }
    for (; t < n; t++) p0 += a[t] * b[t];
    return (p0 + p1) + (p2 + p3);
}

/* out (m, n) = a (m, k) . b (n, k)^T */
static void mm_nt(double *out, const double *a, const double *b, int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) out[i * n + j] = rd(dotd(a + i * k, b + j * k, k));
}

/* out (m, k) = a (m, n) . b (n, k) */
static void mm_nn(double *out, const double *a, const double *b, int64_t m, int64_t n, int64_t k) {
    for (int64_t i = 0; i < m; i++) {
        double *o = out + i * k;
        for (int64_t t = 0; t < k; t++) o[t] = 0;
        for (int64_t j = 0; j < n; j++) {
            double aij = a[i * n + j];
            for (int64_t t = 0; t < k; t++) o[t] += aij * b[j * k + t];
        }
        for (int64_t t = 0; t < k; t++) o[t] = rd(o[t]);
    }
}

/* out (n, k) = a (m, n)^T . b (m, k)    (weight gradients) */
static void mm_tn(double *out, const double *a, const double *b, int64_t m, int64_t n, int64_t k) {
    for (int64_t j = 0; j < n * k; j++) out[j] = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double aij = a[i * n + j];
            for (int64_t t = 0; t < k; t++) out[j * k + t] += aij * b[i * k + t];
        }
    rd_all(out, n * k);
}

/* dst = rd(dst + src): a gradient accumulation */
static void acc_add(double *dst, const double *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = rd(dst[i] + src[i]);
}

/* ---- RMSNorm: out = rd(rd(x * r) * g); nn = rd(x * r) saved ---- */

static void rms_forward(const double *x, const double *g, int64_t m, int64_t d, double eps,
                        double *r, double *nn, double *out) {
    for (int64_t i = 0; i < m; i++) {
        double ss = 0;
        for (int64_t j = 0; j < d; j++) ss += x[i * d + j] * x[i * d + j];
        r[i] = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t j = 0; j < d; j++) {
            nn[i * d + j] = rd(x[i * d + j] * r[i]);
            out[i * d + j] = rd(nn[i * d + j] * g[j]);
        }
    }
}

/* dout (m, d) -> dx (m, d) (overwritten), dg (d) (overwritten).
 *   dnn = rd(dout * g), dg = rd(sum_i rd(dout * nn)),
 *   dx = rd(r dnn - x r^3 (sum_j dnn x) / d). */
static void rms_backward(const double *x, const double *g, const double *r, const double *nn,
                         const double *dout, int64_t m, int64_t d, double *dx, double *dg,
                         double *tmp /* (d) */) {
    for (int64_t j = 0; j < d; j++) dg[j] = 0;
    for (int64_t i = 0; i < m; i++) {
        double s = 0;
        for (int64_t j = 0; j < d; j++) {
            tmp[j] = rd(dout[i * d + j] * g[j]);
            s += tmp[j] * x[i * d + j];
            dg[j] += rd(dout[i * d + j] * nn[i * d + j]);
        }
        double ri = r[i];
        for (int64_t j = 0; j < d; j++)
            dx[i * d + j] = rd(ri * tmp[j] - x[i * d + j] * ri * ri * ri * s / (double)d);
    }
    rd_all(dg, d);
}

/* ---- RoPE, rotate-half: y = rd(rd(x cos) + rd(rh(x) sin)), rh(x) = (-x2, x1) ----
 * The backward is the same rotation by the opposite angle: dx = rd(rd(dy cos)
 * + rh^T(rd(dy sin))), rh^T(g1, g2) = (g2, -g1); sign = -1 gives it, and
 * rd(-v) = -rd(v), so the bits are the same as writing it out. In place is
 * fine: each pair is read before it is written. */
static void rope_rotate(const coda__ref_layer_t *L, const double *x, double *y, int64_t width, double sign) {
    int64_t hd = L->cfg.head_dim, half = hd / 2;
    for (int64_t r = 0; r < L->m; r++) {
        const double *cs = L->cos_t + (r % L->seq) * half, *sn = L->sin_t + (r % L->seq) * half;
        for (int64_t c0 = 0; c0 < width; c0 += hd)
            for (int64_t i = 0; i < half; i++) {
                double x1 = x[r * width + c0 + i], x2 = x[r * width + c0 + i + half];
                y[r * width + c0 + i] = rd(rd(x1 * cs[i]) + rd(-sign * x2 * sn[i]));
                y[r * width + c0 + i + half] = rd(rd(x2 * cs[i]) + rd(sign * x1 * sn[i]));
            }
    }
}

/* ---- attention, one (row, head) at a time ----
 * s_j = rd(rd(q.k_j) / sqrt(hd)), pf = softmax(s) (exact), p = rd(pf), o = rd(sum p_j v_j). */

static void attn_probs(const coda__ref_layer_t *L, int64_t i, int64_t h, double *s, double *pf,
                       double *p) {
    int64_t hd = L->cfg.head_dim, kvh = h / (L->cfg.n_heads / L->cfg.n_kv_heads);
    int64_t r0 = i - i % L->seq;
    double sq = sqrt((double)hd), mx = -INFINITY, l = 0;
    for (int64_t j = r0; j <= i; j++) {
        double dot = dotd(L->q + i * L->nq + h * hd, L->k + j * L->nkv + kvh * hd, hd);
        s[j - r0] = rd(rd(dot) / sq);
        if (s[j - r0] > mx) mx = s[j - r0];
    }
    for (int64_t j = r0; j <= i; j++) l += (pf[j - r0] = exp(s[j - r0] - mx));
    for (int64_t j = r0; j <= i; j++) {
        pf[j - r0] /= l;
        p[j - r0] = rd(pf[j - r0]);
    }
}

static void attention_forward(coda__ref_layer_t *L, double *s, double *pf, double *p) {
    int64_t hd = L->cfg.head_dim, g = L->cfg.n_heads / L->cfg.n_kv_heads;
    for (int64_t i = 0; i < L->m; i++)
        for (int64_t h = 0; h < L->cfg.n_heads; h++) {
            int64_t r0 = i - i % L->seq, kvh = h / g;
            attn_probs(L, i, h, s, pf, p);
            for (int64_t c = 0; c < hd; c++) {
                double acc = 0;
                for (int64_t j = r0; j <= i; j++) acc += p[j - r0] * L->v[j * L->nkv + kvh * hd + c];
                L->o[i * L->nq + h * hd + c] = rd(acc);
            }
        }
}

/* do_ (M, nq) -> dq (M, nq), dk (M, nkv), dv (M, nkv), all after RoPE.
 * dp = rd(do . v), ds = rd(pf (dp - sum pf dp)), dqk = rd(ds / sqrt(hd)),
 * dq = rd(sum_j dqk k_j), per-head dk_h = rd(sum_i dqk q_i), dv_h = rd(sum_i p do_i),
 * then dk = rd(sum over the group's heads), likewise dv (GQA repeat backward). */
static void attention_backward(coda__ref_layer_t *L, const double *dout, double *dq, double *dk,
                               double *dv, double *dkh /* (M, nq) */, double *dvh /* (M, nq) */,
                               double *s, double *pf, double *p, double *dp) {
    int64_t hd = L->cfg.head_dim, nh = L->cfg.n_heads, g = nh / L->cfg.n_kv_heads;
    double sq = sqrt((double)hd);
    for (int64_t i = 0; i < L->m * L->nq; i++) dq[i] = dkh[i] = dvh[i] = 0;
    for (int64_t i = 0; i < L->m; i++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t r0 = i - i % L->seq, kvh = h / g;
            const double *doi = dout + i * L->nq + h * hd, *qi = L->q + i * L->nq + h * hd;
            attn_probs(L, i, h, s, pf, p);
            double sum = 0;
            for (int64_t j = r0; j <= i; j++) {
                dp[j - r0] = rd(dotd(doi, L->v + j * L->nkv + kvh * hd, hd));
                sum += pf[j - r0] * dp[j - r0];
            }
            for (int64_t j = r0; j <= i; j++) {
                double ds = rd(rd(pf[j - r0] * (dp[j - r0] - sum)) / sq);
                const double *kj = L->k + j * L->nkv + kvh * hd;
                for (int64_t c = 0; c < hd; c++) {
                    dq[i * L->nq + h * hd + c] += ds * kj[c];
                    dkh[j * L->nq + h * hd + c] += ds * qi[c];
                    dvh[j * L->nq + h * hd + c] += p[j - r0] * doi[c];
                }
            }
        }
    rd_all(dq, L->m * L->nq);
    rd_all(dkh, L->m * L->nq);
    rd_all(dvh, L->m * L->nq);
    for (int64_t j = 0; j < L->m; j++)
        for (int64_t kvh = 0; kvh < L->cfg.n_kv_heads; kvh++)
            for (int64_t c = 0; c < hd; c++) {
                double sk = 0, sv = 0;
                for (int64_t h = kvh * g; h < (kvh + 1) * g; h++) {
                    sk += dkh[j * L->nq + h * hd + c];
                    sv += dvh[j * L->nq + h * hd + c];
                }
                dk[j * L->nkv + kvh * hd + c] = rd(sk);
                dv[j * L->nkv + kvh * hd + c] = rd(sv);
            }
}

static double silu(double z) { return z / (1.0 + exp(-z)); }
static double dsilu(double z) {
    double sg = 1.0 / (1.0 + exp(-z));
    return sg * (1.0 + z * (1.0 - sg));
}

/* ---- lifetime ---- */

static double *zalloc(int64_t n, int *ok) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p) *ok = 0;
    return p;
}

/* Every double array of the layer, for allocation and freeing in one place. */
#define REF_ARRAYS(X)                                                                         \
    X(w.wq, L->nq * d) X(w.wk, L->nkv * d) X(w.wv, L->nkv * d) X(w.wo, d * L->nq)             \
    X(w.w_gate, ffn * d) X(w.w_up, ffn * d) X(w.w_down, d * ffn) X(w.g1, d) X(w.g2, d)        \
    X(grad.wq, L->nq * d) X(grad.wk, L->nkv * d) X(grad.wv, L->nkv * d) X(grad.wo, d * L->nq) \
    X(grad.w_gate, ffn * d) X(grad.w_up, ffn * d) X(grad.w_down, d * ffn) X(grad.g1, d)       \
    X(grad.g2, d) X(x, m * d) X(dy, m * d) X(y, m * d) X(loss, m) X(dx, m * d)                \
    X(r1, m) X(r2, m) X(rf, m) X(n1, m * d) X(n2, m * d) X(nf, m * d) X(q, m * L->nq)         \
    X(k, m * L->nkv) X(v, m * L->nkv) X(o, m * L->nq) X(h, m * d) X(gate, m * ffn)            \
    X(up, m * ffn) X(c, m * ffn) X(lse, m) X(nn1, m * d) X(nn2, m * d) X(nnf, m * d)          \
    X(q0, m * L->nq) X(k0, m * L->nkv) X(sg, m * ffn) X(cos_t, L->seq * (hd / 2))             \
    X(sin_t, L->seq * (hd / 2))

#define REF_VOCAB_ARRAYS(X) X(w.gf, d) X(w.wlm, vocab * d) X(grad.gf, d) X(grad.wlm, vocab * d) \
    X(logits, m * vocab)

void coda__ref_free(coda__ref_layer_t *L) {
    if (!L) return;
#define FREE_ONE(field, n) free(L->field);
    REF_ARRAYS(FREE_ONE)
    REF_VOCAB_ARRAYS(FREE_ONE)
#undef FREE_ONE
    free(L->targets);
    free(L);
}

static coda_status_t check_cfg(const coda_llama_config_t *cfg, int64_t batch, int64_t seq) {
    if (!cfg) return coda__fail(CODA_ERR_INVALID_ARG, "cfg: is NULL");
    if (cfg->d < 1 || cfg->ffn < 1 || cfg->vocab < 0)
        return coda__fail(CODA_ERR_SHAPE, "cfg: d %lld, ffn %lld must be >= 1 and vocab %lld >= 0",
                          (long long)cfg->d, (long long)cfg->ffn, (long long)cfg->vocab);
    if (cfg->n_heads < 1 || cfg->n_kv_heads < 1 || cfg->n_heads % cfg->n_kv_heads != 0)
        return coda__fail(CODA_ERR_SHAPE, "cfg: n_kv_heads %lld must divide n_heads %lld (both >= 1)",
                          (long long)cfg->n_kv_heads, (long long)cfg->n_heads);
    if (cfg->head_dim < 2 || cfg->head_dim % 2 != 0)
        return coda__fail(CODA_ERR_SHAPE, "cfg: head_dim %lld must be even and >= 2",
                          (long long)cfg->head_dim);
    if (!(cfg->eps > 0) || !(cfg->rope_theta > 0))
        return coda__fail(CODA_ERR_INVALID_ARG, "cfg: eps %g and rope_theta %g must be > 0",
                          (double)cfg->eps, (double)cfg->rope_theta);
    if (batch < 1 || seq < 1)
        return coda__fail(CODA_ERR_SHAPE, "batch %lld and seq %lld must be >= 1", (long long)batch,
                          (long long)seq);
    int64_t lim = (int64_t)1 << 24; /* keeps every array product far from overflow */
    if (cfg->d > lim || cfg->ffn > lim || cfg->vocab > lim || cfg->n_heads * cfg->head_dim > lim ||
        batch > lim / seq)
        return coda__fail(CODA_ERR_SHAPE, "reference layer: shape too large");
    return CODA_OK;
}

coda_status_t coda__ref_create(const coda_llama_config_t *cfg, int64_t batch, int64_t seq,
                               coda__ref_layer_t **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "out: is NULL");
    CODA_TRY(check_cfg(cfg, batch, seq));
    coda__ref_layer_t *L = calloc(1, sizeof *L);
    if (!L) return coda__fail(CODA_ERR_NO_MEMORY, "reference layer: out of host memory");
    L->cfg = *cfg;
    L->batch = batch;
    L->seq = seq;
    L->m = batch * seq;
    L->nq = cfg->n_heads * cfg->head_dim;
    L->nkv = cfg->n_kv_heads * cfg->head_dim;
    L->mode = -1;
    L->loss_scale = 1.0;
    L->use_loss = cfg->vocab > 0;
    L->use_dy = 1;
    int64_t m = L->m, d = cfg->d, ffn = cfg->ffn, hd = cfg->head_dim, vocab = cfg->vocab;
    int ok = 1;
#define ALLOC_ONE(field, n) L->field = zalloc(n, &ok);
    REF_ARRAYS(ALLOC_ONE)
    if (vocab > 0) {
        REF_VOCAB_ARRAYS(ALLOC_ONE)
        L->targets = malloc(sizeof(int32_t) * (size_t)m);
        if (!L->targets) ok = 0;
        else
            for (int64_t i = 0; i < m; i++) L->targets[i] = -100;
    }
#undef ALLOC_ONE
    if (!ok) {
        coda__ref_free(L);
        return coda__fail(CODA_ERR_NO_MEMORY, "reference layer: out of host memory");
    }
    *out = L;
    return CODA_OK;
}

void coda__ref_params(const coda__ref_layer_t *L, const coda__ref_weights_t *w,
                      coda__ref_param_t out[CODA__REF_N_WEIGHTS]) {
    int64_t d = L->cfg.d, ffn = L->cfg.ffn;
    coda__ref_param_t list[CODA__REF_N_WEIGHTS] = {
        {"wq", w->wq, L->nq, d},          {"wk", w->wk, L->nkv, d},
        {"wv", w->wv, L->nkv, d},         {"wo", w->wo, d, L->nq},
        {"w_gate", w->w_gate, ffn, d},    {"w_up", w->w_up, ffn, d},
        {"w_down", w->w_down, d, ffn},    {"g1", w->g1, d, 1},
        {"g2", w->g2, d, 1},              {"gf", w->gf, d, 1},
        {"wlm", w->wlm, L->cfg.vocab, d},
    };
    memcpy(out, list, sizeof list);
}

coda_status_t coda__ref_copy_inputs(coda__ref_layer_t *dst, const coda__ref_layer_t *src) {
    if (!dst || !src) return coda__fail(CODA_ERR_INVALID_ARG, "dst/src: is NULL");
    if (memcmp(&dst->cfg, &src->cfg, sizeof dst->cfg) != 0 || dst->batch != src->batch ||
        dst->seq != src->seq)
        return coda__fail(CODA_ERR_SHAPE, "dst: configuration or batch shape differs from src");
    coda__ref_param_t a[CODA__REF_N_WEIGHTS], b[CODA__REF_N_WEIGHTS];
    coda__ref_params(dst, &dst->w, a);
    coda__ref_params(src, &src->w, b);
    for (int i = 0; i < CODA__REF_N_WEIGHTS; i++)
        if (a[i].data) memcpy(a[i].data, b[i].data, sizeof(double) * (size_t)(a[i].rows * a[i].cols));
    size_t md = sizeof(double) * (size_t)(src->m * src->cfg.d);
    memcpy(dst->x, src->x, md);
    memcpy(dst->dy, src->dy, md);
    if (src->targets) memcpy(dst->targets, src->targets, sizeof(int32_t) * (size_t)src->m);
    dst->use_loss = src->use_loss;
    dst->loss_scale = src->loss_scale;
    dst->use_dy = src->use_dy;
    return CODA_OK;
}

void coda__ref_from_bf16(double *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = coda__bf16_to_f32(src[i]);
}

coda_status_t coda__ref_from_tensor(double *dst, const coda_tensor_t *t, int64_t n) {
    if (!dst) return coda__fail(CODA_ERR_INVALID_ARG, "dst: is NULL");
    CODA_TRY(coda__check_tensor(t, "t"));
    static const coda_dtype_t ok[2] = {CODA_BF16, CODA_F32};
    CODA_TRY(coda__check_dtype(t, "t", ok, 2));
    if (t->device != CODA_DEVICE_CPU) return coda__fail(CODA_ERR_DEVICE, "t: must be a CPU tensor");
    if (t->ndim > 2) return coda__fail(CODA_ERR_SHAPE, "t: must be 1-D or 2-D");
    if (coda_tensor_numel(t) != n)
        return coda__fail(CODA_ERR_SHAPE, "t: has %lld elements, expected %lld",
                          (long long)coda_tensor_numel(t), (long long)n);
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->shape[t->ndim - 1];
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const char *p = (const char *)t->data + i * (t->ndim == 2 ? t->stride[0] : 0) +
                            j * t->stride[t->ndim - 1];
            dst[i * cols + j] = coda__load_f32(p, t->dtype);
        }
    return CODA_OK;
}

/* The inputs as the computation sees them: weights and x rounded to bf16 in
 * bf16 mode (PyTorch holds them as bf16), unchanged in float64 mode. One
 * buffer; *w and *x point into it. The caller's arrays are never modified. */
static double *rounded_inputs(const coda__ref_layer_t *L, coda__ref_weights_t *w, double **x) {
    coda__ref_param_t pw[CODA__REF_N_WEIGHTS];
    coda__ref_params(L, &L->w, pw);
    int64_t total = L->m * L->cfg.d;
    for (int p = 0; p < CODA__REF_N_WEIGHTS; p++)
        if (pw[p].data) total += pw[p].rows * pw[p].cols;
    double *buf = malloc(sizeof(double) * (size_t)total), *at = buf;
    if (!buf) return NULL;
    double **slots[CODA__REF_N_WEIGHTS] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                                            &w->w_down, &w->g1, &w->g2, &w->gf, &w->wlm};
    for (int p = 0; p < CODA__REF_N_WEIGHTS; p++) {
        *slots[p] = NULL;
        if (!pw[p].data) continue;
        *slots[p] = at;
        for (int64_t i = 0; i < pw[p].rows * pw[p].cols; i++) at[i] = rd(pw[p].data[i]);
        at += pw[p].rows * pw[p].cols;
    }
    *x = at;
    for (int64_t i = 0; i < L->m * L->cfg.d; i++) at[i] = rd(L->x[i]);
    return buf;
}

/* ---- forward ---- */

coda_status_t coda__ref_forward(coda__ref_layer_t *L, coda__ref_mode_t mode) {
    if (!L) return coda__fail(CODA_ERR_INVALID_ARG, "layer: is NULL");
    if (mode != CODA__REF_F64 && mode != CODA__REF_BF16)
        return coda__fail(CODA_ERR_INVALID_ARG, "mode: %d is not a reference mode", (int)mode);
    const coda_llama_config_t *cfg = &L->cfg;
    int64_t m = L->m, d = cfg->d, ffn = cfg->ffn, vocab = cfg->vocab, hd = cfg->head_dim;
    int loss_on = L->use_loss && vocab > 0;
    if (loss_on)
        for (int64_t i = 0; i < m; i++)
            if (L->targets[i] != -100 && (L->targets[i] < 0 || L->targets[i] >= vocab))
                return coda__fail(CODA_ERR_INVALID_ARG, "targets[%lld] = %d is outside [0, %lld)",
                                  (long long)i, (int)L->targets[i], (long long)vocab);
    g_round = mode == CODA__REF_BF16;
    coda__ref_weights_t w;
    double *x;
    double *in = rounded_inputs(L, &w, &x);
    double *s = malloc(sizeof(double) * (size_t)(3 * L->seq));  // scores, softmax, rounded
    double *t = malloc(sizeof(double) * (size_t)(m * d));       // a GEMM output
    if (!in || !s || !t) {
        free(in); free(s); free(t);
        return coda__fail(CODA_ERR_NO_MEMORY, "reference forward: out of host memory");
    }
    L->mode = mode;

    /* RoPE tables: cos/sin of pos * theta^(-2i/hd); PyTorch casts them to bf16. */
    for (int64_t pos = 0; pos < L->seq; pos++)
        for (int64_t i = 0; i < hd / 2; i++) {
            double ang = (double)pos * pow((double)cfg->rope_theta, -2.0 * (double)i / (double)hd);
            L->cos_t[pos * (hd / 2) + i] = rd(cos(ang));
            L->sin_t[pos * (hd / 2) + i] = rd(sin(ang));
        }

    /* attention block */
    rms_forward(x, w.g1, m, d, cfg->eps, L->r1, L->nn1, L->n1);
    mm_nt(L->q0, L->n1, w.wq, m, L->nq, d);
    mm_nt(L->k0, L->n1, w.wk, m, L->nkv, d);
    mm_nt(L->v, L->n1, w.wv, m, L->nkv, d);
    rope_rotate(L, L->q0, L->q, L->nq, 1.0);
    rope_rotate(L, L->k0, L->k, L->nkv, 1.0);
    attention_forward(L, s, s + L->seq, s + 2 * L->seq);
    mm_nt(t, L->o, w.wo, m, d, L->nq);
    for (int64_t i = 0; i < m * d; i++) L->h[i] = rd(x[i] + t[i]);

    /* FFN block */
    rms_forward(L->h, w.g2, m, d, cfg->eps, L->r2, L->nn2, L->n2);
    mm_nt(L->gate, L->n2, w.w_gate, m, ffn, d);
    mm_nt(L->up, L->n2, w.w_up, m, ffn, d);
    for (int64_t i = 0; i < m * ffn; i++) {
        L->sg[i] = rd(silu(L->gate[i]));
        L->c[i] = rd(L->sg[i] * L->up[i]);
    }
    mm_nt(t, L->c, w.w_down, m, d, ffn);
    for (int64_t i = 0; i < m * d; i++) L->y[i] = rd(L->h[i] + t[i]);

    /* final norm, LM head, cross-entropy (the loss is not rounded: f32 in PyTorch) */
    for (int64_t i = 0; i < m; i++) L->loss[i] = 0;
    if (loss_on) {
        rms_forward(L->y, w.gf, m, d, cfg->eps, L->rf, L->nnf, L->nf);
        mm_nt(L->logits, L->nf, w.wlm, m, vocab, d);
        for (int64_t i = 0; i < m; i++) {
            const double *z = L->logits + i * vocab;
            double mx = -INFINITY, l = 0;
            for (int64_t j = 0; j < vocab; j++) mx = z[j] > mx ? z[j] : mx;
            for (int64_t j = 0; j < vocab; j++) l += exp(z[j] - mx);
            L->lse[i] = mx + log(l);
            if (L->targets[i] != -100) L->loss[i] = L->lse[i] - z[L->targets[i]];
        }
    }
    free(in); free(s); free(t);
    return CODA_OK;
}

/* ---- backward ---- */

coda_status_t coda__ref_backward(coda__ref_layer_t *L) {
    if (!L) return coda__fail(CODA_ERR_INVALID_ARG, "layer: is NULL");
    if (L->mode < 0)
        return coda__fail(CODA_ERR_INVALID_ARG, "layer: backward needs a forward pass first");
    const coda_llama_config_t *cfg = &L->cfg;
    int64_t m = L->m, d = cfg->d, ffn = cfg->ffn, vocab = cfg->vocab, nq = L->nq, nkv = L->nkv;
    int loss_on = L->use_loss && vocab > 0;
    int64_t wide = d > nq ? d : nq;
    g_round = L->mode == CODA__REF_BF16;
    coda__ref_weights_t w;
    double *x;
    double *in = rounded_inputs(L, &w, &x);
    double *s = malloc(sizeof(double) * (size_t)(4 * L->seq + d));
    double *dY = malloc(sizeof(double) * (size_t)(m * d));     // dL/dy, then dL/dh
    double *ta = malloc(sizeof(double) * (size_t)(m * wide));  // (M, d) or (M, nq) temporaries
    double *tb = malloc(sizeof(double) * (size_t)(m * wide));
    double *dlog = malloc(sizeof(double) * (size_t)(loss_on ? m * vocab : 1));
    double *dc = malloc(sizeof(double) * (size_t)(m * ffn));
    double *dgate = malloc(sizeof(double) * (size_t)(m * ffn));
    double *dup = malloc(sizeof(double) * (size_t)(m * ffn));
    double *dq = malloc(sizeof(double) * (size_t)(m * nq));
    double *dkh = malloc(sizeof(double) * (size_t)(m * nq));
    double *dvh = malloc(sizeof(double) * (size_t)(m * nq));
    double *dk = malloc(sizeof(double) * (size_t)(m * nkv));
    double *dv = malloc(sizeof(double) * (size_t)(m * nkv));
    if (!in || !s || !dY || !ta || !tb || !dlog || !dc || !dgate || !dup || !dq || !dkh || !dvh ||
        !dk || !dv) {
        free(in); free(s); free(dY); free(ta); free(tb); free(dlog); free(dc); free(dgate);
        free(dup); free(dq); free(dkh); free(dvh); free(dk); free(dv);
        return coda__fail(CODA_ERR_NO_MEMORY, "reference backward: out of host memory");
    }
    double *rtmp = s + 4 * L->seq; /* (d) for rms_backward */
    coda__ref_weights_t *G = &L->grad;

    /* dL/dy = dy, plus the loss path through the LM head and the final norm. */
    for (int64_t i = 0; i < m * d; i++) dY[i] = L->use_dy ? rd(L->dy[i]) : 0.0;
    if (loss_on) {
        /* dlogits = rd(scale (softmax - onehot)); ignored rows get 0 */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < vocab; j++) {
                double g = 0;
                if (L->targets[i] != -100)
                    g = L->loss_scale * (exp(L->logits[i * vocab + j] - L->lse[i]) -
                                         (j == L->targets[i] ? 1.0 : 0.0));
                dlog[i * vocab + j] = rd(g);
            }
        mm_tn(G->wlm, dlog, L->nf, m, vocab, d);
        mm_nn(ta, dlog, w.wlm, m, vocab, d); /* dnf */
        rms_backward(L->y, w.gf, L->rf, L->nnf, ta, m, d, tb, G->gf, rtmp);
        acc_add(dY, tb, m * d);
    } else if (G->gf) {
        memset(G->gf, 0, sizeof(double) * (size_t)d);
        memset(G->wlm, 0, sizeof(double) * (size_t)(vocab * d));
    }

    /* y = h + c w_down^T,  c = silu(gate) * up */
    mm_tn(G->w_down, dY, L->c, m, d, ffn);
    mm_nn(dc, dY, w.w_down, m, d, ffn);
    for (int64_t i = 0; i < m * ffn; i++) {
        double dsg = rd(dc[i] * L->up[i]);
        dup[i] = rd(dc[i] * L->sg[i]);
        dgate[i] = rd(dsg * dsilu(L->gate[i]));
    }
    mm_tn(G->w_gate, dgate, L->n2, m, ffn, d);
    mm_tn(G->w_up, dup, L->n2, m, ffn, d);
    mm_nn(ta, dgate, w.w_gate, m, ffn, d);
    mm_nn(tb, dup, w.w_up, m, ffn, d);
    acc_add(ta, tb, m * d); /* dn2 */
    rms_backward(L->h, w.g2, L->r2, L->nn2, ta, m, d, tb, G->g2, rtmp);
    acc_add(dY, tb, m * d); /* dh */

    /* h = x + o wo^T, attention, RoPE, q/k/v projections */
    mm_tn(G->wo, dY, L->o, m, d, nq);
    mm_nn(ta, dY, w.wo, m, d, nq); /* do */
    attention_backward(L, ta, dq, dk, dv, dkh, dvh, s, s + L->seq, s + 2 * L->seq, s + 3 * L->seq);
    rope_rotate(L, dq, dq, nq, -1.0);
    rope_rotate(L, dk, dk, nkv, -1.0);
    mm_tn(G->wq, dq, L->n1, m, nq, d);
    mm_tn(G->wk, dk, L->n1, m, nkv, d);
    mm_tn(G->wv, dv, L->n1, m, nkv, d);
    mm_nn(ta, dq, w.wq, m, nq, d);
    mm_nn(tb, dk, w.wk, m, nkv, d);
    acc_add(ta, tb, m * d);
    mm_nn(tb, dv, w.wv, m, nkv, d);
    acc_add(ta, tb, m * d); /* dn1 */
    rms_backward(x, w.g1, L->r1, L->nn1, ta, m, d, tb, G->g1, rtmp);
    for (int64_t i = 0; i < m * d; i++) L->dx[i] = rd(dY[i] + tb[i]);

    free(in); free(s); free(dY); free(ta); free(tb); free(dlog); free(dc); free(dgate);
    free(dup); free(dq); free(dkh); free(dvh); free(dk); free(dv);
    return CODA_OK;
}
