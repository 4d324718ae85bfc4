/* reference.h - an independent, plain, unfused LLaMA layer: the truth that the
 * fused layer (src/layer/llama.c) and `coda demo` are measured against.
 *
 * Not part of libcoda: the Makefile builds it into build/tests/liboracle.a
 * (the C tests and the CLI link it beside libcoda.a) and, alone, into
 * build/tests/liboracle.so (tests/test_layer_torch.py calls it via ctypes).
 *
 * It computes the layer of coda.h section 8 with its own simple loops (no
 * epilogue programs, no coda_gemm, no coda__attention_*), forward and backward
 * by hand-written calculus, in PyTorch's weight layout:
 *
 *   n1 = RMSNorm(x; g1)                      RMSNorm(x; g) = (x * r) * g,
 *   q = n1 wq^T, k = n1 wk^T, v = n1 wv^T       r = (mean_j x_j^2 + eps)^-1/2
 *   q, k = rope(q), rope(k)                  rotate-half pairs (i, i+hd/2) per
 *   o = softmax(q k^T / sqrt(hd) + causal) v    head, angle pos*theta^(-2i/hd),
 *   h = x + o wo^T                              pos = row % seq
 *   n2 = RMSNorm(h; g2)                      GQA: query head h reads kv head
 *   y = h + (silu(n2 w_gate^T) * n2 w_up^T) w_down^T      h / (n_heads/n_kv_heads)
 *   (vocab > 0) logits = RMSNorm(y; gf) wlm^T,
 *               loss_i = logsumexp(logits_i) - logits_i[t_i], 0 if t_i == -100
 *   L = loss_scale * sum_i loss_i + sum_ij dy_ij y_ij      (backward: dL/d.)
 *
 * Two modes:
 *   CODA__REF_F64   float64 throughout, nothing rounded: the truth.
 *   CODA__REF_BF16  "bf16 unfused": what PyTorch bf16 eager code does (the
 *                   functional layer of tests/test_layer_torch.py). Inputs and
 *                   weights are rounded to bf16 on use, and so is every tensor
 *                   eager code materialises, forward and backward: each GEMM
 *                   output, the normalised x*r, its product with g, each RoPE
 *                   product and their sum, the attention scores before and
 *                   after the 1/sqrt(hd) scale, the softmax output, silu(gate),
 *                   the SwiGLU product, residual sums, logits, every gradient
 *                   tensor and every gradient accumulation. Reductions (GEMM
 *                   sums, norms, softmax, loss) accumulate in float64 and are
 *                   rounded once; the loss itself stays unrounded (f32 in
 *                   PyTorch). Its error versus float64 is the baseline of the
 *                   tolerance rule: err(coda) <= 2 * err(bf16 unfused) + 1e-6.
 *
 * Use:
 *   coda__ref_layer_t *L;
 *   coda__ref_create(&cfg, batch, seq, &L);          // all arrays allocated
 *   coda__ref_from_bf16(L->w.wq, wq_bf16, nq * d);   // ... every weight, L->x,
 *   L->targets[i] = ...; L->dy[...] = ...;           // targets, dy
 *   coda__ref_forward(L, CODA__REF_F64);             // L->y, L->loss
 *   coda__ref_backward(L);                           // L->dx, L->grad.*
 * For both modes, make a second layer with coda__ref_copy_inputs().
 * One layer object per thread at a time; single-threaded loops; attention
 * probabilities are recomputed per row (memory O(M), time O(M*seq)).
 */
#ifndef CODA_ORACLE_REFERENCE_H
#define CODA_ORACLE_REFERENCE_H

#include "core/internal.h"

typedef enum coda__ref_mode {
    CODA__REF_F64 = 0,
    CODA__REF_BF16 = 1
} coda__ref_mode_t;

/* Weights (or their gradients) in PyTorch's layout, row-major, float64.
 * gf and wlm are NULL when vocab == 0. */
typedef struct coda__ref_weights {
    double *wq;      // (nq, d)
    double *wk;      // (nkv, d)
    double *wv;      // (nkv, d)
    double *wo;      // (d, nq)
    double *w_gate;  // (ffn, d)
    double *w_up;    // (ffn, d)
    double *w_down;  // (d, ffn)
    double *g1;      // (d)
    double *g2;      // (d)
    double *gf;      // (d)        final norm
    double *wlm;     // (vocab, d) LM head
} coda__ref_weights_t;

#define CODA__REF_N_WEIGHTS 11

/* One weight of the list, for loops over all of them (tests, comparisons). */
typedef struct coda__ref_param {
    const char *name;  /* "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down",
                          "g1", "g2", "gf", "wlm" */
    double *data;      /* NULL for gf/wlm when vocab == 0 */
    int64_t rows, cols; /* vectors: (d, 1) */
} coda__ref_param_t;

/* tests/test_layer_torch.py mirrors the fields up to `grad` with ctypes: keep
 * them in this order (append new fields after `grad`). */
typedef struct coda__ref_layer {
    coda_llama_config_t cfg;
    int64_t batch, seq, m;       /* m = batch * seq                          */
    int64_t nq, nkv;             /* n_heads*head_dim, n_kv_heads*head_dim     */

    /* Inputs, set by the caller. */
    coda__ref_weights_t w;
    double *x;                   // (M, d) layer input
    int32_t *targets;            // (M) class ids or -100; NULL when vocab == 0
    int use_loss;                /* 1 (default if vocab > 0): compute the loss */
    double loss_scale;           /* default 1                                 */
    double *dy;                  // (M, d) gradient of y
    int use_dy;                  /* 1 (default): include sum dy*y in L         */

    /* Results. */
    double *y;                   // (M, d)
    double *loss;                // (M) per-token loss (0 where ignored), if use_loss
    double *dx;                  // (M, d)
    coda__ref_weights_t grad;    /* dL/dW, PyTorch layout */

    /* Activations of the last forward pass, readable for debugging. */
    double *r1, *r2, *rf;        // (M) inverse RMS of x, h, y
    double *n1, *n2, *nf;        // (M, d) normalised inputs of the GEMMs
    double *q, *k, *v;           // (M, nq), (M, nkv), (M, nkv) after RoPE
    double *o;                   // (M, nq) attention output
    double *h;                   // (M, d) residual after attention
    double *gate, *up, *c;       // (M, ffn) pre-activations and silu(gate)*up
    double *logits;              // (M, vocab)
    double *lse;                 // (M) log-sum-exp of logits

    /* Internal state (do not touch). */
    int mode;                    /* mode of the last forward, -1 if none */
    double *nn1, *nn2, *nnf;     // (M, d) x*r before the weight
    double *q0, *k0;             // pre-RoPE q, k
    double *sg;                  // (M, ffn) silu(gate)
    double *cos_t, *sin_t;       // (seq, hd/2)
} coda__ref_layer_t;

/* Allocate a layer with every array (zero-filled, loss_scale 1, use_loss =
 * vocab > 0, use_dy 1, targets all -100). Validates cfg (d, heads, even
 * head_dim, ffn >= 1, vocab >= 0, eps > 0, rope_theta > 0) and batch, seq >= 1. */
coda_status_t coda__ref_create(const coda_llama_config_t *cfg, int64_t batch, int64_t seq,
                               coda__ref_layer_t **out);
void coda__ref_free(coda__ref_layer_t *layer);

/* Copy weights, x, targets, dy, use_loss, loss_scale, use_dy from src to dst
 * (same configuration and batch shape, else CODA_ERR_SHAPE). */
coda_status_t coda__ref_copy_inputs(coda__ref_layer_t *dst, const coda__ref_layer_t *src);

/* The weights of w (the layer's weights or its gradients) as a list of
 * CODA__REF_N_WEIGHTS entries in the order of coda__ref_param_t.name. */
void coda__ref_params(const coda__ref_layer_t *layer, const coda__ref_weights_t *w,
                      coda__ref_param_t out[CODA__REF_N_WEIGHTS]);

/* dst[i] = src[i] as double. */
void coda__ref_from_bf16(double *dst, const uint16_t *src, int64_t n);
/* A CPU bf16 or f32 tensor of n elements (1-D, or 2-D with any row stride)
 * into a dense double array, row-major. */
coda_status_t coda__ref_from_tensor(double *dst, const coda_tensor_t *t, int64_t n);

/* Forward: y (and loss when use_loss and vocab > 0). CODA_ERR_INVALID_ARG on
 * a target outside [0, vocab) that is not -100. */
coda_status_t coda__ref_forward(coda__ref_layer_t *layer, coda__ref_mode_t mode);

/* Backward of L, in the mode of the last forward: dx and grad. Needs a forward
 * pass first (else CODA_ERR_INVALID_ARG). */
coda_status_t coda__ref_backward(coda__ref_layer_t *layer);

#endif
