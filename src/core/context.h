/* context.h - the context object and the interface between the front ends
 * (argument checking and dispatch, src/api; the layer, src/layer) and the
 * backends (src/cpu, src/cuda). Both sides include this; neither includes
 * the other's headers. */
#ifndef CODA_CONTEXT_H
#define CODA_CONTEXT_H

#include "core/internal.h"

#include <stdatomic.h>
#include "program/ir.h"

struct coda_cuda; /* CUDA backend state, owned by src/cuda; NULL until first use */

/* ---- tuning: what chooses among kernels and launches ----
 *
 * Read once from the environment when the context is created (the
 * variables below are benchmarking and debugging switches, documented in
 * docs/gpu.md); nothing reads the environment later. Tests and benchmarks
 * change it with coda__set_tuning, never with setenv. Every kernel's cache
 * key includes code_key, the hash of the fields that change compiled code,
 * so a kernel built under one tuning is never launched under another. */
enum {
    CODA_STREAMK_OFF = 0,  /* CODA_STREAMK=0: never                              */
    CODA_STREAMK_ON = 1,   /* CODA_STREAMK=1: whenever there is a partial wave   */
    CODA_STREAMK_AUTO = 2, /* default: the measured rule (src/cuda/gemm.c)       */
    CODA_STREAMK_ALL = 3,  /* CODA_STREAMK=a: every unit shared out by k-blocks  */
    CODA_STREAMK_SPLIT = 4 /* CODA_STREAMK=s: the partial wave split in k (tests) */
};
#define CODA_TUNING_OPTS_CAP 256
typedef struct coda__tuning {
    int gemm_cfg;        /* CODA_GEMM_CFG: tile configuration forced (one digit), -1: per shape */
    int streamk;         /* CODA_STREAMK_*                                              */
    int clusters;        /* CODA_DEBUG_CLUSTERS: at most this many clusters, 0: all that fit */
    int l2_promotion;    /* CODA_DEBUG_L2: TMA L2 promotion 0..3 (none, 64, 128, 256 B); 3 */
    int no_ring;         /* CODA_DEBUG_NO_RING: tile inputs never through the stage ring  */
    int log_launch;      /* CODA_DEBUG_LAUNCH: each GEMM launch's grid printed to stderr  */
    int epi_overlap;     /* CODA_DEBUG_OVERLAP=0|1: a fused GEMM's epilogues beside the k-loop never (0), wherever the kernel can (1); -1 by the measured rule (src/cuda/gemm.c) */
    int attn_mma;        /* CODA_DEBUG_ATTN_MMA: attention on the mma.sync kernels       */
    int attn_split_bwd;  /* CODA_DEBUG_ATTN_SPLIT_BWD: the wgmma backward as its dk/dv and dq kernels */
    int attn_stages;     /* CODA_DEBUG_ATTN_STAGES: the wgmma backward's ring, 2..4 stages; 0 default */
    int attn_pipe;       /* CODA_DEBUG_ATTN_PIPE: the dq kernel pipelined and the forward's ping-pong (1) or neither (0); -1 default */
    int attn_fwd_stages; /* CODA_DEBUG_ATTN_FWD_STAGES: the wgmma forward's k/v ring, 2 or 3 stages; 0 default */
    int attn_fwd_apart;  /* CODA_DEBUG_ATTN_FWD_APART: the forward frees a stage's k and v apart (1) or together (0); -1 default */
    int attn_fwd_persist; /* CODA_DEBUG_ATTN_FWD_PERSIST=0|1: the wgmma forward a block a multiprocessor (1) or an item (0); -1 default */
    int attn_fwd_consumers; /* CODA_DEBUG_ATTN_FWD_CONSUMERS=2|3: the wgmma forward's consumer warpgroups (128 or 192 query rows an item); 0 default */
    int attn_bwd_parts;  /* CODA_DEBUG_ATTN_BWD_PARTS: the fused backward's blocks a kv group's heads are shared over, 1..8, -1 one head a block ('h'); 0 default */
    int attn_bwd_order;  /* CODA_DEBUG_ATTN_BWD_ORDER: the fused backward's launch chunks, (kv head part, sequence) pairs each: 1..9, 0 all (kv groups fastest), 1 key blocks fastest; -1 default */
    char extra_opts[CODA_TUNING_OPTS_CAP]; /* CODA_DEBUG_OPTS: up to 4 more NVRTC options */
    uint64_t code_key;   /* hash of extra_opts (0 when empty); set by coda__set_tuning    */
} coda__tuning_t;

/* The defaults, overridden by whatever of the variables above is set. */
void coda__tuning_from_env(coda__tuning_t *t);
/* Replace ctx's tuning (validated: CODA_ERR_INVALID_ARG and no change if a
 * field is out of range); computes code_key. */
coda_status_t coda__set_tuning(coda_context_t *ctx, const coda__tuning_t *t);
/* A copy of ctx's tuning (to change one field and set it back). */
coda__tuning_t coda__get_tuning(const coda_context_t *ctx);

struct coda_context {
    int cpu_threads;          /* >= 1 */
    char cache_dir[1024];     /* compiled-module cache directory */
    coda__tuning_t tuning;    /* read once at creation (above) */
    struct coda_cuda *cuda;
    /* coda_lm_loss's epilogue programs (plain, softcapped), parsed on first
     * use and kept with their generated code, so that a call does not
     * regenerate and rehash its kernel's source; freed with the context. */
    _Atomic(coda_program_t *) lm_programs[2];
    /* GPU launches that took the epilogue overlap (src/cuda/gemm.c): the
     * tests' evidence that a case ran the path it is meant to */
    _Atomic(uint64_t) overlap_launches;
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

#ifdef CODA_WITH_CUDA
/* The device a tensor's data really lives on, as the driver reports it
 * (src/cuda/driver.c): CODA_ERR_DEVICE for host memory unknown to CUDA or
 * another device's memory. Checks ts[0..n) (NULL entries skipped). */
coda_status_t coda__cuda_check_pointers(coda_context_t *ctx, int device_index, const coda_tensor_t *const *ts,
                                        const char *const *names, int n);

/* The layer's steps that are not GEMMs, on CUDA tensors
 * (src/cuda/layer_steps.c, kernels/layer_steps.cuh). Each checks its
 * arguments (descriptors, dtypes, agreeing extents, CUDA tensors of one
 * device, outputs apart from inputs, device pointers), refuses bad input
 * having written nothing, and runs asynchronously on `stream`. */

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
 *   dy (M, N) f32 or bf16, y (M, N) bf16, pos (M) f32, freq (N/2) f32,
 *   dz (M, N) bf16, s_out (M) or (M, 1) f32; N even; any row strides.
 * dy is an array of n_dy (1 to 3) matrices of M rows and an even number of
 * columns each, of one dtype, whose columns side by side are dy's (dq, dk
 * and dv as an attention returns them); the result is the same, bit for
 * bit, however dy is cut.
 * NaN in dy makes its pair of dz and s_out[i] NaN; in y, s_out[i]; in pos,
 * the row of dz. */
coda_status_t coda__cuda_rope_backward(coda_context_t *ctx, const coda_tensor_t *dy, int n_dy, const coda_tensor_t *y,
                                       const coda_tensor_t *pos, const coda_tensor_t *freq, coda_tensor_t *dz,
                                       coda_tensor_t *s_out, void *stream);
/* The same, for a freq the caller knows to repeat: freq[p] = freq[p %
 * period] for every pair p < rot_pairs (a layer's q and k heads: period
 * head_dim / 2, rot_pairs (n_heads + n_kv_heads) head_dim / 2). The kernel
 * then makes each row's cos and sin of those angles once (the same bits).
 * period 0 (and rot_pairs 0): none promised, as coda__cuda_rope_backward;
 * else period a multiple of 4 up to CODA_ROPE_PERIOD_MAX, rot_pairs a
 * multiple of 4 up to N/2, or CODA_ERR_INVALID_ARG. */
#define CODA_ROPE_PERIOD_MAX 128 /* the kernel's table: CODA_ROPE_TAB, kernels/layer_steps.cuh */
coda_status_t coda__cuda_rope_backward_periodic(coda_context_t *ctx, const coda_tensor_t *dy, int n_dy,
                                                const coda_tensor_t *y, const coda_tensor_t *pos,
                                                const coda_tensor_t *freq, int period, int64_t rot_pairs,
                                                coda_tensor_t *dz, coda_tensor_t *s_out, void *stream);

/* Attention on CUDA tensors (src/cuda/attention.c, kernels/attention.cuh),
 * checked by src/api/attention.c. Forward: do_ = o = NULL, out = the
 * forward's o (M, nq) bf16, lse written. Backward: o, lse the forward's,
 * do_ (M, nq) bf16, out = dqkv (M, nqkv) f32, ws the workspace. */
/* Bytes of workspace the backward on `dev` needs (coda_attention_workspace_size's answer). */
size_t coda__attention_ws_bytes(const coda_attention_shape_t *s, coda_device_t dev);
coda_status_t coda__cuda_attention(coda_context_t *ctx, const coda_attention_shape_t *shape,
                                   const coda_tensor_t *qkv, const coda_tensor_t *o, const coda_tensor_t *lse,
                                   const coda_tensor_t *do_, coda_tensor_t *out, void *ws, void *stream);

/* out = in, element by element: in (n) f32, out (n) f32 (the same bits) or
 * bf16 (rounded to nearest even; NaN stays NaN). Each may be 1-D (n) or a
 * column view (n, 1) with any row stride (an element stride). */
coda_status_t coda__cuda_convert_vec(coda_context_t *ctx, const coda_tensor_t *in, coda_tensor_t *out,
                                     void *stream);

/* Memory on CUDA device `index` for front ends that keep buffers of their
 * own (the layer; src/cuda/memory.c). Copies and fills are queued on
 * `stream`, ordered with the kernels on it; `what` names the caller in
 * messages. */
coda_status_t coda__cuda_alloc(coda_context_t *ctx, int index, size_t bytes, void **p, const char *what);
void coda__cuda_release(coda_context_t *ctx, int index, void *p); /* NULL: nothing */
/* rows x width bytes from src (row pitch spitch) to dst (dpitch); a side
 * whose *_host is 1 is host memory. A copy into host memory waits for the
 * stream before it returns. */
coda_status_t coda__cuda_copy_2d(coda_context_t *ctx, int index, void *dst, size_t dpitch, int dst_host,
                                 const void *src, size_t spitch, int src_host, size_t width, size_t rows,
                                 void *stream, const char *what);
/* rows x width bytes of zeros at dst (row pitch `pitch`), device memory. */
coda_status_t coda__cuda_zero_2d(coda_context_t *ctx, int index, void *dst, size_t pitch, size_t width,
                                 size_t rows, void *stream, const char *what);
/* The two above with the driver's pitch limit as a parameter: where a pitch
 * or the width exceeds max_pitch, each row goes in one-row pieces of at most
 * max_pitch bytes. The calls above pass CODA__CUDA_MAX_PITCH (the driver
 * refuses pitches of 2^31 bytes or more); tests pass small ones. */
#define CODA__CUDA_MAX_PITCH ((size_t)0x7fffffff)
coda_status_t coda__cuda_copy_2d_pieces(coda_context_t *ctx, int index, void *dst, size_t dpitch, int dst_host,
                                        const void *src, size_t spitch, int src_host, size_t width, size_t rows,
                                        void *stream, size_t max_pitch, const char *what);
coda_status_t coda__cuda_zero_2d_pieces(coda_context_t *ctx, int index, void *dst, size_t pitch, size_t width,
                                        size_t rows, void *stream, size_t max_pitch, const char *what);
/* Wait for everything queued on the stream. */
coda_status_t coda__cuda_sync(coda_context_t *ctx, int index, void *stream, const char *what);
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
