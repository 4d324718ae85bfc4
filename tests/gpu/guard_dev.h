/* guard_dev.h - the guarded views' memory (tests/guard.h) on the GPU:
 * cudaMalloc'd, copied with cudaMemcpy; a read waits for the device first,
 * so that a kernel's fault shows as an error there, not as wrong bytes. */
#ifndef CODA_TEST_GUARD_DEV_H
#define CODA_TEST_GUARD_DEV_H

#include "guard.h"
#include "gpu/cuda_check.h"

static void *dev_alloc(size_t n) {
    void *p;
    CUDA_OK(cudaMalloc(&p, n));
    return p;
}
static void dev_free(void *p) { CUDA_OK(cudaFree(p)); }
static void dev_put(void *dst, const void *src, size_t n) {
    CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}
static void dev_get(void *dst, const void *src, size_t n) {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}
static const g_mem_t dev_mem = {CODA_DEVICE_CUDA, dev_alloc, dev_free, dev_put, dev_get};

#endif
