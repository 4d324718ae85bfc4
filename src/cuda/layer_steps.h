/* layer_steps.h - the LLaMA layer's non-GEMM steps on CUDA tensors (src/cuda
 * only, the layer and tests; not public). The kernels: kernels/layer_steps.cuh;
 * the CPU versions they replace: src/layer/llama_cpu.c.
 *
 * How llama.c should call them (issue 20: no host copy on a CUDA layer;
 * nothing here is wired in yet). Each call is asynchronous on `stream`, so
 * the shadows (.h), the staging buffers g1h, gtmp and tcheck, and the
 * down()/up() copies around these steps go away:
 *
 *   forward, the first norm's prologue: instead of copying g1 and x to the
 *   host, coda__llama_norm_prologue and the two up() copies,
 *       coda__cuda_norm_prologue(L->ctx, &L->x.d, &w->g1, &L->xg.d, &L->ss1.d, stream);
 *   ss1 stays (M, 1), the single-tile partials coda_finish_rstd reads next.
 *
 *   backward, after the attention backward has left dqkv (M, nqkv) f32 on
 *   the device (until attention runs on the GPU, dqkv is still a host
 *   buffer: copy it up first; then the RoPE backward is the first thing
 *   that needs no host copy of qkv):
 *       coda__cuda_rope_backward(L->ctx, &dqkv_d, &L->qkv.d, &L->pos.d, &L->freq.d,
 *                                &L->dzq.d, &L->svec.d, stream);
 *   instead of coda__llama_rope_backward and up(dzq), up(svec).
 *
 *   store_gvec: the finished norm-weight gradient straight into the caller's
 *   tensor, f32 or bf16, instead of down(gvec), copy_vec and a host copy:
 *       coda__cuda_convert_vec(L->ctx, &L->gvec.d, gout, stream);
 *
 *   forward, targets: today they are copied to the host (tcheck) and checked
 *   before anything is written, which synchronises the stream. On the
 *   device:
 *       coda__cuda_check_targets(L->ctx, targets, cfg->vocab, IGNORE_INDEX, &bad_d, stream);
 *   with bad_d a (1) i32 device buffer of the layer. Reading it is the
 *   caller's choice: copying those 4 bytes back at once (one synchronisation,
 *   but no (M) copy) keeps today's contract, that a forward with a bad target
 *   fails and writes nothing; leaving it on the device keeps the forward
 *   asynchronous (a bad target then picks no logit: its loss is lse,
 *   coda.h section 7) and the flag can be read later or by a test. The
 *   targets can then be bound to lmhead_lse / lmhead_bwd as they are (no
 *   copy into L->targets) if the caller keeps them alive until the backward.
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

#include "coda.h"

#ifdef CODA_WITH_CUDA

/* The RMSNorm prologue of the QKV GEMM: xg = bf16(x g), ss[i] = sum_j x_ij^2
 * (f32).
 *   x (M, d) bf16, g (d) bf16, xg (M, d) bf16, ss (M) or (M, 1) f32;
 *   any row strides; d >= 1 (d = 0: ss is all zeros, xg empty).
 * NaN in x makes its xg element and ss[i] NaN; NaN in g its column of xg. */
coda_status_t coda__cuda_norm_prologue(coda_context_t *ctx, const coda_tensor_t *x, const coda_tensor_t *g,
                                       coda_tensor_t *xg, coda_tensor_t *ss, void *stream);

/* RoPE backward and the QKV RMSNorm's row statistic, per column pair p:
 * th = pos[i] freq[p] (f32), c = cosf(th), s = sinf(th),
 * dz[i][2p] = bf16(dy[i][2p] c + dy[i][2p+1] s), dz[i][2p+1] = bf16(dy[i][2p+1] c
 * - dy[i][2p] s), and s_out[i] = sum_j y_ij dy_ij (f32).
 *   dy (M, N) f32, y (M, N) bf16, pos (M) f32, freq (N/2) f32,
 *   dz (M, N) bf16, s_out (M) or (M, 1) f32; N even; any row strides.
 * NaN in dy makes its pair of dz and s_out[i] NaN; in y, s_out[i]; in pos,
 * the row of dz. */
coda_status_t coda__cuda_rope_backward(coda_context_t *ctx, const coda_tensor_t *dy, const coda_tensor_t *y,
                                       const coda_tensor_t *pos, const coda_tensor_t *freq, coda_tensor_t *dz,
                                       coda_tensor_t *s_out, void *stream);

/* out = in, element by element: in (n) f32, out (n) f32 (the same bits) or
 * bf16 (rounded to nearest even; NaN stays NaN). Each may be 1-D (n) or a
 * column view (n, 1) with any row stride (an element stride). */
coda_status_t coda__cuda_convert_vec(coda_context_t *ctx, const coda_tensor_t *in, coda_tensor_t *out,
                                     void *stream);

/* Cross-entropy targets against the vocabulary, on the device: bad[0] (i32)
 * receives the smallest i with targets[i] outside [0, vocab) and not
 * ignore_index, or -1 when there is none. Asynchronous: the flag is read
 * (or not) when the caller chooses; the call itself does not synchronise.
 *   targets (M) or (M, 1) i32, vocab >= 1, bad (1) i32 apart from targets. */
coda_status_t coda__cuda_check_targets(coda_context_t *ctx, const coda_tensor_t *targets, int64_t vocab,
                                       int32_t ignore_index, coda_tensor_t *bad, void *stream);

/* The NVRTC options layer_steps.cuh is compiled with (tests compile the
 * same text with the same options). */
#define CODA_CUDA_STEPS_NOPTS 3
extern const char *const coda__cuda_steps_opts[CODA_CUDA_STEPS_NOPTS];
/* Its kernels' entry points, NULL-terminated. */
extern const char *const coda__cuda_steps_entries[];

#endif
#endif
