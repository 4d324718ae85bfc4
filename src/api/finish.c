/* finish.c - the finishing steps: combine tile partials into row or column
 * results, in the fixed order t = 0..T-1 (bitwise reproducible, no atomics).
 * Argument checks for both backends, the CPU implementation here; CUDA
 * tensors go to src/cuda/finish_gpu.c (kernels/finish.cuh, the same
 * operations in the same order).
 *
 * The NaN rule (coda.h sections 5 and 7): a NaN partial gives a NaN result,
 * max included (nan_max: fmaxf would drop it), and infinities give no NaN
 * the math does not: exp(m_t - m) is taken as 1 when m_t == m, so a row
 * whose tiles are all -inf (m_t = -inf, l_t = 0) gives lse = -inf, and one
 * with a +inf tile (m_t = +inf, l_t = +inf) gives lse = +inf, never
 * inf - inf. */
#include "core/context.h"

#include <math.h>

static coda_status_t check_common(const char *fn, coda_context_t *ctx, const coda_tensor_t *partials,
                                  int ndim, const char *what) {
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!partials) return coda__fail(CODA_ERR_INVALID_ARG, "%s: partials is NULL", fn);
    CODA_TRY(coda__check_tensor(partials, "partials"));
    if (partials->ndim != ndim)
        return coda__fail(CODA_ERR_SHAPE, "%s: partials must be %s, got %d dims", fn, what, partials->ndim);
    if (partials->dtype != CODA_F32)
        return coda__fail(CODA_ERR_DTYPE, "%s: partials must be f32, got %s", fn,
                          coda_dtype_name(partials->dtype));
    return CODA_OK;
}

/* A 1-D (rows) tensor of dtype dt on the device of partials. */
static coda_status_t check_vec(const char *fn, const coda_tensor_t *t, const char *name, int64_t rows,
                               coda_dtype_t dt, const coda_tensor_t *partials) {
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %s is NULL", fn, name);
    CODA_TRY(coda__check_tensor(t, name));
    if (t->ndim != 1 || t->shape[0] != rows)
        return coda__fail(CODA_ERR_SHAPE, "%s: %s must be 1-D of %lld elements (rows of partials)", fn,
                          name, (long long)rows);
    if (t->dtype != dt)
        return coda__fail(CODA_ERR_DTYPE, "%s: %s must be %s, got %s", fn, name, coda_dtype_name(dt),
                          coda_dtype_name(t->dtype));
    if (t->device != partials->device || t->device_index != partials->device_index)
        return coda__fail(CODA_ERR_DEVICE, "%s: %s is not on the device of partials", fn, name);
    return CODA_OK;
}

/* Without a CUDA backend in the build, CUDA tensors are refused. */
static coda_status_t cuda_refused(const char *fn, const coda_tensor_t *partials) {
    if (partials->device == CODA_DEVICE_CPU) return CODA_OK;
    return coda__fail(CODA_ERR_UNSUPPORTED, "%s: this build has no CUDA backend", fn);
}

/* max that keeps a NaN (the epilogue's max reductions use the same rule) */
static inline float nan_max(float a, float b) { return isnan(a) || isnan(b) ? NAN : fmaxf(a, b); }

static float pget(const coda_tensor_t *p, int64_t i, int64_t t) {
    return *(const float *)coda__at2(p, i, t);
}

/* Sum of row i of (R, T) partials, t in increasing order. */
static float row_sum(const coda_tensor_t *p, int64_t i) {
    float s = 0.0f;
    for (int64_t t = 0; t < p->shape[1]; t++) s += pget(p, i, t);
    return s;
}

coda_status_t coda_finish_reduce(coda_context_t *ctx, coda_reduce_t op, const coda_tensor_t *partials,
                                 coda_tensor_t *out, void *stream) {
    static const char fn[] = "coda_finish_reduce";
    CODA_TRY(check_common(fn, ctx, partials, 2, "2-D (R, T)"));
    if (op != CODA_REDUCE_SUM && op != CODA_REDUCE_MAX && op != CODA_REDUCE_SUMSQ)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: op %d is not SUM (0), MAX (1) or SUMSQ (2)", fn, (int)op);
    CODA_TRY(check_vec(fn, out, "out", partials->shape[0], CODA_F32, partials));
    if (coda__tensors_overlap(out, partials))
        return coda__fail(CODA_ERR_OVERLAP, "%s: out overlaps partials", fn);
#ifdef CODA_WITH_CUDA
    if (partials->device == CODA_DEVICE_CUDA) return coda__cuda_finish_reduce(ctx, op, partials, out, stream);
#endif
    CODA_TRY(cuda_refused(fn, partials));
    (void)stream;
    for (int64_t i = 0; i < partials->shape[0]; i++) {
        float r;
        if (op == CODA_REDUCE_MAX) {
            r = -INFINITY;
            for (int64_t t = 0; t < partials->shape[1]; t++) r = nan_max(r, pget(partials, i, t));
        } else {
            r = row_sum(partials, i); /* SUMSQ partials are already squared */
        }
        *(float *)coda__at1(out, i) = r;
    }
    return CODA_OK;
}

coda_status_t coda_finish_rstd(coda_context_t *ctx, const coda_tensor_t *partials, int64_t d, float eps,
                               coda_tensor_t *rstd, void *stream) {
    static const char fn[] = "coda_finish_rstd";
    CODA_TRY(check_common(fn, ctx, partials, 2, "2-D (M, T)"));
    if (d <= 0) return coda__fail(CODA_ERR_INVALID_ARG, "%s: d %lld must be positive", fn, (long long)d);
    if (!isfinite(eps) || eps < 0.0f)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: eps %g must be finite and >= 0", fn, (double)eps);
    CODA_TRY(check_vec(fn, rstd, "rstd", partials->shape[0], CODA_F32, partials));
    if (coda__tensors_overlap(rstd, partials))
        return coda__fail(CODA_ERR_OVERLAP, "%s: rstd overlaps partials", fn);
#ifdef CODA_WITH_CUDA
    if (partials->device == CODA_DEVICE_CUDA) return coda__cuda_finish_rstd(ctx, partials, d, eps, rstd, stream);
#endif
    CODA_TRY(cuda_refused(fn, partials));
    (void)stream;
    for (int64_t i = 0; i < partials->shape[0]; i++)
        *(float *)coda__at1(rstd, i) = 1.0f / sqrtf(row_sum(partials, i) / (float)d + eps);
    return CODA_OK;
}

coda_status_t coda_finish_lse(coda_context_t *ctx, const coda_tensor_t *partials, const coda_tensor_t *targets,
                              int32_t ignore_index, coda_tensor_t *lse, coda_tensor_t *loss, void *stream) {
    static const char fn[] = "coda_finish_lse";
    CODA_TRY(check_common(fn, ctx, partials, 3, "3-D (M, T, 3)"));
    if (partials->shape[2] != 3)
        return coda__fail(CODA_ERR_SHAPE, "%s: partials must be (M, T, 3), last extent is %lld", fn,
                          (long long)partials->shape[2]);
    int64_t m = partials->shape[0], nt = partials->shape[1];
    CODA_TRY(check_vec(fn, targets, "targets", m, CODA_I32, partials));
    CODA_TRY(check_vec(fn, lse, "lse", m, CODA_F32, partials));
    CODA_TRY(check_vec(fn, loss, "loss", m, CODA_F32, partials));
    if (coda__tensors_overlap(lse, partials) || coda__tensors_overlap(lse, targets))
        return coda__fail(CODA_ERR_OVERLAP, "%s: lse overlaps an input", fn);
    if (coda__tensors_overlap(loss, partials) || coda__tensors_overlap(loss, targets))
        return coda__fail(CODA_ERR_OVERLAP, "%s: loss overlaps an input", fn);
    if (coda__tensors_overlap(lse, loss)) return coda__fail(CODA_ERR_OVERLAP, "%s: lse and loss overlap", fn);
#ifdef CODA_WITH_CUDA
    if (partials->device == CODA_DEVICE_CUDA)
        return coda__cuda_finish_lse(ctx, partials, targets, ignore_index, lse, loss, stream);
#endif
    CODA_TRY(cuda_refused(fn, partials));
    (void)stream;
    int64_t s2 = partials->stride[2];
    for (int64_t i = 0; i < m; i++) {
        float mx = -INFINITY, l = 0.0f, p = 0.0f;
        for (int64_t t = 0; t < nt; t++) mx = nan_max(mx, pget(partials, i, t));
        for (int64_t t = 0; t < nt; t++) {
            const char *e = coda__at2(partials, i, t);
            float mt = *(const float *)e, lt = *(const float *)(e + s2);
            /* mt == mx: 1, not exp(mt - mx), which is NaN for mt = mx = +-inf;
             * mx NaN: exp(NaN) makes l NaN */
            l += lt * (mt == mx ? 1.0f : expf(mt - mx));
            p += *(const float *)(e + 2 * s2);
        }
        float v = mx + logf(l);
        int32_t tg = *(const int32_t *)coda__at1(targets, i);
        *(float *)coda__at1(lse, i) = v;
        *(float *)coda__at1(loss, i) = tg == ignore_index ? 0.0f : v - p;
    }
    return CODA_OK;
}
