/* llama_mem.c - memory on the layer's device: allocation, copies between the
 * CPU and the device (any row strides), zeroing.
 *
 * On the CPU these are malloc / memcpy / memset. On CUDA they use the driver
 * the CUDA backend opened (its dlopen handle; the entry points are looked up
 * here, so the backend's table stays as it is). Copies and fills are queued on
 * the caller's stream, so they are ordered with the GEMMs on it (also when it
 * is a non-blocking stream, as PyTorch's side streams are); a copy into host
 * memory then waits for the stream, because the layer's host steps (attention
 * and the other CPU steps, until they have GPU kernels) read it next. */
#include "layer/llama.h"
#include "core/context.h"

#include <stdlib.h>

#ifdef CODA_WITH_CUDA
#include "cuda/backend.h"
#include <dlfcn.h>
#endif

struct coda__llama_mem {
    coda_device_t device;
    int device_index;
#ifdef CODA_WITH_CUDA
    struct coda_cuda *cuda;
    coda_cuda_device_t *dev;
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*Memcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
    CUresult (*MemsetD2D8Async)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);
    CUresult (*StreamSynchronize)(CUstream);
#endif
};

coda_status_t coda__llama_mem_open(coda_context_t *ctx, coda_device_t device, int device_index,
                                   coda__llama_mem_t **out) {
    coda__llama_mem_t *m = calloc(1, sizeof *m);
    if (!m) return coda__fail(CODA_ERR_NO_MEMORY, "coda_llama_create: out of memory");
    m->device = device;
    m->device_index = device_index;
    if (device == CODA_DEVICE_CPU) {
        *out = m;
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    coda_status_t s = coda__cuda_get(ctx, &m->cuda);
    if (s == CODA_OK) s = coda__cuda_device(ctx, device_index, &m->dev);
    struct { void **slot; const char *sym; } t[] = {
        {(void **)&m->MemAlloc, "cuMemAlloc_v2"},
        {(void **)&m->MemFree, "cuMemFree_v2"},
        {(void **)&m->Memcpy2DAsync, "cuMemcpy2DAsync_v2"},
        {(void **)&m->MemsetD2D8Async, "cuMemsetD2D8Async"},
        {(void **)&m->StreamSynchronize, "cuStreamSynchronize"},
    };
    for (size_t i = 0; s == CODA_OK && i < sizeof t / sizeof t[0]; i++) {
        *t[i].slot = dlsym(m->cuda->lib, t[i].sym);
        if (!*t[i].slot) s = coda__fail(CODA_ERR_DEVICE, "coda_llama_create: the CUDA driver has no %s", t[i].sym);
    }
    if (s != CODA_OK) {
        free(m);
        return s;
    }
    *out = m;
    return CODA_OK;
#else
    (void)ctx;
    free(m);
    return coda__fail(CODA_ERR_DEVICE, "coda_llama_create: CUDA device asked for, but this build has no CUDA backend");
#endif
}

void coda__llama_mem_close(coda__llama_mem_t *m) { free(m); }

#ifdef CODA_WITH_CUDA
/* Run a driver call with the device's context current. */
#define WITH_CTX(m, call, what)                                                    \
    do {                                                                           \
        CODA_CU((m)->cuda, (m)->cuda->cu.CtxPushCurrent((m)->dev->pctx), "cuCtxPushCurrent"); \
        CUresult r_ = (call);                                                      \
        CUcontext prev_;                                                           \
        (m)->cuda->cu.CtxPopCurrent(&prev_);                                       \
        if (r_ != CUDA_SUCCESS) return coda__cu_fail((m)->cuda, r_, (what));       \
    } while (0)
#endif

coda_status_t coda__llama_mem_alloc(coda__llama_mem_t *m, size_t bytes, void **p) {
    bytes = (bytes ? bytes + 255 : 256) / 256 * 256; /* 256-byte aligned sizes: 16-byte rows stay legal */
    if (m->device == CODA_DEVICE_CPU) {
        *p = aligned_alloc(256, bytes);
        if (!*p) return coda__fail(CODA_ERR_NO_MEMORY, "coda_llama_create: out of memory (%zu bytes)", bytes);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    CUdeviceptr d = 0;
    WITH_CTX(m, m->MemAlloc(&d, bytes), "coda_llama_create: cuMemAlloc");
    *p = (void *)(uintptr_t)d;
    return CODA_OK;
#else
    return coda__fail(CODA_ERR_DEVICE, "no CUDA backend");
#endif
}

void coda__llama_mem_free(coda__llama_mem_t *m, void *p) {
    if (!m || !p) return;
    if (m->device == CODA_DEVICE_CPU) {
        free(p);
        return;
    }
#ifdef CODA_WITH_CUDA
    if (m->cuda->cu.CtxPushCurrent(m->dev->pctx) == CUDA_SUCCESS) {
        m->MemFree((CUdeviceptr)(uintptr_t)p);
        CUcontext prev;
        m->cuda->cu.CtxPopCurrent(&prev);
    }
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
    if (rows == 0 || rb == 0) return CODA_OK;
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    if (src->device == CODA_DEVICE_CPU) {
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = src->data;
    } else {
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = (CUdeviceptr)(uintptr_t)src->data;
    }
    if (dst->device == CODA_DEVICE_CPU) {
        c.dstMemoryType = CU_MEMORYTYPE_HOST;
        c.dstHost = dst->data;
    } else {
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = (CUdeviceptr)(uintptr_t)dst->data;
    }
    c.srcPitch = sp;
    c.dstPitch = dp;
    c.WidthInBytes = rb;
    c.Height = rows;
    WITH_CTX(m, m->Memcpy2DAsync(&c, (CUstream)stream), "layer copy: cuMemcpy2DAsync");
    if (dst->device == CODA_DEVICE_CPU)
        WITH_CTX(m, m->StreamSynchronize((CUstream)stream), "layer copy: cuStreamSynchronize");
    return CODA_OK;
#else
    (void)m;
    (void)stream;
    return coda__fail(CODA_ERR_DEVICE, "layer copy: CUDA tensor, but this build has no CUDA backend");
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
    if (rows == 0 || rb == 0) return CODA_OK;
    WITH_CTX(m, m->MemsetD2D8Async((CUdeviceptr)(uintptr_t)t->data, pitch, 0, rb, rows, (CUstream)stream),
             "layer zero: cuMemsetD2D8Async");
    return CODA_OK;
#else
    (void)m;
    (void)stream;
    return coda__fail(CODA_ERR_DEVICE, "layer zero: CUDA tensor, but this build has no CUDA backend");
#endif
}

coda_status_t coda__llama_mem_sync(coda__llama_mem_t *m, void *stream) {
#ifdef CODA_WITH_CUDA
    if (m->device == CODA_DEVICE_CUDA) WITH_CTX(m, m->StreamSynchronize((CUstream)stream), "cuStreamSynchronize");
#else
    (void)m;
    (void)stream;
#endif
    return CODA_OK;
}
