/* cpu_epilogue.c - the CPU interpreter of epilogue programs.
 *
 * For every output tile (tile_m x tile_n accumulator elements, row-major tile
 * order, one task per tile) it computes the f32 accumulator block with the
 * reference GEMM, then evaluates the program one instruction at a time, each
 * as an array over the tile. A value in column space s covers tile_n * 2^s
 * of that space's columns per tile (clipped at the matrix edge), starting at
 * column tn * tile_n * 2^s. Every partial is written by exactly one tile, so
 * the result is bitwise reproducible whatever the thread count.
 *
 * The maps' formulas are the CPU column of the op table, src/program/ops.def,
 * which has the CUDA the code generator writes for them beside it; coda.h
 * section 5 gives the semantics.
 */
#include "cpu/cpu.h"

#include <math.h>
#include <stdlib.h>

/* A value over one tile: element (i, j) is data[i * rs + j * cs]; rs = 0 for
 * values constant along rows (col, scalar), cs = 0 along columns (row, scalar). */
typedef struct val {
    const float *data;
    int64_t rs, cs;
} val_t;

/* Setup shared by all tiles: where each value lives in a thread's arena. */
typedef struct plan {
    coda_layout_t layout;
    const coda_tensor_t *a, *b;
    const coda_program_t *p;
    const coda_tensor_t *const *bound;
    const float *scalars;
    int64_t m, n, tile_m, tile_n, n_tiles;
    size_t gemm_floats;  /* scratch of the GEMM block                     */
    size_t acc_floats;   /* the accumulator, (tile_m, tile_n)             */
    size_t arena_floats; /* the values                                    */
    int64_t offset[CODA_MAX_INSTS]; /* value i's place in the arena, -1: none */
    int64_t ld[CODA_MAX_INSTS];     /* its row length (its space's tile width) */
} plan_t;

/* max and min that keep a NaN (fmaxf / fminf drop it: fmaxf(NaN, 1) = 1).
 * The NaN rule (coda.h section 5): a NaN reaches every output computed from
 * it, so the `max` / `min` maps, max reductions and the lse statement's
 * running max use these; the GPU uses max.NaN.f32 / min.NaN.f32 in the
 * same places (src/codegen/epi_prelude.cuh, cg_max_nan). */
static inline float nan_max(float a, float b) { return isnan(a) || isnan(b) ? NAN : fmaxf(a, b); }
static inline float nan_min(float a, float b) { return isnan(a) || isnan(b) ? NAN : fminf(a, b); }

static int has_row(coda_shape_t s) { return (s & CODA_SHAPE_ROW) != 0; }
static int has_col(coda_shape_t s) { return (s & CODA_SHAPE_COL) != 0; }

/* Columns per tile of space s, before clipping. */
static int64_t tile_width(const plan_t *pl, coda_space_t s) {
    return s == CODA_SPACE_HALF ? pl->tile_n / 2 : s == CODA_SPACE_DOUBLE ? 2 * pl->tile_n : pl->tile_n;
}

/* ---- the arena: values get a slot from their definition to their last use.
 * Slot sizes differ (scalar, row, col, tile); a freed slot is reused by a
 * later value that fits. Done once per program run, so every tile and thread
 * uses the same layout. ---- */

#define MAX_SLOTS CODA_MAX_INSTS

static void plan_arena(plan_t *pl) {
    const coda_program_t *p = pl->p;
    int last_use[CODA_MAX_INSTS];
    for (int i = 0; i < p->n_insts; i++) last_use[i] = i;
    for (int i = 0; i < p->n_insts; i++)
        for (int k = 0; k < 3; k++)
            if (p->insts[i].src[k] >= 0) last_use[p->insts[i].src[k]] = i;

    int64_t slot_off[MAX_SLOTS], slot_cap[MAX_SLOTS];
    int slot_free[MAX_SLOTS];
    int n_slots = 0;
    int slot_of[CODA_MAX_INSTS];
    int64_t top = 0;
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        slot_of[i] = -1;
        pl->offset[i] = -1;
        pl->ld[i] = 1;
        if (coda__op_arity(in->op) < 0 || in->op == CODA_OP_ACC) continue;
        int64_t w = has_col(in->shape) ? tile_width(pl, in->vspace) : 1;
        int64_t need = (has_row(in->shape) ? pl->tile_m : 1) * w;
        pl->ld[i] = w;
        int best = -1;
        for (int s = 0; s < n_slots; s++)
            if (slot_free[s] && slot_cap[s] >= need && (best < 0 || slot_cap[s] < slot_cap[best])) best = s;
        if (best < 0) {
            best = n_slots++;
            slot_off[best] = top;
            slot_cap[best] = (need + 15) & ~(int64_t)15; /* keep slots 64-byte aligned */
            top += slot_cap[best];
        }
        slot_free[best] = 0;
        slot_of[i] = best;
        pl->offset[i] = slot_off[best];
        /* Release operands whose last use is this instruction (after the
         * result got its slot, so that a result never aliases an operand). */
        for (int k = 0; k < 3; k++) {
            int s = in->src[k];
            if (s >= 0 && last_use[s] == i && slot_of[s] >= 0) slot_free[slot_of[s]] = 1;
        }
        if (last_use[i] == i) slot_free[best] = 1;
    }
    pl->arena_floats = (size_t)top;
}

/* ---- one tile ---- */

typedef struct tile {
    int64_t r0, rows;      /* rows [r0, r0 + rows)                        */
    int64_t tn, tm;        /* tile coordinates                            */
    int64_t c0[3], cols[3]; /* per space (index s + 1): first column, count */
} tile_t;

static float ld_elem(const char *p, coda_dtype_t dt) { return coda__load_f32(p, dt); }

/* The helpers of the maps' CPU column in src/program/ops.def. */
static float cpu_silu(float x) { return x / (1.0f + expf(-x)); }
static float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static float cpu_dsilu(float x) {
    float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

/* The element loops of a map, EXPR in the operands' elements x, y, z
 * (ops.def's CPU column): out (nr, nc) with row length ld. */
#define MAP1(EXPR)                                                       \
    for (int64_t i = 0; i < nr; i++)                                     \
        for (int64_t j = 0; j < nc; j++) {                               \
            float x = A.data[i * A.rs + j * A.cs];                       \
            out[i * ld + j] = (EXPR);                                    \
        }
#define MAP2(EXPR)                                                       \
    for (int64_t i = 0; i < nr; i++)                                     \
        for (int64_t j = 0; j < nc; j++) {                               \
            float x = A.data[i * A.rs + j * A.cs], y = B.data[i * B.rs + j * B.cs]; \
            out[i * ld + j] = (EXPR);                                    \
        }
#define MAP3(EXPR)                                                       \
    for (int64_t i = 0; i < nr; i++)                                     \
        for (int64_t j = 0; j < nc; j++) {                               \
            float x = A.data[i * A.rs + j * A.cs], y = B.data[i * B.rs + j * B.cs]; \
            float z = C.data[i * C.rs + j * C.cs];                       \
            out[i * ld + j] = (EXPR);                                    \
        }
/* A pairwise map (ops.def's CODA_PAIR): element (r, c) is element (r, AT)
 * of operand FROM (0: A, 1: B). Local column indices equal global ones up
 * to an even offset (tile_n is even), so pairs never straddle a tile. */
#define PAIR(FROM, AT)                                                   \
    for (int64_t r = 0; r < nr; r++)                                     \
        for (int64_t c = 0; c < nc; c++) {                               \
            const val_t *s = (FROM) ? &B : &A;                           \
            out[r * ld + c] = s->data[r * s->rs + (AT) * s->cs];         \
        }

static void run_tile(const plan_t *pl, const tile_t *t, const float *acc, float *arena) {
    const coda_program_t *p = pl->p;
    val_t v[CODA_MAX_INSTS];
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        int sp = in->vspace + 1;
        /* extents of the result (or, for statements, unused) */
        int64_t nr = has_row(in->shape) ? t->rows : 1, nc = has_col(in->shape) ? t->cols[sp] : 1;
        int64_t ld = pl->ld[i];
        float *out = pl->offset[i] >= 0 ? arena + pl->offset[i] : NULL;
        val_t A = {0}, B = {0}, C = {0};
        if (in->src[0] >= 0) A = v[in->src[0]];
        if (in->src[1] >= 0) B = v[in->src[1]];
        if (in->src[2] >= 0) C = v[in->src[2]];
        if (out) {
            v[i].data = out;
            v[i].rs = has_row(in->shape) ? ld : 0;
            v[i].cs = has_col(in->shape) ? 1 : 0;
        }
        switch (in->op) {
        case CODA_OP_ACC:
            v[i].data = acc;
            v[i].rs = pl->tile_n;
            v[i].cs = 1;
            break;
        case CODA_OP_LOAD: {
            const coda_arg_t *a = &p->args[in->arg];
            const coda_tensor_t *tt = pl->bound[in->arg];
            if (a->kind == CODA_IN_SCALAR) {
                out[0] = pl->scalars[in->arg];
            } else if (a->kind == CODA_IN_ROW) {
                for (int64_t r = 0; r < nr; r++)
                    out[r] = ld_elem(coda__at1(tt, t->r0 + r), tt->dtype);
            } else if (a->kind == CODA_IN_ROWPART) { /* summed in increasing t, as coda_finish_reduce */
                for (int64_t r = 0; r < nr; r++) {
                    float s = 0.0f;
                    for (int64_t q = 0; q < tt->shape[1]; q++)
                        s += ld_elem(coda__at2(tt, t->r0 + r, q), CODA_F32);
                    out[r] = s;
                }
            } else if (a->kind == CODA_IN_COL) {
                for (int64_t c = 0; c < nc; c++)
                    out[c] = ld_elem(coda__at1(tt, t->c0[sp] + c), tt->dtype);
            } else { /* tile */
                for (int64_t r = 0; r < nr; r++)
                    for (int64_t c = 0; c < nc; c++)
                        out[r * ld + c] = ld_elem(coda__at2(tt, t->r0 + r, t->c0[sp] + c), tt->dtype);
            }
            break;
        }
        case CODA_OP_CONST: out[0] = in->imm; break;
        case CODA_OP_ROWIDX:
            for (int64_t r = 0; r < nr; r++) out[r] = (float)(t->r0 + r);
            break;
        case CODA_OP_COLIDX:
            for (int64_t c = 0; c < nc; c++) out[c] = (float)(t->c0[sp] + c);
            break;
        /* maps and pairwise maps: a case for each row of the op table */
#define CODA_MAP(ID, name, n, cpu, cuda, doc) case CODA_OP_##ID: MAP##n(cpu); break;
#define CODA_PAIR(ID, name, n, dspace, from, at, doc) case CODA_OP_##ID: PAIR(from, at); break;
#include "program/ops.def"
        case CODA_OP_STORE: {
            const coda_arg_t *a = &p->args[in->arg];
            const coda_tensor_t *tt = pl->bound[in->arg];
            int s = a->space + 1;
            for (int64_t r = 0; r < t->rows; r++)
                for (int64_t c = 0; c < t->cols[s]; c++)
                    coda__store_f32(coda__at2(tt, t->r0 + r, t->c0[s] + c), tt->dtype,
                                    A.data[r * A.rs + c * A.cs]);
            break;
        }
        case CODA_OP_REDUCE: {
            const coda_arg_t *a = &p->args[in->arg];
            const coda_tensor_t *tt = pl->bound[in->arg];
            int s = p->insts[in->src[0]].vspace + 1;
            coda_reduce_t op = a->reduce;
            float init = op == CODA_REDUCE_MAX ? -INFINITY : 0.0f;
            if (a->kind == CODA_OUT_ROWRED) {
                for (int64_t r = 0; r < t->rows; r++) {
                    float acc_r = init;
                    const float *x = A.data + r * A.rs;
                    for (int64_t c = 0; c < t->cols[s]; c++) {
                        float e = x[c * A.cs];
                        acc_r = op == CODA_REDUCE_MAX ? nan_max(acc_r, e)
                              : op == CODA_REDUCE_SUMSQ ? acc_r + e * e : acc_r + e;
                    }
                    *(float *)coda__at2(tt, t->r0 + r, t->tn) = acc_r;
                }
            } else { /* column partials, increasing row order */
                for (int64_t c = 0; c < t->cols[s]; c++) {
                    float acc_c = init;
                    for (int64_t r = 0; r < t->rows; r++) {
                        float e = A.data[r * A.rs + c * A.cs];
                        acc_c = op == CODA_REDUCE_MAX ? nan_max(acc_c, e)
                              : op == CODA_REDUCE_SUMSQ ? acc_c + e * e : acc_c + e;
                    }
                    *(float *)coda__at2(tt, t->c0[s] + c, t->tm) = acc_c;
                }
            }
            break;
        }
        case CODA_OP_LSE: {
            const coda_tensor_t *tt = pl->bound[in->arg];
            int s = p->insts[in->src[0]].vspace + 1;
            int64_t c0 = t->c0[s], w = t->cols[s];
            /* Per row: m = max (NaN if any element is NaN), then
             * l = sum exp(x - ms) with ms = m where m is finite, else 0 (the
             * GPU's cg_lse_fold takes the same shift): so
             *   m NaN   -> l NaN   (NaN - NaN, whatever the other elements)
             *   m -inf  -> l 0     (all -inf: exp(-inf - 0), never -inf - -inf)
             *   m +inf  -> l +inf  (exp(+inf - 0); never +inf - +inf)
             *   m finite-> l >= 1  the ordinary sum
             * and no NaN comes out of infinities alone. */
            for (int64_t r = 0; r < t->rows; r++) {
                const float *x = A.data + r * A.rs;
                float m = -INFINITY, l = 0.0f, pick = 0.0f;
                for (int64_t c = 0; c < w; c++) m = nan_max(m, x[c * A.cs]);
                const float ms = isinf(m) ? 0.0f : m;
                if (m != -INFINITY) /* all -inf: l stays 0 (the sum would be 0 too) */
                    for (int64_t c = 0; c < w; c++) l += expf(x[c * A.cs] - ms);
                float tg = B.data[r * B.rs];
                /* a whole-number target only, as the GPU's (float)col == t:
                 * 2.5 names no column (it had picked column 2) */
                if ((double)tg >= (double)c0 && (double)tg < (double)(c0 + w) && tg == floorf(tg))
                    pick = x[((int64_t)tg - c0) * A.cs]; /* bounds exact: c0 + w may exceed 2^24 */
                char *base = (char *)tt->data + (t->r0 + r) * tt->stride[0] + t->tn * tt->stride[1];
                *(float *)(base) = m;
                *(float *)(base + tt->stride[2]) = l;
                *(float *)(base + 2 * tt->stride[2]) = pick;
            }
            break;
        }
        default: break; /* the verifier admits nothing else */
        }
    }
}

static void tile_task(void *arg, int64_t task, float *scratch) {
    const plan_t *pl = arg;
    tile_t t;
    t.tm = task / pl->n_tiles;
    t.tn = task % pl->n_tiles;
    t.r0 = t.tm * pl->tile_m;
    t.rows = pl->m - t.r0 < pl->tile_m ? pl->m - t.r0 : pl->tile_m;
    for (int s = -1; s <= 1; s++) {
        int64_t tw = tile_width(pl, (coda_space_t)s), width = coda__space_width((coda_space_t)s, pl->n);
        t.c0[s + 1] = t.tn * tw;
        t.cols[s + 1] = width - t.c0[s + 1] < tw ? width - t.c0[s + 1] : tw;
    }
    float *acc = scratch + pl->gemm_floats, *arena = acc + pl->acc_floats;
    coda__cpu_gemm_block(pl->layout, pl->a, pl->b, t.r0, t.rows, t.c0[1], t.cols[1], acc,
                         pl->tile_n, scratch);
    run_tile(pl, &t, acc, arena);
}

coda_status_t coda__cpu_gemm_epilogue(coda_context_t *ctx, coda_layout_t layout,
                                      const coda_tensor_t *a, const coda_tensor_t *b,
                                      const coda_program_t *p, const coda_tensor_t *const *bound,
                                      const float *scalars, coda_tiling_t tiling) {
    plan_t *pl = calloc(1, sizeof *pl);
    if (!pl) return coda__fail(CODA_ERR_NO_MEMORY, "coda_gemm_epilogue: out of memory");
    int64_t k = 0;
    pl->layout = layout;
    pl->a = a;
    pl->b = b;
    pl->p = p;
    pl->bound = bound;
    pl->scalars = scalars;
    coda__gemm_extents(layout, a, b, &pl->m, &pl->n, &k);
    pl->tile_m = tiling.tile_m;
    pl->tile_n = tiling.tile_n;
    pl->n_tiles = coda__cdiv(pl->n, pl->tile_n);
    pl->gemm_floats = (coda__cpu_gemm_scratch_floats() + 15) & ~(size_t)15;
    pl->acc_floats = ((size_t)(pl->tile_m * pl->tile_n) + 15) & ~(size_t)15;
    plan_arena(pl);
    int64_t n_tasks = coda__cdiv(pl->m, pl->tile_m) * pl->n_tiles;
    coda_status_t st = coda__cpu_parallel(ctx->cpu_threads, n_tasks,
                                          pl->gemm_floats + pl->acc_floats + pl->arena_floats,
                                          tile_task, pl);
    free(pl);
    return st;
}
