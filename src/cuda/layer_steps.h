/* layer_steps.h - the LLaMA layer's non-GEMM steps on CUDA tensors (src/cuda
 * only, the layer and tests; not public). The kernels: kernels/layer_steps.cuh;
 * the CPU versions they replace: src/layer/llama_cpu.c.
 *
 * The block (src/layer/block.c, through steps.c) runs the norm prologue,
 * the RoPE backward and the norm-weight gradients' conversion with these,
 * so no step of a CUDA block copies to or from the host. The targets check
 * is not used yet: the whole-layer call (coda_llama_forward) checks targets
 * on a host copy, and the LM head of the split block is issue 21's.
 *
 * Every call checks its arguments (descriptors, dtypes, agreeing extents,
 * CUDA tensors of one device, outputs apart from inputs and from each other,
 * then with the driver that each pointer is device memory of that device)
 * and on failure returns the status with a message naming the argument,
 * having written nothing and launched nothing. Nothing is required of the
 * pointers' alignment beyond the element's: 16-byte aligned rows take
 * vector loads, others element loads, with the same arithmetic in the same
 * order, so results do not depend on the views' placement. The row sums (ss,
 * s) are summed in one fixed order that depends on the row length only
 * (kernels/layer_steps.cuh): bitwise reproducible run to run, not in the
 * CPU's order (so within rounding of the CPU's, not equal to it). */
#ifndef CODA_CUDA_LAYER_STEPS_H
#define CODA_CUDA_LAYER_STEPS_H

#include "core/context.h"

#ifdef CODA_WITH_CUDA
#include <cuda.h>
#endif

#ifdef CODA_WITH_CUDA

/* coda__cuda_norm_prologue, coda__cuda_rope_backward and coda__cuda_convert_vec
 * are declared in core/context.h (the interface the layer calls). */

/* Cross-entropy targets against the vocabulary, on the device: bad[0] (i32)
 * receives the smallest i with targets[i] outside [0, vocab) and not
 * ignore_index, or -1 when there is none. Asynchronous: the flag is read
 * (or not) when the caller chooses; the call itself does not synchronise.
 *   targets (M) or (M, 1) i32, vocab >= 1, bad (1) i32 apart from targets. */
coda_status_t coda__cuda_check_targets(coda_context_t *ctx, const coda_tensor_t *targets, int64_t vocab,
                                       int32_t ignore_index, coda_tensor_t *bad, void *stream);

/* Launch `entry` of the embedded kernel source `source` (layer_steps.cuh,
 * lm_steps.cuh), compiled on first use with opts and cached under a quick
 * key (key0, the entry's name): `blocks` (capped at 2^16; the kernels loop
 * over rows) of `threads`; preset (not 0): a u32 set to 0xffffffff on the
 * stream first. */
coda_status_t coda__cuda_steps_launch(coda_context_t *ctx, int device_index, const char *source,
                                      const char *const *opts, int nopts, uint64_t key0, const char *entry,
                                      int64_t blocks, int threads, void **args, CUdeviceptr preset, void *stream);

/* The NVRTC options layer_steps.cuh is compiled with (tests compile the
 * same text with the same options). */
#define CODA_CUDA_STEPS_NOPTS 3
extern const char *const coda__cuda_steps_opts[CODA_CUDA_STEPS_NOPTS];
/* The same for lm_steps.cuh (src/cuda/lm_steps.c: coda_lm_loss's steps,
 * declared in core/lm_steps.h). */
#define CODA_CUDA_LM_STEPS_NOPTS 2
extern const char *const coda__cuda_lm_steps_opts[CODA_CUDA_LM_STEPS_NOPTS];
extern const char *const coda__cuda_lm_steps_entries[];
/* Its kernels' entry points, NULL-terminated. */
extern const char *const coda__cuda_steps_entries[];

#endif
#endif
