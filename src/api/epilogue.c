/* epilogue.c - coda_gemm_epilogue and coda_choose_tiling: every check of a
 * fused GEMM call in one place, before anything is written, then dispatch.
 *
 * The checks: the GEMM operands (as coda_gemm), a verified program, the
 * tiling, every program argument bound exactly once by name, each bound
 * tensor's exact shape / dtype / device for its argument kind, N even when a
 * half-space value or a full-space pair swap needs pairs, and no output
 * overlapping another output, A, B, or an input, except an output bound to
 * the very view of a tile input of its own space (an update in place). */
#include "api/gemm_check.h"

#include <math.h>
#include <stdio.h>

#define DEFAULT_TILE_M 128
#define DEFAULT_TILE_N 128
#define MAX_TILE 1024

/* The default tiling on device (kind, index). */
static coda_status_t choose_tiling(coda_context_t *ctx, coda_device_t device, int index,
                                   coda_layout_t layout, int64_t m, int64_t n, int64_t k,
                                   const coda_program_t *p, coda_tiling_t *tiling) {
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "coda_choose_tiling: ctx is NULL");
    if (!tiling) return coda__fail(CODA_ERR_INVALID_ARG, "coda_choose_tiling: tiling is NULL");
    if (device != CODA_DEVICE_CPU && device != CODA_DEVICE_CUDA)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_choose_tiling: device %d is not CPU (0) or CUDA (1)",
                          (int)device);
    if (layout != CODA_LAYOUT_NT && layout != CODA_LAYOUT_NN && layout != CODA_LAYOUT_TN)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_choose_tiling: layout %d is not NT (0), NN (1) or TN (2)",
                          (int)layout);
    if (m < 0 || n < 0 || k < 0)
        return coda__fail(CODA_ERR_SHAPE, "coda_choose_tiling: negative extent (m %lld, n %lld, k %lld)",
                          (long long)m, (long long)n, (long long)k);
    if (device == CODA_DEVICE_CUDA) {
#ifdef CODA_WITH_CUDA
        /* The GPU's tile is its mainloop's (src/cuda/fused_gemm.c). */
        return coda__cuda_choose_tiling(ctx, index, m, n, k, p, tiling);
#else
        (void)index;
        return coda__fail(CODA_ERR_UNSUPPORTED, "coda_choose_tiling: this build has no CUDA backend");
#endif
    }
    tiling->tile_m = DEFAULT_TILE_M;
    tiling->tile_n = DEFAULT_TILE_N;
    return CODA_OK;
}

coda_status_t coda_choose_tiling(coda_context_t *ctx, coda_device_t device, coda_layout_t layout,
                                 int64_t m, int64_t n, int64_t k, coda_tiling_t *tiling) {
    return choose_tiling(ctx, device, 0, layout, m, n, k, NULL, tiling);
}

coda_status_t coda_choose_program_tiling(coda_context_t *ctx, coda_device_t device,
                                         coda_layout_t layout, int64_t m, int64_t n, int64_t k,
                                         const coda_program_t *program, coda_tiling_t *tiling) {
    if (program && !program->verified)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_choose_program_tiling: program is not verified");
    return choose_tiling(ctx, device, 0, layout, m, n, k, program, tiling);
}

static const char *kind_text(coda_arg_kind_t k) {
    switch (k) {
    case CODA_IN_TILE: return "in tile";
    case CODA_IN_ROW: return "in row";
    case CODA_IN_COL: return "in col";
    case CODA_IN_SCALAR: return "in scalar";
    case CODA_OUT_TILE: return "out tile";
    case CODA_OUT_ROWRED: return "out row reduction";
    case CODA_OUT_COLRED: return "out column reduction";
    case CODA_OUT_LSE: return "out lse";
    case CODA_IN_ROWPART: return "in rowpart";
    }
    return "?";
}

/* Does the program need N even: a value or argument in the half space, or a
 * swap of full-space pairs (an odd N would leave the last column unpaired). */
static int needs_even_n(const coda_program_t *p) {
    for (int i = 0; i < p->n_args; i++) {
        coda_arg_kind_t k = p->args[i].kind;
        if ((k == CODA_IN_TILE || k == CODA_IN_COL || k == CODA_OUT_TILE || k == CODA_OUT_COLRED) &&
            p->args[i].space == CODA_SPACE_HALF)
            return 1;
    }
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (coda__op_arity(in->op) < 0) continue;
        if ((in->shape & CODA_SHAPE_COL) && in->vspace == CODA_SPACE_HALF) return 1;
        if (in->op == CODA_OP_SWAP && in->vspace == CODA_SPACE_FULL) return 1;
    }
    return 0;
}

/* A tiling's fields, defaults filled in: what every backend's tiles take. */
static coda_status_t check_tiling(const char *fn, const coda_tiling_t *tl) {
    if (tl->tile_m < 1 || tl->tile_m > MAX_TILE)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: tiling.tile_m %d outside 1..%d", fn, tl->tile_m, MAX_TILE);
    if (tl->tile_n < 2 || tl->tile_n > MAX_TILE || tl->tile_n % 2 != 0)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: tiling.tile_n %d must be even and in 2..%d", fn,
                          tl->tile_n, MAX_TILE);
    return CODA_OK;
}

coda_status_t coda_program_arg_shape(const coda_program_t *p, int index, int64_t m, int64_t n,
                                     const coda_tiling_t *tiling, int *ndim, int64_t shape[3],
                                     coda_dtype_t *dtype) {
    if (!p || !ndim || !shape || !dtype)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_arg_shape: NULL argument");
    if (index < 0 || index >= p->n_args)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_arg_shape: index %d outside 0..%d", index,
                          p->n_args - 1);
    /* a tensor's extents stop at 2^40 (coda__check_tensor): the widths and
     * tile counts below then cannot overflow (a review found 2n wrap) */
    if (m < 0 || n < 0 || m > ((int64_t)1 << 40) || n > ((int64_t)1 << 40))
        return coda__fail(CODA_ERR_SHAPE, "coda_program_arg_shape: extent outside 0..2^40 (m %lld, n %lld)",
                          (long long)m, (long long)n);
    /* the tiling as coda_gemm_epilogue takes it: 0 the default, else in range */
    coda_tiling_t tl = {DEFAULT_TILE_M, DEFAULT_TILE_N};
    if (tiling && tiling->tile_m) tl.tile_m = tiling->tile_m;
    if (tiling && tiling->tile_n) tl.tile_n = tiling->tile_n;
    CODA_TRY(check_tiling("coda_program_arg_shape", &tl));
    const int64_t tm = tl.tile_m, tn = tl.tile_n;
    const coda_arg_t *arg = &p->args[index];
    int64_t w = coda__space_width(arg->space, n);
    *ndim = 2;
    shape[0] = m, shape[1] = w, shape[2] = 3;
    *dtype = arg->dtype;
    switch (arg->kind) {
    case CODA_IN_TILE: case CODA_OUT_TILE: break;
    case CODA_IN_ROW: *ndim = 1; break;
    case CODA_IN_COL: *ndim = 1; shape[0] = w; break;
    case CODA_IN_SCALAR: *ndim = 0; *dtype = CODA_F32; break;
    case CODA_OUT_ROWRED: shape[1] = coda__cdiv(n, tn); *dtype = CODA_F32; break;
    case CODA_OUT_COLRED: shape[0] = w; shape[1] = coda__cdiv(m, tm); *dtype = CODA_F32; break;
    case CODA_OUT_LSE: *ndim = 3; shape[1] = coda__cdiv(n, tn); *dtype = CODA_F32; break;
    case CODA_IN_ROWPART: shape[1] = 0; *dtype = CODA_F32; break; /* any T >= 1 */
    }
    return CODA_OK;
}

/* Argument i's tensor against the shape and dtype it must have. */
static coda_status_t check_bound(const coda_program_t *p, int i, const coda_tensor_t *t,
                                 const coda_tensor_t *a, int64_t m, int64_t n, coda_tiling_t tl) {
    const coda_arg_t *arg = &p->args[i];
    char what[CODA_NAME_MAX + 96];
    snprintf(what, sizeof what, "coda_gemm_epilogue: binding '%s' (%s)", arg->name, kind_text(arg->kind));
    CODA_TRY(coda__check_tensor(t, what));
    int ndim;
    int64_t shape[3];
    coda_dtype_t want;
    CODA_TRY(coda_program_arg_shape(p, i, m, n, &tl, &ndim, shape, &want));
    if (t->ndim != ndim)
        return coda__fail(CODA_ERR_SHAPE, "%s: expected %d dims, got %d", what, ndim, t->ndim);
    if (arg->kind == CODA_IN_ROWPART && t->ndim == 2 && (t->shape[1] < 1 || t->shape[1] > INT32_MAX))
        return coda__fail(CODA_ERR_SHAPE, "%s: shape (%lld, %lld), expected (%lld, T) with 1 <= T < 2^31", what,
                          (long long)t->shape[0], (long long)t->shape[1], (long long)m);
    if (arg->kind == CODA_IN_ROWPART && t->ndim == 2 && t->shape[0] != m)
        return coda__fail(CODA_ERR_SHAPE, "%s: shape (%lld, %lld), expected (%lld, T)", what,
                          (long long)t->shape[0], (long long)t->shape[1], (long long)m);
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d] && arg->kind != CODA_IN_ROWPART) {
            if (ndim == 1)
                return coda__fail(CODA_ERR_SHAPE, "%s: shape (%lld), expected (%lld)", what,
                                  (long long)t->shape[0], (long long)shape[0]);
            if (ndim == 2)
                return coda__fail(CODA_ERR_SHAPE, "%s: shape (%lld, %lld), expected (%lld, %lld)", what,
                                  (long long)t->shape[0], (long long)t->shape[1], (long long)shape[0],
                                  (long long)shape[1]);
            return coda__fail(CODA_ERR_SHAPE, "%s: shape (%lld, %lld, %lld), expected (%lld, %lld, 3)",
                              what, (long long)t->shape[0], (long long)t->shape[1],
                              (long long)t->shape[2], (long long)shape[0], (long long)shape[1]);
        }
    if (t->dtype != want)
        return coda__fail(CODA_ERR_DTYPE, "%s: dtype %s, expected %s", what,
                          coda_dtype_name(t->dtype), coda_dtype_name(want));
    if (t->device != a->device || t->device_index != a->device_index)
        return coda__fail(CODA_ERR_DEVICE, "%s: not on the device of a and b", what);
    return CODA_OK;
}

static int is_output(coda_arg_kind_t k) { return !coda__arg_is_input(k); }

/* Whether output i may share its memory with input j: both tiles of one
 * column space bound to the same view (base, dtype, shape, strides), and
 * every `load` of j before the first `store` into i in the program. A tile
 * reads and writes only its own elements of a space, and the CPU backend
 * runs a tile's statements in program order (the GPU's fetches all of a
 * batch's inputs first), so each element is then read before it is
 * overwritten, and by the tile that overwrites it. A store before a load
 * would hand the load the stored values on the CPU. */
static int in_place(const coda_program_t *p, int i, int j, const coda_tensor_t *o, const coda_tensor_t *in) {
    if (p->args[i].kind != CODA_OUT_TILE || p->args[j].kind != CODA_IN_TILE || p->args[i].space != p->args[j].space)
        return 0;
    if (o->data != in->data || o->dtype != in->dtype || o->ndim != in->ndim) return 0;
    for (int d = 0; d < o->ndim; d++)
        if (o->shape[d] != in->shape[d] || o->stride[d] != in->stride[d]) return 0;
    int stored = 0;
    for (int k = 0; k < p->n_insts; k++) {
        const coda_inst_t *x = &p->insts[k];
        if (x->op == CODA_OP_STORE && x->arg == i) stored = 1;
        if (x->op == CODA_OP_LOAD && x->arg == j && stored) return 0;
    }
    return 1;
}

coda_status_t coda_gemm_epilogue(coda_context_t *ctx, coda_layout_t layout, const coda_tensor_t *a,
                                 const coda_tensor_t *b, const coda_program_t *program,
                                 const coda_binding_t *bindings, int n_bindings,
                                 const coda_tiling_t *tiling, void *stream) {
    static const char fn[] = "coda_gemm_epilogue";
    if (!ctx) return coda__fail(CODA_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    int64_t m = 0, n = 0, k = 0;
    CODA_TRY(coda__check_gemm_operands(fn, layout, a, b, &m, &n, &k));
    if (!program) return coda__fail(CODA_ERR_INVALID_ARG, "%s: program is NULL", fn);
    const coda_program_t *p = program;
    if (!p->verified || p->n_args < 0 || p->n_args > CODA_MAX_ARGS || p->n_insts < 0 ||
        p->n_insts > CODA_MAX_INSTS)
        return coda__fail(CODA_ERR_VERIFY, "%s: program '%s' is not verified (build it with "
                          "coda_program_finish or coda_program_parse)", fn, p->name);

    /* tiling: 0 in a field means the backend default */
    coda_tiling_t tl = {0, 0}, def;
    CODA_TRY(choose_tiling(ctx, a->device, a->device_index, layout, m, n, k, NULL, &def));
    if (tiling) tl = *tiling;
    if (tl.tile_m == 0) tl.tile_m = def.tile_m;
    if (tl.tile_n == 0) tl.tile_n = def.tile_n;
    CODA_TRY(check_tiling(fn, &tl));

    /* bindings: each argument exactly once, by name */
    if (n_bindings < 0) return coda__fail(CODA_ERR_INVALID_ARG, "%s: n_bindings %d < 0", fn, n_bindings);
    if (n_bindings > 0 && !bindings)
        return coda__fail(CODA_ERR_INVALID_ARG, "%s: bindings is NULL but n_bindings is %d", fn, n_bindings);
    int which[CODA_MAX_ARGS];
    for (int i = 0; i < p->n_args; i++) which[i] = -1;
    for (int j = 0; j < n_bindings; j++) {
        const char *name = bindings[j].name;
        if (!name) return coda__fail(CODA_ERR_INVALID_ARG, "%s: bindings[%d].name is NULL", fn, j);
        int i = coda_program_find_arg(p, name);
        if (i < 0 || i >= p->n_args)
            return coda__fail(CODA_ERR_BINDING, "%s: bindings[%d]: program '%s' has no argument '%.64s'",
                              fn, j, p->name, name);
        if (which[i] >= 0)
            return coda__fail(CODA_ERR_BINDING, "%s: argument '%s' is bound twice (bindings[%d] and [%d])",
                              fn, p->args[i].name, which[i], j);
        which[i] = j;
    }
    for (int i = 0; i < p->n_args; i++)
        if (which[i] < 0)
            return coda__fail(CODA_ERR_BINDING, "%s: argument '%s' (%s) is not bound", fn, p->args[i].name,
                              kind_text(p->args[i].kind));

    /* an lse picks its target by comparing f32 column numbers: exact below 2^24 */
    for (int i = 0; i < p->n_insts; i++) {
        if (p->insts[i].op != CODA_OP_LSE) continue;
        int64_t w = coda__space_width(p->insts[p->insts[i].src[0]].vspace, n);
        if (w > CODA_LSE_MAX_COLS)
            return coda__fail(CODA_ERR_SHAPE, "%s: program '%s': lse %s takes %lld columns, more than "
                              "CODA_LSE_MAX_COLS (2^24: targets are compared as f32 column numbers)", fn,
                              p->name, p->args[p->insts[i].arg].name, (long long)w);
    }

    if (needs_even_n(p) && n % 2 != 0)
        return coda__fail(CODA_ERR_SHAPE, "%s: program '%s' works on column pairs (half space or swap), "
                          "but N = %lld is odd", fn, p->name, (long long)n);

    const coda_tensor_t *bound[CODA_MAX_ARGS];
    float scalars[CODA_MAX_ARGS];
    for (int i = 0; i < p->n_args; i++) {
        const coda_binding_t *bd = &bindings[which[i]];
        bound[i] = NULL;
        scalars[i] = 0.0f;
        if (p->args[i].kind == CODA_IN_SCALAR) {
            if (!isfinite(bd->scalar))
                return coda__fail(CODA_ERR_INVALID_ARG, "%s: scalar '%s' is not finite", fn, p->args[i].name);
            scalars[i] = bd->scalar;
            continue;
        }
        bound[i] = &bd->tensor;
        CODA_TRY(check_bound(p, i, bound[i], a, m, n, tl));
    }

    /* no output may overlap another output, A, B, or an input (but for an
     * update in place of a tile input, in_place) */
    for (int i = 0; i < p->n_args; i++) {
        if (!is_output(p->args[i].kind)) continue;
        if (coda__tensors_overlap(bound[i], a))
            return coda__fail(CODA_ERR_OVERLAP, "%s: output '%s' overlaps a", fn, p->args[i].name);
        if (coda__tensors_overlap(bound[i], b))
            return coda__fail(CODA_ERR_OVERLAP, "%s: output '%s' overlaps b", fn, p->args[i].name);
        for (int j = 0; j < p->n_args; j++) {
            if (j == i || !bound[j] || (is_output(p->args[j].kind) && j < i)) continue;
            if (in_place(p, i, j, bound[i], bound[j])) continue;
            if (coda__tensors_overlap(bound[i], bound[j]))
                return coda__fail(CODA_ERR_OVERLAP, "%s: output '%s' overlaps %s '%s'", fn, p->args[i].name,
                                  is_output(p->args[j].kind) ? "output" : "input", p->args[j].name);
        }
    }

    if (a->device == CODA_DEVICE_CPU) return coda__cpu_gemm_epilogue(ctx, layout, a, b, p, bound, scalars, tl);
#ifdef CODA_WITH_CUDA
    return coda__cuda_gemm_epilogue(ctx, layout, a, b, p, bound, scalars, tl, stream);
#else
    (void)stream;
    return coda__fail(CODA_ERR_UNSUPPORTED, "%s: this build has no CUDA backend", fn);
#endif
}
