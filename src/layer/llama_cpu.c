/* llama_cpu.c - the layer's few steps that are not GEMMs, as plain CPU loops
 * (the CPU backend's, and the reference the GPU kernels are tested against).
 *
 * They are memory-bound and tiny next to the GEMMs. On CUDA each is a small
 * kernel of the backend (steps.c dispatches); the norm prologue can also be
 * skipped, the previous block's down-projection epilogue giving x*g1 and the
 * row statistic (coda_block_forward_post's g_next). */
#include "layer/llama.h"

#include <math.h>

void coda__llama_norm_prologue(const coda_tensor_t *x, const coda_tensor_t *g, coda_tensor_t *xg,
                               coda_tensor_t *ss) {
    int64_t m = x->shape[0], d = x->shape[1];
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *xr = coda__at2(x, i, 0);
        uint16_t *out = coda__at2(xg, i, 0);
        float acc = 0.0f;
        for (int64_t j = 0; j < d; j++) {
            float v = coda__bf16_to_f32(xr[j]);
            float gv = coda__bf16_to_f32(*(const uint16_t *)coda__at1(g, j));
            out[j] = coda__f32_to_bf16(v * gv);
            acc += v * v;
        }
        *(float *)coda__at2(ss, i, 0) = acc;
    }
}

void coda__llama_rope_pos(int64_t batch, int64_t seq, float *pos) {
    for (int64_t i = 0; i < batch * seq; i++) pos[i] = (float)(i % seq);
}

void coda__llama_rope_freq(const coda_llama_config_t *cfg, float *freq) {
    int64_t hd = cfg->head_dim, half = hd / 2;
    int64_t pairs_qk = (cfg->n_heads + cfg->n_kv_heads) * half;
    int64_t pairs = pairs_qk + cfg->n_kv_heads * half;
    for (int64_t p = 0; p < pairs; p++) {
        if (p >= pairs_qk) {
            freq[p] = 0.0f; /* v: cos 0 = 1, sin 0 = 0, passes unchanged */
            continue;
        }
        int64_t i = p % half; /* pair i of its head: columns (i, i + hd/2) unpacked */
        freq[p] = (float)pow((double)cfg->rope_theta, -2.0 * (double)i / (double)hd);
    }
}

/* On CUDA: the backend's kernel (steps.c). The angle is computed exactly
 * as the qkv_rope program does, in f32: th = pos * freq. */
void coda__llama_rope_backward(const coda_tensor_t *dy, int n_dy, const coda_tensor_t *y, const coda_tensor_t *pos,
                               const coda_tensor_t *freq, coda_tensor_t *dz, coda_tensor_t *s) {
    int64_t m = dy[0].shape[0], n = y->shape[1];
    for (int64_t i = 0; i < m; i++) {
        const uint16_t *yr = coda__at2(y, i, 0);
        uint16_t *out = coda__at2(dz, i, 0);
        float pi = *(const float *)coda__at1(pos, i);
        float acc = 0.0f;
        int q = 0;       /* the part of dy holding pair p */
        int64_t off = 0; /* its first column */
        for (int64_t p = 0; p < n / 2; p++) {
            while (q < n_dy - 1 && 2 * p >= off + dy[q].shape[1]) off += dy[q++].shape[1];
            float de = coda__load_f32(coda__at2(&dy[q], i, 2 * p - off), dy[q].dtype);
            float dd = coda__load_f32(coda__at2(&dy[q], i, 2 * p + 1 - off), dy[q].dtype);
            acc += coda__bf16_to_f32(yr[2 * p]) * de + coda__bf16_to_f32(yr[2 * p + 1]) * dd;
            float th = pi * *(const float *)coda__at1(freq, p);
            float c = cosf(th), sn = sinf(th);
            /* forward: (ye, yo) = (ze c - zo s, ze s + zo c); backward is R^T. */
            out[2 * p] = coda__f32_to_bf16(de * c + dd * sn);
            out[2 * p + 1] = coda__f32_to_bf16(dd * c - de * sn);
        }
        *(float *)coda__at1(s, i) = acc;
    }
}

void coda__llama_copy_vec(const coda_tensor_t *in, coda_tensor_t *out) {
    for (int64_t i = 0; i < out->shape[0]; i++)
        coda__store_f32(coda__at1(out, i), out->dtype, *(const float *)coda__at1(in, i));
}
