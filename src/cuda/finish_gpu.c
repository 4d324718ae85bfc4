/* finish_gpu.c - the finishing steps (coda_finish_*) on CUDA tensors.
 *
 * Small kernels, a thread a row (kernels/finish.cuh), compiled once by
 * NVRTC and cached like every other kernel. Arguments arrive validated by
 * src/api/finish.c (shapes, strides, dtypes, overlap); what only the driver
 * can tell, that each tensor is device memory on the device its descriptor
 * names, is checked here before anything is launched. */
#include "cuda/backend.h"

static const char *const finish_opts[] = {"--gpu-architecture=sm_90a", "--fmad=false",
                                          "-default-device"};

/* Push the device of `t`, fetch kernel `entry`, launch blocks of 256 threads,
 * one a `per_block` rows. */
static coda_status_t run(coda_context_t *ctx, const coda_tensor_t *t, const char *entry,
                         int64_t rows, int per_block, void **args, void *stream) {
    if (rows == 0) return CODA_OK;
    coda_cuda_device_t *d;
    CODA_TRY(coda__cuda_device(ctx, t->device_index, &d));
    struct coda_cuda *cu = ctx->cuda;
    const char *src = coda__cuda_source("finish.cuh");
    if (!src) return coda__fail(CODA_ERR_INTERNAL, "finish.cuh is not embedded");
    CODA_CU(cu, cu->cu.CtxPushCurrent(d->pctx), "cuCtxPushCurrent");
    /* quick key: a constant per entry point, so later calls skip hashing */
    uint64_t quick[2] = {0xc0daf1a15bull, coda__hash(CODA_HASH_SEED0, entry, strlen(entry))};
    CUfunction fn = coda__cuda_kernel_find(d, quick);
    coda_status_t s = fn ? CODA_OK : coda__cuda_kernel(ctx, d, src, finish_opts, 3, entry, quick, &fn);
    if (s == CODA_OK) {
        CUlaunchConfig lc;
        memset(&lc, 0, sizeof lc);
        lc.gridDimX = (unsigned)((rows + per_block - 1) / per_block);
        lc.gridDimY = lc.gridDimZ = 1;
        lc.blockDimX = 256;
        lc.blockDimY = lc.blockDimZ = 1;
        lc.hStream = (CUstream)stream;
        CUresult r = cu->cu.LaunchKernelEx(&lc, fn, args, NULL);
        if (r != CUDA_SUCCESS) s = coda__cu_fail(cu, r, entry);
    }
    CUcontext prev;
    cu->cu.CtxPopCurrent(&prev);
    return s;
}

/* kernels/finish.cuh's FIN_ROWS: the rows of a coda_finish_reduce_kernel block */
#define FIN_ROWS 64

static long long es(const coda_tensor_t *t, int dim) {
    return (long long)(t->stride[dim] / (int64_t)coda_dtype_size(t->dtype));
}

coda_status_t coda__cuda_finish_reduce(coda_context_t *ctx, coda_reduce_t op,
                                       const coda_tensor_t *partials, coda_tensor_t *out,
                                       void *stream) {
    long long ps0 = es(partials, 0), ps1 = es(partials, 1), os0 = es(out, 0);
    long long rows = partials->shape[0], T = partials->shape[1];
    int o = op == CODA_REDUCE_MAX ? 1 : 0;
    void *pp = partials->data, *po = out->data;
    void *args[] = {&pp, &ps0, &ps1, &po, &os0, &rows, &T, &o};
    const coda_tensor_t *ts[] = {partials, out};
    const char *names[] = {"partials", "out"};
    if (rows > 0) CODA_TRY(coda__cuda_check_pointers(ctx, partials->device_index, ts, names, 2));
    return run(ctx, partials, "coda_finish_reduce_kernel", rows, FIN_ROWS, args, stream);
}

coda_status_t coda__cuda_finish_rstd(coda_context_t *ctx, const coda_tensor_t *partials, int64_t d,
                                     float eps, coda_tensor_t *rstd, void *stream) {
    long long ps0 = es(partials, 0), ps1 = es(partials, 1), os0 = es(rstd, 0);
    long long rows = partials->shape[0], T = partials->shape[1];
    float df = (float)d;
    void *pp = partials->data, *po = rstd->data;
    void *args[] = {&pp, &ps0, &ps1, &po, &os0, &rows, &T, &df, &eps};
    const coda_tensor_t *ts[] = {partials, rstd};
    const char *names[] = {"partials", "rstd"};
    if (rows > 0) CODA_TRY(coda__cuda_check_pointers(ctx, partials->device_index, ts, names, 2));
    return run(ctx, partials, "coda_finish_rstd_kernel", rows, 256, args, stream);
}

coda_status_t coda__cuda_finish_lse(coda_context_t *ctx, const coda_tensor_t *partials,
                                    const coda_tensor_t *targets, int32_t ignore_index,
                                    coda_tensor_t *lse, coda_tensor_t *loss, void *stream) {
    long long ps0 = es(partials, 0), ps1 = es(partials, 1), ps2 = es(partials, 2);
    long long ts0 = es(targets, 0), ls0 = es(lse, 0), os0 = es(loss, 0);
    long long rows = partials->shape[0], T = partials->shape[1];
    int ig = ignore_index;
    void *pp = partials->data, *pt = targets->data, *pl = lse->data, *po = loss->data;
    void *args[] = {&pp, &ps0, &ps1, &ps2, &pt, &ts0, &ig, &pl, &ls0, &po, &os0, &rows, &T};
    const coda_tensor_t *ts[] = {partials, targets, lse, loss};
    const char *names[] = {"partials", "targets", "lse", "loss"};
    if (rows > 0) CODA_TRY(coda__cuda_check_pointers(ctx, partials->device_index, ts, names, 4));
    return run(ctx, partials, "coda_finish_lse_kernel", rows, 256, args, stream);
}
