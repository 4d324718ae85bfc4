/* internal.h - helpers shared by every part of the library (not public). */
#ifndef CODA_INTERNAL_H
#define CODA_INTERNAL_H

#include "coda.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__)
#define CODA_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CODA_PRINTF(f, a)
#endif

/* Record a message for coda_last_error() and return status. Use as
 *     return coda__fail(CODA_ERR_SHAPE, "a: expected %d dims, got %d", 2, t->ndim);
 * An argument may be coda_last_error() itself (context around a callee's). */
coda_status_t coda__fail(coda_status_t status, const char *fmt, ...) CODA_PRINTF(2, 3);

/* A query that calls something which may fail (opening the driver, looking
 * up a device) and then goes on without it is not a failing call, so it
 * must leave coda_last_error() as the caller's last failing call left it:
 *     coda__error_kept_t k; coda__error_keep(&k); ...; coda__error_restore(&k); */
typedef struct {
    char msg[1024];
} coda__error_kept_t;
void coda__error_keep(coda__error_kept_t *k);
void coda__error_restore(const coda__error_kept_t *k);

/* Propagate a failure: the callee already set the message. */
#define CODA_TRY(expr)                         \
    do {                                       \
        coda_status_t coda__s = (expr);        \
        if (coda__s != CODA_OK) return coda__s; \
    } while (0)

/* ---- tensor checks (src/core/tensor.c). `what` names the argument. ---- */

/* Well-formed descriptor: non-null data, known dtype, 1..4 dims, non-negative
 * extents, innermost stride == element size, strides multiples of the element
 * size, no overlap of rows (stride[d] >= shape[d+1] * stride[d+1]). */
coda_status_t coda__check_tensor(const coda_tensor_t *t, const char *what);

/* check_tensor + exact ndim and extents (-1 in `shape` accepts any extent). */
coda_status_t coda__check_shape(const coda_tensor_t *t, const char *what, int ndim,
                                const int64_t *shape);
/* dtype must be one of the `n` listed. */
coda_status_t coda__check_dtype(const coda_tensor_t *t, const char *what,
                                const coda_dtype_t *allowed, int n);
/* Byte ranges [data, data+span) intersect, on the same device. */
bool coda__tensors_overlap(const coda_tensor_t *a, const coda_tensor_t *b);

/* Element address of a 2-D tensor. */
static inline void *coda__at2(const coda_tensor_t *t, int64_t i, int64_t j) {
    return (char *)t->data + i * t->stride[0] + j * t->stride[1];
}
static inline void *coda__at1(const coda_tensor_t *t, int64_t i) {
    return (char *)t->data + i * t->stride[0];
}

/* ---- bf16 <-> f32, round to nearest even (NaN stays NaN) ---- */

static inline float coda__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t coda__f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float coda__round_bf16(float f) { return coda__bf16_to_f32(coda__f32_to_bf16(f)); }

/* Load / store one element of any supported dtype as f32. */
static inline float coda__load_f32(const void *p, coda_dtype_t dt) {
    switch (dt) {
    case CODA_BF16: return coda__bf16_to_f32(*(const uint16_t *)p);
    case CODA_F32: return *(const float *)p;
    case CODA_I32: return (float)*(const int32_t *)p;
    default: return 0.0f;
    }
}
static inline void coda__store_f32(void *p, coda_dtype_t dt, float v) {
    switch (dt) {
    case CODA_BF16: *(uint16_t *)p = coda__f32_to_bf16(v); break;
    case CODA_F32: *(float *)p = v; break;
    case CODA_I32: *(int32_t *)p = (int32_t)v; break;
    default: break;
    }
}

static inline int64_t coda__cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* FNV-1a, 64 bit, continued from h. Two different seeds give a 128-bit key
 * (kernel caches). About 4 cycles a byte: hash a text once and keep the key. */
static inline uint64_t coda__hash(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}
#define CODA_HASH_SEED0 0xcbf29ce484222325ull
#define CODA_HASH_SEED1 0x84222325cbf29ce4ull

#endif
