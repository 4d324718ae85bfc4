/* lm_steps.h - the memory-bound steps of coda_lm_loss (src/layer/lm_loss.c),
 * the same three on each backend: the CPU's in src/layer/lm_loss_cpu.c (the
 * reference), CUDA's in src/cuda/lm_steps.c (kernels/lm_steps.cuh).
 *
 * lm_loss.c checks every argument before the first step runs; the steps
 * trust them: descriptors well formed, dtypes and extents as below, one
 * device, outputs apart from inputs. Strides are the tensors' own (bytes).
 *
 *   targets  count[0] (1) i32 = number of i with targets[i] != ignore_index;
 *            targets (M) i32 or i64. For i64 also t32 (M) i32, contiguous:
 *              t32[i] = targets[i]    if it is ignore_index or in [0, V)
 *                     = bad           otherwise (outside int32 included),
 *              bad = -1, or -2 when ignore_index is -1: a value the rows
 *              step takes as outside [0, V) and never as ignore_index.
 *            t32 is NULL for i32 targets (they are read as they are).
 *
 *   rows     one chunk of C rows of the logits, after the logits GEMM:
 *              logits   (C, V) bf16, read, and overwritten with dz
 *                       when p->want_grad (else left as they are)
 *              partials (C, T, 3) f32, the epilogue's (m, l, p) per row and
 *                       column tile (coda.h section 5; p is not used)
 *              targets  (C) i32, count (1) i32 (read when p->mean),
 *              loss     (C) f32, written.
 *            Per row i, with t = targets[i], z_j = logits[i][j] (f32 of the
 *            bf16), eps = p->smoothing, zc = p->z_loss, c = p->softcap:
 *              lse  = m + log(sum_t l_t exp(m_t - m)), m = max_t m_t, with
 *                     exp(m_t - m) taken as 1 where m_t == m and a NaN m_t or
 *                     l_t giving NaN (coda_finish_lse's rule)
 *              if t == ignore_index:  loss = 0; dz row = +0 (NaN or not)
 *              else:
 *                zt   = z_t if 0 <= t < V, else NaN
 *                loss = lse - (1 - eps) zt + zc lse lse
 *                       - (eps / V) sum_j z_j       (this term only if eps > 0)
 *                s    = p->grad_scale, divided by (float)count[0] if p->mean
 *                a    = s (1 + 2 zc lse)
 *                dz_j = a exp(z_j - lse) - (j == t ? s (1 - eps) : 0)
 *                       - s eps / V,
 *                       times (1 - (z_j / c)^2) if c > 0,
 *                       NaN for every j if t is outside [0, V),
 *                       rounded to bf16 (nearest even)
 *            Sums over j and t in a fixed order per backend (bitwise
 *            reproducible run to run; the backends agree within rounding).
 *
 *   total    total[0] (1) f32 = sum_i loss[i] (fixed order), divided by
 *            (float)count[0] if mean. loss (M) f32.
 */
#ifndef CODA_CORE_LM_STEPS_H
#define CODA_CORE_LM_STEPS_H

#include "core/internal.h"

/* The i32 stand-in for an i64 target that is neither ignore_index nor in
 * [0, V): negative (so the rows step gives its row NaN), not ignore_index. */
static inline int32_t coda__lm_bad_target(int32_t ignore_index) { return ignore_index == -1 ? -2 : -1; }

typedef struct coda__lm_params {
    int64_t vocab;        /* V, the logits' columns                       */
    int32_t ignore_index;
    float smoothing;      /* eps                                          */
    float z_loss;         /* zc                                           */
    float softcap;        /* c; 0: none                                   */
    float grad_scale;
    int mean;             /* 1: gradients divided by count[0]             */
    int want_grad;        /* 0: only the loss; the logits stay            */
} coda__lm_params_t;

void coda__cpu_lm_targets(const coda_tensor_t *targets, int32_t ignore_index, int64_t vocab, coda_tensor_t *t32,
                          coda_tensor_t *count);
void coda__cpu_lm_rows(const coda__lm_params_t *p, coda_tensor_t *logits, const coda_tensor_t *partials,
                       const coda_tensor_t *targets, const coda_tensor_t *count, coda_tensor_t *loss);
void coda__cpu_lm_total(const coda_tensor_t *loss, const coda_tensor_t *count, int mean, coda_tensor_t *total);

#ifdef CODA_WITH_CUDA
coda_status_t coda__cuda_lm_targets(coda_context_t *ctx, const coda_tensor_t *targets, int32_t ignore_index,
                                    int64_t vocab, coda_tensor_t *t32, coda_tensor_t *count, void *stream);
coda_status_t coda__cuda_lm_rows(coda_context_t *ctx, const coda__lm_params_t *p, coda_tensor_t *logits,
                                 const coda_tensor_t *partials, const coda_tensor_t *targets,
                                 const coda_tensor_t *count, coda_tensor_t *loss, void *stream);
coda_status_t coda__cuda_lm_total(coda_context_t *ctx, const coda_tensor_t *loss, const coda_tensor_t *count,
                                  int mean, coda_tensor_t *total, void *stream);
/* coda_scale on a CUDA tensor (src/api/scale.c has checked it) */
coda_status_t coda__cuda_scale(coda_context_t *ctx, coda_tensor_t *t, const coda_tensor_t *s, void *stream);
#endif

#endif
