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

/* cuMemcpy2D and cuMemsetD2D8 refuse a pitch or a row of 2 GiB or more
 * (CU_DEVICE_ATTRIBUTE_MAX_PITCH is 2^31 - 1 on Hopper). Rows that long, or
 * that far apart (a whole f32 70B embedding as one row, say), go a row at a
 * time in pieces of at most `max_pitch` bytes, each a one-row call whose
 * pitch is its width. */
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

static coda_status_t copy_rect(coda_context_t *ctx, int index, char *dst, size_t dpitch, int dst_host,
                               const char *src, size_t spitch, int src_host, size_t width, size_t rows,
                               void *stream, const char *what) {
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
    return CODA_OK;
}

coda_status_t coda__cuda_copy_2d_pieces(coda_context_t *ctx, int index, void *dst, size_t dpitch, int dst_host,
                                        const void *src, size_t spitch, int src_host, size_t width, size_t rows,
                                        void *stream, size_t max_pitch, const char *what) {
    if (rows == 0 || width == 0) return CODA_OK;
    if (rows == 1) spitch = dpitch = width; /* one row: no pitch is stepped over */
    char *d = dst;
    const char *s = src;
    if (width <= max_pitch && spitch <= max_pitch && dpitch <= max_pitch) {
        CODA_TRY(copy_rect(ctx, index, d, dpitch, dst_host, s, spitch, src_host, width, rows, stream, what));
    } else {
        for (size_t r = 0; r < rows; r++)
            for (size_t off = 0; off < width; off += max_pitch) {
                size_t w = min_size(width - off, max_pitch);
                CODA_TRY(copy_rect(ctx, index, d + r * dpitch + off, w, dst_host, s + r * spitch + off, w, src_host,
                                   w, 1, stream, what));
            }
    }
    /* the host reads what it asked for next */
    if (dst_host) ON_DEVICE(ctx, index, ctx->cuda->cu.StreamSynchronize((CUstream)stream), what);
    return CODA_OK;
}

coda_status_t coda__cuda_copy_2d(coda_context_t *ctx, int index, void *dst, size_t dpitch, int dst_host,
                                 const void *src, size_t spitch, int src_host, size_t width, size_t rows,
                                 void *stream, const char *what) {
    return coda__cuda_copy_2d_pieces(ctx, index, dst, dpitch, dst_host, src, spitch, src_host, width, rows, stream,
                                     CODA__CUDA_MAX_PITCH, what);
}

coda_status_t coda__cuda_zero_2d_pieces(coda_context_t *ctx, int index, void *dst, size_t pitch, size_t width,
                                        size_t rows, void *stream, size_t max_pitch, const char *what) {
    if (rows == 0 || width == 0) return CODA_OK;
    if (rows == 1) pitch = width;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst;
    if (width <= max_pitch && pitch <= max_pitch) {
        ON_DEVICE(ctx, index, ctx->cuda->cu.MemsetD2D8Async(d, pitch, 0, width, rows, (CUstream)stream), what);
        return CODA_OK;
    }
    for (size_t r = 0; r < rows; r++)
        for (size_t off = 0; off < width; off += max_pitch) {
            size_t w = min_size(width - off, max_pitch);
            ON_DEVICE(ctx, index, ctx->cuda->cu.MemsetD2D8Async(d + r * pitch + off, w, 0, w, 1, (CUstream)stream),
                      what);
        }
    return CODA_OK;
}

coda_status_t coda__cuda_zero_2d(coda_context_t *ctx, int index, void *dst, size_t pitch, size_t width,
                                 size_t rows, void *stream, const char *what) {
    return coda__cuda_zero_2d_pieces(ctx, index, dst, pitch, width, rows, stream, CODA__CUDA_MAX_PITCH, what);
}

coda_status_t coda__cuda_sync(coda_context_t *ctx, int index, void *stream, const char *what) {
    ON_DEVICE(ctx, index, ctx->cuda->cu.StreamSynchronize((CUstream)stream), what);
    return CODA_OK;
}
