/* llama_mem.c - memory on the layer's device: allocation, copies between the
 * CPU and the device (any row strides), zeroing.
 *
 * On the CPU these are aligned_alloc / memcpy / memset; on CUDA the backend's
 * memory calls (core/context.h, src/cuda/memory.c), queued on the caller's
 * stream so they are ordered with the GEMMs on it. A copy into host memory
 * waits for the stream, because the layer's host steps read it next. */
#include "layer/llama.h"
#include "core/context.h"

#include <stdio.h>
#include <stdlib.h>

struct coda__llama_mem {
    const char *owner; /* the call that made it, for messages: coda_llama_create, coda_block_create */
    coda_context_t *ctx;
    coda_device_t device;
    int device_index;
};

coda_status_t coda__llama_mem_open(coda_context_t *ctx, coda_device_t device, int device_index, const char *fn,
                                   coda__llama_mem_t **out) {
#ifndef CODA_WITH_CUDA
    if (device != CODA_DEVICE_CPU)
        return coda__fail(CODA_ERR_UNSUPPORTED, "%s: CUDA device asked for, but this build has no CUDA backend", fn);
#endif
    coda__llama_mem_t *m = calloc(1, sizeof *m);
    if (!m) return coda__fail(CODA_ERR_NO_MEMORY, "%s: out of memory", fn);
    m->owner = fn;
    m->ctx = ctx;
    m->device = device;
    m->device_index = device_index;
    *out = m;
    return CODA_OK;
}

void coda__llama_mem_close(coda__llama_mem_t *m) { free(m); }

#ifndef CODA_WITH_CUDA
static coda_status_t no_cuda(const char *what) {
    return coda__fail(CODA_ERR_UNSUPPORTED, "%s: CUDA tensor, but this build has no CUDA backend", what);
}
#endif

coda_status_t coda__llama_mem_alloc(coda__llama_mem_t *m, size_t bytes, void **p) {
    bytes = (bytes ? bytes + 255 : 256) / 256 * 256; /* 256-byte aligned sizes: 16-byte rows stay legal */
    if (m->device == CODA_DEVICE_CPU) {
        *p = aligned_alloc(256, bytes);
        if (!*p) return coda__fail(CODA_ERR_NO_MEMORY, "%s: out of memory (%zu bytes)", m->owner, bytes);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    char what[64];
    snprintf(what, sizeof what, "%s: cuMemAlloc", m->owner);
    coda_status_t s = coda__cuda_alloc(m->ctx, m->device_index, bytes, p, what);
    /* the device's own messages (no driver, no such device) do not say
     * which call failed */
    if (s != CODA_OK && strncmp(coda_last_error(), m->owner, strlen(m->owner)) != 0)
        coda__fail(s, "%s: %s", m->owner, coda_last_error());
    return s;
#else
    return no_cuda(m->owner);
#endif
}

void coda__llama_mem_free(coda__llama_mem_t *m, void *p) {
    if (!m || !p) return;
    if (m->device == CODA_DEVICE_CPU) {
        free(p);
        return;
    }
#ifdef CODA_WITH_CUDA
    coda__cuda_release(m->ctx, m->device_index, p);
#endif
}

/* Rows, bytes per row and row pitch of a 1-D or 2-D tensor. A vector is one
 * row when `whole` (contiguous), else one row per element. */
static void rows_of(const coda_tensor_t *t, int whole, size_t *rows, size_t *row_bytes, size_t *pitch) {
    size_t es = coda_dtype_size(t->dtype);
    if (t->ndim == 1) {
        *rows = whole ? (t->shape[0] ? 1 : 0) : (size_t)t->shape[0];
        *row_bytes = whole ? es * (size_t)t->shape[0] : es;
        *pitch = whole ? *row_bytes : (size_t)t->stride[0];
        return;
    }
    *rows = (size_t)t->shape[0];
    *row_bytes = es * (size_t)t->shape[1];
    *pitch = (size_t)t->stride[0];
}

static int contiguous_vec(const coda_tensor_t *t) {
    return t->ndim == 1 && t->stride[0] == (int64_t)coda_dtype_size(t->dtype);
}

coda_status_t coda__llama_mem_copy(coda__llama_mem_t *m, const coda_tensor_t *src, coda_tensor_t *dst,
                                   void *stream) {
    if (src->data == dst->data && src->device == dst->device) return CODA_OK; /* a CPU alias */
    size_t rows, rb, sp, dr, drb, dp;
    int whole = contiguous_vec(src) && contiguous_vec(dst);
    rows_of(src, whole, &rows, &rb, &sp);
    rows_of(dst, whole, &dr, &drb, &dp);
    if (rows != dr || rb != drb)
        return coda__fail(CODA_ERR_INTERNAL, "layer copy: extents differ (%zu x %zu vs %zu x %zu bytes)", rows, rb,
                          dr, drb);
    if (src->device == CODA_DEVICE_CPU && dst->device == CODA_DEVICE_CPU) {
        for (size_t i = 0; i < rows; i++) memcpy((char *)dst->data + i * dp, (const char *)src->data + i * sp, rb);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_copy_2d(m->ctx, m->device_index, dst->data, dp, dst->device == CODA_DEVICE_CPU, src->data, sp,
                              src->device == CODA_DEVICE_CPU, rb, rows, stream, "layer copy: cuMemcpy2DAsync");
#else
    (void)stream;
    return no_cuda("layer copy");
#endif
}

coda_status_t coda__llama_mem_zero(coda__llama_mem_t *m, coda_tensor_t *t, void *stream) {
    size_t rows, rb, pitch;
    rows_of(t, contiguous_vec(t), &rows, &rb, &pitch);
    if (t->device == CODA_DEVICE_CPU) {
        for (size_t i = 0; i < rows; i++) memset((char *)t->data + i * pitch, 0, rb);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_zero_2d(m->ctx, m->device_index, t->data, pitch, rb, rows, stream,
                              "layer zero: cuMemsetD2D8Async");
#else
    (void)stream;
    return no_cuda("layer zero");
#endif
}

coda_status_t coda__llama_mem_sync(coda__llama_mem_t *m, void *stream) {
#ifdef CODA_WITH_CUDA
    if (m->device == CODA_DEVICE_CUDA)
        return coda__cuda_sync(m->ctx, m->device_index, stream, "cuStreamSynchronize");
#else
    (void)m;
    (void)stream;
#endif
    return CODA_OK;
}
