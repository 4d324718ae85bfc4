/* lm_steps.c - coda_lm_loss's memory-bound steps on CUDA tensors: the count
 * of rows not ignored, the rows step (lse, loss, dz in place) and the total
 * (core/lm_steps.h says what each computes; kernels/lm_steps.cuh how), and
 * coda_scale's multiply (grad_output times those gradients, later).
 *
 * lm_loss.c and scale.c have checked every argument, so these only marshal and launch
 * (through layer_steps.c's launcher: compiled once by NVRTC, cached). */
#ifdef CODA_WITH_CUDA

#include "core/lm_steps.h"
#include "cuda/layer_steps.h"

#define THREADS 512            /* CODA_LM_THREADS in the kernels */
#define SCALE_UNROLL 4         /* CODA_SCALE_UNROLL in coda_scale_kernel */
#define KEY0 0xc0da1a55e5ull   /* lm_steps.cuh's quick keys */

/* Default FMA contraction (unlike layer_steps.cuh, nothing here is compared
 * with the CPU bit for bit: the GEMMs before it are not). */
const char *const coda__cuda_lm_steps_opts[CODA_CUDA_LM_STEPS_NOPTS] = {"--gpu-architecture=sm_90a",
                                                                      "-default-device"};
const char *const coda__cuda_lm_steps_entries[] = {"coda_lm_targets_kernel", "coda_lm_rows_kernel",
                                                   "coda_lm_total_kernel", "coda_scale_kernel", NULL};

static coda_status_t launch(coda_context_t *ctx, const coda_tensor_t *like, const char *entry, int64_t blocks,
                            int threads, void **args, void *stream) {
    return coda__cuda_steps_launch(ctx, like->device_index, "lm_steps.cuh", coda__cuda_lm_steps_opts,
                                   CODA_CUDA_LM_STEPS_NOPTS, KEY0, entry, blocks, threads,
                                   args, 0, stream);
}

/* Threads of a rows block (a row a block), by V alone (so the sums' order
 * is fixed for a V): 16 or more 16-byte vectors a thread, 128 to 512
 * threads. A row of a short vocabulary is latency (two block reductions and
 * the target's logit before the first dz) more than bytes, so small blocks
 * keep more rows in flight on an SM: at V = 8192 a 512-thread block gave
 * 0.15 ms for 8192 rows (1.7 TB/s), against 3.7 TB/s at V = 128256. */
static int rows_threads(int64_t V) {
    int64_t vec = V / 8;
    return vec >= 16 * 512 ? 512 : vec >= 16 * 256 ? 256 : 128;
}

static long long es(const coda_tensor_t *t, int dim) {
    return (long long)(t->stride[dim] / (int64_t)coda_dtype_size(t->dtype));
}

coda_status_t coda__cuda_lm_targets(coda_context_t *ctx, const coda_tensor_t *targets, int32_t ignore_index,
                                    int64_t vocab, coda_tensor_t *t32, coda_tensor_t *count, void *stream) {
    int i64 = targets->dtype == CODA_I64;
    void *pt = targets->data;            // (M) i32 or i64
    void *po = t32 ? t32->data : NULL;   // (M) i32, contiguous (i64 targets)
    void *pc = count->data;              // (1) i32
    long long ts = es(targets, 0), m = targets->shape[0], V = vocab;
    int ig = ignore_index, bad = coda__lm_bad_target(ignore_index);
    void *args[] = {&pt, &i64, &ts, &m, &ig, &bad, &V, &po, &pc};
    return launch(ctx, targets, "coda_lm_targets_kernel", 1, THREADS, args, stream);
}

coda_status_t coda__cuda_lm_rows(coda_context_t *ctx, const coda__lm_params_t *p, coda_tensor_t *logits,
                                 const coda_tensor_t *partials, const coda_tensor_t *targets,
                                 const coda_tensor_t *count, coda_tensor_t *loss, void *stream) {
    void *pz = logits->data;    // (C, V) bf16, dz in place
    void *pp = partials->data;  // (C, T, 3) f32
    void *pt = targets->data;   // (C) i32
    void *pc = count->data;     // (1) i32
    void *pl = loss->data;      // (C) f32
    long long zs = es(logits, 0), p0 = es(partials, 0), p1 = es(partials, 1), p2 = es(partials, 2);
    long long T = partials->shape[1], ts = es(targets, 0), ls = es(loss, 0), rows = logits->shape[0], V = p->vocab;
    int ig = p->ignore_index, mean = p->mean, want = p->want_grad;
    float eps = p->smoothing, zc = p->z_loss, cap = p->softcap, gs = p->grad_scale;
    void *args[] = {&pz, &zs, &pp, &p0, &p1, &p2, &T, &pt, &ts, &pc, &pl, &ls, &rows, &V,
                    &ig, &eps, &zc, &cap, &gs, &mean, &want};
    return launch(ctx, logits, "coda_lm_rows_kernel", rows, rows_threads(V), args, stream);
}

coda_status_t coda__cuda_lm_total(coda_context_t *ctx, const coda_tensor_t *loss, const coda_tensor_t *count,
                                  int mean, coda_tensor_t *total, void *stream) {
    void *pl = loss->data;   // (M) f32
    void *pc = count->data;  // (1) i32
    void *po = total->data;  // (1) f32
    long long ls = es(loss, 0), m = loss->shape[0];
    void *args[] = {&pl, &ls, &m, &pc, &mean, &po};
    return launch(ctx, loss, "coda_lm_total_kernel", 1, THREADS, args, stream);
}

coda_status_t coda__cuda_scale(coda_context_t *ctx, coda_tensor_t *t, const coda_tensor_t *s, void *stream) {
    int two = t->ndim == 2, f32 = t->dtype == CODA_F32, per_vec = f32 ? 4 : 8;
    void *pt = t->data;       // (rows, cols) bf16 or f32, in place
    void *ps = s->data;       // (1) f32
    long long rows = two ? t->shape[0] : 1, cols = t->shape[two], ld = two ? es(t, 0) : cols;
    int vec = (uintptr_t)pt % 16 == 0 && cols % per_vec == 0 && (rows == 1 || ld % per_vec == 0);
    long long units = vec ? cols / per_vec : cols, seg = (long long)THREADS * SCALE_UNROLL;
    void *args[] = {&pt, &ld, &rows, &cols, &f32, &vec, &ps};
    return launch(ctx, t, "coda_scale_kernel", rows * ((units + seg - 1) / seg), THREADS, args, stream);
}

#endif /* CODA_WITH_CUDA */
