/* attention.c - coda.h section 11: causal grouped-query attention, the
 * argument checks of both backends and the dispatch: CPU tensors go to
 * src/layer/attention.c (the oracle), CUDA tensors to src/cuda/attention.c.
 * Every check runs before anything is launched or written, so a call that
 * fails has changed nothing. */
#include "core/context.h"
#include "layer/attention.h"

#include <stdio.h>

#define MAX_ROWS ((int64_t)1 << 30)

/* The shape, as a layer configuration (attention.c's interface). */
static coda_status_t check_shape(const char *fn, const coda_attention_shape_t *s, coda_device_t dev,
                                 coda_llama_config_t *cfg) {
    if (!s) return coda__fail(CODA_ERR_INVALID_ARG, "%s: shape is NULL", fn);
    if (s->batch < 1 || s->seq < 1 || s->batch > MAX_ROWS / s->seq)
        return coda__fail(CODA_ERR_SHAPE, "%s: batch = %lld, seq = %lld: both must be >= 1 and batch * seq "
                          "at most 2^30", fn, (long long)s->batch, (long long)s->seq);
    if (s->n_heads < 1 || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads != 0 || s->n_heads > (1 << 16))
        return coda__fail(CODA_ERR_SHAPE, "%s: n_heads = %lld, n_kv_heads = %lld: n_kv_heads must be >= 1 "
                          "and divide n_heads (at most 65536)", fn, (long long)s->n_heads,
                          (long long)s->n_kv_heads);
    if (s->head_dim < 1 || s->head_dim > (1 << 16))
        return coda__fail(CODA_ERR_SHAPE, "%s: head_dim = %lld is out of range", fn, (long long)s->head_dim);
    if (dev == CODA_DEVICE_CUDA && s->head_dim != 64 && s->head_dim != 128)
        return coda__fail(CODA_ERR_UNSUPPORTED, "%s: head_dim = %lld: the CUDA kernels take 64 or 128", fn,
                          (long long)s->head_dim);
    if (dev == CODA_DEVICE_CPU && s->head_dim % 2 != 0)
        return coda__fail(CODA_ERR_SHAPE, "%s: head_dim = %lld must be even", fn, (long long)s->head_dim);
    memset(cfg, 0, sizeof *cfg);
    cfg->n_heads = s->n_heads;
    cfg->n_kv_heads = s->n_kv_heads;
    cfg->head_dim = s->head_dim;
    cfg->d = s->n_heads * s->head_dim;
    return CODA_OK;
}

/* A (rows, cols) matrix of dtype dt on the device of `like` (NULL: any);
 * on CUDA with unit columns and a base and row stride aligned to `align`
 * bytes (what the kernels load and store it by: 16-byte cp.async for the
 * bf16 matrices, 8-byte pairs for dqkv, single elements for lse). */
static coda_status_t check_mat(const char *fn, const coda_tensor_t *t, const char *name, int64_t rows,
                               int64_t cols, coda_dtype_t dt, const coda_tensor_t *like, int align) {
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %s is NULL", fn, name);
    char what[96];
    snprintf(what, sizeof what, "%s: %s", fn, name);
    CODA_TRY(coda__check_tensor(t, what));
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return coda__fail(CODA_ERR_SHAPE, "%s: %s must be (%lld, %lld), got %d dims (%lld, %lld)", fn, name,
                          (long long)rows, (long long)cols, t->ndim, (long long)t->shape[0],
                          (long long)(t->ndim > 1 ? t->shape[1] : 0));
    if (t->dtype != dt)
        return coda__fail(CODA_ERR_DTYPE, "%s: %s must be %s, got %s", fn, name, coda_dtype_name(dt),
                          coda_dtype_name(t->dtype));
    if (like && (t->device != like->device || t->device_index != like->device_index))
        return coda__fail(CODA_ERR_DEVICE, "%s: %s is not on qkv's device", fn, name);
    if (t->device == CODA_DEVICE_CUDA) {
        size_t es = coda_dtype_size(dt);
        if (t->stride[1] != (int64_t)es)
            return coda__fail(CODA_ERR_STRIDE, "%s: %s's columns must be contiguous on CUDA", fn, name);
        if ((uintptr_t)t->data % (uintptr_t)align != 0 || t->stride[0] % align != 0)
            return coda__fail(CODA_ERR_STRIDE, "%s: %s: the CUDA kernels need a %d-byte aligned base and row "
                              "stride (got %p, %lld bytes)", fn, name, align, t->data, (long long)t->stride[0]);
    }
    return CODA_OK;
}

static coda_status_t check_apart(const char *fn, const coda_tensor_t *const *outs, const char *const *onames,
                                 int n_out, const coda_tensor_t *const *ins, const char *const *inames, int n_in) {
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            if (coda__tensors_overlap(outs[o], ins[i]))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps %s", fn, onames[o], inames[i]);
        for (int p = 0; p < o; p++)
            if (coda__tensors_overlap(outs[o], outs[p]))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps %s", fn, onames[o], onames[p]);
    }
    return CODA_OK;
}

size_t coda__attention_ws_bytes(const coda_attention_shape_t *s, coda_device_t dev) {
    if (dev == CODA_DEVICE_CPU) return 0;
    /* src/cuda/attention.c: D and lse log2(e), (batch, n_heads, seq padded to
     * 128) f32 each, then 2 counters per 64 of those rows */
    const size_t plane = (size_t)(s->batch * s->n_heads) * ((size_t)(s->seq + 127) / 128 * 128);
    return ((2 * plane + plane / 64 * 2) * sizeof(float) + 255) / 256 * 256;
}

static coda_status_t check_backend(const char *fn, coda_device_t dev) {
    if (dev == CODA_DEVICE_CPU) return CODA_OK;
#ifdef CODA_WITH_CUDA
    if (dev == CODA_DEVICE_CUDA) return CODA_OK;
#endif
    return coda__fail(CODA_ERR_UNSUPPORTED, "%s: CUDA tensors, but this build has no CUDA backend", fn);
}

/* What both calls check first: ctx, the shape (as a layer configuration in
 * *cfg), qkv, the backend for its device, and o and lse (the forward's
 * outputs, the backward's inputs). */
static coda_status_t check_common(const char *fn, coda_context_t *ctx, const coda_attention_shape_t *shape,
                                  const coda_tensor_t *qkv, const coda_tensor_t *o, const coda_tensor_t *lse,
                                  coda_llama_config_t *cfg) {
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!qkv) return coda__fail(CODA_ERR_INVALID_ARG, "%s: qkv is NULL", fn);
    CODA_TRY(check_shape(fn, shape, qkv->device, cfg));
    const int64_t m = shape->batch * shape->seq, nq = shape->n_heads * shape->head_dim;
    const int64_t w = nq + 2 * shape->n_kv_heads * shape->head_dim;
    CODA_TRY(check_mat(fn, qkv, "qkv", m, w, CODA_BF16, NULL, 16));
    CODA_TRY(check_backend(fn, qkv->device));
    CODA_TRY(check_mat(fn, o, "o", m, nq, CODA_BF16, qkv, 16));
    return check_mat(fn, lse, "lse", m, shape->n_heads, CODA_F32, qkv, 4);
}

coda_status_t coda_attention_workspace_size(coda_context_t *ctx, coda_device_t device,
                                            const coda_attention_shape_t *shape, size_t *bytes) {
    static const char fn[] = "coda_attention_workspace_size";
    if (!bytes) return coda__fail(CODA_ERR_INVALID_ARG, "%s: bytes is NULL", fn);
    /* *bytes is written on success only (coda.h: a failed call changes nothing) */
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (device != CODA_DEVICE_CPU && device != CODA_DEVICE_CUDA)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: device %d is not a coda_device_t", fn, (int)device);
    coda_llama_config_t cfg;
    CODA_TRY(check_shape(fn, shape, device, &cfg));
    *bytes = coda__attention_ws_bytes(shape, device);
    return CODA_OK;
}

coda_status_t coda_attention_forward(coda_context_t *ctx, const coda_attention_shape_t *shape,
                                     const coda_tensor_t *qkv, coda_tensor_t *o, coda_tensor_t *lse,
                                     void *stream) {
    static const char fn[] = "coda_attention_forward";
    coda_llama_config_t cfg;
    CODA_TRY(check_common(fn, ctx, shape, qkv, o, lse, &cfg));
    {
        const coda_tensor_t *outs[] = {o, lse}, *ins[] = {qkv};
        const char *on[] = {"o", "lse"}, *in[] = {"qkv"};
        CODA_TRY(check_apart(fn, outs, on, 2, ins, in, 1));
    }
    if (qkv->device == CODA_DEVICE_CPU) {
        (void)stream;
        return coda__attention_forward(&cfg, shape->batch, shape->seq, qkv, o, lse, ctx->cpu_threads);
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_attention(ctx, shape, qkv, NULL, lse, NULL, o, NULL, stream);
#else
    return coda__fail(CODA_ERR_INTERNAL, "%s: unreachable", fn);
#endif
}

coda_status_t coda_attention_backward(coda_context_t *ctx, const coda_attention_shape_t *shape,
                                      const coda_tensor_t *qkv, const coda_tensor_t *o,
                                      const coda_tensor_t *lse, const coda_tensor_t *do_,
                                      coda_tensor_t *dqkv, void *workspace, size_t workspace_bytes,
                                      void *stream) {
    static const char fn[] = "coda_attention_backward";
    coda_llama_config_t cfg;
    CODA_TRY(check_common(fn, ctx, shape, qkv, o, lse, &cfg));
    const int64_t m = shape->batch * shape->seq, nq = cfg.n_heads * cfg.head_dim;
    CODA_TRY(check_mat(fn, do_, "do_", m, nq, CODA_BF16, qkv, 16));
    CODA_TRY(check_mat(fn, dqkv, "dqkv", m, qkv->shape[1], CODA_F32, qkv, 8));
    {
        const coda_tensor_t *outs[] = {dqkv}, *ins[] = {qkv, o, lse, do_};
        const char *on[] = {"dqkv"}, *in[] = {"qkv", "o", "lse", "do_"};
        CODA_TRY(check_apart(fn, outs, on, 1, ins, in, 4));
    }
    const size_t need = coda__attention_ws_bytes(shape, qkv->device);
    if (need > 0) {
        if (!workspace)
            return coda__fail(CODA_ERR_INVALID_ARG, "%s: workspace is NULL (%zu bytes needed)", fn, need);
        if (workspace_bytes < need)
            return coda__fail(CODA_ERR_INVALID_ARG, "%s: workspace is %zu bytes, %zu needed", fn,
                              workspace_bytes, need);
        if ((uintptr_t)workspace % 256 != 0)
            return coda__fail(CODA_ERR_STRIDE, "%s: workspace %p is not 256-byte aligned", fn, workspace);
        /* the workspace apart from every tensor */
        coda_tensor_t wt = coda_tensor_1d(workspace, CODA_F32, (int64_t)(need / sizeof(float)));
        wt.device = qkv->device;
        wt.device_index = qkv->device_index;
        const coda_tensor_t *outs[] = {&wt}, *ins[] = {qkv, o, lse, do_, dqkv};
        const char *on[] = {"workspace"}, *in[] = {"qkv", "o", "lse", "do_", "dqkv"};
        CODA_TRY(check_apart(fn, outs, on, 1, ins, in, 5));
    }
    if (qkv->device == CODA_DEVICE_CPU) {
        (void)stream;
        return coda__attention_backward(&cfg, shape->batch, shape->seq, qkv, o, lse, do_, dqkv,
                                        ctx->cpu_threads);
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_attention(ctx, shape, qkv, o, lse, do_, dqkv, workspace, stream);
#else
    return coda__fail(CODA_ERR_INTERNAL, "%s: unreachable", fn);
#endif
}
