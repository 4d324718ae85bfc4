/* epilogue_cuda.c - generate CUDA C for an epilogue program (see codegen.h).
 *
 * Every value of the program becomes 1, 2 or 4 float registers per
 * accumulator pair (its space: half, full, double); values that do not vary
 * along columns (scalars, row values) are one register, broadcast. The
 * generated code is straight-line: the kernel unrolls its fragment loops, so
 * the slot indices are constants and the reduction state stays in registers.
 */
#include "codegen/codegen.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- a growable string ---- */

typedef struct sb {
    char *buf;
    size_t len, cap;
    int oom;
} sb_t;

static void sb_printf(sb_t *b, const char *fmt, ...) CODA_PRINTF(2, 3);
static void sb_printf(sb_t *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->buf ? b->buf + b->len : NULL, b->buf ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->buf && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
}

/* ---- value geometry ---- */

static int varies(const coda_inst_t *in) { return (in->shape & CODA_SHAPE_COL) != 0; }

/* Elements of a space per accumulator pair. */
static int space_width(coda_space_t s) { return s == CODA_SPACE_HALF ? 1 : s == CODA_SPACE_FULL ? 2 : 4; }

static int value_width(const coda_inst_t *in) { return varies(in) ? space_width(in->vspace) : 1; }

/* Name of element e of value v (broadcast if v does not vary along columns). */
static const char *el(const coda_program_t *p, int v, int e, char *buf, size_t cap) {
    snprintf(buf, cap, "v%d_%d", v, varies(&p->insts[v]) ? e : 0);
    return buf;
}

/* Is element e of a value in space s inside the matrix? Pairs are only run for
 * col < N; the second accumulator column may fall off the edge when N is odd. */
static const char *elem_ok(coda_space_t s, int e) {
    if (s == CODA_SPACE_HALF) return "1";
    if (s == CODA_SPACE_FULL) return e == 0 ? "1" : "ok1";
    return e < 2 ? "1" : "ok1";
}

/* Column index of element e of space s, as C text. */
static void elem_col(coda_space_t s, int e, char *buf, size_t cap) {
    if (s == CODA_SPACE_HALF) snprintf(buf, cap, "(col >> 1)");
    else if (s == CODA_SPACE_FULL) snprintf(buf, cap, "(col + %d)", e);
    else snprintf(buf, cap, "(2 * col + %d)", e);
}

/* C text that reads element at index expression `idx` of a row vector,
 * argument k, as float, through the non-coherent volatile loads that
 * coda_epi_preload issues before the tile's k-loop. */
static void load_text(const coda_arg_t *a, int k, const char *idx, char *buf, size_t cap) {
    switch (a->dtype) {
    case CODA_BF16:
        snprintf(buf, cap, "cg_bf16_to_f32((unsigned short)cg_ld16v((const unsigned short *)P->ptr[%d] + %s))", k,
                 idx);
        break;
    case CODA_I32: snprintf(buf, cap, "(float)(int)cg_ld32v((const int *)P->ptr[%d] + %s)", k, idx); break;
    default: snprintf(buf, cap, "__uint_as_float(cg_ld32v((const float *)P->ptr[%d] + %s))", k, idx); break;
    }
}

static const char *map_fn(coda_op_t op) {
    switch (op) {
    case CODA_OP_NEG: return "(-%s)";
    case CODA_OP_ABS: return "fabsf(%s)";
    case CODA_OP_EXP: return "cg_exp(%s)";
    case CODA_OP_LOG: return "logf(%s)";
    case CODA_OP_SQRT: return "sqrtf(%s)";
    case CODA_OP_RSQRT: return "rsqrtf(%s)";
    case CODA_OP_RECIP: return "cg_div(1.0f, %s)";
    case CODA_OP_SIN: return "cg_sin(%s)";
    case CODA_OP_COS: return "cg_cos(%s)";
    case CODA_OP_TANH: return "tanhf(%s)";
    case CODA_OP_SIGMOID: return "cg_sigmoid(%s)";
    case CODA_OP_SILU: return "cg_silu(%s)";
    case CODA_OP_DSILU: return "cg_dsilu(%s)";
    case CODA_OP_SQUARE: return "cg_square(%s)";
    case CODA_OP_ROUND_BF16: return "cg_round_bf16(%s)";
    case CODA_OP_ADD: return "(%s + %s)";
    case CODA_OP_SUB: return "(%s - %s)";
    case CODA_OP_MUL: return "(%s * %s)";
    case CODA_OP_DIV: return "cg_div(%s, %s)";
    case CODA_OP_MAX: return "fmaxf(%s, %s)";
    case CODA_OP_MIN: return "fminf(%s, %s)";
    case CODA_OP_POW: return "powf(%s, %s)";
    case CODA_OP_EQ: return "(%s == %s ? 1.0f : 0.0f)";
    case CODA_OP_LT: return "(%s < %s ? 1.0f : 0.0f)";
    case CODA_OP_MOD: return "fmodf(%s, %s)";
    case CODA_OP_FMA: return "fmaf(%s, %s, %s)";
    case CODA_OP_SELECT: return "(%s != 0.0f ? %s : %s)";
    default: return NULL;
    }
}

/* The device helpers every generated epilogue starts with (cg_* loads,
 * stores, conversions, branch-free math, the log-sum-exp steps): a real CUDA
 * file, src/codegen/epi_prelude.cuh, embedded by the build (tools/embed). */
extern const struct { const char *name; const char *text; } coda_codegen_sources[];

static const char *prelude(void) {
    for (int i = 0; coda_codegen_sources[i].name; i++)
        if (strcmp(coda_codegen_sources[i].name, "epi_prelude.cuh") == 0) return coda_codegen_sources[i].text;
    return NULL;
}

static const char *red_init(coda_reduce_t r) { return r == CODA_REDUCE_MAX ? "CG_NEG_INF" : "0.0f"; }

/* "x OP y" for a reduction, into buf. */
static void red_expr(char *buf, size_t cap, coda_reduce_t r, const char *x, const char *y) {
    if (r == CODA_REDUCE_MAX) /* a NaN element makes the max NaN, as on the CPU */
        snprintf(buf, cap, "((%s != %s || %s != %s) ? __int_as_float(0x7fc00000) : fmaxf(%s, %s))", x, x, y, y, x, y);
    else snprintf(buf, cap, "(%s + %s)", x, y);
}

/* "x = x OP y" for a reduction. */
static void red_fold(sb_t *b, coda_reduce_t r, const char *x, const char *y) {
    char e[256];
    red_expr(e, sizeof e, r, x, y);
    sb_printf(b, "%s = %s;", x, e);
}

/* Fold x with its copies in the lanes sh = lo, 2 lo, .., hi apart (butterfly
 * shuffles), one line per step indented by `indent` spaces. */
static void shfl_fold(sb_t *b, coda_reduce_t r, int lo, int hi, int indent) {
    for (int sh = lo; sh <= hi; sh *= 2) {
        char y[64];
        snprintf(y, sizeof y, "__shfl_xor_sync(0xffffffffu, x, %d)", sh);
        sb_printf(b, "%*s{ float y_ = %s; ", indent, "", y);
        red_fold(b, r, "x", "y_");
        sb_printf(b, " }\n");
    }
}

/* Elements a pair gives the lse output k (the width of its value). */
static int lse_width(const coda_program_t *p, int k) {
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_LSE && p->insts[i].arg == k) {
            const coda_inst_t *v = &p->insts[p->insts[i].src[0]];
            return (v->shape & CODA_SHAPE_COL) ? space_width(v->vspace) : 1;
        }
    return 1;
}

/* ---- the three functions ---- */

/* How a program uses each consumer warp's 4 KiB slab (t.stage) in the
 * N16 and RING forms: staged tile inputs and outputs (plan_staging, below),
 * then the tile's slice of each column vector (coda_epi_preload). */
#define STAGE_BATCH 4
#define STAGE_BYTES 4096
typedef struct stage_plan {
    int off[CODA_EPI_MAX_ARGS];   /* region offset in the slab; -1: not staged */
    int pitch[CODA_EPI_MAX_ARGS]; /* bytes per staged row */
    int any_in, any_out;
    int col_off[CODA_EPI_MAX_ARGS]; /* column vector's region; -1: read from global memory */
    int any_col;
} stage_plan_t;

/* C text of column vector a's element count (in its space), of its
 * elements in one tile, and of the index (in its space) of the pair at
 * tile column `col` relative to the tile's first. */
static const char *col_count(const coda_arg_t *a) {
    return a->space == CODA_SPACE_HALF ? "(P->n / 2)" : a->space == CODA_SPACE_FULL ? "P->n" : "(2LL * P->n)";
}
static const char *col_per_tile(const coda_arg_t *a) {
    return a->space == CODA_SPACE_HALF ? "(CODA_BN / 2)" : a->space == CODA_SPACE_FULL ? "CODA_BN" : "(2 * CODA_BN)";
}
static const char *col_in_tile(const coda_arg_t *a) {
    return a->space == CODA_SPACE_HALF   ? "(((col - t.col) + 2 * (t.tid & 3)) >> 1)"
         : a->space == CODA_SPACE_FULL ? "((col - t.col) + 2 * (t.tid & 3))"
                                         : "(2 * ((col - t.col) + 2 * (t.tid & 3)))";
}

/* Column vectors (in NAME col) in the N16 and RING forms: each consumer
 * warp copies the tile's slice into its slab before the k-loop (cp.async,
 * 16 bytes a lane, zero-filled past the vector's end), coda_epi_begin waits
 * for the copies (long done by then), and coda_epi_fetch reads each pair's
 * elements from shared memory. Loaded from global memory batch by batch,
 * their latency was the largest wait in rmsnorm_bwd's epilogue (session 8,
 * Nsight Compute stall samples: about 16% of them). A warp's slab is its
 * own, and its earlier tile's readers (the column partials' second barrier)
 * are done before it copies the next slice. */
static void gen_col_copy(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    if (!sp->any_col) return;
    sb_printf(b, "#if CG_COL_SLAB\n"
                 "    {\n"
                 "        const int lane_ = t.tid & 31;\n"
                 "        cg_cp_async_wait_all(); /* an earlier piece's (a stream-K contributor runs no epilogue) */\n");
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        if (sp->col_off[k] < 0) continue;
        const coda_arg_t *a = &p->args[k];
        int esz = a->dtype == CODA_BF16 ? 2 : 4;
        sb_printf(b, "        { /* %s */\n"
                     "            const long long e0_ = (long long)t.tile_n * %s;\n"
                     "            const long long left_ = (%s - e0_) * %d; /* bytes from the slice's start to the end */\n"
                     "            const char *g_ = (const char *)P->ptr[%d];\n"
                     "#pragma unroll\n"
                     "            for (int u = lane_; u < %s * %d / 16; u += 32) {\n"
                     "                const long long n_ = left_ - 16LL * u;\n"
                     "                cg_cp_async16(t.stage + %du + 16u * (unsigned)u, n_ > 0 ? g_ + e0_ * %d + 16LL * u : g_,\n"
                     "                              n_ >= 16 ? 16 : n_ > 0 ? (int)n_ : 0);\n"
                     "            }\n"
                     "        }\n",
                  a->name, col_per_tile(a), col_count(a), esz, k, col_per_tile(a), esz, sp->col_off[k], esz);
    }
    sb_printf(b, "        cg_cp_async_commit();\n    }\n#endif\n");
}

/* Row vectors (in NAME row): coda_epi_preload reads each load's values for
 * the thread's row slots before the tile's k-loop (volatile loads, so they
 * stay there), coda_epi_begin keeps them in the state, and the pairs use
 * them from registers. Loaded at the epilogue's start, their latency had
 * been the first pair's wait in every tile. Rows past M read row M - 1
 * (their results are never stored). */
static void gen_preload(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    sb_printf(b, "struct coda_epi_pre {\n    int unused_;\n");
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_LOAD && p->args[p->insts[i].arg].kind == CODA_IN_ROW)
            sb_printf(b, "    float v%d[CODA_EPI_ROW_SLOTS]; /* %s */\n", i, p->args[p->insts[i].arg].name);
    sb_printf(b, "};\n\n"
                 "static __device__ __forceinline__ void coda_epi_preload(const coda_epi_params &P_,\n"
                 "        const coda_epi_tile &t, coda_epi_pre &Q) {\n"
                 "    const coda_epi_params *P = &P_;\n"
                 "    const int row0 = t.row;\n"
                 "    (void)P; (void)row0; (void)Q;\n"
                 "#pragma unroll\n"
                 "    for (int rs = 0; rs < CODA_EPI_ROW_SLOTS; rs++) {\n"
                 "        const int row = CG_SLOT_ROW(row0, rs);\n"
                 "        const long long r = row < P->m ? row : P->m - 1;\n"
                 "        (void)r;\n");
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_LOAD || p->args[in->arg].kind != CODA_IN_ROW) continue;
        char idx[64], ld[256];
        snprintf(idx, sizeof idx, "r * P->s0[%d]", in->arg);
        load_text(&p->args[in->arg], in->arg, idx, ld, sizeof ld);
        sb_printf(b, "        Q.v%d[rs] = %s;\n", i, ld);
    }
    sb_printf(b, "    }\n");
    gen_col_copy(b, p, sp);
    sb_printf(b, "}\n\n");
}

static void gen_state(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    gen_preload(b, p, sp);
    sb_printf(b, "struct coda_epi_state {\n    int unused_;\n    coda_epi_pre pre; /* row vectors */\n");
    for (int k = 0; k < p->n_args; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind == CODA_OUT_ROWRED)
            sb_printf(b, "    float r%d[CODA_EPI_ROW_SLOTS];  /* %s: row partials */\n", k, a->name);
        else if (a->kind == CODA_OUT_LSE)
            sb_printf(b, "    float lm%d[CODA_EPI_ROW_SLOTS], ll%d[CODA_EPI_ROW_SLOTS];\n"
                         "    float lp%d[CODA_EPI_ROW_SLOTS]; /* %s */\n"
                         "    float lb%d[CODA_EPI_ROW_SLOTS * CODA_EPI_BATCH * %d]; /* the batch's values, folded by coda_epi_flush */\n",
                      k, k, k, a->name, k, lse_width(p, k));
        else if (a->kind == CODA_OUT_COLRED)
            sb_printf(b, "    float c%d[CODA_EPI_COL_SLOTS * %d];  /* %s: column partials */\n", k,
                      space_width(a->space), a->name);
    }
    sb_printf(b, "};\n\n");

    sb_printf(b, "static __device__ __forceinline__ void coda_epi_begin(const coda_epi_params &P_,\n"
                 "        const coda_epi_tile &t, coda_epi_state &S_, const coda_epi_pre &Q) {\n"
                 "    coda_epi_state *S = &S_;\n    (void)P_; (void)t;\n    S->pre = Q;\n");
    if (sp->any_col) /* the column vectors coda_epi_preload copied: in the slab, seen by the whole warp */
        sb_printf(b, "#if CG_COL_SLAB\n    cg_cp_async_wait_all();\n    __syncwarp();\n#endif\n");
    for (int k = 0; k < p->n_args; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind == CODA_OUT_ROWRED)
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) S->r%d[i] = %s;\n", k,
                      red_init(a->reduce));
        else if (a->kind == CODA_OUT_LSE)
            sb_printf(b,
                      "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) {\n"
                      "        S->lm%d[i] = CG_NEG_INF; S->ll%d[i] = 0.0f;\n    }\n"
                      "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) S->lp%d[i] = 0.0f;\n"
                      "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS * CODA_EPI_BATCH * %d; i++) S->lb%d[i] = CG_NEG_INF;\n",
                      k, k, k, lse_width(p, k), k);
        else if (a->kind == CODA_OUT_COLRED)
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_COL_SLOTS * %d; i++) S->c%d[i] = %s;\n",
                      space_width(a->space), k, red_init(a->reduce));
    }
    sb_printf(b, "    (void)S;\n}\n\n");
}

/* First column of the elements a pair covers, in space s, as C text. */
static const char *first_col(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(col >> 1)" : s == CODA_SPACE_FULL ? "col" : "(2 * col)";
}
/* The same as the thread's first column and the chunk's offset from it
 * (col - t.col: a constant once the kernel's loops are unrolled), so that
 * `pointer + first + offset` is a per-thread register and an immediate. */
static const char *first_col_split(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(t.col >> 1) + ((col - t.col) >> 1)"
         : s == CODA_SPACE_FULL ? "t.col + (col - t.col)" : "2 * t.col + 2 * (col - t.col)";
}
/* The same for loads, from the clamped column cl (always inside the matrix). */
static const char *first_col_load(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(cl >> 1)" : s == CODA_SPACE_FULL ? "cl" : "(2 * cl)";
}

/* 32-bit words a pair's w elements of type dt take (the fetch struct). */
static int vec_words(int w, coda_dtype_t dt) {
    int bytes = w * (dt == CODA_BF16 ? 2 : 4);
    return bytes < 4 ? 1 : bytes / 4;
}

/* Fetch the raw words of value i's w elements from element pointer `q`
 * (bf16 or f32) into L.u<i>[]. pred (a tile, N even: every pair is whole):
 * the load is predicated on the pair being inside (valid; words 0 when
 * not). Else q is inside (clamped) and, N odd (the
 * pair function returned for pairs outside): all w when the pair is whole
 * (ok1), else the first half (missing words are 0). Alignment: rows start
 * 16-byte aligned (fused_gemm.c checks) and col is even, so a pair's
 * elements are one aligned 2, 4, 8 or 16-byte access. */
static void gen_vec_fetch(sb_t *b, int i, int w, coda_dtype_t dt, const char *q, const char *pred) {
    const char *t = dt == CODA_BF16 ? "unsigned short" : "float";
    int nw = vec_words(w, dt);
    sb_printf(b, "    {\n        const %s *q_ = %s;\n        unsigned *u_ = L.u%d;\n", t, q, i);
    if (nw == 1 && dt == CODA_BF16 && w == 1) /* a half-space bf16 element: 2 bytes */
        pred ? sb_printf(b, "        u_[0] = cg_ld16p(%s, q_);\n", pred) : sb_printf(b, "        u_[0] = cg_ld16(q_);\n");
    else if (pred)
        sb_printf(b, nw == 1   ? "        u_[0] = cg_ld32p(%s, q_);\n"
                     : nw == 2 ? "        cg_ld64p(%s, q_, &u_[0], &u_[1]);\n"
                               : "        cg_ld128p(%s, q_, &u_[0], &u_[1], &u_[2], &u_[3]);\n", pred);
    else if (nw == 1)
        sb_printf(b, "        u_[0] = %s;\n", dt == CODA_F32 ? "cg_ld32(q_)" : "ok1 ? cg_ld32(q_) : cg_ld16(q_)");
    else if (nw == 2)
        sb_printf(b, "        if (ok1) cg_ld64(q_, &u_[0], &u_[1]);\n"
                     "        else { u_[0] = cg_ld32(q_); u_[1] = 0u; }\n");
    else
        sb_printf(b, "        if (ok1) cg_ld128(q_, &u_[0], &u_[1], &u_[2], &u_[3]);\n"
                     "        else { cg_ld64(q_, &u_[0], &u_[1]); u_[2] = u_[3] = 0u; }\n");
    sb_printf(b, "    }\n");
}

/* Value i's w elements from the fetched words: element e of a pair that is
 * not whole (!ok1) and lies in its second half is 0. */
static void gen_vec_decode(sb_t *b, int i, int w, coda_dtype_t dt) {
    for (int e = 0; e < w; e++) {
        char x[64];
        if (dt == CODA_BF16) snprintf(x, sizeof x, "cg_%s(L.u%d[%d])", e % 2 ? "hi" : "lo", i, e / 2);
        else snprintf(x, sizeof x, "__uint_as_float(L.u%d[%d])", i, e);
        if (w > 1 && e >= w / 2) sb_printf(b, "    const float v%d_%d = ok1 ? %s : 0.0f;\n", i, e, x);
        else sb_printf(b, "    const float v%d_%d = %s;\n", i, e, x);
    }
}

/* Vector store of w elements (names x[0..w-1]; as bf16, the packed words
 * pk[0..w/2-1]) to element pointer `q`, predicated on the pair being
 * inside (valid): all w when it is whole (ok1), else the first half. No
 * branches (see cg_st32). */
static void gen_vec_store(sb_t *b, int w, coda_dtype_t dt, const char *q, char x[4][48], char pk[2][112]) {
    sb_printf(b, "    {\n        %s *q_ = %s;\n", dt == CODA_BF16 ? "unsigned short" : "float", q);
    if (dt == CODA_BF16) {
        if (w == 1) sb_printf(b, "        cg_st16(valid, q_, cg_f32_to_bf16(%s));\n", x[0]);
        else if (w == 2)
            sb_printf(b, "        cg_st32(valid && ok1, q_, %s);\n"
                         "        if (!ok1) cg_st16(valid, q_, cg_f32_to_bf16(%s));\n", pk[0], x[0]);
        else
            sb_printf(b, "        cg_st64(valid && ok1, q_, %s, %s);\n"
                         "        if (!ok1) cg_st32(valid, q_, %s);\n",
                      pk[0], pk[1], pk[0]);
    } else {
        if (w == 1) sb_printf(b, "        cg_st32(valid, q_, __float_as_uint(%s));\n", x[0]);
        else if (w == 2)
            sb_printf(b, "        cg_st64(valid && ok1, q_, __float_as_uint(%s), __float_as_uint(%s));\n"
                         "        if (!ok1) cg_st32(valid, q_, __float_as_uint(%s));\n", x[0], x[1], x[0]);
        else
            sb_printf(b, "        cg_st128(valid && ok1, q_, __float_as_uint(%s), __float_as_uint(%s),\n"
                         "                 __float_as_uint(%s), __float_as_uint(%s));\n"
                         "        if (!ok1) cg_st64(valid, q_, __float_as_uint(%s), __float_as_uint(%s));\n",
                      x[0], x[1], x[2], x[3], x[0], x[1]);
    }
    sb_printf(b, "    }\n");
}

/* The lines every pair function starts with: is the pair inside (valid),
 * the row and column its loads use (r, cl), is it whole (ok1).
 * even_n: N is even, so every pair is whole. Then the pair code has no
 * branches: loads read from a clamped row and column (always inside the
 * matrix) with no condition; only stores and reductions are predicated on
 * the pair being inside. The general form (odd N) returns early for pairs
 * outside and tests ok1. */
static void gen_pair_start(sb_t *b, int even_n) {
    if (even_n)
        sb_printf(b,
                  "    const int valid = row < P->m && col < P->n;\n"
                  "    const long long r = row < P->m ? row : P->m - 1;  /* loads stay inside */\n"
                  "    const int cl = col < P->n ? col : P->n - 2;\n"
                  "    const int ok1 = 1;\n");
    else
        sb_printf(b,
                  "    if (row >= P->m || col >= P->n) return;\n"
                  "    const int ok1 = col + 1 < P->n;\n"
                  "    const long long r = row;\n"
                  "    const int cl = col, valid = 1;\n");
    sb_printf(b, "    (void)ok1; (void)r; (void)cl; (void)valid;\n");
}

/* Staging of tile outputs (form N16; the kernel sets CODA_EPI_STAGE; the
 * plan's struct, stage_plan_t, is defined above): each
 * consumer warp owns a 4 KiB shared-memory slab (t.stage). For one batch of
 * CODA_EPI_BATCH (4) column chunks the pairs write their outputs into the
 * slab in the fragment layout (16 rows of the warp x the batch's columns, one
 * region per output), and coda_epi_flush writes them out as 16-byte vectors.
 * Stored straight from the fragment, every store instruction would put 4 to
 * 8 bytes into each of 8 rows: measured on the H200, resid_add's one bf16
 * output then cost 0.075 ms at M = N = K = 4096, 40% of the GEMM. Regions
 * are rows of `pitch` bytes with their 16-byte units swizzled by row, so
 * that neither the fragment writes nor the vector reads conflict on banks. */
static int stage_pitch(const coda_arg_t *a) {
    return STAGE_BATCH * 4 * space_width(a->space) * (a->dtype == CODA_BF16 ? 2 : 4); /* 4 lanes a chunk */
}

/* Argument k is loaded, and only in its own space. */
static int loaded_in_own_space(const coda_program_t *p, int k) {
    int loads = 0;
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->arg != k || in->op != CODA_OP_LOAD) continue;
        if (in->vspace != p->args[k].space) return 0;
        loads++;
    }
    return loads > 0;
}

int coda__codegen_col_staged(const coda_program_t *p, int k) {
    return p && k >= 0 && k < p->n_args && p->args[k].kind == CODA_IN_COL && loaded_in_own_space(p, k);
}

/* Tile outputs stored once and tile inputs loaded in their own space get a
 * region while the slab has room. Inputs and outputs share the slab: the
 * inputs are read into registers (coda_epi_fetch) before any pair writes an
 * output, with a __syncwarp between. */
static void plan_staging(const coda_program_t *p, int n16, const coda_ring_plan_t *rp, stage_plan_t *sp) {
    int used_in = 0, used_out = 0;
    for (int k = 0; k < CODA_EPI_MAX_ARGS; k++) sp->off[k] = sp->col_off[k] = -1, sp->pitch[k] = 0;
    sp->any_in = sp->any_out = sp->any_col = 0;
    if (!n16) return;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        const coda_arg_t *a = &p->args[k];
        if (rp->first_box[k] >= 0) continue; /* comes through the stage ring */
        int stores = 0;
        for (int i = 0; i < p->n_insts; i++) stores += p->insts[i].arg == k && p->insts[i].op == CODA_OP_STORE;
        int pitch = stage_pitch(a), *used;
        if (a->kind == CODA_OUT_TILE && stores == 1) used = &used_out;
        else if (a->kind == CODA_IN_TILE && loaded_in_own_space(p, k)) used = &used_in;
        else continue;
        if (*used + 16 * pitch > STAGE_BYTES) continue;
        sp->off[k] = *used;
        sp->pitch[k] = pitch;
        *used += 16 * pitch;
        if (a->kind == CODA_IN_TILE) sp->any_in = 1;
        else sp->any_out = 1;
    }
    /* Column vectors loaded in their own space: the tile's slice of each
     * after the staged regions, while it fits (sized for CODA_BN = 256). */
    int used = used_in > used_out ? used_in : used_out;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        const coda_arg_t *a = &p->args[k];
        if (!coda__codegen_col_staged(p, k)) continue;
        int bytes = 256 * space_width(a->space) / 2 * (a->dtype == CODA_BF16 ? 2 : 4);
        if (used + bytes > STAGE_BYTES) continue;
        sp->col_off[k] = used;
        used += bytes;
        sp->any_col = 1;
    }
}

/* The slab address of a pair's elements (e bytes) in row half h and chunk
 * jj of the batch (C expressions, constants once the kernel's loops are
 * unrolled): the lane's part (its row, its bytes, the swizzle key) and the
 * chunk's part (a 16-byte unit, and for e = 2 the upper 8 bytes) have
 * disjoint bits, so the chunk enters by an XOR and an add to a per-thread
 * value instead of the whole swizzle for every pair. */
static void slab_pair_addr(char *buf, size_t cap, int off, int pitch, int e, const char *h, const char *jj) {
    int rp = pitch >= 128 ? 1 : 128 / pitch, nch = pitch / 16;
    snprintf(buf, cap,
             "        const int r_ = 8 * (%s) + ((t.tid & 31) >> 2), xl_ = (t.tid & 3) * %d, xc_ = (%s) * %d;\n"
             "        const unsigned a_ = t.stage + %d + ((r_ * %d + ((((xl_ >> 4) ^ ((r_ / %d) & %d))) << 4) + "
             "(xl_ & 15)) ^ (xc_ & ~15)) + (xc_ & 15);\n",
             h, e, jj, 4 * e, off, pitch, rp, nch - 1);
}

/* The swizzled slab address of byte x_ of staged row r_ (C expressions). */
static void stage_addr(char *buf, size_t cap, int off, int pitch) {
    int rp = pitch >= 128 ? 1 : 128 / pitch, nch = pitch / 16;
    snprintf(buf, cap, "t.stage + %d + r_ * %d + ((((x_ >> 4) ^ ((r_ / %d) & %d))) << 4) + (x_ & 15)", off, pitch,
             rp, nch - 1);
}

/* Tile inputs through the stage ring (form RING, codegen.h). */
void coda__codegen_ring_plan(const coda_program_t *p, coda_ring_plan_t *plan) {
    memset(plan, 0, sizeof *plan);
    for (int k = 0; k < CODA_EPI_MAX_ARGS; k++) plan->first_box[k] = -1;
    if (!p) return;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind != CODA_IN_TILE || (a->dtype != CODA_BF16 && a->dtype != CODA_F32)) continue;
        if (a->space != CODA_SPACE_FULL && a->space != CODA_SPACE_DOUBLE) continue;
        if (!loaded_in_own_space(p, k)) continue;
        /* bytes of one row of a 64-column chunk, in 128-byte boxes */
        int per_col = (a->space == CODA_SPACE_DOUBLE ? 2 : 1) * (a->dtype == CODA_BF16 ? 2 : 4);
        int boxes = 64 * per_col / 128, elems = 128 / (a->dtype == CODA_BF16 ? 2 : 4);
        if (plan->nbox + boxes > CODA_RING_MAX_BOX) continue;
        plan->first_box[k] = plan->nbox;
        for (int b = 0; b < boxes; b++) {
            plan->arg[plan->nbox] = k;
            plan->xmul[plan->nbox] = a->space == CODA_SPACE_DOUBLE ? 2 : 1;
            plan->xadd[plan->nbox] = b * elems;
            plan->nbox++;
        }
    }
}

/* A ring input's pair from the stage (t.ring: the chunk's stage; box k at
 * k * t.ring_box bytes). Tiles start at multiples of 128 rows and 64
 * columns, so the row in the box is row & 127 and the byte in the chunk's
 * row (col & 63) times the bytes per accumulator column; 16-byte unit u of
 * box row r sits at u ^ (r & 7).
 * The address splits into a part that depends on the thread only (its
 * row, its lane's bytes, the swizzle key r & 7, the same for row + 8) and
 * one that depends on the chunk only (col - t.col and row - t.row are
 * constants once the kernel's loops are unrolled): the unit's chunk bits
 * and the lane's bits are disjoint, so the chunk enters by one XOR, and
 * ptxas keeps the per-thread part in a register instead of redoing the
 * swizzle for every pair (session 6: 4-6 integer instructions a load). */
static void gen_ring_fetch(sb_t *b, int i, const coda_arg_t *a, int first_box) {
    int esz = a->dtype == CODA_BF16 ? 2 : 4, per_col = (a->space == CODA_SPACE_DOUBLE ? 2 : 1) * esz;
    int e = 2 * per_col; /* bytes of the pair */
    sb_printf(b, "    { /* %s: copied into the stage ring by TMA */\n"
                 "        const int xl_ = (t.col & 7) * %d, xc_ = ((col - t.col) & 63) * %d;\n"
                 "        const unsigned thr_ = (t.row & 127) * 128 + ((((xl_ >> 4) ^ (t.row & 7))) << 4) + (xl_ & 15);\n"
                 "        const unsigned a_ = t.ring + (%d + (xc_ >> 7)) * t.ring_box + (thr_ ^ (xc_ & 0x70)) + "
                 "(row - t.row) * 128;\n",
              a->name, per_col, per_col, first_box);
    if (e == 4) sb_printf(b, "        L.u%d[0] = cg_lds32(a_);\n", i);
    else if (e == 8) sb_printf(b, "        cg_lds64(a_, L.u%d);\n", i);
    else sb_printf(b, "        cg_lds128(a_, L.u%d);\n", i);
    sb_printf(b, "    }\n");
}

/* Tile and column-vector inputs are read in a separate step, coda_epi_fetch,
 * into a struct of raw words: the mainloop fetches a batch of pairs before
 * it runs the program on any of them (CODA_EPI_BATCH), so that many loads
 * are in flight at once instead of one round trip to memory per pair. */
static void gen_fetch(sb_t *b, const coda_program_t *p, int even_n, const coda_ring_plan_t *rp,
                      const stage_plan_t *sp) {
    sb_printf(b, "struct coda_epi_in {\n    unsigned unused_;\n");
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_LOAD) continue;
        const coda_arg_t *a = &p->args[in->arg];
        if (a->kind == CODA_IN_TILE || a->kind == CODA_IN_COL)
            sb_printf(b, "    unsigned u%d[%d]; /* %s */\n", i, vec_words(value_width(in), a->dtype), a->name);
    }
    sb_printf(b, "};\n\n");
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_fetch(const coda_epi_params &P_,\n"
              "        const coda_epi_tile &t, int row, int col, coda_epi_in &L) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    (void)t; (void)P; (void)L;\n");
    gen_pair_start(b, even_n);
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        if (in->op != CODA_OP_LOAD) continue;
        const coda_arg_t *a = &p->args[in->arg];
        if (a->kind != CODA_IN_TILE && a->kind != CODA_IN_COL) continue;
        char q[160];
        const char *t = a->dtype == CODA_BF16 ? "unsigned short" : "float";
        /* Tiles, N even: unclamped row and column, the load predicated on
         * the pair being inside, the address a per-thread pointer plus the
         * chunk's columns as a constant. Column vectors: the clamped column
         * and no predicate, so that ptxas sees the same load for both rows
         * of a column and makes it once (predicated, each row kept its own:
         * session 6). N odd: the clamped row and column. */
        const char *pred = even_n && a->kind == CODA_IN_TILE ? "valid" : NULL;
        const char *c0 = pred ? first_col_split(in->vspace) : first_col_load(in->vspace);
        if (a->kind == CODA_IN_TILE)
            snprintf(q, sizeof q, "(const %s *)P->ptr[%d] + %s * P->s0[%d] + %s", t, in->arg,
                     pred ? "(long long)row" : "r", in->arg, c0);
        else /* a column vector: contiguous (innermost stride is one element) */
            snprintf(q, sizeof q, "(const %s *)P->ptr[%d] + %s", t, in->arg, c0);
        if (rp->first_box[in->arg] >= 0) { /* the stage ring, or global memory */
            sb_printf(b, "#if CODA_EPI_RING\n");
            gen_ring_fetch(b, i, a, rp->first_box[in->arg]);
            sb_printf(b, "#else\n");
            gen_vec_fetch(b, i, value_width(in), a->dtype, q, pred);
            sb_printf(b, "#endif\n");
        } else if (sp->off[in->arg] >= 0) { /* staged: the pair's elements from the slab */
            int w = value_width(in), e = w * (a->dtype == CODA_BF16 ? 2 : 4);
            char addr[512];
            slab_pair_addr(addr, sizeof addr, sp->off[in->arg], sp->pitch[in->arg], e, "((row - t.row) >> 3) & 1",
                           "((col - t.col) >> 3) % CODA_EPI_BATCH");
            sb_printf(b, "#if CODA_EPI_STAGE\n"
                         "    { /* %s: staged by coda_epi_vput */\n%s",
                      a->name, addr);
            if (e == 2) sb_printf(b, "        L.u%d[0] = cg_lds16(a_);\n", i);
            else if (e == 4) sb_printf(b, "        L.u%d[0] = cg_lds32(a_);\n", i);
            else if (e == 8) sb_printf(b, "        cg_lds64(a_, L.u%d);\n", i);
            else sb_printf(b, "        cg_lds128(a_, L.u%d);\n", i);
            sb_printf(b, "    }\n#else\n");
            gen_vec_fetch(b, i, w, a->dtype, q, pred);
            sb_printf(b, "#endif\n");
        } else if (a->kind == CODA_IN_COL) {
            /* CODA_X_NO_COL_LOAD (experiment): ones, no load; else from the
             * slab where coda_epi_preload copied the tile's slice, or from
             * global memory */
            int w = value_width(in), e = w * (a->dtype == CODA_BF16 ? 2 : 4);
            sb_printf(b, "#ifdef CODA_X_NO_COL_LOAD\n"
                         "    for (int w_ = 0; w_ < %d; w_++) L.u%d[w_] = %s;\n",
                      vec_words(w, a->dtype), i, a->dtype == CODA_BF16 ? "0x3f803f80u" : "0x3f800000u");
            if (sp->col_off[in->arg] >= 0) {
                sb_printf(b, "#elif CG_COL_SLAB\n"
                             "    { /* %s: the tile's slice, in the slab */\n"
                             "        const unsigned a_ = t.stage + %du + (unsigned)%s * %du;\n",
                          a->name, sp->col_off[in->arg], col_in_tile(a), a->dtype == CODA_BF16 ? 2u : 4u);
                if (e == 2) sb_printf(b, "        L.u%d[0] = cg_lds16(a_);\n", i);
                else if (e == 4) sb_printf(b, "        L.u%d[0] = cg_lds32(a_);\n", i);
                else if (e == 8) sb_printf(b, "        cg_lds64(a_, L.u%d);\n", i);
                else sb_printf(b, "        cg_lds128(a_, L.u%d);\n", i);
                sb_printf(b, "    }\n");
            }
            sb_printf(b, "#else\n");
            gen_vec_fetch(b, i, w, a->dtype, q, pred);
            sb_printf(b, "#endif\n");
        } else {
            gen_vec_fetch(b, i, value_width(in), a->dtype, q, pred);
        }
    }
    sb_printf(b, "}\n\n");
}

/* A pair's w elements of output arg k into its slab region. */
static void gen_stage_store(sb_t *b, const coda_arg_t *a, int off, int pitch, char x[4][48], char pk[2][112]) {
    int w = space_width(a->space), esz = a->dtype == CODA_BF16 ? 2 : 4, e = w * esz;
    char addr[512];
    slab_pair_addr(addr, sizeof addr, off, pitch, e, "rs & 1", "(cs % (CODA_BN / 8)) % CODA_EPI_BATCH");
    sb_printf(b, "    { /* %s: staged, coda_epi_flush writes it out */\n%s", a->name, addr);
    if (a->dtype == CODA_BF16) {
        if (w == 1) sb_printf(b, "        cg_sts16(a_, cg_f32_to_bf16(%s));\n", x[0]);
        else if (w == 2) sb_printf(b, "        cg_sts32(a_, %s);\n", pk[0]);
        else sb_printf(b, "        cg_sts64(a_, %s, %s);\n", pk[0], pk[1]);
    } else {
        if (w == 1) sb_printf(b, "        cg_sts32(a_, __float_as_uint(%s));\n", x[0]);
        else if (w == 2) sb_printf(b, "        cg_sts64(a_, __float_as_uint(%s), __float_as_uint(%s));\n", x[0], x[1]);
        else
            sb_printf(b, "        cg_sts128(a_, __float_as_uint(%s), __float_as_uint(%s), __float_as_uint(%s), "
                         "__float_as_uint(%s));\n", x[0], x[1], x[2], x[3]);
    }
    sb_printf(b, "    }\n");
}

/* A staged argument as the flush and the input staging need it: element
 * size, region pitch and 16-byte units per row, C expressions for its first
 * column at accumulator column col0 and for its number of columns, and the
 * swizzled slab address of unit x_ of row r_. */
typedef struct staged_arg {
    const coda_arg_t *a;
    int esz, pitch, nch;
    int jmul;                  /* the arg's columns per unit of j0 (8 accumulator columns) */
    const char *first, *ncols; /* the warp's first column in the tile (j0 = 0); the arg's columns */
    char addr[160];
} staged_arg_t;

static int staged_arg(const coda_program_t *p, const stage_plan_t *sp, int k, coda_arg_kind_t kind,
                      staged_arg_t *sa) {
    if (sp->off[k] < 0 || p->args[k].kind != kind) return 0;
    coda_space_t sw = p->args[k].space;
    sa->a = &p->args[k];
    sa->esz = sa->a->dtype == CODA_BF16 ? 2 : 4;
    sa->pitch = sp->pitch[k];
    sa->nch = sa->pitch / 16;
    sa->first = sw == CODA_SPACE_HALF ? "(col0 >> 1)" : sw == CODA_SPACE_FULL ? "col0" : "(2 * col0)";
    sa->jmul = sw == CODA_SPACE_HALF ? 4 : sw == CODA_SPACE_FULL ? 8 : 16;
    sa->ncols = sw == CODA_SPACE_HALF ? "(P->n / 2)" : sw == CODA_SPACE_FULL ? "(long long)P->n" : "(2LL * P->n)";
    stage_addr(sa->addr, sizeof sa->addr, sp->off[k], sa->pitch);
    return 1;
}

/* The warp's first row and the tile's first accumulator column. The
 * batch's columns (j0) are added last, as a constant: the address of a
 * lane's vector is then one per-tile register and an immediate offset for
 * every batch, and its bounds test one compare (session 6: the 64-bit
 * address arithmetic had been redone for every vector of every batch). */
static const char WARP_ORIGIN[] =
    "    const long long row0 = t.row - (lane >> 2) + 64 * mh; /* the warp's first row */\n"
    "    const long long col0 = t.col - 2 * (lane & 3); /* the tile's first acc column */\n";

/* coda_epi_flush(P, t, mh, j0): after the pairs of the batch at chunk j0 of
 * row block mh, the warp writes each staged region out, 16 bytes a lane. N
 * is a multiple of 16 and a batch starts at a multiple of 32 columns, so a
 * vector is wholly inside the output or wholly outside. */
static void gen_flush(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_flush(const coda_epi_params &P_, coda_epi_state &S_,\n"
              "        const coda_epi_tile &t, int mh, int j0) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    coda_epi_state *S = &S_;\n"
              "    (void)P; (void)S; (void)t; (void)mh; (void)j0;\n");
    for (int k = 0; k < p->n_args; k++) {
        if (p->args[k].kind != CODA_OUT_LSE) continue;
        int w = lse_width(p, k);
        sb_printf(b, "#if CODA_EPI_STORE_C\n#error \"lse outputs are folded by coda_epi_flush, which the C-store path does not call\"\n#endif\n");
        sb_printf(b, "    /* %s: the batch's values of row slots 2 mh and 2 mh + 1 into their states */\n"
                     "#pragma unroll\n"
                     "    for (int h = 0; h < 2; h++) {\n"
                     "        const int rs = 2 * mh + h;\n"
                     "        cg_lse_fold(&S->lm%d[rs], &S->ll%d[rs],\n"
                     "                    &S->lb%d[rs * CODA_EPI_BATCH * %d], CODA_EPI_BATCH * %d);\n"
                     "        /* -inf again: with N odd a pair outside returns before it writes\n"
                     "         * its values (with N even every pair writes, and these die) */\n"
                     "#pragma unroll\n"
                     "        for (int i = 0; i < CODA_EPI_BATCH * %d; i++) S->lb%d[rs * CODA_EPI_BATCH * %d + i] = CG_NEG_INF;\n"
                     "    }\n",
                  p->args[k].name, k, k, k, w, w, w, k, w);
    }
    if (sp->any_out) {
        sb_printf(b, "#if CODA_EPI_STAGE\n"
                     "#if CODA_EPI_BATCH != %d\n#error \"the staged epilogue is laid out for batches of %d chunks\"\n#endif\n"
                     "    __syncwarp(); /* the pairs' slab writes are visible to the warp */\n"
                     "    const int lane = t.tid & 31;\n%s",
                  STAGE_BATCH, STAGE_BATCH, WARP_ORIGIN);
        staged_arg_t sa;
        for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
            if (!staged_arg(p, sp, k, CODA_OUT_TILE, &sa)) continue;
            sb_printf(b,
                      "    { /* %s */\n"
                      "        const long long c_ = %s + (lane %% %d) * %d, rem_ = %s - c_;\n"
                      "        %s *g0_ = (%s *)P->ptr[%d] + (row0 + lane / %d) * P->s0[%d] + c_;\n"
                      "        const long long step_ = %d * P->s0[%d];\n"
                      "#pragma unroll\n"
                      "        for (int i = lane; i < %d; i += 32) {\n"
                      "            const int r_ = i / %d, x_ = (i %% %d) * 16;\n"
                      "            unsigned v[4];\n"
                      "            cg_lds128(%s, v);\n"
                      "            cg_st128(row0 + r_ < P->m && %d * j0 < rem_, g0_ + (i / 32) * step_ + %d * j0,\n"
                      "                     v[0], v[1], v[2], v[3]);\n"
                      "        }\n"
                      "    }\n",
                      sa.a->name, sa.first, sa.nch, 16 / sa.esz, sa.ncols,
                      sa.esz == 2 ? "unsigned short" : "float", sa.esz == 2 ? "unsigned short" : "float", k, sa.nch, k,
                      32 / sa.nch, k, 16 * sa.nch, sa.nch, sa.nch, sa.addr, sa.jmul, sa.jmul);
        }
        sb_printf(b, "    __syncwarp(); /* read out before the next batch writes */\n#endif\n");
    }
    sb_printf(b, "}\n\n");
}

/* Staged tile inputs (form N16): coda_epi_vload reads the warp's 16 rows x
 * one batch's columns of each staged input into registers as 16-byte
 * vectors, coda_epi_vput stores them into the slab; coda_epi_fetch then
 * reads each pair's elements from there. The mainloop issues the next
 * batch's vload before it runs the current batch, so the global loads'
 * latency hides behind a batch of pairs. */
static void gen_stage_in(sb_t *b, const coda_program_t *p, const stage_plan_t *sp) {
    int nv = 0;
    for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++)
        if (sp->off[k] >= 0 && p->args[k].kind == CODA_IN_TILE) nv += sp->pitch[k] / 32;
    sb_printf(b, "struct coda_epi_vin {\n    unsigned v[%d][4]; /* 16-byte vectors of the staged inputs */\n};\n\n",
              nv ? nv : 1);
    for (int put = 0; put < 2; put++) {
        if (put)
            sb_printf(b, "static __device__ __forceinline__ void coda_epi_vput(const coda_epi_tile &t, const coda_epi_vin &V) {\n"
                         "    (void)t; (void)V;\n");
        else
            sb_printf(b, "static __device__ __forceinline__ void coda_epi_vload(const coda_epi_params &P_,\n"
                         "        const coda_epi_tile &t, int mh, int j0, coda_epi_vin &V) {\n"
                         "    const coda_epi_params *P = &P_;\n"
                         "    (void)P; (void)t; (void)mh; (void)j0; (void)V;\n");
        if (!sp->any_in) {
            sb_printf(b, "}\n\n");
            continue;
        }
        sb_printf(b, "#if CODA_EPI_STAGE\n"
                     "#if CODA_EPI_BATCH != %d\n#error \"the staged epilogue is laid out for batches of %d chunks\"\n#endif\n"
                     "    const int lane = t.tid & 31;\n%s",
                  STAGE_BATCH, STAGE_BATCH, put ? "" : WARP_ORIGIN);
        int v = 0;
        staged_arg_t sa;
        for (int k = 0; k < p->n_args && k < CODA_EPI_MAX_ARGS; k++) {
            if (!staged_arg(p, sp, k, CODA_IN_TILE, &sa)) continue;
            for (int i = 0; i < sa.pitch / 32; i++, v++) {
                sb_printf(b, "    { /* %s, vector %d */\n        const int idx = lane + %d, r_ = idx / %d, x_ = (idx %% %d) * 16;\n",
                          sa.a->name, i, 32 * i, sa.nch, sa.nch);
                if (put)
                    sb_printf(b, "        (void)x_;\n        cg_sts128(%s, V.v[%d][0], V.v[%d][1], V.v[%d][2], V.v[%d][3]);\n",
                              sa.addr, v, v, v, v);
                else
                    sb_printf(b, "        const long long gr = row0 + r_, gc = %s + (idx %% %d) * %d;\n"
                                 "        (void)x_;\n"
                                 "        cg_ld128p(gr < P->m && %d * j0 < %s - gc,\n"
                                 "                  (const %s *)P->ptr[%d] + gr * P->s0[%d] + gc + %d * j0,\n"
                                 "                  &V.v[%d][0], &V.v[%d][1], &V.v[%d][2], &V.v[%d][3]);\n",
                              sa.first, sa.nch, 16 / sa.esz, sa.jmul, sa.ncols, sa.esz == 2 ? "unsigned short" : "float",
                              k, k, sa.jmul, v, v, v, v);
                sb_printf(b, "    }\n");
            }
        }
        if (put) sb_printf(b, "    __syncwarp(); /* the slab holds the batch's inputs */\n");
        sb_printf(b, "#endif\n}\n\n");
    }
}

static coda_status_t gen_pair(sb_t *b, const coda_program_t *p, int even_n, const stage_plan_t *sp) {
    char e0[48], e1[48], e2[48], col[48];
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_pair(const coda_epi_params &P_,\n"
              "        const coda_epi_tile &t, coda_epi_state &S_, int rs, int cs, int row, int col,\n"
              "        float &a0, float &a1, const coda_epi_in &L) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    coda_epi_state *S = &S_;\n"
              "    (void)t; (void)S; (void)rs; (void)cs; (void)L;\n");
    gen_pair_start(b, even_n);
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        int w = value_width(in);
        switch (in->op) {
        case CODA_OP_ACC:
            sb_printf(b, "    float v%d_0 = a0, v%d_1 = a1;\n", i, i);
            break;
        case CODA_OP_CONST:
            sb_printf(b, "    const float v%d_0 = %.9ef;\n", i, (double)in->imm);
            break;
        case CODA_OP_ROWIDX:
            sb_printf(b, "    const float v%d_0 = (float)row;\n", i);
            break;
        case CODA_OP_COLIDX:
            for (int e = 0; e < w; e++) {
                elem_col(in->vspace, e, col, sizeof col);
                sb_printf(b, "    const float v%d_%d = (float)%s;\n", i, e, col);
            }
            break;
        case CODA_OP_LOAD: {
            const coda_arg_t *a = &p->args[in->arg];
            if (a->kind == CODA_IN_SCALAR) {
                sb_printf(b, "    const float v%d_0 = P->scalar[%d];\n", i, in->arg);
            } else if (a->kind == CODA_IN_ROW) { /* loaded by coda_epi_preload */
                sb_printf(b, "    const float v%d_0 = S->pre.v%d[rs];\n", i, i);
            } else { /* tile or column vector: fetched by coda_epi_fetch */
                gen_vec_decode(b, i, w, a->dtype);
            }
            break;
        }
        case CODA_OP_EVEN:
        case CODA_OP_ODD:
            for (int e = 0; e < w; e++)
                sb_printf(b, "    const float v%d_%d = %s;\n", i, e,
                          el(p, in->src[0], 2 * e + (in->op == CODA_OP_ODD), e0, sizeof e0));
            break;
        case CODA_OP_INTERLEAVE:
            for (int e = 0; e < w; e++)
                sb_printf(b, "    const float v%d_%d = %s;\n", i, e,
                          el(p, in->src[e & 1], e >> 1, e0, sizeof e0));
            break;
        case CODA_OP_SWAP:
            if (in->vspace == CODA_SPACE_HALF) {
                free(b->buf);
                b->buf = NULL;
                return coda__fail(CODA_ERR_UNSUPPORTED,
                                  "line %d: swap in the half space pairs columns held by different GPU threads",
                                  in->line);
            }
            for (int e = 0; e < w; e++)
                sb_printf(b, "    const float v%d_%d = %s;\n", i, e, el(p, in->src[0], e ^ 1, e0, sizeof e0));
            break;
        case CODA_OP_STORE: {
            const coda_arg_t *a = &p->args[in->arg];
            int wa = space_width(a->space);
            char x[4][48], q[160], pk[2][112];
            for (int e = 0; e < wa; e++) el(p, in->src[0], e, x[e], sizeof x[e]);
            /* bf16 words: a value round_bf16 made is bf16 already, so its
             * words are its high halves (cg_pack_exact) */
            const int exact = p->insts[in->src[0]].op == CODA_OP_ROUND_BF16;
            for (int h = 0; h < wa / 2; h++)
                snprintf(pk[h], sizeof pk[h], "%s(%.47s, %.47s)", exact ? "cg_pack_exact" : "cg_pack", x[2 * h],
                         x[2 * h + 1]);
            snprintf(q, sizeof q, "(%s *)P->ptr[%d] + r * P->s0[%d] + %s",
                     a->dtype == CODA_BF16 ? "unsigned short" : "float", in->arg, in->arg, first_col(a->space));
            if (sp->off[in->arg] >= 0) {
                sb_printf(b, "#if CODA_EPI_STAGE\n");
                gen_stage_store(b, a, sp->off[in->arg], sp->pitch[in->arg], x, pk);
                sb_printf(b, "#else\n");
                gen_vec_store(b, wa, a->dtype, q, x, pk);
                sb_printf(b, "#endif\n");
            } else {
                gen_vec_store(b, wa, a->dtype, q, x, pk);
            }
            break;
        }
        case CODA_OP_REDUCE: {
            const coda_arg_t *a = &p->args[in->arg];
            const coda_inst_t *v = &p->insts[in->src[0]];
            int wv = value_width(v);
            for (int e = 0; e < wv; e++) {
                el(p, in->src[0], e, e0, sizeof e0);
                char x[64], y[128];
                if (a->reduce == CODA_REDUCE_SUMSQ) snprintf(y, sizeof y, "%s * %s", e0, e0);
                else snprintf(y, sizeof y, "%s", e0);
                if (a->kind == CODA_OUT_ROWRED) snprintf(x, sizeof x, "S->r%d[rs]", in->arg);
                else snprintf(x, sizeof x, "S->c%d[cs * %d + %d]", in->arg, wv, e);
                /* a select, not an if: branches around these updates cut
                 * the pair code into blocks (rmsnorm_bwd had 128 a tile) */
                char f[256];
                red_expr(f, sizeof f, a->reduce, x, "y_");
                sb_printf(b, "    { const float y_ = %s; %s = (valid && %s) ? %s : %s; }\n", y, x, elem_ok(v->vspace, e), f,
                          x);
            }
            break;
        }
        case CODA_OP_LSE: {
            const coda_inst_t *v = &p->insts[in->src[0]];
            int wv = value_width(v);
            el(p, in->src[1], 0, e1, sizeof e1);
            for (int e = 0; e < wv; e++) {
                el(p, in->src[0], e, e0, sizeof e0);
                elem_col(v->vspace, e, col, sizeof col);
                /* no branch: an element outside folds in as -inf */
                sb_printf(b, "    {\n        const int in_ = valid && %s;\n"
                             "        S->lb%d[(rs * CODA_EPI_BATCH + (cs %% (CODA_BN / 8)) %% CODA_EPI_BATCH) * %d + %d] = "
                             "in_ ? %s : CG_NEG_INF;\n"
                             "        S->lp%d[rs] += in_ && (float)%s == %s ? %s : 0.0f;\n    }\n",
                          elem_ok(v->vspace, e), in->arg, wv, e, e0, in->arg, col, e1, e0);
            }
            break;
        }
        default: {
            if (in->op == CODA_OP_ROUND_BF16 && w >= 2) {
                /* two elements a conversion (cg_round_bf16x2) */
                for (int h = 0; h < w / 2; h++) {
                    el(p, in->src[0], 2 * h, e0, sizeof e0);
                    el(p, in->src[0], 2 * h + 1, e1, sizeof e1);
                    sb_printf(b, "    float v%d_%d, v%d_%d;\n    cg_round_bf16x2(%s, %s, v%d_%d, v%d_%d);\n", i, 2 * h, i,
                              2 * h + 1, e0, e1, i, 2 * h, i, 2 * h + 1);
                }
                break;
            }
            const char *fmt = map_fn(in->op);
            if (!fmt) {
                free(b->buf);
                b->buf = NULL;
                return coda__fail(CODA_ERR_INTERNAL, "codegen: no CUDA form for op %s", coda_op_name(in->op));
            }
            for (int e = 0; e < w; e++) {
                char expr[512];
                el(p, in->src[0], e, e0, sizeof e0);
                if (in->src[1] >= 0) el(p, in->src[1], e, e1, sizeof e1);
                if (in->src[2] >= 0) el(p, in->src[2], e, e2, sizeof e2);
                snprintf(expr, sizeof expr, fmt, e0, e1, e2);
                sb_printf(b, "    const float v%d_%d = %s;\n", i, e, expr);
            }
            break;
        }
        }
    }
    sb_printf(b, "}\n\n");
    return CODA_OK;
}

static void gen_end(sb_t *b, const coda_program_t *p) {
    sb_printf(b,
              "static __device__ __forceinline__ void coda_epi_end(const coda_epi_params &P_,\n"
              "        const coda_epi_tile &t, coda_epi_state &S_) {\n"
              "    const coda_epi_params *P = &P_;\n"
              "    coda_epi_state *S = &S_;\n"
              "    int rows[CODA_EPI_ROW_SLOTS]; /* slot rs = 2 mh + h: row + 8 h + 64 mh */\n"
              "#pragma unroll\n"
              "    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) rows[i] = CG_SLOT_ROW(t.row, i);\n"
              "    const int m_tile = t.tile_m, n_tile = t.tile_n;\n"
              "    const int lane = t.tid & 31;\n"
              "    (void)P; (void)S; (void)rows; (void)m_tile; (void)n_tile; (void)lane;\n");
    for (int k = 0; k < p->n_args; k++) {
        const coda_arg_t *a = &p->args[k];
        if (a->kind == CODA_OUT_ROWRED) {
            sb_printf(b, "    /* %s: the 4 lanes of a quad hold all columns of their rows */\n", a->name);
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) {\n        float x = S->r%d[i];\n", k);
            shfl_fold(b, a->reduce, 1, 2, 8);
            sb_printf(b, "        cg_st32(CG_PART_OK((lane & 3) == 0 && rows[i] < P->m),\n"
                         "                (float *)P->ptr[%d] + (long long)rows[i] * P->s0[%d] + n_tile, __float_as_uint(x));\n    }\n",
                      k, k);
        } else if (a->kind == CODA_OUT_LSE) {
            sb_printf(b, "#pragma unroll\n    for (int i = 0; i < CODA_EPI_ROW_SLOTS; i++) {\n"
                         "        float m = S->lm%d[i], l = S->ll%d[i], pk = S->lp%d[i];\n",
                      k, k, k);
            for (int sh = 1; sh <= 2; sh *= 2)
                sb_printf(b, "        { float m2 = __shfl_xor_sync(0xffffffffu, m, %d), l2 = __shfl_xor_sync(0xffffffffu, l, %d);\n"
                             "          pk += __shfl_xor_sync(0xffffffffu, pk, %d); cg_lse_merge(&m, &l, m2, l2); }\n",
                          sh, sh, sh);
            sb_printf(b, "        if (m == CG_NEG_INF) l = 0.0f; /* no finite element: the CPU's sum is skipped */\n"
                         "        if ((lane & 3) == 0 && rows[i] < P->m) {\n"
                         "            float *o = (float *)P->ptr[%d] + (long long)rows[i] * P->s0[%d] + (long long)n_tile * P->s1[%d];\n"
                         "            o[0] = m; o[1] = l; o[2] = pk;\n        }\n    }\n",
                      k, k, k);
        } else if (a->kind == CODA_OUT_COLRED) {
            /* Column partials of the tile's 128 rows (on the GPU tile_m is
             * 128, coda_choose_tiling), in two steps.
             * 1. In each warp: a warp holds 16 rows of a 64-row block
             *    (lanes with equal lane%4 share columns). The 8 lanes of a
             *    column group reduce-scatter their V values in three
             *    shuffle steps (lane bit 2, 3, 4): each step a lane keeps
             *    half of its values, sends the other half to its partner
             *    and adds what the partner sent, so a lane ends with V/8
             *    column sums of the warp's rows (each sum mine + partner's,
             *    in the same order as a butterfly: session 6). The lane
             *    puts them into its warp's slab, one row of sums per 16-row
             *    group (mh).
             * 2. After a barrier over the tile's consumer threads
             *    (CODA_EPI_TILE_SYNC), each thread combines one column's 8
             *    group sums, in group order (the same bits every run), and
             *    stores the tile's partial; a second barrier keeps the
             *    slabs until every thread has read them.
             * One store per column and tile: the 16-row partials of
             * sessions 1-6 took 8, scattered (session 7, bench_epilogue
             * A/B without partial stores: 11% of rmsnorm_bwd's time at
             * 2048, 5% at 4096). */
            int w = space_width(a->space);
            const char *n_w = a->space == CODA_SPACE_HALF ? "(P->n / 2)" : a->space == CODA_SPACE_FULL ? "P->n" : "(P->n * 2)";
            const char *cw = a->space == CODA_SPACE_HALF ? "(CODA_BN / 2)" : a->space == CODA_SPACE_FULL ? "CODA_BN" : "(2 * CODA_BN)";
            const char *lc = a->space == CODA_SPACE_HALF ? "(c0_ >> 1)" : a->space == CODA_SPACE_FULL ? "c0_ + e" : "2 * c0_ + e";
            const char *first = a->space == CODA_SPACE_HALF ? "(long long)n_tile * (CODA_BN / 2)"
                                : a->space == CODA_SPACE_FULL ? "(long long)n_tile * CODA_BN"
                                                              : "2LL * n_tile * CODA_BN";
            char e[256], e2[256];
            /* the shuffle first, by every lane: inside the max's NaN test
             * (a short-circuit) a lane holding NaN would skip a full-mask
             * shuffle (review, session 6) */
            red_expr(e, sizeof e, a->reduce, "kp_", "y_");
            red_expr(e2, sizeof e2, a->reduce, "s_", "y_");
            sb_printf(b, "#if CODA_EPI_STORE_C\n#error \"column partials go through the slabs, which the C-store path gives to TMA\"\n#endif\n");
            sb_printf(b, "    /* %s: column partials of the tile's 128 rows */\n", a->name);
            sb_printf(b, "    {\n"
                         "        enum { V_ = CODA_EPI_COL_SLOTS * %d, CW_ = %s };\n"
                         "        float x_[V_];\n"
                         "#pragma unroll\n"
                         "        for (int i = 0; i < V_; i++) x_[i] = S->c%d[i];\n"
                         "#define CG_RS_STEP(s_) { \\\n"
                         "            const int hb_ = (lane >> (2 + (s_))) & 1; \\\n"
                         "            _Pragma(\"unroll\") for (int i = 0; i < (V_ >> ((s_) + 1)); i++) { \\\n"
                         "                const int h_ = V_ >> ((s_) + 1); \\\n"
                         "                const float kp_ = hb_ ? x_[i + h_] : x_[i], sd_ = hb_ ? x_[i] : x_[i + h_]; \\\n"
                         "                const float y_ = __shfl_xor_sync(0xffffffffu, sd_, 4 << (s_)); \\\n"
                         "                x_[i] = %s; \\\n"
                         "            } }\n"
                         "        CG_RS_STEP(0) CG_RS_STEP(1) CG_RS_STEP(2)\n"
                         "#undef CG_RS_STEP\n"
                         "        /* this lane's sums: values base_ .. base_ + V_/8 - 1, into the slab */\n"
                         "        const int base_ = ((lane >> 2) & 1) * (V_ / 2) + ((lane >> 3) & 1) * (V_ / 4) +\n"
                         "                          ((lane >> 4) & 1) * (V_ / 8);\n"
                         "#pragma unroll\n"
                         "        for (int u = 0; u < V_ / 8; u++) {\n"
                         "            const int j = base_ / %d + u / %d, e = u %% %d; /* slot j = mh (CODA_BN / 8) + jj */\n"
                         "            const int c0_ = 2 * (lane & 3) + 8 * (j %% (CODA_BN / 8)); /* the tile's even acc column */\n"
                         "            (void)e;\n"
                         "            cg_sts32(t.stage + (unsigned)((j / (CODA_BN / 8)) * CW_ + %s) * 4u, __float_as_uint(x_[u]));\n"
                         "        }\n"
                         "        CODA_EPI_TILE_SYNC(t);\n"
                         "        /* group g: rows 16 g .. of the tile; its sums are in the slab of\n"
                         "         * warp g (cooperative) or of warp g %% 4, row g / 4 (ping-pong) */\n"
                         "        const unsigned slabs_ = t.stage - (unsigned)(t.wg * 4 + (t.tid >> 5)) * 4096u;\n"
                         "        const int q_ = t.tid + (CODA_WG_MH == 1 ? 128 * t.wg : 0), np_ = CODA_WG_MH == 1 ? 256 : 128;\n"
                         "#pragma unroll\n"
                         "        for (int lc = q_; lc < CW_; lc += np_) {\n"
                         "            float s_ = 0.0f;\n"
                         "#pragma unroll\n"
                         "            for (int g = 0; g < 8; g++) {\n"
                         "                const unsigned at_ = slabs_ + (unsigned)(CODA_WG_MH == 1 ? g : t.wg * 4 + (g & 3)) * 4096u +\n"
                         "                                     (unsigned)((CODA_WG_MH == 1 ? 0 : (g >> 2) * CW_) + lc) * 4u;\n"
                         "                const float y_ = __uint_as_float(cg_lds32(at_));\n"
                         "                s_ = g == 0 ? y_ : %s;\n"
                         "            }\n"
                         "            const long long gc = %s + lc;\n"
                         "            /* m_tile inside: with 2-CTA clusters and an odd number of row\n"
                         "             * tiles, the last pair's second CTA runs a tile wholly below M */\n"
                         "            cg_st32(CG_PART_OK(gc < %s && m_tile * 128 < P->m), (float *)P->ptr[%d] + gc * P->s0[%d] + m_tile,\n"
                         "                    __float_as_uint(s_));\n"
                         "        }\n"
                         "        CODA_EPI_TILE_SYNC(t); /* the slabs are read */\n"
                         "    }\n",
                      w, cw, k, e, w, w, w, lc, e2, first, n_w, k, k);
        }
    }
    sb_printf(b, "}\n");
}

coda_status_t coda__codegen_cuda(const coda_program_t *p, char **out) {
    return coda__codegen_cuda_ex(p, CODA_CG_ANY, out);
}

_Static_assert(sizeof(((coda_program_t *)0)->cuda_src) / sizeof(((coda_program_t *)0)->cuda_src[0]) == CODA_CG_NFORMS,
               "one cached text per form");

coda_cg_form_t coda__codegen_form(int64_t n) {
    return n % 16 == 0 ? CODA_CG_N16 : n % 2 == 0 ? CODA_CG_EVEN : CODA_CG_ANY;
}

coda_status_t coda__codegen_cuda_ex(const coda_program_t *p, coda_cg_form_t form, char **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: out is NULL");
    *out = NULL;
    if (!p || !p->verified) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: program is NULL or not verified");
    if ((unsigned)form >= CODA_CG_NFORMS) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: form %d", (int)form);
    const int even_n = form != CODA_CG_ANY;
    if (p->n_args > CODA_EPI_MAX_ARGS)
        return coda__fail(CODA_ERR_UNSUPPORTED, "codegen: %d arguments; the GPU epilogue takes at most %d",
                          p->n_args, CODA_EPI_MAX_ARGS);
    sb_t b = {0};
    const char *pre = prelude();
    if (!pre) return coda__fail(CODA_ERR_INTERNAL, "codegen: epi_prelude.cuh is not embedded");
    sb_printf(&b, "%s\n/* ---- generated from epilogue program '%s'%s ---- */\n", pre, p->name,
              form == CODA_CG_RING ? " (N a multiple of 16, tile inputs through the stage ring)"
              : form == CODA_CG_N16 ? " (N a multiple of 16)" : even_n ? " (N even)" : "");
    coda_ring_plan_t rp;
    coda__codegen_ring_plan(form == CODA_CG_RING ? p : NULL, &rp);
    if (form == CODA_CG_RING)
        /* the cooperative mainloop (staging slabs, no ping-pong) fills the
         * ring; elsewhere the ring inputs are read from global memory */
        sb_printf(&b, "#define CODA_EPI_RING_BOXES %d\n"
                      "#if CODA_EPI_STAGE && !CODA_PINGPONG\n#define CODA_EPI_RING 1\n#else\n#define CODA_EPI_RING 0\n#endif\n",
                  rp.nbox);
    stage_plan_t sp;
    plan_staging(p, form == CODA_CG_N16 || form == CODA_CG_RING, &rp, &sp);
    gen_state(&b, p, &sp);
    gen_fetch(&b, p, even_n, &rp, &sp);
    gen_stage_in(&b, p, &sp);
    CODA_TRY(gen_pair(&b, p, even_n, &sp));
    gen_flush(&b, p, &sp);
    gen_end(&b, p);
    if (b.oom) {
        free(b.buf);
        return coda__fail(CODA_ERR_NO_MEMORY, "codegen: out of memory");
    }
    *out = b.buf;
    return CODA_OK;
}

coda_status_t coda__codegen_cuda_cached(const coda_program_t *p, coda_cg_form_t form, const char **out,
                                        const uint64_t **key) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: out is NULL");
    if (!p) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: program is NULL");
    if ((unsigned)form >= CODA_CG_NFORMS) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: form %d", (int)form);
    _Atomic(struct coda_cg_text *) *slot = &((coda_program_t *)p)->cuda_src[form];
    struct coda_cg_text *cur = atomic_load(slot);
    if (!cur) {
        char *text = NULL;
        CODA_TRY(coda__codegen_cuda_ex(p, form, &text));
        size_t len = strlen(text);
        struct coda_cg_text *made = malloc(sizeof *made + len + 1);
        if (!made) {
            free(text);
            return coda__fail(CODA_ERR_NO_MEMORY, "codegen: out of memory");
        }
        memcpy(made->text, text, len + 1);
        free(text);
        made->key[0] = coda__hash(CODA_HASH_SEED0, made->text, len);
        made->key[1] = coda__hash(CODA_HASH_SEED1, made->text, len);
        /* another thread may have been first: keep its text, drop ours */
        if (atomic_compare_exchange_strong(slot, &cur, made)) cur = made;
        else free(made);
    }
    *out = cur->text;
    if (key) *key = cur->key;
    return CODA_OK;
}
