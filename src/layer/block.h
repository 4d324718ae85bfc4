/* block.h - internals of the split block (block.c) shared with the whole
 * layer (llama.c) and the layer steps (steps.c); not public. */
#ifndef CODA_LAYER_BLOCK_H
#define CODA_LAYER_BLOCK_H

#include "layer/llama.h"

/* The built-in programs a block runs, parsed once per block. */
enum {
    CODA__P_RESID_NORM, CODA__P_RESID_ADD, CODA__P_QKV, CODA__P_GATEUP, CODA__P_LSE, CODA__P_LM_BWD,
    CODA__P_SWIGLU_BWD, CODA__P_RMS_BWD, CODA__P_GATEUP_INFER, CODA__P_SWIGLU_BWD_KEPT, CODA__P_COUNT
};
extern const char *const coda__llama_prog_names[CODA__P_COUNT];

struct coda_block {
    coda_context_t *ctx;
    coda_llama_config_t cfg;
    int64_t nq, nkv, nqkv;      /* widths of q, k (= v) and the qkv block   */
    coda_device_t device;
    int device_index;
    coda__llama_mem_t *mem;     /* allocations and copies on `device`        */
    coda_program_t *prog[CODA__P_COUNT];
    coda_tensor_t freq;         /* (nqkv/2) f32 RoPE frequency per column pair */
};

/* A program argument bound to a tensor, or to a scalar. */
static inline coda_binding_t coda__bind(const char *name, const coda_tensor_t *t) {
    coda_binding_t b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.tensor = *t;
    return b;
}
static inline coda_binding_t coda__bind_scalar(const char *name, float v) {
    coda_binding_t b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.scalar = v;
    return b;
}

/* coda_block_create with `fn` naming the public call in messages;
 * with_vocab: cfg->vocab is a GEMM's contraction too (the whole layer's LM
 * head), so on CUDA it must be a multiple of 8 as well. */
coda_status_t coda__block_create(coda_context_t *ctx, const coda_llama_config_t *cfg, coda_device_t device,
                                 int with_vocab, const char *fn, coda_block_t **out);

/* t is (rows, cols) [cols < 0: 1-D] of one of the n_dts dtypes, on the
 * block's device; `fn: what` names it in messages. */
coda_status_t coda__block_check_arg(const coda_block_t *B, const coda_tensor_t *t, const char *fn, const char *what,
                                    int64_t rows, int64_t cols, const coda_dtype_t *dts, int n_dts);

/* The fields of coda_llama_weights_t by index (g1 wqkv wo g2 wgu wd gf
 * wlm), their names and their shapes for B's configuration (cols -1: a
 * vector; wlm's rows are cfg->vocab). Masks: bit i for field i. */
#define CODA__N_WEIGHTS 8
#define CODA__W_BLOCK 0x3fu /* the block's six */
#define CODA__W_LM 0xc0u    /* the LM head's gf, wlm */
const coda_tensor_t *coda__weight(const coda_llama_weights_t *w, int i);
const char *coda__weight_name(int i);
void coda__weight_shape(const coda_block_t *B, int i, int64_t *rows, int64_t *cols);

/* The fields of w in mask well formed: shape, one of the dtypes, on B's
 * device; `what` names w in messages ("w", "grads"). */
coda_status_t coda__block_check_weights(const coda_block_t *B, const coda_llama_weights_t *w, unsigned mask,
                                        const char *fn, const char *what, const coda_dtype_t *dts, int n_dts);

/* Outputs apart from each other, from the inputs, from the weights of w in
 * wmask and from the gradients of grads in gmask (may be NULL); and those
 * gradients apart from the inputs, the weights and each other. NULL
 * tensors are skipped. */
typedef struct { const coda_tensor_t *t; const char *name; } coda__named_t;
coda_status_t coda__block_check_apart(const char *fn, const coda__named_t *out, int n_out, const coda__named_t *in,
                                      int n_in, const coda_llama_weights_t *w, unsigned wmask,
                                      const coda_llama_weights_t *grads, unsigned gmask);

/* On CUDA, what the GPU steps need of the caller's tensors, checked before
 * anything is written: every tensor's data on the block's device (not host
 * memory the descriptor calls CUDA), and its base and row stride multiples
 * of `align` bytes (16: GEMM operands and weight-gradient outputs, for the
 * copy engine; 4: tensors the epilogues read or write pair by pair; 0: no
 * alignment). NULL tensors are skipped; at most 32. Nothing on the CPU. */
typedef struct { const coda_tensor_t *t; const char *name; int align; } coda__dev_arg_t;
coda_status_t coda__block_check_on_device(const coda_block_t *B, const char *fn, const coda__dev_arg_t *a, int n);

/* ---- the steps that are not GEMMs, on the block's device (steps.c):
 * the CPU loops of llama_cpu.c, or the backend's kernels on CUDA (no copy
 * to or from the host). Arguments are checked by the caller. ---- */

/* xg (M, d) bf16 = x (M, d) bf16 * g (d) bf16; ss (M, 1) f32 = rowsum x^2. */
coda_status_t coda__layer_norm_prologue(const coda_block_t *B, const coda_tensor_t *x, const coda_tensor_t *g,
                                        coda_tensor_t *xg, coda_tensor_t *ss, void *stream);
/* dz (M, N) bf16 = R^T dy per column pair (dy (M, N) f32 or bf16, the
 * rotation by pos (M) f32 * freq (N/2) f32); s (M) f32 = rowsum y * dy with
 * y (M, N) bf16 the forward's roped output. dy: n_dy matrices (1 to 3)
 * whose columns side by side are dy's (dq, dk, dv). */
coda_status_t coda__layer_rope_backward(const coda_block_t *B, const coda_tensor_t *dy, int n_dy, const coda_tensor_t *y,
                                        const coda_tensor_t *pos, const coda_tensor_t *freq, coda_tensor_t *dz,
                                        coda_tensor_t *s, void *stream);
/* out (n) bf16 or f32 = in (n) f32. */
coda_status_t coda__layer_convert_vec(const coda_block_t *B, const coda_tensor_t *in, coda_tensor_t *out,
                                      void *stream);

#endif
