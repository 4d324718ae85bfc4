/* memory.c - device memory for front ends that keep buffers of their own
 * (the layer): allocation, 2-D copies between host and device, zero fills,
 * stream waits, each with the device's primary context current
 * (core/context.h). Copies and fills are queued on the caller's stream, so
 * they are ordered with the kernels on it, also on a non-blocking stream
 * (PyTorch's side streams). */
#include "cuda/backend.h"

/* Run a driver call with device `index`'s context current. */
#define ON_DEVICE(ctx, index, call, what)                                           \
    do {                                                                            \
        coda_cuda_device_t *d_;                                                     \
        CODA_TRY(coda__cuda_device((ctx), (index), &d_));                           \
        struct coda_cuda *cu_ = (ctx)->cuda;                                        \
        CODA_CU(cu_, cu_->cu.CtxPushCurrent(d_->pctx), "cuCtxPushCurrent");         \
        CUresult r_ = (call);                                                       \
        CUcontext prev_;                                                            \
        cu_->cu.CtxPopCurrent(&prev_);                                              \
        if (r_ != CUDA_SUCCESS) return coda__cu_fail(cu_, r_, (what));              \
    } while (0)

coda_status_t coda__cuda_alloc(coda_context_t *ctx, int index, size_t bytes, void **p, const char *what) {
    CUdeviceptr d = 0;
    ON_DEVICE(ctx, index, ctx->cuda->cu.MemAlloc(&d, bytes), what);
    *p = (void *)(uintptr_t)d;
    return CODA_OK;
}

void coda__cuda_release(coda_context_t *ctx, int index, void *p) {
    coda_cuda_device_t *d;
    if (!p || !ctx || !ctx->cuda || coda__cuda_device(ctx, index, &d) != CODA_OK) return;
    struct coda_cuda *cu = ctx->cuda;
    if (cu->cu.CtxPushCurrent(d->pctx) != CUDA_SUCCESS) return;
    cu->cu.MemFree((CUdeviceptr)(uintptr_t)p);
    CUcontext prev;
    cu->cu.CtxPopCurrent(&prev);
}

coda_status_t coda__cuda_copy_2d(coda_context_t *ctx, int index, void *dst, size_t dpitch, int dst_host,
                                 const void *src, size_t spitch, int src_host, size_t width, size_t rows,
                                 void *stream, const char *what) {
    if (rows == 0 || width == 0) return CODA_OK;
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = src_host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    if (src_host) c.srcHost = src;
    else c.srcDevice = (CUdeviceptr)(uintptr_t)src;
    c.dstMemoryType = dst_host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
    if (dst_host) c.dstHost = dst;
    else c.dstDevice = (CUdeviceptr)(uintptr_t)dst;
    c.srcPitch = spitch;
    c.dstPitch = dpitch;
    c.WidthInBytes = width;
    c.Height = rows;
    ON_DEVICE(ctx, index, ctx->cuda->cu.Memcpy2DAsync(&c, (CUstream)stream), what);
    /* the host reads what it asked for next */
    if (dst_host) ON_DEVICE(ctx, index, ctx->cuda->cu.StreamSynchronize((CUstream)stream), what);
    return CODA_OK;
}

coda_status_t coda__cuda_zero_2d(coda_context_t *ctx, int index, void *dst, size_t pitch, size_t width,
                                 size_t rows, void *stream, const char *what) {
    if (rows == 0 || width == 0) return CODA_OK;
    ON_DEVICE(ctx, index,
              ctx->cuda->cu.MemsetD2D8Async((CUdeviceptr)(uintptr_t)dst, pitch, 0, width, rows, (CUstream)stream),
              what);
    return CODA_OK;
}

coda_status_t coda__cuda_sync(coda_context_t *ctx, int index, void *stream, const char *what) {
    ON_DEVICE(ctx, index, ctx->cuda->cu.StreamSynchronize((CUstream)stream), what);
    return CODA_OK;
}
