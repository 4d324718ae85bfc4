/* tensor.c - tensor descriptors: constructors, sizes, validation, overlap. */
#include "core/internal.h"

size_t coda_dtype_size(coda_dtype_t dtype) {
    switch (dtype) {
    case CODA_BF16: return 2;
    case CODA_F32: return 4;
    case CODA_F16: return 2;
    case CODA_FP8_E4M3: return 1;
    case CODA_I32: return 4;
    case CODA_I64: return 8;
    }
    return 0;
}

const char *coda_dtype_name(coda_dtype_t dtype) {
    switch (dtype) {
    case CODA_BF16: return "bf16";
    case CODA_F32: return "f32";
    case CODA_F16: return "f16";
    case CODA_FP8_E4M3: return "fp8e4m3";
    case CODA_I32: return "i32";
    case CODA_I64: return "i64";
    }
    return NULL;
}

static coda_tensor_t make(void *data, coda_dtype_t dtype, int ndim, const int64_t *shape) {
    coda_tensor_t t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = CODA_DEVICE_CPU;
    t.ndim = ndim;
    int64_t s = (int64_t)coda_dtype_size(dtype);
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.stride[d] = s;
        /* an empty dim keeps outer strides valid; an absurd shape saturates
         * (coda__check_tensor then refuses the descriptor) */
        if (__builtin_mul_overflow(s, shape[d] > 1 ? shape[d] : 1, &s)) s = INT64_MAX;
    }
    return t;
}

coda_tensor_t coda_tensor_1d(void *data, coda_dtype_t dtype, int64_t n) {
    int64_t shape[1] = {n};
    return make(data, dtype, 1, shape);
}
coda_tensor_t coda_tensor_2d(void *data, coda_dtype_t dtype, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return make(data, dtype, 2, shape);
}
coda_tensor_t coda_tensor_3d(void *data, coda_dtype_t dtype, int64_t d0, int64_t d1, int64_t d2) {
    int64_t shape[3] = {d0, d1, d2};
    return make(data, dtype, 3, shape);
}

int64_t coda_tensor_numel(const coda_tensor_t *t) {
    if (!t || t->ndim < 1 || t->ndim > CODA_MAX_DIMS) return 0;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(n, t->shape[d], &n)) return INT64_MAX; /* saturate */
    return n;
}

int64_t coda_tensor_span_bytes(const coda_tensor_t *t) {
    if (!t || coda_tensor_numel(t) == 0) return 0;
    int64_t last = 0, off;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &off) ||
            __builtin_add_overflow(last, off, &last))
            return INT64_MAX; /* saturate */
    return last + (int64_t)coda_dtype_size(t->dtype);
}

coda_status_t coda__check_tensor(const coda_tensor_t *t, const char *what) {
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s: tensor descriptor is NULL", what);
    if (!coda_dtype_name(t->dtype))
        return coda__fail(CODA_ERR_DTYPE, "%s: unknown dtype %d", what, (int)t->dtype);
    if (t->device != CODA_DEVICE_CPU && t->device != CODA_DEVICE_CUDA)
        return coda__fail(CODA_ERR_DEVICE, "%s: unknown device %d", what, (int)t->device);
    /* the overlap checks take tensors on different devices (index
     * included) as apart: a CPU tensor with another index would slip past
     * them, and past the device checks that look at CUDA's indices only */
    if (t->device == CODA_DEVICE_CPU ? t->device_index != 0 : t->device_index < 0)
        return coda__fail(CODA_ERR_DEVICE, "%s: device_index %d (%s)", what, t->device_index,
                          t->device == CODA_DEVICE_CPU ? "0 for the CPU" : "a CUDA ordinal is >= 0");
    if (t->ndim < 1 || t->ndim > CODA_MAX_DIMS)
        return coda__fail(CODA_ERR_SHAPE, "%s: ndim %d outside 1..%d", what, t->ndim, CODA_MAX_DIMS);
    int64_t es = (int64_t)coda_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || t->shape[d] > ((int64_t)1 << 40))
            return coda__fail(CODA_ERR_SHAPE, "%s: extent %lld of dim %d out of range", what,
                              (long long)t->shape[d], d);
        if (t->stride[d] <= 0 || t->stride[d] % es != 0)
            return coda__fail(CODA_ERR_STRIDE,
                              "%s: stride %lld of dim %d is not a positive multiple of the %lld-byte element",
                              what, (long long)t->stride[d], d, (long long)es);
    }
    if (t->stride[t->ndim - 1] != es)
        return coda__fail(CODA_ERR_STRIDE, "%s: innermost stride %lld must equal the element size %lld",
                          what, (long long)t->stride[t->ndim - 1], (long long)es);
    /* numel and the byte span must fit comfortably in 64 bits (every later
     * size computation relies on it) */
    int64_t numel = 1, last = 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t off;
        if (__builtin_mul_overflow(numel, t->shape[d], &numel) || numel > ((int64_t)1 << 56) ||
            (t->shape[d] > 0 && (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &off) ||
                                 __builtin_add_overflow(last, off, &last) || last > ((int64_t)1 << 56))))
            return coda__fail(CODA_ERR_SHAPE, "%s: extents and strides describe more than 2^56 bytes", what);
    }
    /* every dimension of extent > 1 must step past the whole block of the
     * dimensions inside it: the bytes from its start to the end of its last
     * element (a size-1 dimension adds nothing and checks nothing, so the
     * block is carried past it: a review found (M, 1, 3) with byte strides
     * (4, 4, 4), rows on top of each other, accepted) */
    int64_t span = es;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] <= 1) continue;
        if (d < t->ndim - 1 && t->stride[d] < span)
            return coda__fail(CODA_ERR_STRIDE, "%s: stride %lld of dim %d makes rows overlap (needs >= %lld)",
                              what, (long long)t->stride[d], d, (long long)span);
        span += (t->shape[d] - 1) * t->stride[d]; /* below 2^56 + es: checked above */
    }
    if (coda_tensor_numel(t) > 0 && !t->data)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: data pointer is NULL", what);
    if ((uintptr_t)t->data % (uintptr_t)es != 0)
        return coda__fail(CODA_ERR_STRIDE, "%s: data pointer %p is not aligned to its %lld-byte element",
                          what, t->data, (long long)es);
    return CODA_OK;
}

coda_status_t coda__check_shape(const coda_tensor_t *t, const char *what, int ndim,
                                const int64_t *shape) {
    CODA_TRY(coda__check_tensor(t, what));
    if (t->ndim != ndim)
        return coda__fail(CODA_ERR_SHAPE, "%s: expected %d dims, got %d", what, ndim, t->ndim);
    for (int d = 0; d < ndim; d++)
        if (shape[d] >= 0 && t->shape[d] != shape[d])
            return coda__fail(CODA_ERR_SHAPE, "%s: dim %d is %lld, expected %lld", what, d,
                              (long long)t->shape[d], (long long)shape[d]);
    return CODA_OK;
}

coda_status_t coda__check_dtype(const coda_tensor_t *t, const char *what,
                                const coda_dtype_t *allowed, int n) {
    for (int i = 0; i < n; i++)
        if (t->dtype == allowed[i]) return CODA_OK;
    const char *name = coda_dtype_name(t->dtype);
    return coda__fail(CODA_ERR_DTYPE, "%s: dtype %s is not supported here", what, name ? name : "?");
}

bool coda__tensors_overlap(const coda_tensor_t *a, const coda_tensor_t *b) {
    if (!a || !b || a->device != b->device || a->device_index != b->device_index) return false;
    int64_t sa = coda_tensor_span_bytes(a), sb = coda_tensor_span_bytes(b);
    if (sa == 0 || sb == 0) return false;
    uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    return a0 < b0 + (uintptr_t)sb && b0 < a0 + (uintptr_t)sa;
}
