/* context.h - the context object and the hooks between the front end
 * (argument checking, src/core) and the backends (src/cpu, src/cuda). */
#ifndef CODA_CONTEXT_H
#define CODA_CONTEXT_H

#include "core/internal.h"
#include "program/ir.h"

struct coda_cuda; /* CUDA backend state, owned by src/cuda; NULL until first use */

struct coda_context {
    int cpu_threads;          /* >= 1 */
    char cache_dir[1024];     /* compiled-module cache directory */
    struct coda_cuda *cuda;
};

/* ---- CPU backend (src/cpu). Arguments are already validated. ---- */

coda_status_t coda__cpu_gemm(coda_context_t *ctx, coda_layout_t layout, const coda_tensor_t *a,
                             const coda_tensor_t *b, coda_tensor_t *c, float alpha, float beta);

/* bound[i] is the tensor bound to program argument i (NULL for scalars),
 * scalars[i] its scalar value; m, n, k the GEMM extents; tiling is resolved. */
coda_status_t coda__cpu_gemm_epilogue(coda_context_t *ctx, coda_layout_t layout,
                                      const coda_tensor_t *a, const coda_tensor_t *b,
                                      const coda_program_t *p, const coda_tensor_t *const *bound,
                                      const float *scalars, coda_tiling_t tiling);

/* ---- CUDA backend (src/cuda), present when built with CODA_WITH_CUDA. ---- */
#ifdef CODA_WITH_CUDA
/* Lazily open the driver and the device; CODA_ERR_DEVICE if there is none. */
coda_status_t coda__cuda_get(coda_context_t *ctx, struct coda_cuda **out);
void coda__cuda_free(struct coda_cuda *cuda);
coda_status_t coda__cuda_describe(coda_context_t *ctx, char *buf, size_t cap);
coda_status_t coda__cuda_gemm(coda_context_t *ctx, coda_layout_t layout, const coda_tensor_t *a,
                              const coda_tensor_t *b, coda_tensor_t *c, float alpha, float beta,
                              void *stream);
/* Fused GEMM (src/cuda/fused_gemm.c): the program compiled into the GEMM's
 * epilogue. Arguments validated as for coda__cpu_gemm_epilogue. */
coda_status_t coda__cuda_gemm_epilogue(coda_context_t *ctx, coda_layout_t layout,
                                       const coda_tensor_t *a, const coda_tensor_t *b,
                                       const coda_program_t *p, const coda_tensor_t *const *bound,
                                       const float *scalars, coda_tiling_t tiling, void *stream);
/* The tiling the fused GEMM uses on device `index` for this shape, for
 * program p (NULL: any program). */
coda_status_t coda__cuda_choose_tiling(coda_context_t *ctx, int index, int64_t m, int64_t n,
                                       int64_t k, const coda_program_t *p, coda_tiling_t *tiling);
/* Finishing steps on CUDA tensors (src/cuda/finish_gpu.c); validated. */
coda_status_t coda__cuda_finish_reduce(coda_context_t *ctx, coda_reduce_t op,
                                       const coda_tensor_t *partials, coda_tensor_t *out,
                                       void *stream);
coda_status_t coda__cuda_finish_rstd(coda_context_t *ctx, const coda_tensor_t *partials, int64_t d,
                                     float eps, coda_tensor_t *rstd, void *stream);
coda_status_t coda__cuda_finish_lse(coda_context_t *ctx, const coda_tensor_t *partials,
                                    const coda_tensor_t *targets, int32_t ignore_index,
                                    coda_tensor_t *lse, coda_tensor_t *loss, void *stream);
#endif

/* GEMM extents from the layout and the A, B descriptors (already checked 2-D). */
static inline void coda__gemm_extents(coda_layout_t layout, const coda_tensor_t *a,
                                      const coda_tensor_t *b, int64_t *m, int64_t *n, int64_t *k) {
    switch (layout) {
    case CODA_LAYOUT_NT: *m = a->shape[0]; *k = a->shape[1]; *n = b->shape[0]; break;
    case CODA_LAYOUT_NN: *m = a->shape[0]; *k = a->shape[1]; *n = b->shape[1]; break;
    case CODA_LAYOUT_TN: *m = a->shape[1]; *k = a->shape[0]; *n = b->shape[1]; break;
    }
}

#endif
