/* cg_values.c - the CUDA generator's text helpers (a growable string) and
 * value geometry: which registers hold a value's elements for one
 * accumulator pair, which columns they are, and the C text that names them.
 * Every value of the program becomes 1, 2 or 4 float registers per
 * accumulator pair (its space: half, full, double); values that do not vary
 * along columns (scalars, row values) are one register, broadcast. */
#include "codegen/cg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sb_printf(sb_t *b, const char *fmt, ...) {
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


static int varies(const coda_inst_t *in) { return (in->shape & CODA_SHAPE_COL) != 0; }

/* Elements of a space per accumulator pair. */
int space_width(coda_space_t s) { return s == CODA_SPACE_HALF ? 1 : s == CODA_SPACE_FULL ? 2 : 4; }

int value_width(const coda_inst_t *in) { return varies(in) ? space_width(in->vspace) : 1; }

/* Name of element e of value v (broadcast if v does not vary along columns). */
const char *el(const coda_program_t *p, int v, int e, char *buf, size_t cap) {
    snprintf(buf, cap, "v%d_%d", v, varies(&p->insts[v]) ? e : 0);
    return buf;
}

/* Is element e of a value in space s inside the matrix? Pairs are only run for
 * col < N; the second accumulator column may fall off the edge when N is odd. */
const char *elem_ok(coda_space_t s, int e) {
    if (s == CODA_SPACE_HALF) return "1";
    if (s == CODA_SPACE_FULL) return e == 0 ? "1" : "ok1";
    return e < 2 ? "1" : "ok1";
}

/* Column index of element e of space s, as C text. */
void elem_col(coda_space_t s, int e, char *buf, size_t cap) {
    if (s == CODA_SPACE_HALF) snprintf(buf, cap, "(col >> 1)");
    else if (s == CODA_SPACE_FULL) snprintf(buf, cap, "(col + %d)", e);
    else snprintf(buf, cap, "(2 * col + %d)", e);
}

/* C text that reads element at index expression `idx` of a row vector,
 * argument k, as float, through the non-coherent volatile loads that
 * coda_epi_preload issues before the tile's k-loop. */
void load_text(const coda_arg_t *a, int k, const char *idx, char *buf, size_t cap) {
    switch (a->dtype) {
    case CODA_BF16:
        snprintf(buf, cap, "cg_bf16_to_f32((unsigned short)cg_ld16v((const unsigned short *)P->ptr[%d] + %s))", k,
                 idx);
        break;
    case CODA_I32: snprintf(buf, cap, "(float)(int)cg_ld32v((const int *)P->ptr[%d] + %s)", k, idx); break;
    default: snprintf(buf, cap, "__uint_as_float(cg_ld32v((const float *)P->ptr[%d] + %s))", k, idx); break;
    }
}


const char *red_init(coda_reduce_t r) { return r == CODA_REDUCE_MAX ? "CG_NEG_INF" : "0.0f"; }

/* "x OP y" for a reduction, into buf. */
void red_expr(char *buf, size_t cap, coda_reduce_t r, const char *x, const char *y) {
    if (r == CODA_REDUCE_MAX) /* a NaN element makes the max NaN, as on the CPU: max.NaN, one
                               * instruction (an explicit NaN test and fmaxf took four) */
        snprintf(buf, cap, "cg_max_nan(%s, %s)", x, y);
    else snprintf(buf, cap, "(%s + %s)", x, y);
}


/* Elements a pair gives the lse output k (the width of its value). */
int lse_width(const coda_program_t *p, int k) {
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].op == CODA_OP_LSE && p->insts[i].arg == k) {
            const coda_inst_t *v = &p->insts[p->insts[i].src[0]];
            return (v->shape & CODA_SHAPE_COL) ? space_width(v->vspace) : 1;
        }
    return 1;
}


/* First column of the elements a pair covers, in space s, as C text. */
const char *first_col(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(col >> 1)" : s == CODA_SPACE_FULL ? "col" : "(2 * col)";
}
/* The same as the thread's first column and the chunk's offset from it
 * (col - t.col: a constant once the kernel's loops are unrolled), so that
 * `pointer + first + offset` is a per-thread register and an immediate. */
const char *first_col_split(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(t.col >> 1) + ((col - t.col) >> 1)"
         : s == CODA_SPACE_FULL ? "t.col + (col - t.col)" : "2 * t.col + 2 * (col - t.col)";
}
/* The same for loads, from the clamped column cl (always inside the matrix). */
const char *first_col_load(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(cl >> 1)" : s == CODA_SPACE_FULL ? "cl" : "(2 * cl)";
}

/* Elements of a row of C in space s (C text: P->n columns), and of a
 * tile's row (CODA_BN columns): column vectors and column partials. */
const char *space_count(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(P->n / 2)" : s == CODA_SPACE_FULL ? "P->n" : "(P->n * 2)";
}
const char *space_per_tile(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "(CODA_BN / 2)" : s == CODA_SPACE_FULL ? "CODA_BN" : "(2 * CODA_BN)";
}

/* 32-bit words a pair's w elements of type dt take (the fetch struct). */
int vec_words(int w, coda_dtype_t dt) {
    int bytes = w * (dt == CODA_BF16 ? 2 : 4);
    return bytes < 4 ? 1 : bytes / 4;
}


/* The lines every pair function starts with: is the pair inside (valid),
 * the row and column its loads use (r, cl), is it whole (ok1).
 * even_n: N is even, so every pair is whole. Then the pair code has no
 * branches: loads read from a clamped row and column (always inside the
 * matrix) with no condition; only stores and reductions are predicated on
 * the pair being inside. The general form (odd N) returns early for pairs
 * outside and tests ok1. */
void gen_pair_start(sb_t *b, int even_n) {
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
