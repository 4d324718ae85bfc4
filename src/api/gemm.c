/* gemm.c - coda_gemm: argument checks, then the CPU or CUDA backend.
 *
 * Only what holds on every backend is checked here; the CUDA backend adds its
 * own limits (K % 8, 16-byte row strides) and reports them itself. */
#include "api/gemm_check.h"

#include <math.h>

coda_status_t coda__check_gemm_operands(const char *fn, coda_layout_t layout, const coda_tensor_t *a,
                                        const coda_tensor_t *b, int64_t *m, int64_t *n, int64_t *k) {
    if (layout != CODA_LAYOUT_NT && layout != CODA_LAYOUT_NN && layout != CODA_LAYOUT_TN)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: layout %d is not NT (0), NN (1) or TN (2)", fn,
                          (int)layout);
    if (!a) return coda__fail(CODA_ERR_INVALID_ARG, "%s: a is NULL", fn);
    if (!b) return coda__fail(CODA_ERR_INVALID_ARG, "%s: b is NULL", fn);
    CODA_TRY(coda__check_tensor(a, "a"));
    CODA_TRY(coda__check_tensor(b, "b"));
    if (a->ndim != 2) return coda__fail(CODA_ERR_SHAPE, "%s: a must be 2-D, got %d dims", fn, a->ndim);
    if (b->ndim != 2) return coda__fail(CODA_ERR_SHAPE, "%s: b must be 2-D, got %d dims", fn, b->ndim);
    const coda_dtype_t in_cpu[2] = {CODA_BF16, CODA_F32};
    /* f32 operands are a convenience of the CPU reference backend only. */
    int n_in = a->device == CODA_DEVICE_CPU ? 2 : 1;
    CODA_TRY(coda__check_dtype(a, "a", in_cpu, n_in));
    CODA_TRY(coda__check_dtype(b, "b", in_cpu, n_in));
    if (a->device != b->device || a->device_index != b->device_index)
        return coda__fail(CODA_ERR_DEVICE, "%s: a and b are on different devices", fn);
    static const char *const names[3] = {"NT", "NN", "TN"};
    int64_t ka, kb;
    coda__gemm_extents(layout, a, b, m, n, k);
    switch (layout) {
    case CODA_LAYOUT_NT: ka = a->shape[1]; kb = b->shape[1]; break;
    case CODA_LAYOUT_NN: ka = a->shape[1]; kb = b->shape[0]; break;
    default: ka = a->shape[0]; kb = b->shape[0]; break;
    }
    if (ka != kb)
        return coda__fail(CODA_ERR_SHAPE,
                          "%s: layout %s: a (%lld, %lld) and b (%lld, %lld) disagree on K (%lld vs %lld)",
                          fn, names[layout], (long long)a->shape[0], (long long)a->shape[1],
                          (long long)b->shape[0], (long long)b->shape[1], (long long)ka, (long long)kb);
    return CODA_OK;
}

coda_status_t coda_gemm(coda_context_t *ctx, coda_layout_t layout, const coda_tensor_t *a,
                        const coda_tensor_t *b, coda_tensor_t *c, float alpha, float beta,
                        void *stream) {
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "coda_gemm: ctx is NULL");
    int64_t m = 0, n = 0, k = 0;
    CODA_TRY(coda__check_gemm_operands("coda_gemm", layout, a, b, &m, &n, &k));
    if (!c) return coda__fail(CODA_ERR_INVALID_ARG, "coda_gemm: c is NULL");
    CODA_TRY(coda__check_tensor(c, "c"));
    if (c->ndim != 2) return coda__fail(CODA_ERR_SHAPE, "coda_gemm: c must be 2-D, got %d dims", c->ndim);
    const coda_dtype_t out[2] = {CODA_BF16, CODA_F32};
    CODA_TRY(coda__check_dtype(c, "c", out, 2));
    if (c->shape[0] != m || c->shape[1] != n)
        return coda__fail(CODA_ERR_SHAPE, "coda_gemm: c is (%lld, %lld), expected (M, N) = (%lld, %lld)",
                          (long long)c->shape[0], (long long)c->shape[1], (long long)m, (long long)n);
    if (c->device != a->device || c->device_index != a->device_index)
        return coda__fail(CODA_ERR_DEVICE, "coda_gemm: c is not on the device of a and b");
    if (coda__tensors_overlap(c, a)) return coda__fail(CODA_ERR_OVERLAP, "coda_gemm: c overlaps a");
    if (coda__tensors_overlap(c, b)) return coda__fail(CODA_ERR_OVERLAP, "coda_gemm: c overlaps b");
    if (!isfinite(alpha)) return coda__fail(CODA_ERR_INVALID_ARG, "coda_gemm: alpha is not finite");
    if (!isfinite(beta)) return coda__fail(CODA_ERR_INVALID_ARG, "coda_gemm: beta is not finite");

    if (a->device == CODA_DEVICE_CPU) return coda__cpu_gemm(ctx, layout, a, b, c, alpha, beta);
#ifdef CODA_WITH_CUDA
    return coda__cuda_gemm(ctx, layout, a, b, c, alpha, beta, stream);
#else
    (void)stream;
    return coda__fail(CODA_ERR_UNSUPPORTED, "coda_gemm: CUDA tensors given, but this build has no CUDA backend");
#endif
}
