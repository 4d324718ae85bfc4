/* driver.c - open the CUDA driver with dlopen, and the devices' primary contexts.
 *
 * No link-time dependency on libcuda: a machine without a driver still loads
 * the library and runs the CPU backend; coda__cuda_get then reports
 * CODA_ERR_DEVICE. We use each device's primary context (the one the CUDA
 * runtime and PyTorch use), so pointers from cudaMalloc / torch work as is. */
#include "cuda/backend.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

coda_status_t coda__cu_fail(struct coda_cuda *cuda, CUresult r, const char *what) {
    const char *name = "?", *text = "?";
    if (cuda && cuda->cu.GetErrorName) cuda->cu.GetErrorName(r, &name);
    if (cuda && cuda->cu.GetErrorString) cuda->cu.GetErrorString(r, &text);
    return coda__fail(CODA_ERR_DEVICE, "%s: CUDA driver error %d (%s: %s)", what, (int)r,
                      name ? name : "?", text ? text : "?");
}

static coda_status_t load_api(struct coda_cuda *c) {
    c->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!c->lib)
        return coda__fail(CODA_ERR_DEVICE, "no CUDA driver: dlopen(libcuda.so.1) failed: %s",
                          dlerror());
    struct { void **slot; const char *sym; } t[] = {
        {(void **)&c->cu.Init, "cuInit"},
        {(void **)&c->cu.DriverGetVersion, "cuDriverGetVersion"},
        {(void **)&c->cu.DeviceGetCount, "cuDeviceGetCount"},
        {(void **)&c->cu.DeviceGet, "cuDeviceGet"},
        {(void **)&c->cu.DeviceGetName, "cuDeviceGetName"},
        {(void **)&c->cu.DeviceGetAttribute, "cuDeviceGetAttribute"},
        {(void **)&c->cu.DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
        {(void **)&c->cu.DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
        {(void **)&c->cu.CtxPushCurrent, "cuCtxPushCurrent_v2"},
        {(void **)&c->cu.CtxPopCurrent, "cuCtxPopCurrent_v2"},
        {(void **)&c->cu.ModuleLoadData, "cuModuleLoadData"},
        {(void **)&c->cu.ModuleUnload, "cuModuleUnload"},
        {(void **)&c->cu.ModuleGetFunction, "cuModuleGetFunction"},
        {(void **)&c->cu.FuncSetAttribute, "cuFuncSetAttribute"},
        {(void **)&c->cu.FuncGetAttribute, "cuFuncGetAttribute"},
        {(void **)&c->cu.LaunchKernelEx, "cuLaunchKernelEx"},
        {(void **)&c->cu.TensorMapEncodeTiled, "cuTensorMapEncodeTiled"},
        {(void **)&c->cu.PointerGetAttribute, "cuPointerGetAttribute"},
        {(void **)&c->cu.GetErrorString, "cuGetErrorString"},
        {(void **)&c->cu.GetErrorName, "cuGetErrorName"},
        {(void **)&c->cu.MemAlloc, "cuMemAlloc_v2"},
        {(void **)&c->cu.MemFree, "cuMemFree_v2"},
        {(void **)&c->cu.MemsetD32Async, "cuMemsetD32Async"},
        {(void **)&c->cu.StreamIsCapturing, "cuStreamIsCapturing"},
        {(void **)&c->cu.EventCreate, "cuEventCreate"},
        {(void **)&c->cu.EventDestroy, "cuEventDestroy_v2"},
        {(void **)&c->cu.EventRecord, "cuEventRecord"},
        {(void **)&c->cu.EventQuery, "cuEventQuery"},
        {(void **)&c->cu.Memcpy2DAsync, "cuMemcpy2DAsync_v2"},
        {(void **)&c->cu.MemsetD2D8Async, "cuMemsetD2D8Async"},
        {(void **)&c->cu.StreamSynchronize, "cuStreamSynchronize"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        *t[i].slot = dlsym(c->lib, t[i].sym);
        if (!*t[i].slot)
            return coda__fail(CODA_ERR_DEVICE,
                              "CUDA driver too old: libcuda.so.1 has no %s (need CUDA 12.0+)",
                              t[i].sym);
    }
    *(void **)&c->cu.OccupancyMaxActiveClusters = dlsym(c->lib, "cuOccupancyMaxActiveClusters");
    *(void **)&c->cu.ThreadExchangeStreamCaptureMode = dlsym(c->lib, "cuThreadExchangeStreamCaptureMode");
    *(void **)&c->cu.StreamGetId = dlsym(c->lib, "cuStreamGetId");
    return CODA_OK;
}

coda_status_t coda__cuda_get(coda_context_t *ctx, struct coda_cuda **out) {
    if (!ctx || !out) return coda__fail(CODA_ERR_INVALID_ARG, "coda__cuda_get: NULL argument");
    *out = NULL;
    if (ctx->cuda) {
        *out = ctx->cuda;
        return CODA_OK;
    }
    struct coda_cuda *c = calloc(1, sizeof *c);
    if (!c) return coda__fail(CODA_ERR_NO_MEMORY, "CUDA backend: out of memory");
    coda_status_t s = load_api(c);
    if (s == CODA_OK) {
        CUresult r = c->cu.Init(0);
        if (r != CUDA_SUCCESS) s = coda__cu_fail(c, r, "cuInit (no usable GPU?)");
    }
    if (s == CODA_OK) {
        CUresult r = c->cu.DeviceGetCount(&c->device_count);
        if (r != CUDA_SUCCESS) s = coda__cu_fail(c, r, "cuDeviceGetCount");
        else if (c->device_count <= 0) s = coda__fail(CODA_ERR_DEVICE, "no CUDA device found");
        c->cu.DriverGetVersion(&c->driver_version);
        if (c->device_count > CODA_CUDA_MAX_DEVICES) c->device_count = CODA_CUDA_MAX_DEVICES;
    }
    if (s != CODA_OK) {
        if (c->lib) dlclose(c->lib);
        free(c);
        return s;
    }
    ctx->cuda = c;
    *out = c;
    return CODA_OK;
}

/* A device's name and attributes, read once without touching its primary
 * context: coda_context_describe lists every device this way, so asking
 * what a machine holds does not create (and keep) a context, with its
 * few hundred MiB, on GPUs the caller never uses. */
static coda_status_t cuda_read_properties(struct coda_cuda *c, int index, coda_cuda_device_t *d) {
    if (d->known) return CODA_OK;
    CODA_CU(c, c->cu.DeviceGet(&d->dev, index), "cuDeviceGet");
    CODA_CU(c, c->cu.DeviceGetName(d->name, (int)sizeof d->name, d->dev), "cuDeviceGetName");
    CODA_CU(c, c->cu.DeviceGetAttribute(&d->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev), "cuDeviceGetAttribute");
    CODA_CU(c, c->cu.DeviceGetAttribute(&d->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev), "cuDeviceGetAttribute");
    CODA_CU(c, c->cu.DeviceGetAttribute(&d->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev), "cuDeviceGetAttribute");
    CODA_CU(c, c->cu.DeviceGetAttribute(&d->smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d->dev), "cuDeviceGetAttribute");
    /* peak memory bandwidth, for the stream-K rule (gemm.c): two transfers
     * a clock on the bus (H100 SXM: 2619 MHz x 5120 bits, 3352 GB/s; H200:
     * 3201 MHz x 6144 bits, 4917 GB/s). Unknown (0) if the driver does not
     * say: nothing depends on it but a choice of schedule. */
    int mem_khz = 0, bus_bits = 0;
    if (c->cu.DeviceGetAttribute(&mem_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, d->dev) == CUDA_SUCCESS &&
        c->cu.DeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, d->dev) == CUDA_SUCCESS &&
        mem_khz > 0 && bus_bits > 0)
        d->mem_gbps = (int)((double)mem_khz * 2.0 * (double)bus_bits / 8.0 / 1e6);
    /* the L2's size, for the attention backward's layout (attention.c); 0 if unknown */
    if (c->cu.DeviceGetAttribute(&d->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, d->dev) != CUDA_SUCCESS)
        d->l2_bytes = 0;
    d->known = 1;
    return CODA_OK;
}

static int cuda_supported(const coda_cuda_device_t *d) { return d->cc_major == 9 && d->cc_minor == 0; }

coda_status_t coda__cuda_device(coda_context_t *ctx, int index, coda_cuda_device_t **out) {
    struct coda_cuda *c;
    CODA_TRY(coda__cuda_get(ctx, &c));
    if (index < 0 || index >= c->device_count)
        return coda__fail(CODA_ERR_DEVICE, "CUDA device %d does not exist (%d found)", index,
                          c->device_count);
    coda_cuda_device_t *d = &c->devices[index];
    if (d->opened) {
        *out = d;
        return CODA_OK;
    }
    CODA_TRY(cuda_read_properties(c, index, d));
    if (!cuda_supported(d))
        return coda__fail(CODA_ERR_DEVICE,
                          "CUDA device %d (%s) has compute capability %d.%d; coda's kernels "
                          "need 9.0 (Hopper, sm_90a: wgmma and TMA)",
                          index, d->name, d->cc_major, d->cc_minor);
    CODA_CU(c, c->cu.DevicePrimaryCtxRetain(&d->pctx, d->dev), "cuDevicePrimaryCtxRetain");
    d->opened = 1;
    *out = d;
    return CODA_OK;
}

void coda__cuda_free(struct coda_cuda *c) {
    if (!c) return;
    for (int i = 0; i < c->device_count; i++) {
        coda_cuda_device_t *d = &c->devices[i];
        if (!d->opened) continue;
        CUcontext prev;
        int pushed = c->cu.CtxPushCurrent(d->pctx) == CUDA_SUCCESS;
        for (int w = 0; w < CODA_CUDA_SK_STREAMS; w++)
            if (d->sk_ws[w].part) {
                c->cu.MemFree(d->sk_ws[w].part);
                c->cu.MemFree(d->sk_ws[w].flag);
                c->cu.EventDestroy(d->sk_ws[w].done);
            }
        for (coda_cuda_kernel_t *k = d->kernels, *next; k; k = next) {
            next = k->next;
            c->cu.ModuleUnload(k->module);
            free(k);
        }
        if (pushed) c->cu.CtxPopCurrent(&prev);
        c->cu.DevicePrimaryCtxRelease(d->dev);
    }
    if (c->lib) dlclose(c->lib);
    free(c);
}

coda_status_t coda__cuda_describe(coda_context_t *ctx, char *buf, size_t cap) {
    struct coda_cuda *c;
    if (coda__cuda_get(ctx, &c) != CODA_OK) {
        int n = snprintf(buf, cap, "cuda: unavailable (%s)\n", coda_last_error());
        if (n < 0 || (size_t)n >= cap)
            return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_describe: buffer too small");
        return CODA_OK;
    }
    size_t used = 0;
    int n = snprintf(buf, cap, "cuda: driver %d.%d, %d device(s)\n", c->driver_version / 1000,
                     (c->driver_version % 1000) / 10, c->device_count);
    if (n < 0 || (size_t)n >= cap)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_describe: buffer too small");
    used = (size_t)n;
    for (int i = 0; i < c->device_count; i++) {
        /* properties only: describing a device does not open it */
        coda_cuda_device_t *d = &c->devices[i];
        if (cuda_read_properties(c, i, d) == CODA_OK)
            n = snprintf(buf + used, cap - used, "  cuda:%d %s, sm_%d%d, %d SMs, %d KiB smem/block, %d GB/s, %d MiB L2%s\n",
                         i, d->name, d->cc_major, d->cc_minor, d->sm_count, d->smem_optin / 1024, d->mem_gbps,
                         d->l2_bytes >> 20, cuda_supported(d) ? "" : " (unsupported: coda needs sm_90)");
        else
            n = snprintf(buf + used, cap - used, "  cuda:%d unusable: %s\n", i, coda_last_error());
        if (n < 0 || (size_t)n >= cap - used)
            return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_describe: buffer too small");
        used += (size_t)n;
    }
    return CODA_OK;
}

coda_status_t coda__cuda_check_pointer(struct coda_cuda *cu, const coda_tensor_t *t, const char *what) {
    int ordinal = -1;
    CUresult r = cu->cu.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                            (CUdeviceptr)(uintptr_t)t->data);
    if (r != CUDA_SUCCESS)
        return coda__fail(CODA_ERR_DEVICE, "%s: data %p is not CUDA device memory", what, t->data);
    if (ordinal != t->device_index)
        return coda__fail(CODA_ERR_DEVICE, "%s: data is on CUDA device %d, descriptor says %d",
                          what, ordinal, t->device_index);
    return CODA_OK;
}

coda_status_t coda__cuda_check_pointers(coda_context_t *ctx, int device_index, const coda_tensor_t *const *ts,
                                        const char *const *names, int n) {
    coda_cuda_device_t *d;
    CODA_TRY(coda__cuda_device(ctx, device_index, &d));
    struct coda_cuda *cu = ctx->cuda;
    CODA_CU(cu, cu->cu.CtxPushCurrent(d->pctx), "cuCtxPushCurrent");
    coda_status_t s = CODA_OK;
    for (int i = 0; s == CODA_OK && i < n; i++)
        if (ts[i]) s = coda__cuda_check_pointer(cu, ts[i], names[i]);
    CUcontext prev;
    cu->cu.CtxPopCurrent(&prev);
    return s;
}
