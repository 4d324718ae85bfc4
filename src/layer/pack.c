/* pack.c - weight layout conversions between PyTorch's layout and coda's,
 * and the configuration check shared by the layer's public calls.
 *
 * wqkv: q, k, v row blocks; inside each q and k head, row i and row
 * i + head_dim/2 (a rotate-half RoPE pair) move to rows 2i and 2i+1, so that
 * the pair lands in adjacent accumulator columns of the QKV GEMM and RoPE is
 * a pairwise epilogue map. v rows keep their order.
 * wgu: row 2j = gate row j, row 2j+1 = up row j, so SwiGLU is a pairwise map.
 */
#include "layer/llama.h"

#include <math.h>
#include <stdio.h>

coda_status_t coda__llama_check_config(const coda_llama_config_t *cfg, const char *fn) {
    if (!cfg) return coda__fail(CODA_ERR_INVALID_ARG, "%s: cfg is NULL", fn);
    const int64_t lim = (int64_t)1 << 31;
    if (cfg->d <= 0 || cfg->d > lim)
        return coda__fail(CODA_ERR_SHAPE, "%s: cfg->d = %lld must be in 1..2^31", fn, (long long)cfg->d);
    if (cfg->n_heads <= 0 || cfg->n_heads > lim)
        return coda__fail(CODA_ERR_SHAPE, "%s: cfg->n_heads = %lld must be positive", fn,
                          (long long)cfg->n_heads);
    if (cfg->n_kv_heads <= 0 || cfg->n_kv_heads > cfg->n_heads || cfg->n_heads % cfg->n_kv_heads)
        return coda__fail(CODA_ERR_SHAPE, "%s: cfg->n_kv_heads = %lld must be positive and divide n_heads = %lld",
                          fn, (long long)cfg->n_kv_heads, (long long)cfg->n_heads);
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 || cfg->head_dim > lim)
        return coda__fail(CODA_ERR_SHAPE, "%s: cfg->head_dim = %lld must be positive and even", fn,
                          (long long)cfg->head_dim);
    if (cfg->n_heads * cfg->head_dim > lim)
        return coda__fail(CODA_ERR_SHAPE, "%s: n_heads * head_dim = %lld is too large", fn,
                          (long long)(cfg->n_heads * cfg->head_dim));
    const int64_t nqkv = (cfg->n_heads + 2 * cfg->n_kv_heads) * cfg->head_dim; /* <= 3 x 2^31: no overflow */
    if (nqkv > CODA_LLAMA_MAX_QKV)
        return coda__fail(CODA_ERR_SHAPE, "%s: (n_heads + 2 n_kv_heads) * head_dim = %lld is past 2^24 "
                          "(CODA_LLAMA_MAX_QKV: a RoPE angle is kept for each column pair)", fn, (long long)nqkv);
    if (cfg->ffn <= 0 || cfg->ffn > lim)
        return coda__fail(CODA_ERR_SHAPE, "%s: cfg->ffn = %lld must be in 1..2^31", fn, (long long)cfg->ffn);
    if (cfg->vocab < 0 || cfg->vocab > CODA_LSE_MAX_COLS)
        return coda__fail(CODA_ERR_SHAPE, "%s: cfg->vocab = %lld must be in 0..2^24 (CODA_LSE_MAX_COLS: the "
                          "loss's targets are compared as f32 column numbers)", fn, (long long)cfg->vocab);
    if (!(cfg->eps > 0.0f) || !isfinite(cfg->eps))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: cfg->eps = %g must be positive and finite", fn,
                          (double)cfg->eps);
    if (!(cfg->rope_theta > 0.0f) || !isfinite(cfg->rope_theta))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: cfg->rope_theta = %g must be positive and finite",
                          fn, (double)cfg->rope_theta);
    return CODA_OK;
}

/* A CPU 2-D tensor of the given extents and dtype. */
static coda_status_t check_mat(const coda_tensor_t *t, const char *fn, const char *what, int64_t rows,
                               int64_t cols, coda_dtype_t dtype) {
    char name[64];
    snprintf(name, sizeof name, "%s: %s", fn, what);
    int64_t shape[2] = {rows, cols};
    CODA_TRY(coda__check_shape(t, name, 2, shape));
    if (t->device != CODA_DEVICE_CPU)
        return coda__fail(CODA_ERR_DEVICE, "%s: %s must be a CPU tensor", fn, what);
    if (t->dtype != dtype)
        return coda__fail(CODA_ERR_DTYPE, "%s: %s is %s, expected %s like the first tensor", fn, what,
                          coda_dtype_name(t->dtype), coda_dtype_name(dtype));
    return CODA_OK;
}

static coda_status_t check_first(const coda_tensor_t *t, const char *fn, const char *what) {
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);
    if (t->dtype != CODA_BF16 && t->dtype != CODA_F32)
        return coda__fail(CODA_ERR_DTYPE, "%s: %s must be bf16 or f32, got %s", fn, what,
                          coda_dtype_name(t->dtype) ? coda_dtype_name(t->dtype) : "an unknown dtype");
    return CODA_OK;
}

/* The output must not share bytes with any input. */
static coda_status_t check_apart(const coda_tensor_t *out, const char *fn, const char *what,
                                 const coda_tensor_t *const *ins, const char *const *in_names, int n) {
    for (int i = 0; i < n; i++)
        if (coda__tensors_overlap(out, ins[i]))
            return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps %s", fn, what, in_names[i]);
    return CODA_OK;
}

static void copy_row(const coda_tensor_t *src, int64_t si, coda_tensor_t *dst, int64_t di) {
    memcpy(coda__at2(dst, di, 0), coda__at2(src, si, 0),
           (size_t)src->shape[1] * coda_dtype_size(src->dtype));
}

/* Row of wqkv holding row `r` of the q|k|v block layout (unpacked order). */
static int64_t packed_row(const coda_llama_config_t *cfg, int64_t r) {
    int64_t hd = cfg->head_dim, half = hd / 2;
    int64_t nqk = (cfg->n_heads + cfg->n_kv_heads) * hd; /* q and k rows are permuted */
    if (r >= nqk) return r;
    int64_t head = r / hd, i = r % hd;
    return head * hd + (i < half ? 2 * i : 2 * (i - half) + 1);
}

static coda_status_t qkv_check(const coda_llama_config_t *cfg, const coda_tensor_t *wq,
                               const coda_tensor_t *wk, const coda_tensor_t *wv,
                               const coda_tensor_t *wqkv, const char *fn, int pack) {
    CODA_TRY(coda__llama_check_config(cfg, fn));
    int64_t d = cfg->d, nq = cfg->n_heads * cfg->head_dim, nkv = cfg->n_kv_heads * cfg->head_dim;
    const coda_tensor_t *first = pack ? wq : wqkv;
    CODA_TRY(check_first(first, fn, pack ? "wq" : "wqkv"));
    coda_dtype_t dt = first->dtype;
    CODA_TRY(check_mat(wq, fn, "wq", nq, d, dt));
    CODA_TRY(check_mat(wk, fn, "wk", nkv, d, dt));
    CODA_TRY(check_mat(wv, fn, "wv", nkv, d, dt));
    CODA_TRY(check_mat(wqkv, fn, "wqkv", nq + 2 * nkv, d, dt));
    if (pack) {
        const coda_tensor_t *ins[3] = {wq, wk, wv};
        const char *nm[3] = {"wq", "wk", "wv"};
        CODA_TRY(check_apart(wqkv, fn, "wqkv", ins, nm, 3));
    } else {
        const coda_tensor_t *outs[3] = {wq, wk, wv};
        const char *nm[3] = {"wq", "wk", "wv"};
        for (int i = 0; i < 3; i++) {
            CODA_TRY(check_apart(outs[i], fn, nm[i], &wqkv, (const char *const[]){"wqkv"}, 1));
            for (int j = 0; j < i; j++)
                CODA_TRY(check_apart(outs[i], fn, nm[i], &outs[j], &nm[j], 1));
        }
    }
    return CODA_OK;
}

coda_status_t coda_llama_pack_qkv(const coda_llama_config_t *cfg, const coda_tensor_t *wq,
                                  const coda_tensor_t *wk, const coda_tensor_t *wv,
                                  coda_tensor_t *wqkv) {
    CODA_TRY(qkv_check(cfg, wq, wk, wv, wqkv, "coda_llama_pack_qkv", 1));
    int64_t nq = cfg->n_heads * cfg->head_dim, nkv = cfg->n_kv_heads * cfg->head_dim;
    for (int64_t r = 0; r < nq + 2 * nkv; r++) {
        const coda_tensor_t *src = r < nq ? wq : r < nq + nkv ? wk : wv;
        int64_t sr = r < nq ? r : r < nq + nkv ? r - nq : r - nq - nkv;
        copy_row(src, sr, wqkv, packed_row(cfg, r));
    }
    return CODA_OK;
}

coda_status_t coda_llama_unpack_qkv(const coda_llama_config_t *cfg, const coda_tensor_t *wqkv,
                                    coda_tensor_t *wq, coda_tensor_t *wk, coda_tensor_t *wv) {
    CODA_TRY(qkv_check(cfg, wq, wk, wv, wqkv, "coda_llama_unpack_qkv", 0));
    int64_t nq = cfg->n_heads * cfg->head_dim, nkv = cfg->n_kv_heads * cfg->head_dim;
    for (int64_t r = 0; r < nq + 2 * nkv; r++) {
        coda_tensor_t *dst = r < nq ? wq : r < nq + nkv ? wk : wv;
        int64_t dr = r < nq ? r : r < nq + nkv ? r - nq : r - nq - nkv;
        copy_row(wqkv, packed_row(cfg, r), dst, dr);
    }
    return CODA_OK;
}

static coda_status_t gu_check(const coda_llama_config_t *cfg, const coda_tensor_t *wg,
                              const coda_tensor_t *wu, const coda_tensor_t *wgu, const char *fn,
                              int pack) {
    CODA_TRY(coda__llama_check_config(cfg, fn));
    const coda_tensor_t *first = pack ? wg : wgu;
    CODA_TRY(check_first(first, fn, pack ? "w_gate" : "wgu"));
    coda_dtype_t dt = first->dtype;
    CODA_TRY(check_mat(wg, fn, "w_gate", cfg->ffn, cfg->d, dt));
    CODA_TRY(check_mat(wu, fn, "w_up", cfg->ffn, cfg->d, dt));
    CODA_TRY(check_mat(wgu, fn, "wgu", 2 * cfg->ffn, cfg->d, dt));
    const char *nm[2] = {"w_gate", "w_up"};
    const coda_tensor_t *io[2] = {wg, wu};
    if (pack) return check_apart(wgu, fn, "wgu", io, nm, 2);
    CODA_TRY(check_apart(wg, fn, "w_gate", &wgu, (const char *const[]){"wgu"}, 1));
    CODA_TRY(check_apart(wu, fn, "w_up", &wgu, (const char *const[]){"wgu"}, 1));
    return check_apart(wu, fn, "w_up", &io[0], &nm[0], 1);
}

coda_status_t coda_llama_pack_gate_up(const coda_llama_config_t *cfg, const coda_tensor_t *w_gate,
                                      const coda_tensor_t *w_up, coda_tensor_t *wgu) {
    CODA_TRY(gu_check(cfg, w_gate, w_up, wgu, "coda_llama_pack_gate_up", 1));
    for (int64_t j = 0; j < cfg->ffn; j++) {
        copy_row(w_gate, j, wgu, 2 * j);
        copy_row(w_up, j, wgu, 2 * j + 1);
    }
    return CODA_OK;
}

coda_status_t coda_llama_unpack_gate_up(const coda_llama_config_t *cfg, const coda_tensor_t *wgu,
                                        coda_tensor_t *w_gate, coda_tensor_t *w_up) {
    CODA_TRY(gu_check(cfg, w_gate, w_up, wgu, "coda_llama_unpack_gate_up", 0));
    for (int64_t j = 0; j < cfg->ffn; j++) {
        copy_row(wgu, 2 * j, w_gate, j);
        copy_row(wgu, 2 * j + 1, w_up, j);
    }
    return CODA_OK;
}
