/* scale.c - coda_scale: t *= s[0] in place, s a one-element f32 tensor on
 * t's device (coda.h section 10). The argument checks for both backends and
 * the CPU loop, the reference, here; CUDA tensors go to src/cuda/lm_steps.c
 * (kernels/lm_steps.cuh: coda_scale_kernel, the same products).
 *
 * Why it exists: coda_lm_loss makes dx and dw in the forward call, and the
 * backward that follows has grad_output only as a device value. Multiplying
 * by it through the framework costs a pass over dw, (V, d), even when it is
 * 1, the usual case; reading it on the host to skip that costs a stream
 * sync. This kernel reads it on the device and stops when it is 1. */
#include "core/context.h"
#include "core/lm_steps.h"

coda_status_t coda_scale(coda_context_t *ctx, coda_tensor_t *t, const coda_tensor_t *s, void *stream) {
    static const char fn[] = "coda_scale";
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s: t is NULL", fn);
    if (!s) return coda__fail(CODA_ERR_INVALID_ARG, "%s: s is NULL", fn);
    CODA_TRY(coda__check_tensor(t, "t"));
    CODA_TRY(coda__check_tensor(s, "s"));
    if (t->ndim > 2) return coda__fail(CODA_ERR_SHAPE, "%s: t must be 1-D or 2-D, got %d dims", fn, t->ndim);
    if (t->dtype != CODA_BF16 && t->dtype != CODA_F32)
        return coda__fail(CODA_ERR_DTYPE, "%s: t must be bf16 or f32, got %s", fn, coda_dtype_name(t->dtype));
    if (s->ndim != 1 || s->shape[0] != 1)
        return coda__fail(CODA_ERR_SHAPE, "%s: s must be 1-D of one element", fn);
    if (s->dtype != CODA_F32)
        return coda__fail(CODA_ERR_DTYPE, "%s: s must be f32, got %s", fn, coda_dtype_name(s->dtype));
    if (s->device != t->device || s->device_index != t->device_index)
        return coda__fail(CODA_ERR_DEVICE, "%s: s is not on t's device", fn);
    if (coda__tensors_overlap(t, s)) return coda__fail(CODA_ERR_OVERLAP, "%s: s overlaps t", fn);
    if (coda_tensor_numel(t) == 0) return CODA_OK;
#ifdef CODA_WITH_CUDA
    if (t->device == CODA_DEVICE_CUDA) return coda__cuda_scale(ctx, t, s, stream);
#endif
    if (t->device != CODA_DEVICE_CPU)
        return coda__fail(CODA_ERR_UNSUPPORTED, "%s: CUDA tensors, but this build has no CUDA backend", fn);
    (void)stream;
    const float g = t->dtype == CODA_BF16 ? coda__round_bf16(*(const float *)s->data) : *(const float *)s->data;
    if (g == 1.0f) return CODA_OK;
    const int two = t->ndim == 2;
    const int64_t rows = two ? t->shape[0] : 1, cols = t->shape[two];
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            void *p = two ? coda__at2(t, i, j) : coda__at1(t, j);
            coda__store_f32(p, t->dtype, coda__load_f32(p, t->dtype) * g);
        }
    return CODA_OK;
}
