/* guard.h - guarded views: every tensor a call is handed sits inside a larger
 * block of memory, and the test proves the call wrote only its outputs' views.
 *
 *   g_make(...)      a block filled with a position-dependent sentinel; the
 *                    view (the coda_tensor_t handed to coda) inside it, with
 *                    guard bytes before and after, row padding, a column
 *                    slice of a wider matrix or an offset base pointer
 *   g_check(...)     after the call: every byte outside an output's view,
 *                    and every byte of an input, is as it was
 *   g_same(...)      after a failing call: nothing changed at all
 *   g_view(...)      the view's elements, gathered into a contiguous host
 *                    array, to compare with a reference run
 *
 * The memory is the backend's: g_mem_t says how to allocate and copy (host
 * memory for the CPU backend, cudaMalloc for CUDA; tests/guard_cases.h runs
 * every entry point through it, tests/test_guard.c on the CPU and
 * tests/gpu/test_guard_gpu.c on the GPU). Header only, like harness.h. */
#ifndef CODA_TEST_GUARD_H
#define CODA_TEST_GUARD_H

#include "harness.h"

typedef struct g_mem {
    coda_device_t device;
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    void (*put)(void *dst, const void *src, size_t n); /* host -> this memory */
    void (*get)(void *dst, const void *src, size_t n); /* this memory -> host */
} g_mem_t;

/* Where a view sits in its block. */
typedef enum g_place {
    G_TIGHT = 0, /* rows back to back (rounded up to the alignment) */
    G_PADDED,    /* rows further apart than their bytes: padding after each  */
    G_SLICE,     /* columns [c0, c0 + cols) of a wider matrix                 */
    G_OFFSET,    /* tight rows, base pointer moved on inside the block        */
    G_NPLACES
} g_place_t;
static const char *const g_place_name[G_NPLACES] = {"tight", "padded", "slice", "offset"};

/* What the call may do to a view: read it, write it (poisoned with NaN
 * first), or both (random data that may be replaced). */
typedef enum g_role { G_IN = 0, G_OUT, G_INOUT } g_role_t;

/* What an input holds. */
typedef enum g_fill {
    G_RANDOM = 0, /* uniform in [-scale, scale)                   */
    G_POSITIVE,   /* uniform in [0.5 scale, 1.5 scale): sums of squares */
    G_TARGETS     /* i32 column indices in [0, range), every 5th -100   */
} g_fill_t;

#define G_GUARD 256 /* sentinel bytes before and after every view's rows */

typedef struct g_buf {
    const g_mem_t *mem;
    const char *name;
    coda_tensor_t t;        /* the view handed to coda                        */
    unsigned char *block;   /* the whole block, in mem                        */
    unsigned char *init;    /* host image of the block as it was filled       */
    size_t bytes;           /* block size                                     */
    size_t off;             /* byte offset of the view's first element        */
    int64_t rows, row_bytes, ld; /* the view: rows of row_bytes, ld bytes apart */
    g_role_t role;
} g_buf_t;

/* Sentinel byte at block offset i: position-dependent, so that a shifted
 * copy of the block shows too, and never a run of one value. */
static inline unsigned char g_sentinel(size_t i) {
    return (unsigned char)(((uint32_t)i * 2654435761u) >> 24) ^ 0xa5u;
}

static inline int64_t g_round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* A view of `shape` (ndim 1..3; dims after the first are contiguous) in a
 * new block. `align`: the base and row stride alignment in bytes the call
 * needs (a multiple of the element size). 1-D views take G_TIGHT or
 * G_OFFSET only (a vector's stride is its element size). */
static inline void g_make(g_buf_t *b, const g_mem_t *mem, const char *name, coda_dtype_t dt, int ndim,
                          const int64_t *shape, g_place_t place, int64_t align, g_role_t role,
                          g_fill_t fill, float scale, int64_t range, h_rng *r) {
    int64_t es = (int64_t)coda_dtype_size(dt);
    if (align < es) align = es;
    int64_t rows = shape[0], inner = 1;
    for (int d = 1; d < ndim; d++) inner *= shape[d];
    if (ndim == 1 && (place == G_PADDED || place == G_SLICE)) place = G_OFFSET;
    int64_t row_bytes = inner * es;
    int64_t c0 = place == G_SLICE ? align * (1 + (int64_t)(rng_uniform(r) + 1.0f)) : 0;
    int64_t ld = ndim == 1 ? es : g_round_up(c0 + row_bytes, align);
    if (place == G_PADDED || place == G_SLICE) ld += align * (1 + (int64_t)(rng_uniform(r) + 1.0f));
    int64_t lead = place == G_OFFSET ? align * (1 + (int64_t)(2.0f * (rng_uniform(r) + 1.0f))) : 0;
    b->mem = mem;
    b->name = name;
    b->role = role;
    b->rows = rows;
    b->row_bytes = ndim == 1 ? es : row_bytes;
    b->ld = ld;
    b->off = (size_t)(G_GUARD + lead + c0);
    b->bytes = (size_t)(G_GUARD + lead + (rows > 0 ? rows : 1) * ld + G_GUARD);
    b->init = h_alloc(b->bytes);
    for (size_t i = 0; i < b->bytes; i++) b->init[i] = g_sentinel(i);
    /* the view's elements */
    for (int64_t i = 0; i < rows; i++) {
        unsigned char *row = b->init + b->off + i * ld;
        int64_t n = b->row_bytes / es;
        for (int64_t j = 0; j < n; j++) {
            unsigned char *e = row + j * es;
            if (role == G_OUT) {
                if (dt == CODA_BF16) { uint16_t v = 0x7fc1; memcpy(e, &v, 2); }
                else if (dt == CODA_F32) { float v = NAN; memcpy(e, &v, 4); }
                else { int32_t v = INT32_MIN; memcpy(e, &v, 4); }
                continue;
            }
            float u = rng_uniform(r);
            if (dt == CODA_I32) {
                int32_t v = (i + j) % 5 == 4 ? -100 : (int32_t)((u + 1.0f) * 0.5f * (float)(range - 1) + 0.5f);
                if (fill != G_TARGETS) v = (int32_t)(u * 100);
                memcpy(e, &v, 4);
                continue;
            }
            float v = fill == G_POSITIVE ? (1.0f + 0.5f * u) * scale : u * scale;
            if (dt == CODA_BF16) { uint16_t h = h_f2bf(v); memcpy(e, &h, 2); }
            else memcpy(e, &v, 4);
        }
    }
    b->block = mem->alloc(b->bytes);
    mem->put(b->block, b->init, b->bytes);
    coda_tensor_t t;
    memset(&t, 0, sizeof t);
    t.data = b->block + b->off;
    t.dtype = dt;
    t.device = mem->device;
    t.ndim = ndim;
    for (int d = 0; d < ndim; d++) t.shape[d] = shape[d];
    t.stride[ndim - 1] = es;
    for (int d = ndim - 2; d >= 0; d--) t.stride[d] = t.stride[d + 1] * shape[d + 1];
    if (ndim > 1) t.stride[0] = ld;
    b->t = t;
}

static inline void g_free(g_buf_t *b) {
    if (b->block) b->mem->release(b->block);
    free(b->init);
    memset(b, 0, sizeof *b);
}

/* Is block offset i one of the view's bytes? */
static inline int g_in_view(const g_buf_t *b, size_t i) {
    if (i < b->off) return 0;
    int64_t o = (int64_t)(i - b->off);
    return o / b->ld < b->rows && o % b->ld < b->row_bytes;
}

/* After a call that returned CODA_OK: the bytes it may not touch are as
 * they were (outside an output's view; all of an input). Returns the count
 * of changed bytes; the first is reported as a CHECK failure with where it
 * lies. `what` names the call. */
static inline int64_t g_check(const g_buf_t *b, const char *what) {
    unsigned char *now = h_alloc(b->bytes);
    b->mem->get(now, b->block, b->bytes);
    int64_t bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < b->bytes; i++) {
        if (now[i] == b->init[i]) continue;
        if (b->role != G_IN && g_in_view(b, i)) continue;
        if (!bad) first = i;
        bad++;
    }
    if (bad) {
        const char *where = "inside the view (an input changed)";
        int64_t row = -1, col = -1;
        if (first < b->off) where = "before the view";
        else {
            int64_t o = (int64_t)(first - b->off);
            row = o / b->ld;
            col = o % b->ld;
            if (row >= b->rows) where = "after the view's last row";
            else if (col >= b->row_bytes) where = "in the row padding (past the last column)";
        }
        CHECK(0, "%s: %s: %lld bytes changed outside what it may write; first at block byte %zu, %s "
                 "(view row %lld, byte %lld of a %lld-byte row, stride %lld)",
              what, b->name, (long long)bad, first, where, (long long)row, (long long)col,
              (long long)b->row_bytes, (long long)b->ld);
    } else {
        CHECK(1, "guard");
    }
    free(now);
    return bad;
}

/* After a call that failed: not one byte of the block changed. */
static inline int g_same(const g_buf_t *b, const char *what) {
    unsigned char *now = h_alloc(b->bytes);
    b->mem->get(now, b->block, b->bytes);
    int same = memcmp(now, b->init, b->bytes) == 0;
    CHECK(same, "%s failed but changed %s", what, b->name);
    free(now);
    return same;
}

/* Take the block as it is now as the image later checks compare with (after
 * a step whose writes were checked, before the next). */
static inline void g_rebase(g_buf_t *b) { b->mem->get(b->init, b->block, b->bytes); }

/* The view's elements, contiguous (rows x row_bytes), from memory (now = 1)
 * or from the image it was filled with (now = 0). malloc'd. */
static inline void *g_view(const g_buf_t *b, int now) {
    unsigned char *img = b->init, *got = NULL;
    if (now) {
        got = h_alloc(b->bytes);
        b->mem->get(got, b->block, b->bytes);
        img = got;
    }
    unsigned char *out = h_alloc((size_t)(b->rows * b->row_bytes));
    for (int64_t i = 0; i < b->rows; i++)
        memcpy(out + i * b->row_bytes, img + b->off + i * b->ld, (size_t)b->row_bytes);
    free(got);
    return out;
}

/* A contiguous host tensor of b's shape holding b's initial elements (what
 * the reference run reads), or, for an output, its poison. */
static inline coda_tensor_t g_host_copy(const g_buf_t *b) {
    coda_tensor_t t = b->t;
    t.data = g_view(b, 0);
    t.device = CODA_DEVICE_CPU;
    t.device_index = 0;
    int64_t es = (int64_t)coda_dtype_size(t.dtype);
    t.stride[t.ndim - 1] = es;
    for (int d = t.ndim - 2; d >= 0; d--) t.stride[d] = t.stride[d + 1] * t.shape[d + 1];
    return t;
}

/* Compare n elements of dtype dt: got (the guarded run) against want (the
 * reference run). NaN and inf must sit in the same places; the normalised
 * error ||got - want|| / ||want|| must be <= tol (0: bit for bit). */
static inline int g_compare(const char *what, const char *name, coda_dtype_t dt, const void *got,
                            const void *want, int64_t n, double tol) {
    if (tol == 0) {
        int same = memcmp(got, want, (size_t)n * coda_dtype_size(dt)) == 0;
        CHECK(same, "%s: %s differs from the reference run (bit for bit expected)", what, name);
        return same;
    }
    double num = 0, den = 0;
    int64_t nan_bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double g, w;
        if (dt == CODA_BF16) g = h_bf2f(((const uint16_t *)got)[i]), w = h_bf2f(((const uint16_t *)want)[i]);
        else if (dt == CODA_F32) g = ((const float *)got)[i], w = ((const float *)want)[i];
        else g = ((const int32_t *)got)[i], w = ((const int32_t *)want)[i];
        if (isnan(g) != isnan(w) || isinf(g) != isinf(w) || (isinf(g) && (g > 0) != (w > 0))) {
            nan_bad++;
            continue;
        }
        if (!isfinite(g)) continue;
        num += (g - w) * (g - w);
        den += w * w;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int ok = nan_bad == 0 && rel <= tol;
    CHECK(ok, "%s: %s: rel err %.3g (tol %.3g), %lld NaN/inf mismatches", what, name, rel, tol,
          (long long)nan_bad);
    return ok;
}

#endif
