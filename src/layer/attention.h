/* attention.h - causal grouped-query attention on the CPU, forward and backward.
 *
 * Attention is not an epilogue program (docs/layer.md): the layer calls
 * these between the QKV GEMM and the O-projection. f32 math, exact softmax
 * (not tiled), work split over `threads` pthreads with a fixed partition, so
 * results do not depend on the thread count.
 *
 * Layout. M = batch * seq rows; row r is position r % seq of sequence r / seq.
 * qkv holds three column blocks q | k | v of widths nq = n_heads*head_dim,
 * nkv, nkv (nkv = n_kv_heads*head_dim); head h occupies columns h*head_dim ..
 * of its block. Query head h reads kv head h / (n_heads / n_kv_heads). Token i
 * attends to tokens j <= i of its own sequence, softmax scale 1/sqrt(head_dim).
 * coda permutes q and k columns inside each head (rotate-half pairs made
 * adjacent); q.k is invariant under one permutation applied to both, so
 * nothing here depends on it. All tensors are CPU tensors.
 */
#ifndef CODA_LAYER_ATTENTION_H
#define CODA_LAYER_ATTENTION_H

#include "core/internal.h"

/* o = softmax(q k^T * scale + causal mask) v, and lse[r][h] = log sum_j exp(s_rj)
 * (the row's log-sum-exp of scaled scores), saved for the backward pass.
 *   qkv (M, nq + 2 nkv) bf16,  o (M, nq) bf16,  lse (M, n_heads) f32. */
coda_status_t coda__attention_forward(const coda_llama_config_t *cfg, int64_t batch, int64_t seq,
                                      const coda_tensor_t *qkv, coda_tensor_t *o,
                                      coda_tensor_t *lse, int threads);

/* Gradients of sum(do * o) with respect to q, k and v, written to the same
 * column blocks of dqkv (every element is written; nothing is accumulated).
 * o and lse are the forward outputs (o as stored, bf16; D_i = do_i . o_i).
 *   qkv (M, nq + 2 nkv) bf16, o (M, nq) bf16, lse (M, n_heads) f32,
 *   do_ (M, nq) bf16, dqkv (M, nq + 2 nkv) f32. */
coda_status_t coda__attention_backward(const coda_llama_config_t *cfg, int64_t batch, int64_t seq,
                                       const coda_tensor_t *qkv, const coda_tensor_t *o,
                                       const coda_tensor_t *lse, const coda_tensor_t *do_,
                                       coda_tensor_t *dqkv, int threads);

#endif
