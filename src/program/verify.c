/* verify.c - the verifier: checks a program and annotates each value with its
 * shape class and column space (coda_inst_t.shape, .vspace).
 *
 * It trusts nothing in the IR (the C builder lets callers pass any ids), so
 * every index is range-checked before use. Messages start "line N: " for
 * parsed programs, "instruction I: " / "argument I: " for built ones. */
#include "program/program.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

static const char *space_name(coda_space_t s) {
    return s == CODA_SPACE_HALF ? "half" : s == CODA_SPACE_DOUBLE ? "double" : "full";
}
static const char *shape_name(coda_shape_t s) {
    switch (s) {
    case CODA_SHAPE_SCALAR: return "a scalar";
    case CODA_SHAPE_ROW: return "a row value";
    case CODA_SHAPE_COL: return "a col value";
    case CODA_SHAPE_TILE: return "a tile value";
    }
    return "?";
}
static int space_ok(coda_space_t s) { return s >= CODA_SPACE_HALF && s <= CODA_SPACE_DOUBLE; }
static int has_cols(coda_shape_t s) { return (s & CODA_SHAPE_COL) != 0; }

/* Words of an argument kind, as the text form declares them. */
static const char *kind_words(const coda_arg_t *a) {
    static const char *const red[2][3] = {
        {"an out rowsum", "an out rowmax", "an out rowsumsq"},
        {"an out colsum", "an out colmax", "an out colsumsq"}};
    switch (a->kind) {
    case CODA_IN_TILE: return "an in tile";
    case CODA_IN_ROW: return "an in row";
    case CODA_IN_COL: return "an in col";
    case CODA_IN_SCALAR: return "an in scalar";
    case CODA_OUT_TILE: return "an out tile";
    case CODA_OUT_ROWRED:
    case CODA_OUT_COLRED:
        if (a->reduce >= CODA_REDUCE_SUM && a->reduce <= CODA_REDUCE_SUMSQ)
            return a->kind == CODA_OUT_ROWRED ? red[0][a->reduce] : red[1][a->reduce];
        return "a reduction";
    case CODA_OUT_LSE: return "an out lse";
    case CODA_IN_ROWPART: return "an in rowpart";
    }
    return "?";
}

/* A verify error at instruction or argument `i` ("line N: " or "instruction I: "). */
static coda_status_t vfail(int line, const char *kind, int i, const char *fmt, va_list ap) {
    char where[48], msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return coda__fail(CODA_ERR_VERIFY, "%s%s", coda__where(where, line, kind, i), msg);
}

static coda_status_t fail_inst(const coda_program_t *p, int i, const char *fmt, ...)
    CODA_PRINTF(3, 4);
static coda_status_t fail_inst(const coda_program_t *p, int i, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    coda_status_t s = vfail(p->insts[i].line, "instruction", i, fmt, ap);
    va_end(ap);
    return s;
}

static coda_status_t fail_arg(const coda_program_t *p, int i, const char *fmt, ...)
    CODA_PRINTF(3, 4);
static coda_status_t fail_arg(const coda_program_t *p, int i, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    coda_status_t s = vfail(p->args[i].line, "argument", i, fmt, ap);
    va_end(ap);
    return s;
}

static coda_status_t verify_arg(const coda_program_t *p, int i) {
    const coda_arg_t *a = &p->args[i];
    const char *dir = coda__arg_is_input(a->kind) ? "in" : "out";
    if (!coda__arg_kind_ok(a->kind))
        return fail_arg(p, i, "%s: unknown argument kind %d", a->name, (int)a->kind);
    int has_dtype = a->kind == CODA_IN_TILE || a->kind == CODA_IN_ROW || a->kind == CODA_IN_COL ||
                    a->kind == CODA_OUT_TILE;
    int has_space = a->kind == CODA_IN_TILE || a->kind == CODA_IN_COL ||
                    a->kind == CODA_OUT_TILE || a->kind == CODA_OUT_COLRED;
    if (has_dtype) {
        const char *dn = coda_dtype_name(a->dtype);
        const char *what = a->kind == CODA_IN_ROW ? "row" : a->kind == CODA_IN_COL ? "col" : "tile";
        if (!dn) return fail_arg(p, i, "%s %s: unknown dtype %d", dir, a->name, (int)a->dtype);
        if (a->dtype == CODA_F16 || a->dtype == CODA_FP8_E4M3) { /* coda.h: CODA_ERR_DTYPE, not VERIFY */
            char where[48];
            return coda__fail(CODA_ERR_DTYPE, "%s%s %s: dtype %s is reserved, not supported yet",
                              coda__where(where, a->line, "argument", i), dir, a->name, dn);
        }
        /* what the backends load and store: i64 (a tensor dtype, the LM
         * loss's targets) is no program dtype, and the text form has no
         * word for it (a builder's i64 argument loaded zeros on the CPU) */
        if (a->dtype != CODA_BF16 && a->dtype != CODA_F32 && a->dtype != CODA_I32)
            return fail_arg(p, i, "%s %s: dtype %s: a program's arguments are bf16, f32 or (in row) i32", dir,
                            a->name, dn);
        if (a->dtype == CODA_I32 && a->kind != CODA_IN_ROW)
            return fail_arg(p, i, "%s %s: dtype i32 is only allowed for in row (an %s %s takes "
                            "bf16 or f32)", dir, a->name, dir, what);
    } else if (a->dtype != CODA_F32) {
        return fail_arg(p, i, "%s %s: this kind takes no dtype (it is f32)", dir, a->name);
    }
    if (has_space && !space_ok(a->space))
        return fail_arg(p, i, "%s %s: unknown column space %d", dir, a->name, (int)a->space);
    if (!has_space && a->space != CODA_SPACE_FULL)
        return fail_arg(p, i, "%s %s: this kind takes no column space", dir, a->name);
    if ((a->kind == CODA_OUT_ROWRED || a->kind == CODA_OUT_COLRED) &&
        (a->reduce < CODA_REDUCE_SUM || a->reduce > CODA_REDUCE_SUMSQ))
        return fail_arg(p, i, "out %s: unknown reduction %d", a->name, (int)a->reduce);
    return CODA_OK;
}

/* Operand k of instruction i must be an earlier value-defining instruction. */
static coda_status_t check_operand(const coda_program_t *p, int i, int k, const char *opname) {
    int s = p->insts[i].src[k];
    if (s < 0 || s >= i)
        return fail_inst(p, i, "%s: operand %d (value id %d) is not a value defined before it",
                         opname, k + 1, s);
    if (coda__op_arity(p->insts[s].op) < 0)
        return fail_inst(p, i, "%s: operand %d (id %d) is a statement, not a value", opname,
                         k + 1, s);
    return CODA_OK;
}

/* The argument of a load/store/reduce/lse, range-checked. */
static coda_status_t check_arg_index(const coda_program_t *p, int i, const char *opname) {
    int a = p->insts[i].arg;
    if (a < 0 || a >= p->n_args)
        return fail_inst(p, i, "%s: argument index %d out of range (%d arguments)", opname, a,
                         p->n_args);
    return CODA_OK;
}

/* Shape and space of a map's result: operands broadcast, column spaces agree. */
static coda_status_t join_operands(coda_program_t *p, int i, int n, const char *opname) {
    coda_inst_t *in = &p->insts[i];
    int shape = 0, have_space = 0;
    coda_space_t space = CODA_SPACE_FULL;
    for (int k = 0; k < n; k++) {
        const coda_inst_t *s = &p->insts[in->src[k]];
        shape |= (int)s->shape;
        if (!has_cols(s->shape)) continue;
        if (have_space && s->vspace != space)
            return fail_inst(p, i, "%s: operands are in column spaces %s and %s", opname,
                             space_name(space), space_name(s->vspace));
        space = s->vspace;
        have_space = 1;
    }
    in->shape = (coda_shape_t)shape;
    in->vspace = space;
    return CODA_OK;
}

/* Pairwise ops need a value along columns; `dir` moves the space (-1, 0, +1). */
static coda_status_t pair_space(coda_program_t *p, int i, const char *opname, int dir) {
    coda_inst_t *in = &p->insts[i];
    for (int k = 0; k < coda__ops[in->op].n_src; k++) {
        const coda_inst_t *s = &p->insts[in->src[k]];
        if (!has_cols(s->shape))
            return fail_inst(p, i, "%s: operand %s is %s; pairwise ops need a value that "
                             "varies along columns", opname, s->name, shape_name(s->shape));
    }
    int to = (int)in->vspace + dir;
    if (to < CODA_SPACE_HALF || to > CODA_SPACE_DOUBLE)
        return fail_inst(p, i, "%s: operand is in the %s space; the result would be outside "
                         "{half, full, double}", opname, space_name(in->vspace));
    in->vspace = (coda_space_t)to;
    return CODA_OK;
}

/* Statement i writes output a: once only. written[a] holds the writer + 1. */
static coda_status_t mark_written(coda_program_t *p, int i, int a, int *written,
                                  const char *opname) {
    if (written[a]) {
        const coda_inst_t *w = &p->insts[written[a] - 1];
        if (w->line > 0)
            return fail_inst(p, i, "%s %s: %s is already written (line %d)", opname,
                             p->args[a].name, p->args[a].name, w->line);
        return fail_inst(p, i, "%s %s: %s is already written (instruction %d)", opname,
                         p->args[a].name, p->args[a].name, written[a] - 1);
    }
    written[a] = i + 1;
    return CODA_OK;
}

/* acc, load, const, rowidx, colidx: a shape rule each. */
static coda_status_t verify_source(coda_program_t *p, int i, const char *opname) {
    coda_inst_t *in = &p->insts[i];
    switch (in->op) {
    case CODA_OP_ACC:
        in->shape = CODA_SHAPE_TILE;
        return CODA_OK;
    case CODA_OP_LOAD: {
        CODA_TRY(check_arg_index(p, i, opname));
        const coda_arg_t *a = &p->args[in->arg];
        switch (a->kind) {
        case CODA_IN_TILE: in->shape = CODA_SHAPE_TILE; in->vspace = a->space; break;
        case CODA_IN_ROW: in->shape = CODA_SHAPE_ROW; break;
        case CODA_IN_COL: in->shape = CODA_SHAPE_COL; in->vspace = a->space; break;
        case CODA_IN_SCALAR: in->shape = CODA_SHAPE_SCALAR; break;
        case CODA_IN_ROWPART: in->shape = CODA_SHAPE_ROW; break;
        default:
            return fail_inst(p, i, "load %s: %s is %s; loads read inputs only", a->name, a->name,
                             kind_words(a));
        }
        return CODA_OK;
    }
    case CODA_OP_CONST:
        if (!isfinite(in->imm)) return fail_inst(p, i, "const: value is not finite");
        return CODA_OK;
    case CODA_OP_ROWIDX:
        in->shape = CODA_SHAPE_ROW;
        return CODA_OK;
    case CODA_OP_COLIDX:
        if (!space_ok(in->space))
            return fail_inst(p, i, "colidx: unknown column space %d", (int)in->space);
        in->shape = CODA_SHAPE_COL;
        in->vspace = in->space;
        return CODA_OK;
    default: /* a source row in ops.def without its rule here */
        return coda__fail(CODA_ERR_INTERNAL, "verifier: no shape rule for source %s", opname);
    }
}

/* store, reduce, lse: into an output of the statement's kind, a value of
 * the shape and space that output takes. */
static coda_status_t verify_write(coda_program_t *p, int i, int *written, const char *opname) {
    coda_inst_t *in = &p->insts[i];
    CODA_TRY(check_arg_index(p, i, opname));
    const coda_arg_t *a = &p->args[in->arg];
    const coda_inst_t *v = &p->insts[in->src[0]];
    if (coda__arg_is_input(a->kind))
        return fail_inst(p, i, "%s into %s: %s is %s; %s writes outputs only", opname,
                         a->name, a->name, kind_words(a), opname);
    if (in->op == CODA_OP_STORE && a->kind != CODA_OUT_TILE)
        return fail_inst(p, i, "store into %s: %s is %s, not an out tile (use %s)", a->name,
                         a->name, kind_words(a), a->kind == CODA_OUT_LSE ? "lse" : "reduce");
    if (in->op == CODA_OP_REDUCE && a->kind != CODA_OUT_ROWRED && a->kind != CODA_OUT_COLRED)
        return fail_inst(p, i, "reduce into %s: %s is %s, not a reduction (use %s)", a->name,
                         a->name, kind_words(a), a->kind == CODA_OUT_LSE ? "lse" : "store");
    if (in->op == CODA_OP_LSE && a->kind != CODA_OUT_LSE)
        return fail_inst(p, i, "lse into %s: %s is %s, not an out lse (use %s)", a->name,
                         a->name, kind_words(a), a->kind == CODA_OUT_TILE ? "store" : "reduce");
    if (in->op == CODA_OP_STORE) {
        if (has_cols(v->shape) && v->vspace != a->space)
            return fail_inst(p, i, "store %s: value %s is in the %s space, %s is in the %s "
                             "space", a->name, v->name, space_name(v->vspace), a->name,
                             space_name(a->space));
    } else {
        if (v->shape != CODA_SHAPE_TILE)
            return fail_inst(p, i, "%s %s: value %s is %s; %s needs a tile value", opname,
                             a->name, v->name, shape_name(v->shape), opname);
        if (a->kind == CODA_OUT_COLRED && v->vspace != a->space)
            return fail_inst(p, i, "reduce %s: value %s is in the %s space, %s is in the %s "
                             "space", a->name, v->name, space_name(v->vspace), a->name,
                             space_name(a->space));
    }
    if (in->op == CODA_OP_LSE) {
        const coda_inst_t *t = &p->insts[in->src[1]];
        if (t->shape != CODA_SHAPE_ROW && t->shape != CODA_SHAPE_SCALAR)
            return fail_inst(p, i, "lse %s: target %s is %s; it must be a row value or a "
                             "scalar", a->name, t->name, shape_name(t->shape));
    }
    return mark_written(p, i, in->arg, written, opname);
}

/* Operands first (the op table says how many), then the rule of the op's kind. */
static coda_status_t verify_inst(coda_program_t *p, int i, int *written) {
    coda_inst_t *in = &p->insts[i];
    if ((int)in->op < 0 || in->op >= CODA_OP_COUNT_)
        return fail_inst(p, i, "unknown op %d", (int)in->op);
    const coda_op_info_t *op = &coda__ops[in->op];
    const char *opname = op->name;
    int n_src = op->n_src;
    for (int k = 0; k < n_src; k++) CODA_TRY(check_operand(p, i, k, opname));
    for (int k = n_src; k < 3; k++)
        if (in->src[k] != -1)
            return fail_inst(p, i, "%s: takes %d operand%s, but operand %d is set (%d)", opname,
                             n_src, n_src == 1 ? "" : "s", k + 1, in->src[k]);
    in->shape = CODA_SHAPE_SCALAR;
    in->vspace = CODA_SPACE_FULL;

    switch (op->kind) {
    case CODA_OPK_SOURCE:
        return verify_source(p, i, opname);
    case CODA_OPK_MAP:
        return join_operands(p, i, n_src, opname);
    case CODA_OPK_PAIR:
        CODA_TRY(join_operands(p, i, n_src, opname));
        CODA_TRY(pair_space(p, i, opname, op->dspace));
        /* A pair of half-space columns is spread over two accumulator pairs
         * (two GPU threads' registers), and N/2 may be odd: refuse it. */
        if (in->op == CODA_OP_SWAP && in->vspace == CODA_SPACE_HALF)
            return fail_inst(p, i, "swap: operand is in the half column space; swap pairs full- or "
                             "double-space columns only");
        return CODA_OK;
    case CODA_OPK_STATEMENT:
        return verify_write(p, i, written, opname);
    }
    return fail_inst(p, i, "%s: unknown op kind %d", opname, (int)op->kind);
}

coda_status_t coda__program_verify(coda_program_t *p) {
    if (!p) return coda__fail(CODA_ERR_INVALID_ARG, "program: is NULL");
    p->verified = 0;
    if (p->n_args < 0 || p->n_args > CODA_MAX_ARGS)
        return coda__fail(CODA_ERR_VERIFY, "program: %d arguments (limit %d)", p->n_args,
                          CODA_MAX_ARGS);
    if (p->n_insts < 0 || p->n_insts > CODA_MAX_INSTS)
        return coda__fail(CODA_ERR_VERIFY, "program: %d instructions (limit %d)", p->n_insts,
                          CODA_MAX_INSTS);
    for (int i = 0; i < p->n_args; i++) CODA_TRY(verify_arg(p, i));

    int written[CODA_MAX_ARGS] = {0};
    for (int i = 0; i < p->n_insts; i++) CODA_TRY(verify_inst(p, i, written));

    int n_out = 0, last_line = 0;
    for (int i = 0; i < p->n_args; i++) {
        const coda_arg_t *a = &p->args[i];
        if (a->line > last_line) last_line = a->line;
        if (coda__arg_is_input(a->kind)) continue;
        n_out++;
        if (!written[i]) return fail_arg(p, i, "out %s: output is never written", a->name);
    }
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].line > last_line) last_line = p->insts[i].line;
    if (n_out == 0) {
        if (last_line > 0)
            return coda__fail(CODA_ERR_VERIFY, "line %d: program writes no output (declare an "
                              "out argument and store into it)", last_line);
        return coda__fail(CODA_ERR_VERIFY, "program: writes no output (declare an out argument "
                          "and store into it)");
    }
    p->verified = 1;
    return CODA_OK;
}
