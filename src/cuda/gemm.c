/* gemm.c - the CUDA GEMM front (work in progress). */
#include "cuda/backend.h"

coda_status_t coda__cuda_gemm(coda_context_t *ctx, coda_layout_t layout, const coda_tensor_t *a,
                              const coda_tensor_t *b, coda_tensor_t *c, float alpha, float beta,
                              void *stream) {
    (void)ctx; (void)layout; (void)a; (void)b; (void)c; (void)alpha; (void)beta; (void)stream;
    return coda__fail(CODA_ERR_DEVICE, "coda_gemm on CUDA: not implemented yet");
}
