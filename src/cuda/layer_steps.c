/* layer_steps.c - the LLaMA layer's non-GEMM steps on CUDA tensors
 * (layer_steps.h says what each computes and how the layer calls them).
 *
 * Small kernels (kernels/layer_steps.cuh), compiled once by NVRTC and cached
 * like every other kernel, found again by a constant quick key per entry
 * point, launched with cuLaunchKernelEx through the driver table, as
 * finish_gpu.c does. Unlike the finishing steps these calls have no front
 * end in src/api, so they check their own arguments, all of them before
 * anything is launched: a call that fails has written nothing. */
#ifdef CODA_WITH_CUDA

#include "cuda/layer_steps.h"
#include "cuda/backend.h"

#include <stdio.h>

/* FMA contraction off: each element is the CPU's float operations in the
 * CPU's order (layer_steps.cuh). */
const char *const coda__cuda_steps_opts[CODA_CUDA_STEPS_NOPTS] = {"--gpu-architecture=sm_90a", "--fmad=false",
                                                                  "-default-device"};
const char *const coda__cuda_steps_entries[] = {"coda_norm_prologue_kernel", "coda_rope_backward_kernel",
                                                "coda_convert_vec_kernel", "coda_check_targets_kernel", NULL};

#define THREADS 256                /* CODA_STEPS_THREADS in the kernels */
#define MAX_BLOCKS ((int64_t)1 << 16) /* the kernels loop over what a grid this size leaves */

/* ---- argument checks ---- */

static int64_t elem_stride(const coda_tensor_t *t, int dim) {
    return t->stride[dim] / (int64_t)coda_dtype_size(t->dtype);
}

/* A well-formed descriptor of dtype dt, on CUDA. */
static coda_status_t check_desc(const char *fn, const coda_tensor_t *t, const char *name, coda_dtype_t dt) {
    if (!t) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %s is NULL", fn, name);
    char what[96];
    snprintf(what, sizeof what, "%s: %s", fn, name);
    CODA_TRY(coda__check_tensor(t, what));
    if (t->dtype != dt)
        return coda__fail(CODA_ERR_DTYPE, "%s: %s must be %s, got %s", fn, name, coda_dtype_name(dt),
                          coda_dtype_name(t->dtype));
    if (t->device != CODA_DEVICE_CUDA)
        return coda__fail(CODA_ERR_DEVICE, "%s: %s is a CPU tensor; this step runs on CUDA tensors", fn, name);
    return CODA_OK;
}

/* A (rows, cols) matrix; rows < 0 or cols < 0: any extent. */
static coda_status_t check_mat(const char *fn, const coda_tensor_t *t, const char *name, coda_dtype_t dt,
                               int64_t rows, int64_t cols) {
    CODA_TRY(check_desc(fn, t, name, dt));
    if (t->ndim != 2)
        return coda__fail(CODA_ERR_SHAPE, "%s: %s must be 2-D, got %d dims", fn, name, t->ndim);
    if ((rows >= 0 && t->shape[0] != rows) || (cols >= 0 && t->shape[1] != cols))
        return coda__fail(CODA_ERR_SHAPE, "%s: %s is (%lld, %lld), expected (%lld, %lld)", fn, name,
                          (long long)t->shape[0], (long long)t->shape[1], (long long)rows, (long long)cols);
    return CODA_OK;
}

/* A vector of n elements: 1-D (n), or with column = 1 also a column view
 * (n, 1) with any row stride. *es: its element stride. */
static coda_status_t check_vec(const char *fn, const coda_tensor_t *t, const char *name, coda_dtype_t dt,
                               int64_t n, int column, int64_t *es) {
    CODA_TRY(check_desc(fn, t, name, dt));
    int ok = t->ndim == 1 || (column && t->ndim == 2 && t->shape[1] == 1);
    if (!ok || t->shape[0] != n) {
        if (column)
            return coda__fail(CODA_ERR_SHAPE, "%s: %s must be (%lld) or (%lld, 1), got %d dims (%lld, ...)", fn,
                              name, (long long)n, (long long)n, t->ndim, (long long)t->shape[0]);
        return coda__fail(CODA_ERR_SHAPE, "%s: %s must be 1-D (%lld), got %d dims (%lld, ...)", fn, name,
                          (long long)n, t->ndim, (long long)t->shape[0]);
    }
    *es = elem_stride(t, 0);
    return CODA_OK;
}

/* Every tensor on the device of ts[0]. */
static coda_status_t check_same_device(const char *fn, const coda_tensor_t *const *ts, const char *const *names,
                                       int n) {
    for (int i = 1; i < n; i++)
        if (ts[i]->device_index != ts[0]->device_index)
            return coda__fail(CODA_ERR_DEVICE, "%s: %s is on cuda:%d, %s on cuda:%d", fn, names[i],
                              ts[i]->device_index, names[0], ts[0]->device_index);
    return CODA_OK;
}

/* Output outs[o] apart from every input and from the outputs before it. */
static coda_status_t check_apart(const char *fn, const coda_tensor_t *const *ins, const char *const *in_names,
                                 int n_in, const coda_tensor_t *const *outs, const char *const *out_names,
                                 int n_out) {
    for (int o = 0; o < n_out; o++) {
        for (int i = 0; i < n_in; i++)
            if (coda__tensors_overlap(outs[o], ins[i]))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps %s", fn, out_names[o], in_names[i]);
        for (int p = 0; p < o; p++)
            if (coda__tensors_overlap(outs[o], outs[p]))
                return coda__fail(CODA_ERR_OVERLAP, "%s: %s overlaps %s", fn, out_names[o], out_names[p]);
    }
    return CODA_OK;
}

/* The driver's word on every non-empty tensor: device memory of its
 * descriptor's device (an empty one may have no data at all). */
static coda_status_t check_pointers(coda_context_t *ctx, const coda_tensor_t *const *ts, const char *const *names,
                                    int n) {
    const coda_tensor_t *live[8];
    for (int i = 0; i < n && i < 8; i++) live[i] = coda_tensor_numel(ts[i]) > 0 ? ts[i] : NULL;
    return coda__cuda_check_pointers(ctx, ts[0]->device_index, live, names, n < 8 ? n : 8);
}

/* ---- launch ---- */

/* Fetch kernel `entry` of `source` (compiled on first use with opts;
 * found again by a quick key made of key0 and the entry's name), then on
 * `stream`: set the u32 at `preset` (if not 0) to 0xffffffff, and launch
 * `blocks` blocks (0: no launch; at most MAX_BLOCKS, the kernels loop) of
 * `threads` threads. The kernel is fetched first, so that once the preset
 * is written only the launch itself can still fail. */
coda_status_t coda__cuda_steps_launch(coda_context_t *ctx, int device_index, const char *source,
                                      const char *const *opts, int nopts, uint64_t key0, const char *entry,
                                      int64_t blocks, int threads, void **args, CUdeviceptr preset, void *stream) {
    coda_cuda_device_t *d;
    CODA_TRY(coda__cuda_device(ctx, device_index, &d));
    struct coda_cuda *cu = ctx->cuda;
    const char *src = coda__cuda_source(source);
    if (!src) return coda__fail(CODA_ERR_INTERNAL, "%s is not embedded", source);
    CODA_CU(cu, cu->cu.CtxPushCurrent(d->pctx), "cuCtxPushCurrent");
    /* quick key: a constant per entry point, so later calls skip hashing the source */
    uint64_t quick[2] = {key0, coda__hash(CODA_HASH_SEED0, entry, strlen(entry))};
    CUfunction fn = coda__cuda_kernel_find(d, quick);
    coda_status_t s = fn ? CODA_OK : coda__cuda_kernel(ctx, d, src, opts, nopts, entry, quick, &fn);
    if (s == CODA_OK && preset) {
        CUresult r = cu->cu.MemsetD32Async(preset, 0xffffffffu, 1, (CUstream)stream);
        if (r != CUDA_SUCCESS) s = coda__cu_fail(cu, r, "cuMemsetD32Async");
    }
    if (s == CODA_OK && blocks > 0) {
        CUlaunchConfig lc;
        memset(&lc, 0, sizeof lc);
        lc.gridDimX = (unsigned)(blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS);
        lc.gridDimY = lc.gridDimZ = 1;
        lc.blockDimX = (unsigned)threads;
        lc.blockDimY = lc.blockDimZ = 1;
        lc.hStream = (CUstream)stream;
        CUresult r = cu->cu.LaunchKernelEx(&lc, fn, args, NULL);
        if (r != CUDA_SUCCESS) s = coda__cu_fail(cu, r, entry);
    }
    CUcontext prev;
    cu->cu.CtxPopCurrent(&prev);
    return s;
}

static coda_status_t launch(coda_context_t *ctx, int device_index, const char *entry, int64_t blocks,
                            void **args, CUdeviceptr preset, void *stream) {
    return coda__cuda_steps_launch(ctx, device_index, "layer_steps.cuh", coda__cuda_steps_opts,
                                   CODA_CUDA_STEPS_NOPTS, 0xc0da57e95ull, entry, blocks, THREADS, args, preset,
                                   stream);
}

/* Warps per row for a row of `len` elements: a warp (8 rows a block) up to
 * 1024 elements, at most 4 chunks of 8 a lane, where a whole block would
 * leave most of its threads idle; a block (8 warps) above. The choice
 * depends on the length alone, and so does the order of the row sums. */
static int warps_per_row(int64_t len) { return len <= 1024 ? 1 : 8; }

static int64_t row_blocks(int64_t rows, int wpr) { return coda__cdiv(rows, 8 / wpr); }

/* ---- the steps ---- */

coda_status_t coda__cuda_norm_prologue(coda_context_t *ctx, const coda_tensor_t *x, const coda_tensor_t *g,
                                       coda_tensor_t *xg, coda_tensor_t *ss, void *stream) {
    static const char fn[] = "coda__cuda_norm_prologue";
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    CODA_TRY(check_mat(fn, x, "x", CODA_BF16, -1, -1));
    int64_t m = x->shape[0], d = x->shape[1], gs, sss;
    CODA_TRY(check_vec(fn, g, "g", CODA_BF16, d, 0, &gs));
    CODA_TRY(check_mat(fn, xg, "xg", CODA_BF16, m, d));
    CODA_TRY(check_vec(fn, ss, "ss", CODA_F32, m, 1, &sss));
    const coda_tensor_t *all[] = {x, g, xg, ss};
    const char *names[] = {"x", "g", "xg", "ss"};
    CODA_TRY(check_same_device(fn, all, names, 4));
    CODA_TRY(check_apart(fn, all, names, 2, all + 2, names + 2, 2));
    if (m == 0) return CODA_OK;
    CODA_TRY(check_pointers(ctx, all, names, 4));

    long long xs = elem_stride(x, 0), os = elem_stride(xg, 0), sstride = sss, rows = m, dl = d;
    int wpr = warps_per_row(d);
    void *px = x->data;   // (M, d) bf16
    void *pg = g->data;   // (d) bf16
    void *po = xg->data;  // (M, d) bf16
    void *pss = ss->data; // (M) f32, element stride sstride
    void *args[] = {&px, &xs, &pg, &po, &os, &pss, &sstride, &rows, &dl, &wpr};
    return launch(ctx, x->device_index, "coda_norm_prologue_kernel", row_blocks(m, wpr), args, 0, stream);
}

/* The kernel's coda_rope_parts_t (layer_steps.cuh), field for field. */
typedef struct {
    const void *p[3];
    long long st[3];
    long long off[4];
} rope_parts_t;

coda_status_t coda__cuda_rope_backward(coda_context_t *ctx, const coda_tensor_t *dy, int n_dy, const coda_tensor_t *y,
                                       const coda_tensor_t *pos, const coda_tensor_t *freq, coda_tensor_t *dz,
                                       coda_tensor_t *s_out, void *stream) {
    return coda__cuda_rope_backward_periodic(ctx, dy, n_dy, y, pos, freq, 0, 0, dz, s_out, stream);
}

coda_status_t coda__cuda_rope_backward_periodic(coda_context_t *ctx, const coda_tensor_t *dy, int n_dy,
                                                const coda_tensor_t *y, const coda_tensor_t *pos,
                                                const coda_tensor_t *freq, int period, int64_t rot_pairs,
                                                coda_tensor_t *dz, coda_tensor_t *s_out, void *stream) {
    static const char fn[] = "coda__cuda_rope_backward";
    static const char *const dy_names[3] = {"dy[0]", "dy[1]", "dy[2]"};
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    if (!dy) return coda__fail(CODA_ERR_INVALID_ARG, "%s: dy is NULL", fn);
    if (n_dy < 1 || n_dy > 3) return coda__fail(CODA_ERR_INVALID_ARG, "%s: %d parts of dy: 1 to 3", fn, n_dy);
    const coda_dtype_t dt = dy[0].dtype == CODA_BF16 ? CODA_BF16 : CODA_F32;
    rope_parts_t P;
    memset(&P, 0, sizeof P);
    int64_t m = -1, n = 0;
    for (int q = 0; q < 3; q++) {
        P.off[q] = n;
        if (q >= n_dy) continue;
        CODA_TRY(check_mat(fn, &dy[q], n_dy > 1 ? dy_names[q] : "dy", dt, m, -1));
        m = dy[q].shape[0];
        if (dy[q].shape[1] % 2 != 0)
            return coda__fail(CODA_ERR_SHAPE, "%s: %s has %lld columns; RoPE needs an even number (column pairs)",
                              fn, n_dy > 1 ? dy_names[q] : "dy", (long long)dy[q].shape[1]);
        P.p[q] = dy[q].data;
        P.st[q] = elem_stride(&dy[q], 0);
        n += dy[q].shape[1];
    }
    P.off[3] = n;
    int64_t ps, fs, s_s;
    CODA_TRY(check_mat(fn, y, "y", CODA_BF16, m, n));
    if (period == 0 ? rot_pairs != 0
                    : period < 0 || period % 4 || period > CODA_ROPE_PERIOD_MAX || period > n / 2 ||
                          rot_pairs < 0 || rot_pairs % 4 || rot_pairs > n / 2)
        return coda__fail(CODA_ERR_INVALID_ARG,
                          "%s: period %d, rot_pairs %lld: 0 and 0, or a multiple of 4 up to %d and a multiple "
                          "of 4, both at most %lld (N/2)", fn, period, (long long)rot_pairs, CODA_ROPE_PERIOD_MAX,
                          (long long)(n / 2));
    CODA_TRY(check_vec(fn, pos, "pos", CODA_F32, m, 0, &ps));
    CODA_TRY(check_vec(fn, freq, "freq", CODA_F32, n / 2, 0, &fs));
    CODA_TRY(check_mat(fn, dz, "dz", CODA_BF16, m, n));
    CODA_TRY(check_vec(fn, s_out, "s", CODA_F32, m, 1, &s_s));
    const coda_tensor_t *all[8] = {y, pos, freq, dz, s_out};
    const char *names[8] = {"y", "pos", "freq", "dz", "s"};
    for (int q = 0; q < n_dy; q++) all[5 + q] = &dy[q], names[5 + q] = n_dy > 1 ? dy_names[q] : "dy";
    const int nt = 5 + n_dy;
    CODA_TRY(check_same_device(fn, all, names, nt));
    const coda_tensor_t *ins[6] = {y, pos, freq, all[5], all[6], all[7]};
    const char *in_names[6] = {"y", "pos", "freq", names[5], names[6], names[7]};
    CODA_TRY(check_apart(fn, ins, in_names, 3 + n_dy, all + 3, names + 3, 2));
    if (m == 0) return CODA_OK;
    CODA_TRY(check_pointers(ctx, all, names, nt));

    long long ys = elem_stride(y, 0), pst = ps, dzs = elem_stride(dz, 0), sst = s_s, rows = m;
    int wpr = warps_per_row(n);
    void *py = y->data;      // (M, N) bf16
    void *ppos = pos->data;  // (M) f32
    void *pf = freq->data;   // (N/2) f32
    void *pdz = dz->data;    // (M, N) bf16
    void *psv = s_out->data; // (M) f32, element stride sst
    int dy_bf16 = dt == CODA_BF16;
    long long rp = rot_pairs;
    void *args[] = {&P, &py, &ys, &ppos, &pst, &pf, &pdz, &dzs, &psv, &sst, &rows, &wpr, &dy_bf16, &period, &rp};
    return launch(ctx, y->device_index, "coda_rope_backward_kernel", row_blocks(m, wpr), args, 0, stream);
}

coda_status_t coda__cuda_convert_vec(coda_context_t *ctx, const coda_tensor_t *in, coda_tensor_t *out,
                                     void *stream) {
    static const char fn[] = "coda__cuda_convert_vec";
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    int64_t is, os;
    CODA_TRY(check_desc(fn, in, "in", CODA_F32));
    CODA_TRY(check_vec(fn, in, "in", CODA_F32, in->shape[0], 1, &is));
    int64_t n = in->shape[0];
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "%s: out is NULL", fn);
    if (out->dtype != CODA_F32 && out->dtype != CODA_BF16) {
        const char *dn = coda_dtype_name(out->dtype);
        return coda__fail(CODA_ERR_DTYPE, "%s: out must be f32 or bf16, got %s", fn, dn ? dn : "an unknown dtype");
    }
    CODA_TRY(check_vec(fn, out, "out", out->dtype, n, 1, &os));
    const coda_tensor_t *all[] = {in, out};
    const char *names[] = {"in", "out"};
    CODA_TRY(check_same_device(fn, all, names, 2));
    CODA_TRY(check_apart(fn, all, names, 1, all + 1, names + 1, 1));
    if (n == 0) return CODA_OK;
    CODA_TRY(check_pointers(ctx, all, names, 2));

    long long ist = is, ost = os, nl = n;
    int to_bf16 = out->dtype == CODA_BF16;
    void *pi = in->data;   // (n) f32, element stride ist
    void *po = out->data;  // (n) bf16 or f32, element stride ost
    void *args[] = {&pi, &ist, &po, &ost, &nl, &to_bf16};
    return launch(ctx, in->device_index, "coda_convert_vec_kernel", coda__cdiv(n, THREADS), args, 0, stream);
}

coda_status_t coda__cuda_check_targets(coda_context_t *ctx, const coda_tensor_t *targets, int64_t vocab,
                                       int32_t ignore_index, coda_tensor_t *bad, void *stream) {
    static const char fn[] = "coda__cuda_check_targets";
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    int64_t ts, bs;
    CODA_TRY(check_desc(fn, targets, "targets", CODA_I32));
    CODA_TRY(check_vec(fn, targets, "targets", CODA_I32, targets->shape[0], 1, &ts));
    int64_t m = targets->shape[0];
    /* the flag is an i32 index */
    if (m > ((int64_t)1 << 31))
        return coda__fail(CODA_ERR_SHAPE, "%s: targets has %lld elements; at most 2^31 (bad is an i32 index)", fn,
                          (long long)m);
    if (vocab < 1)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: vocab %lld must be at least 1", fn, (long long)vocab);
    CODA_TRY(check_vec(fn, bad, "bad", CODA_I32, 1, 0, &bs));
    const coda_tensor_t *all[] = {targets, bad};
    const char *names[] = {"targets", "bad"};
    CODA_TRY(check_same_device(fn, all, names, 2));
    CODA_TRY(check_apart(fn, all, names, 1, all + 1, names + 1, 1));
    CODA_TRY(check_pointers(ctx, all, names, 2));

    long long tst = ts, nl = m, V = vocab;
    int ig = ignore_index;
    void *pt = targets->data; // (M) i32, element stride tst
    void *pb = bad->data;     // (1) i32, preset to -1 on the stream
    void *args[] = {&pt, &tst, &nl, &V, &ig, &pb};
    /* m == 0: the preset alone (no bad target) */
    return launch(ctx, targets->device_index, "coda_check_targets_kernel", coda__cdiv(m, THREADS), args,
                  (CUdeviceptr)(uintptr_t)bad->data, stream);
}

#endif /* CODA_WITH_CUDA */
