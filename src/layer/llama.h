/* llama.h - internals of the LLaMA layer shared by src/layer files (not public).
 *
 * block.c runs the block through the public GEMM machinery (coda_gemm,
 * coda_gemm_epilogue with the built-in programs of programs.c,
 * coda_finish_*); llama.c puts it around attention and the LM head. The few
 * steps that are not GEMMs are plain CPU loops here (llama_cpu.c) and the
 * backend's kernels on CUDA (steps.c dispatches). */
#ifndef CODA_LAYER_LLAMA_H
#define CODA_LAYER_LLAMA_H

#include "core/internal.h"

/* Checks a configuration: positive extents, even head_dim, n_kv_heads divides
 * n_heads, vocab >= 0, finite eps > 0 and rope_theta > 0. `fn` names the
 * public call in the message. */
coda_status_t coda__llama_check_config(const coda_llama_config_t *cfg, const char *fn);

/* ---- CPU steps that are not GEMMs (llama_cpu.c). Arguments are checked. ---- */

/* RMSNorm prologue of the first GEMM: xg = x * g (bf16) and ss[i] = sum_j
 * x_ij^2 (the sum-of-squares partials of a single column tile).
 *   x (M, d) bf16, g (d) bf16, xg (M, d) bf16, ss (M, 1) f32. */
void coda__llama_norm_prologue(const coda_tensor_t *x, const coda_tensor_t *g, coda_tensor_t *xg,
                               coda_tensor_t *ss);

/* RoPE tables: pos (batch seq) f32 = i % seq; freq (N/2) f32 per column
 * pair of the packed qkv columns: theta^(-2i/head_dim) for pair i of a q or
 * k head, 0 for v. */
void coda__llama_rope_pos(int64_t batch, int64_t seq, float *pos);
void coda__llama_rope_freq(const coda_llama_config_t *cfg, float *freq);

/* RoPE backward and the QKV RMSNorm statistic: dz = R^T dy per column pair
 * (R the forward rotation by pos_i * freq_j), and s[i] = sum_j y_ij dy_ij
 * (= sum z dz, R being a rotation).
 *   dy (M, N) f32 or bf16 from the attention backward, y (M, N) bf16 the
 *   forward qkv, pos (M), freq (N/2) f32, dz (M, N) bf16, s (M) f32.
 *   dy is n_dy (1 to 3) matrices side by side, each of an even width (dq,
 *   dk, dv). */
void coda__llama_rope_backward(const coda_tensor_t *dy, int n_dy, const coda_tensor_t *y, const coda_tensor_t *pos,
                               const coda_tensor_t *freq, coda_tensor_t *dz, coda_tensor_t *s);

/* out (n) = in (n) f32, converted to out's dtype (bf16 or f32). CPU tensors. */
void coda__llama_copy_vec(const coda_tensor_t *in, coda_tensor_t *out);

/* ---- memory on the layer's device (llama_mem.c) ---- */

typedef struct coda__llama_mem coda__llama_mem_t;

/* A handle for one device (CPU, or CUDA device_index of ctx); fn (a
 * string that outlives it) names the public call in its messages. */
coda_status_t coda__llama_mem_open(coda_context_t *ctx, coda_device_t device, int device_index, const char *fn,
                                   coda__llama_mem_t **out);
void coda__llama_mem_close(coda__llama_mem_t *m);
/* bytes on the handle's device, 256-byte aligned. */
coda_status_t coda__llama_mem_alloc(coda__llama_mem_t *m, size_t bytes, void **p);
void coda__llama_mem_free(coda__llama_mem_t *m, void *p);
/* dst = src: same dtype and extents, 1-D or 2-D, any row strides; each on the
 * CPU or the handle's device. Queued on the stream; a copy into host memory
 * waits for the stream before it returns. Nothing happens when src and dst
 * are the same CPU tensor. */
coda_status_t coda__llama_mem_copy(coda__llama_mem_t *m, const coda_tensor_t *src, coda_tensor_t *dst,
                                   void *stream);
/* Zero a 1-D or 2-D tensor on the CPU or the handle's device. */
coda_status_t coda__llama_mem_zero(coda__llama_mem_t *m, coda_tensor_t *t, void *stream);
/* Wait for the stream (no-op on the CPU). */
coda_status_t coda__llama_mem_sync(coda__llama_mem_t *m, void *stream);

#endif
