/* lm_loss_cpu.c - coda_lm_loss's memory-bound steps as plain CPU loops: the
 * CPU backend's, and the reference the CUDA kernels (src/cuda/lm_steps.c)
 * are tested against. What each computes: core/lm_steps.h. */
#include "core/lm_steps.h"

#include <math.h>

static inline float nan_max(float a, float b) { return isnan(a) || isnan(b) ? NAN : fmaxf(a, b); }

void coda__cpu_lm_targets(const coda_tensor_t *targets, int32_t ignore_index, int64_t vocab, coda_tensor_t *t32,
                          coda_tensor_t *count) {
    const int32_t bad = coda__lm_bad_target(ignore_index);
    int32_t n = 0;
    for (int64_t i = 0; i < targets->shape[0]; i++) {
        int32_t t;
        if (targets->dtype == CODA_I64) {
            int64_t v = *(const int64_t *)coda__at1(targets, i);
            t = v == ignore_index || (v >= 0 && v < vocab) ? (int32_t)v : bad;
            *(int32_t *)coda__at1(t32, i) = t;
        } else {
            t = *(const int32_t *)coda__at1(targets, i);
        }
        n += t != ignore_index;
    }
    *(int32_t *)count->data = n;
}

/* lse of row i from its (m, l, p) partials, coda_finish_lse's arithmetic. */
static float row_lse(const coda_tensor_t *part, int64_t i) {
    int64_t nt = part->shape[1], s2 = part->stride[2];
    float mx = -INFINITY, l = 0.0f;
    for (int64_t t = 0; t < nt; t++) mx = nan_max(mx, *(const float *)coda__at2(part, i, t));
    for (int64_t t = 0; t < nt; t++) {
        const char *e = coda__at2(part, i, t);
        float mt = *(const float *)e, lt = *(const float *)(e + s2);
        l += lt * (mt == mx ? 1.0f : expf(mt - mx));
    }
    return mx + logf(l);
}

void coda__cpu_lm_rows(const coda__lm_params_t *p, coda_tensor_t *logits, const coda_tensor_t *partials,
                       const coda_tensor_t *targets, const coda_tensor_t *count, coda_tensor_t *loss) {
    int64_t rows = logits->shape[0], V = p->vocab;
    float eps = p->smoothing, zc = p->z_loss, cap = p->softcap;
    float s = p->grad_scale;
    if (p->mean) s = s / (float)*(const int32_t *)count->data;
    for (int64_t i = 0; i < rows; i++) {
        uint16_t *z = coda__at2(logits, i, 0);          /* (V) bf16, dz in place */
        int32_t t = *(const int32_t *)coda__at1(targets, i);
        float *out = coda__at1(loss, i);
        if (t == p->ignore_index) {
            *out = 0.0f;
            if (p->want_grad)
                for (int64_t j = 0; j < V; j++) z[j] = 0;
            continue;
        }
        float lse = row_lse(partials, i);
        int in_range = t >= 0 && t < V;
        float zt = in_range ? coda__bf16_to_f32(z[t]) : NAN;
        /* the z-loss term only where it is on: 0 * lse^2 is NaN for an infinite lse */
        float l = lse - (1.0f - eps) * zt + (zc > 0.0f ? zc * lse * lse : 0.0f);
        if (eps > 0.0f) {
            float sum = 0.0f;
            for (int64_t j = 0; j < V; j++) sum += coda__bf16_to_f32(z[j]);
            l -= eps / (float)V * sum;
        }
        *out = l;
        if (!p->want_grad) continue;
        float a = s * (zc > 0.0f ? 1.0f + 2.0f * zc * lse : 1.0f), hit = s * (1.0f - eps), base = s * eps / (float)V;
        for (int64_t j = 0; j < V; j++) {
            float zj = coda__bf16_to_f32(z[j]);
            float g = a * expf(zj - lse) - (j == t ? hit : 0.0f) - base;
            if (cap > 0.0f) {
                float u = zj / cap;
                g *= 1.0f - u * u;
            }
            z[j] = coda__f32_to_bf16(in_range ? g : NAN);
        }
    }
}

void coda__cpu_lm_total(const coda_tensor_t *loss, const coda_tensor_t *count, int mean, coda_tensor_t *total) {
    float sum = 0.0f;
    for (int64_t i = 0; i < loss->shape[0]; i++) sum += *(const float *)coda__at1(loss, i);
    if (mean) sum /= (float)*(const int32_t *)count->data;
    *(float *)total->data = sum;
}
