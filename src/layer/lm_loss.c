/* lm_loss.c - coda_lm_loss: the LM head and the cross-entropy loss, forward
 * and backward in one call, with a bounded chunk of the logits alive
 * (coda.h section 10; docs/lm_loss.md).
 *
 * Per chunk of C rows (x_c (C, d), targets_c, loss_c):
 *
 *   logits GEMM   z = x_c w^T (C, V), epilogue lm_logits: optional softcap,
 *                 z stored in bf16 in the workspace, and the online
 *                 log-sum-exp partials (C, T, 3) of the stored values
 *   rows step     lse from the partials, loss_c, and dz over z in place
 *                 (core/lm_steps.h: the CPU's loops or CUDA's kernel)
 *   dgrad GEMM    dx_c = dz w             (C, d)   NN, K = V
 *   wgrad GEMM    dw  += dz^T x_c         (V, d)   TN, K = C
 *
 * so the logits cost one store and one read-modify-write pass beside the
 * three GEMMs, and the memory is one chunk (C, V) bf16 plus its partials.
 * The mean's divisor (the rows not ignored) is counted on the device before
 * the first chunk, and i64 targets narrowed to i32 in the same pass, so
 * nothing waits for the host.
 *
 * Every argument is checked before the first kernel: a call that fails has
 * written nothing. */
#include "core/context.h"
#include "core/lm_steps.h"
#include "layer/block.h"   /* coda__bind, coda__bind_scalar */

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define FN "coda_lm_loss"
#define CHUNK_BYTES ((int64_t)1 << 30) /* default: a chunk's logits take at most 1 GiB, */
#define CHUNK_PER_W 2                  /* or twice w's bytes if that is more            */
#define CHUNK_ALIGN 256                /* default chunk_rows is a multiple of this    */
#define MIN_TILE_N 128                 /* the narrowest tile either backend chooses   */

/* ---- the epilogue programs of the logits GEMM ---- */

static const char prog_logits[] =
    "program lm_logits\n"
    "in  t    row i32         # (C) targets (the pick is not used)\n"
    "out z    tile bf16       # (C, V) logits\n"
    "out part lse             # (C, T, 3) log-sum-exp partials of the stored z\n"
    "a  = acc\n"
    "zr = round_bf16 a\n"
    "store z zr\n"
    "tv = load t\n"
    "lse part zr tv\n";

static const char prog_logits_capped[] =
    "program lm_logits_capped\n"
    "in  t    row i32         # (C) targets (the pick is not used)\n"
    "in  cap  scalar          # softcap\n"
    "in  icap scalar          # 1 / softcap\n"
    "out z    tile bf16       # (C, V) softcap tanh(acc / softcap)\n"
    "out part lse             # (C, T, 3) log-sum-exp partials of the stored z\n"
    "a  = acc\n"
    "ic = load icap\n"
    "u  = mul a ic\n"
    "th = tanh u\n"
    "c  = load cap\n"
    "y  = mul th c\n"
    "zr = round_bf16 y\n"
    "store z zr\n"
    "tv = load t\n"
    "lse part zr tv\n";

/* The context's copy of program `capped` (0 / 1), parsed on first use; a
 * thread that loses the race to store its copy frees it. */
static coda_status_t lm_program(coda_context_t *ctx, int capped, const coda_program_t **out) {
    coda_program_t *p = atomic_load(&ctx->lm_programs[capped]);
    if (!p) {
        coda_program_t *made = NULL;
        CODA_TRY(coda_program_parse(capped ? prog_logits_capped : prog_logits, &made));
        if (atomic_compare_exchange_strong(&ctx->lm_programs[capped], &p, made)) p = made;
        else coda_program_free(made);
    }
    *out = p;
    return CODA_OK;
}

/* ---- options ---- */

void coda_lm_loss_opts_init(coda_lm_loss_opts_t *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->ignore_index = -100;
    o->grad_scale = 1.0f;
    o->reduction = CODA_LM_MEAN;
}

static coda_status_t check_opts(const char *fn, const coda_lm_loss_opts_t *o) {
    if (!(o->label_smoothing >= 0.0f && o->label_smoothing <= 1.0f))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: label_smoothing %g is outside [0, 1]", fn,
                          (double)o->label_smoothing);
    if (!(o->z_loss >= 0.0f) || !isfinite(o->z_loss))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: z_loss %g must be finite and >= 0", fn, (double)o->z_loss);
    if (!(o->softcap >= 0.0f) || !isfinite(o->softcap) || (o->softcap > 0.0f && !isfinite(1.0f / o->softcap)))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: softcap %g must be 0 (none) or finite and > 0", fn,
                          (double)o->softcap);
    if (!isfinite(o->grad_scale))
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: grad_scale %g is not finite", fn, (double)o->grad_scale);
    if (o->reduction != CODA_LM_MEAN && o->reduction != CODA_LM_SUM)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: reduction %d is not CODA_LM_MEAN (0) or CODA_LM_SUM (1)", fn,
                          (int)o->reduction);
    if (o->accumulate != 0 && o->accumulate != 1)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: accumulate is %d, not 0 or 1", fn, o->accumulate);
    if (o->chunk_rows < 0)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: chunk_rows %lld is negative", fn, (long long)o->chunk_rows);
    return CODA_OK;
}

/* Rows per chunk for m rows of vocabulary V (padded: vp) and hidden size d.
 * The default bounds a chunk's logits by the larger of 1 GiB and twice w's
 * own bytes: the wgrad GEMM contracts over the chunk's rows and rereads dw
 * once a chunk, so a larger head wants a longer chunk, and memory then
 * stays in proportion to the weight the call holds anyway. */
static int64_t chunk_rows(const coda_lm_loss_opts_t *o, int64_t m, int64_t vp, int64_t d) {
    int64_t c = o->chunk_rows;
    if (c == 0) {
        int64_t cap = CHUNK_PER_W * vp * d * 2;
        if (cap < CHUNK_BYTES) cap = CHUNK_BYTES;
        c = cap / (vp * 2) / CHUNK_ALIGN * CHUNK_ALIGN;
        if (c < CHUNK_ALIGN) c = CHUNK_ALIGN;
    }
    return c < m ? c : m;
}

/* ---- the workspace: the chunk's logits, its partials, the count, the
 * contraction tails, the targets as i32 (when they came as i64) ---- */

typedef struct {
    int64_t rows, vp, nt;   /* chunk rows, padded row length, partial tiles (most) */
    int64_t rows8;          /* rows of the logits buffer: chunk rows rounded up to 8 */
    size_t logits_at, part_at, count_at, wtail_at, xtail_at, t32_at, used;
} ws_layout_t;

static size_t up256(size_t b) { return (b + 255) / 256 * 256; }

/* The CUDA GEMM contracts over multiples of 8 (coda.h section 4): the
 * dgrad's contraction is V and the wgrad's the chunk's rows, so on CUDA a
 * contraction with a tail of r < 8 runs as a GEMM over the multiple of 8
 * below it plus one of K = 8 over zero-padded copies (wtail: the last r rows
 * of w; xtail: the last r rows of x; the logits buffer's padding columns and
 * rows are zeros). Chunks other than the last have a multiple of 8 rows. */
static ws_layout_t ws_layout(const coda_lm_loss_opts_t *o, int64_t m, int64_t V, int64_t d) {
    ws_layout_t L;
    L.vp = (V + 7) / 8 * 8; /* 16-byte rows for the GEMMs' copy engine */
    L.rows = chunk_rows(o, m, L.vp, d);
    if (L.rows < m) L.rows = (L.rows + 7) / 8 * 8;
    L.rows8 = (L.rows + 7) / 8 * 8;
    L.nt = coda__cdiv(V, MIN_TILE_N);
    L.logits_at = 0;
    L.part_at = up256((size_t)L.rows8 * (size_t)L.vp * 2);
    L.count_at = L.part_at + up256((size_t)L.rows * (size_t)L.nt * 3 * 4);
    L.wtail_at = L.count_at + 256;
    L.xtail_at = L.wtail_at + up256((size_t)8 * (size_t)d * 2);
    L.t32_at = L.xtail_at + up256((size_t)8 * (size_t)d * 2); /* i64 targets narrowed to i32 */
    L.used = L.t32_at + up256((size_t)m * 4);
    return L;
}

/* The extents coda.h section 10 allows, one rule for the call and its size
 * query (they had drifted apart: the call took d = 2^31). */
static coda_status_t check_extents(const char *fn, int64_t m, int64_t d, int64_t vocab) {
    if (m < 1 || d < 1 || vocab < 1 || m >= ((int64_t)1 << 31) || d >= ((int64_t)1 << 31) ||
        vocab > CODA_LSE_MAX_COLS)
        return coda__fail(CODA_ERR_SHAPE, "%s: M %lld, d %lld and V %lld must be >= 1, M and d below 2^31, V at "
                          "most 2^24 (CODA_LSE_MAX_COLS)", fn, (long long)m, (long long)d, (long long)vocab);
    return CODA_OK;
}

coda_status_t coda_lm_loss_workspace_size(coda_context_t *ctx, coda_device_t device, int64_t m, int64_t d,
                                          int64_t vocab, const coda_lm_loss_opts_t *opts, size_t *bytes) {
    static const char fn[] = "coda_lm_loss_workspace_size";
    if (!ctx || !bytes) return coda__fail(CODA_ERR_INVALID_ARG, "%s: NULL argument", fn);
    if (device != CODA_DEVICE_CPU && device != CODA_DEVICE_CUDA)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: device %d is neither CPU (0) nor CUDA (1)", fn, (int)device);
    CODA_TRY(check_extents(fn, m, d, vocab));
    coda_lm_loss_opts_t def;
    coda_lm_loss_opts_init(&def);
    const coda_lm_loss_opts_t *o = opts ? opts : &def;
    CODA_TRY(check_opts(fn, o));
    *bytes = ws_layout(o, m, vocab, d).used;
    return CODA_OK;
}

/* ---- argument checks ---- */

/* A 2-D (rows, cols) tensor of one of the dtypes, rows contiguous. */
static coda_status_t check_mat(const coda_tensor_t *t, const char *name, int64_t rows, int64_t cols,
                               const coda_dtype_t *dts, int n_dt) {
    char what[64];
    snprintf(what, sizeof what, FN ": %s", name);
    CODA_TRY(coda__check_tensor(t, what));
    CODA_TRY(coda__check_dtype(t, what, dts, n_dt));
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return coda__fail(CODA_ERR_SHAPE, "%s must be (%lld, %lld), got %d dims (%lld, %lld)", what,
                          (long long)rows, (long long)cols, t->ndim, (long long)t->shape[0],
                          (long long)(t->ndim > 1 ? t->shape[1] : 0));
    if (t->stride[1] != (int64_t)coda_dtype_size(t->dtype))
        return coda__fail(CODA_ERR_STRIDE, "%s: rows must be contiguous (column stride %lld bytes)", what,
                          (long long)t->stride[1]);
    if (t->device == CODA_DEVICE_CUDA && ((uintptr_t)t->data % 16 != 0 || t->stride[0] % 16 != 0))
        return coda__fail(CODA_ERR_STRIDE, "%s: base %p and row stride %lld bytes must be multiples of 16 on the GPU",
                          what, t->data, (long long)t->stride[0]);
    return CODA_OK;
}

/* A vector of n elements of one of the dtypes: (n), or (n, 1). */
static coda_status_t check_vec_of(const coda_tensor_t *t, const char *name, int64_t n, const coda_dtype_t *dts,
                                  int n_dt) {
    char what[64];
    snprintf(what, sizeof what, FN ": %s", name);
    CODA_TRY(coda__check_tensor(t, what));
    CODA_TRY(coda__check_dtype(t, what, dts, n_dt));
    if (!(t->ndim == 1 || (t->ndim == 2 && t->shape[1] == 1)) || t->shape[0] != n)
        return coda__fail(CODA_ERR_SHAPE, "%s must be (%lld) or (%lld, 1), got %d dims (%lld, ...)", what,
                          (long long)n, (long long)n, t->ndim, (long long)t->shape[0]);
    return CODA_OK;
}

static coda_status_t check_vec(const coda_tensor_t *t, const char *name, int64_t n, coda_dtype_t dt) {
    return check_vec_of(t, name, n, &dt, 1);
}

typedef struct { const coda_tensor_t *t; const char *name; } named_t;

/* ---- a view of rows [r0, r0 + n) ---- */

static coda_tensor_t rows_of(const coda_tensor_t *t, int64_t r0, int64_t n) {
    coda_tensor_t v = *t;
    v.data = (char *)t->data + r0 * t->stride[0];
    v.shape[0] = n;
    return v;
}

static coda_tensor_t ws_tensor(const coda_tensor_t *like, void *p, coda_dtype_t dt, int ndim, const int64_t *shape,
                               const int64_t *stride) {
    coda_tensor_t t;
    memset(&t, 0, sizeof t);
    t.data = p;
    t.dtype = dt;
    t.device = like->device;
    t.device_index = like->device_index;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        t.stride[i] = stride[i];
    }
    return t;
}

/* ---- the steps on the call's device ---- */

#ifndef CODA_WITH_CUDA
static coda_status_t no_cuda(void) {
    return coda__fail(CODA_ERR_UNSUPPORTED, FN ": CUDA tensors, but this build has no CUDA backend");
}
#endif

static coda_status_t step_targets(coda_context_t *ctx, const coda_tensor_t *targets, int32_t ignore, int64_t V,
                                  coda_tensor_t *t32, coda_tensor_t *count, void *stream) {
    if (targets->device == CODA_DEVICE_CPU) {
        coda__cpu_lm_targets(targets, ignore, V, t32, count);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_lm_targets(ctx, targets, ignore, V, t32, count, stream);
#else
    return no_cuda();
#endif
}

static coda_status_t step_rows(coda_context_t *ctx, const coda__lm_params_t *p, coda_tensor_t *logits,
                               const coda_tensor_t *part, const coda_tensor_t *targets, const coda_tensor_t *count,
                               coda_tensor_t *loss, void *stream) {
    if (logits->device == CODA_DEVICE_CPU) {
        coda__cpu_lm_rows(p, logits, part, targets, count, loss);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_lm_rows(ctx, p, logits, part, targets, count, loss, stream);
#else
    return no_cuda();
#endif
}

static coda_status_t step_total(coda_context_t *ctx, const coda_tensor_t *loss, const coda_tensor_t *count, int mean,
                                coda_tensor_t *total, void *stream) {
    if (loss->device == CODA_DEVICE_CPU) {
        coda__cpu_lm_total(loss, count, mean, total);
        return CODA_OK;
    }
#ifdef CODA_WITH_CUDA
    return coda__cuda_lm_total(ctx, loss, count, mean, total, stream);
#else
    return no_cuda();
#endif
}

/* ---- the GEMMs with dz, and the CUDA contraction tails ---- */

static coda_status_t zero_bytes(coda_context_t *ctx, const coda_tensor_t *like, void *dst, size_t pitch,
                                size_t width, int64_t rows, void *stream) {
#ifdef CODA_WITH_CUDA
    return coda__cuda_zero_2d(ctx, like->device_index, dst, pitch, width, (size_t)rows, stream, FN);
#else
    return no_cuda();
#endif
}

static coda_status_t copy_rows(coda_context_t *ctx, const coda_tensor_t *like, void *dst, size_t dpitch,
                               const void *src, size_t spitch, size_t width, int64_t rows, void *stream) {
#ifdef CODA_WITH_CUDA
    return coda__cuda_copy_2d(ctx, like->device_index, dst, dpitch, 0, src, spitch, 0, width, (size_t)rows, stream,
                              FN);
#else
    return no_cuda();
#endif
}

/* Columns [c0, c0 + n) of a 2-D tensor. */
static coda_tensor_t cols_of(const coda_tensor_t *t, int64_t c0, int64_t n) {
    coda_tensor_t v = *t;
    v.data = (char *)t->data + c0 * t->stride[1];
    v.shape[1] = n;
    return v;
}

/* dx_c (+)= dz w. wtail (CUDA, V % 8 != 0): the last V % 8 columns of dz
 * (and the zero padding after them) against w's last rows, zero padded. */
static coda_status_t dgrad(coda_context_t *ctx, const coda_tensor_t *z, const coda_tensor_t *w,
                           const coda_tensor_t *wtail, coda_tensor_t *dxc, float beta, void *stream) {
    int64_t V = z->shape[1], v8 = wtail ? V / 8 * 8 : V;
    if (v8 > 0) {
        coda_tensor_t zv = cols_of(z, 0, v8), wv = rows_of(w, 0, v8);
        CODA_TRY(coda_gemm(ctx, CODA_LAYOUT_NN, &zv, &wv, dxc, 1.0f, beta, stream));
        beta = 1.0f;
    }
    if (!wtail) return CODA_OK;
    coda_tensor_t zt = cols_of(z, v8, 8);
    return coda_gemm(ctx, CODA_LAYOUT_NN, &zt, wtail, dxc, 1.0f, beta, stream);
}

/* dw (+)= dz^T x_c. xtail (CUDA): a chunk of c rows with c % 8 != 0 runs
 * its last c % 8 rows as K = 8 against a zero-padded copy of x's rows, the
 * logits buffer's rows after them zeroed first (earlier chunks wrote them). */
static coda_status_t wgrad(coda_context_t *ctx, const coda_tensor_t *z, int64_t vp, const coda_tensor_t *xc,
                           const coda_tensor_t *xtail, coda_tensor_t *dw, float beta, void *stream) {
    int64_t c = z->shape[0], c8 = xtail ? c / 8 * 8 : c, d = xc->shape[1];
    if (c8 > 0) {
        coda_tensor_t zv = rows_of(z, 0, c8), xv = rows_of(xc, 0, c8);
        CODA_TRY(coda_gemm(ctx, CODA_LAYOUT_TN, &zv, &xv, dw, 1.0f, beta, stream));
        beta = 1.0f;
    }
    if (c8 == c) return CODA_OK;
    CODA_TRY(zero_bytes(ctx, xc, coda__at2(z, c, 0), (size_t)z->stride[0], (size_t)vp * 2, c8 + 8 - c, stream));
    CODA_TRY(zero_bytes(ctx, xc, xtail->data, (size_t)xtail->stride[0], (size_t)d * 2, 8, stream));
    CODA_TRY(copy_rows(ctx, xc, xtail->data, (size_t)xtail->stride[0], coda__at2(xc, c8, 0), (size_t)xc->stride[0],
                       (size_t)d * 2, c - c8, stream));
    coda_tensor_t zt = rows_of(z, c8, 8);
    return coda_gemm(ctx, CODA_LAYOUT_TN, &zt, xtail, dw, 1.0f, beta, stream);
}

/* ---- the call ---- */

coda_status_t coda_lm_loss(coda_context_t *ctx, const coda_tensor_t *x, const coda_tensor_t *w,
                           const coda_tensor_t *targets, const coda_lm_loss_opts_t *opts, coda_tensor_t *loss,
                           coda_tensor_t *total, coda_tensor_t *dx, coda_tensor_t *dw, void *ws, size_t ws_bytes,
                           void *stream) {
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, FN ": ctx is NULL");
    if (!x || !w || !targets || !loss)
        return coda__fail(CODA_ERR_INVALID_ARG, FN ": %s is NULL",
                          !x ? "x" : !w ? "w" : !targets ? "targets" : "loss");
    coda_lm_loss_opts_t def;
    coda_lm_loss_opts_init(&def);
    const coda_lm_loss_opts_t *o = opts ? opts : &def;
    CODA_TRY(check_opts(FN, o));

    const coda_dtype_t bf16 = CODA_BF16, grad_dts[2] = {CODA_BF16, CODA_F32};
    CODA_TRY(coda__check_tensor(x, FN ": x"));
    if (x->ndim != 2) return coda__fail(CODA_ERR_SHAPE, FN ": x must be 2-D (M, d), got %d dims", x->ndim);
    CODA_TRY(coda__check_tensor(w, FN ": w"));
    if (w->ndim != 2) return coda__fail(CODA_ERR_SHAPE, FN ": w must be 2-D (V, d), got %d dims", w->ndim);
    int64_t M = x->shape[0], d = x->shape[1], V = w->shape[0];
    CODA_TRY(check_extents(FN, M, d, V));
    if (x->device == CODA_DEVICE_CUDA && d % 8 != 0)
        return coda__fail(CODA_ERR_SHAPE, FN ": d = %lld must be a multiple of 8 on the GPU", (long long)d);
    CODA_TRY(check_mat(x, "x", M, d, &bf16, 1));
    CODA_TRY(check_mat(w, "w", V, d, &bf16, 1));
    const coda_dtype_t target_dts[2] = {CODA_I32, CODA_I64};
    CODA_TRY(check_vec_of(targets, "targets", M, target_dts, 2));
    /* i32 targets are read as they are, by the logits GEMM's epilogue, which
     * takes contiguous row vectors only (a review found a padded (M, 1) view
     * refused there, with an internal binding's name, after the count had
     * been written); i64 ones are copied into the workspace first */
    if (targets->dtype == CODA_I32 && M > 1 && targets->stride[0] != 4)
        return coda__fail(CODA_ERR_STRIDE, FN ": i32 targets must be contiguous (elements 4 bytes apart), got a "
                          "stride of %lld bytes", (long long)targets->stride[0]);
    CODA_TRY(check_vec(loss, "loss", M, CODA_F32));
    if (total) CODA_TRY(check_vec(total, "total", 1, CODA_F32));
    if (dx) CODA_TRY(check_mat(dx, "dx", M, d, grad_dts, 2));
    if (dw) CODA_TRY(check_mat(dw, "dw", V, d, grad_dts, 2));

    const coda_tensor_t *all[] = {x, w, targets, loss, total, dx, dw};
    const char *all_names[] = {"x", "w", "targets", "loss", "total", "dx", "dw"};
    for (int i = 1; i < 7; i++)
        if (all[i] && (all[i]->device != x->device || all[i]->device_index != x->device_index))
            return coda__fail(CODA_ERR_DEVICE, FN ": %s is on another device than x", all_names[i]);

    /* The workspace, as a tensor for the overlap and device checks. */
    ws_layout_t L = ws_layout(o, M, V, d);
    if (ws_bytes < L.used)
        return coda__fail(CODA_ERR_SHAPE, FN ": workspace of %zu bytes, this call needs %zu "
                          "(coda_lm_loss_workspace_size)", ws_bytes, L.used);
    if (!ws) return coda__fail(CODA_ERR_INVALID_ARG, FN ": workspace is NULL");
    if ((uintptr_t)ws % 256 != 0)
        return coda__fail(CODA_ERR_STRIDE, FN ": workspace %p is not 256-byte aligned", ws);
    int64_t ws_shape[1] = {(int64_t)(L.used / 4)}, ws_stride[1] = {4};
    coda_tensor_t wst = ws_tensor(x, ws, CODA_F32, 1, ws_shape, ws_stride);

    named_t out[] = {{loss, "loss"}, {total, "total"}, {dx, "dx"}, {dw, "dw"}, {&wst, "the workspace"}};
    named_t in[] = {{x, "x"}, {w, "w"}, {targets, "targets"}};
    for (int i = 0; i < 5; i++) {
        if (!out[i].t) continue;
        for (int j = 0; j < i; j++)
            if (out[j].t && coda__tensors_overlap(out[i].t, out[j].t))
                return coda__fail(CODA_ERR_OVERLAP, FN ": %s overlaps %s", out[i].name, out[j].name);
        for (int j = 0; j < 3; j++)
            if (coda__tensors_overlap(out[i].t, in[j].t))
                return coda__fail(CODA_ERR_OVERLAP, FN ": %s overlaps %s", out[i].name, in[j].name);
    }
#ifdef CODA_WITH_CUDA
    if (x->device == CODA_DEVICE_CUDA) {
        const coda_tensor_t *ts[8] = {x, w, targets, loss, total, dx, dw, &wst};
        const char *names[8] = {"x", "w", "targets", "loss", "total", "dx", "dw", "workspace"};
        CODA_TRY(coda__cuda_check_pointers(ctx, x->device_index, ts, names, 8));
    }
#endif

    /* The program and the tilings, before anything runs. */
    const coda_program_t *prog;
    CODA_TRY(lm_program(ctx, o->softcap > 0.0f, &prog));
    coda_tiling_t tl;
    CODA_TRY(coda_choose_program_tiling(ctx, x->device, CODA_LAYOUT_NT, L.rows, V, d, prog, &tl));
    if (tl.tile_n < MIN_TILE_N || tl.tile_m < 1)
        return coda__fail(CODA_ERR_INTERNAL, FN ": the backend chose tiling %dx%d (the workspace assumes tile_n >= %d)",
                          tl.tile_m, tl.tile_n, MIN_TILE_N);
    coda_status_t st = CODA_OK;
    int64_t nt = coda__cdiv(V, tl.tile_n);

    coda__lm_params_t p = {V, o->ignore_index, o->label_smoothing, o->z_loss, o->softcap, o->grad_scale,
                           o->reduction == CODA_LM_MEAN, dx != NULL || dw != NULL};
    int64_t one[1] = {1}, four[1] = {4}, m1[1] = {M};
    coda_tensor_t count = ws_tensor(x, (char *)ws + L.count_at, CODA_I32, 1, one, four);
    /* i64 targets are read once, into an i32 copy the steps read (with the
     * count on the way); i32 ones as they are, counted for the mean only */
    coda_tensor_t t32 = ws_tensor(x, (char *)ws + L.t32_at, CODA_I32, 1, m1, four);
    const int narrow = targets->dtype == CODA_I64;
    if (p.mean || narrow) st = step_targets(ctx, targets, o->ignore_index, V, narrow ? &t32 : NULL, &count, stream);
    /* the epilogue's row input is 1-D: an (M, 1) column is read as its (M) */
    coda_tensor_t t1 = *targets;
    t1.ndim = 1;
    const coda_tensor_t *tg = narrow ? &t32 : &t1;

    /* CUDA: contraction tails (ws_layout's comment). The logits buffer's
     * padding columns stay zero (the epilogue and the rows step write only
     * columns < V); wtail holds w's last V % 8 rows and zero rows. */
    int cuda = x->device == CODA_DEVICE_CUDA;
    coda_tensor_t wtail_t, xtail_t;
    const coda_tensor_t *wtail = NULL, *xtail = NULL;
    int64_t ts8[2] = {8, d}, tst[2] = {d * 2, 2};
    if (cuda) {
        xtail_t = ws_tensor(x, (char *)ws + L.xtail_at, CODA_BF16, 2, ts8, tst);
        xtail = &xtail_t;
    }
    if (st == CODA_OK && cuda && V % 8 && dx) {
        int64_t v8 = V / 8 * 8;
        wtail_t = ws_tensor(x, (char *)ws + L.wtail_at, CODA_BF16, 2, ts8, tst);
        wtail = &wtail_t;
        st = zero_bytes(ctx, x, (char *)ws + L.logits_at + v8 * 2, (size_t)L.vp * 2, 16, L.rows8, stream);
        if (st == CODA_OK) st = zero_bytes(ctx, x, wtail_t.data, (size_t)d * 2, (size_t)d * 2, 8, stream);
        if (st == CODA_OK)
            st = copy_rows(ctx, x, wtail_t.data, (size_t)d * 2, coda__at2(w, v8, 0), (size_t)w->stride[0],
                           (size_t)d * 2, V - v8, stream);
    }

    int dw_started = o->accumulate;
    for (int64_t r0 = 0; st == CODA_OK && r0 < M; r0 += L.rows) {
        int64_t c = M - r0 < L.rows ? M - r0 : L.rows;
        coda_tensor_t xc = rows_of(x, r0, c), tc = rows_of(tg, r0, c), lc = rows_of(loss, r0, c);
        int64_t zs[2] = {c, V}, zst[2] = {L.vp * 2, 2};
        coda_tensor_t z = ws_tensor(x, (char *)ws + L.logits_at, CODA_BF16, 2, zs, zst);
        int64_t ps[3] = {c, nt, 3}, pst[3] = {nt * 12, 12, 4};
        coda_tensor_t part = ws_tensor(x, (char *)ws + L.part_at, CODA_F32, 3, ps, pst);

        coda_binding_t b[5] = {coda__bind("t", &tc), coda__bind("z", &z), coda__bind("part", &part),
                               coda__bind_scalar("cap", o->softcap),
                               coda__bind_scalar("icap", o->softcap > 0.0f ? 1.0f / o->softcap : 0.0f)};
        st = coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &xc, w, prog, b, o->softcap > 0.0f ? 5 : 3, &tl, stream);
        if (st == CODA_OK) st = step_rows(ctx, &p, &z, &part, &tc, &count, &lc, stream);
        if (st == CODA_OK && dx) {
            coda_tensor_t dxc = rows_of(dx, r0, c);
            st = dgrad(ctx, &z, w, wtail, &dxc, o->accumulate ? 1.0f : 0.0f, stream);
        }
        if (st == CODA_OK && dw) {
            st = wgrad(ctx, &z, L.vp, &xc, cuda ? xtail : NULL, dw, dw_started ? 1.0f : 0.0f, stream);
            dw_started = 1;
        }
    }
    if (st == CODA_OK && total) st = step_total(ctx, loss, &count, p.mean, total, stream);
    return st;
}
