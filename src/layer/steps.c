/* steps.c - the block's steps that are not GEMMs, on the block's device:
 * the CPU loops of llama_cpu.c for a CPU block, the backend's kernels for a
 * CUDA one (core/context.h; src/cuda/layer_steps.c), so that no step of a
 * CUDA block copies to or from the host. Arguments are checked by block.c. */
#include "layer/block.h"
#include "core/context.h"

#ifndef CODA_WITH_CUDA
static coda_status_t no_cuda(void) {
    return coda__fail(CODA_ERR_UNSUPPORTED, "block: a CUDA block, but this build has no CUDA backend");
}
#endif

coda_status_t coda__layer_norm_prologue(const coda_block_t *B, const coda_tensor_t *x, const coda_tensor_t *g,
                                        coda_tensor_t *xg, coda_tensor_t *ss, void *stream) {
    if (B->device == CODA_DEVICE_CPU) {
        coda__llama_norm_prologue(x, g, xg, ss);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_norm_prologue(B->ctx, x, g, xg, ss, stream);
#else
    (void)stream;
    return no_cuda();
#endif
}

coda_status_t coda__layer_rope_backward(const coda_block_t *B, const coda_tensor_t *dy, int n_dy, const coda_tensor_t *y,
                                        const coda_tensor_t *pos, const coda_tensor_t *freq, coda_tensor_t *dz,
                                        coda_tensor_t *s, void *stream) {
    if (B->device == CODA_DEVICE_CPU) {
        coda__llama_rope_backward(dy, n_dy, y, pos, freq, dz, s);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    /* B->freq repeats with the heads (coda__llama_rope_freq): each row's
     * head_dim / 2 angles made once, where the kernel's table takes them */
    const int64_t half = B->cfg.head_dim / 2, rot = (B->cfg.n_heads + B->cfg.n_kv_heads) * half;
    const int tab = freq == &B->freq && half % 4 == 0 && half <= CODA_ROPE_PERIOD_MAX;
    return coda__cuda_rope_backward_periodic(B->ctx, dy, n_dy, y, pos, freq, tab ? (int)half : 0, tab ? rot : 0, dz,
                                             s, stream);
#else
    (void)stream;
    return no_cuda();
#endif
}

coda_status_t coda__layer_convert_vec(const coda_block_t *B, const coda_tensor_t *in, coda_tensor_t *out,
                                      void *stream) {
    if (B->device == CODA_DEVICE_CPU) {
        coda__llama_copy_vec(in, out);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_convert_vec(B->ctx, in, out, stream);
#else
    (void)stream;
    return no_cuda();
#endif
}
