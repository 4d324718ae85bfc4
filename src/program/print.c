/* print.c - IR -> canonical text.
 *
 * Canonical form: a `program NAME` line, the declarations in order, then the
 * instructions, one space between tokens, the column space only where it is
 * not full, consts with "%.9g" (nine significant digits identify every float,
 * so strtof gives the same bits back). parse(print(p)) prints identically. */
#include "program/program.h"

#include <stdarg.h>
#include <stdio.h>

typedef struct out {
    char *buf;
    size_t cap;
    size_t len;   /* length of the full text so far, even past cap */
} out_t;

static void put(out_t *o, const char *fmt, ...) CODA_PRINTF(2, 3);
static void put(out_t *o, const char *fmt, ...) {
    /* The longest line, "N = select A B C" with 31-character names, needs
     * 5 * 31 + 14 bytes; consts need at most 16 characters. */
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1; /* cannot happen: see above */
    if (o->len < o->cap) {
        size_t room = o->cap - o->len; /* includes the byte kept for the NUL */
        size_t k = (size_t)n < room ? (size_t)n : room - 1;
        memcpy(o->buf + o->len, tmp, k);
    }
    o->len += (size_t)n;
}

static const char *space_suffix(coda_space_t s) {
    return s == CODA_SPACE_HALF ? " half" : s == CODA_SPACE_DOUBLE ? " double" : "";
}

static void print_arg(out_t *o, const coda_arg_t *a) {
    static const char *const red[3] = {"sum", "max", "sumsq"};
    const char *dt = coda_dtype_name(a->dtype);
    switch (a->kind) {
    case CODA_IN_TILE: put(o, "in %s tile %s%s\n", a->name, dt, space_suffix(a->space)); break;
    case CODA_IN_ROW: put(o, "in %s row %s\n", a->name, dt); break;
    case CODA_IN_COL: put(o, "in %s col %s%s\n", a->name, dt, space_suffix(a->space)); break;
    case CODA_IN_SCALAR: put(o, "in %s scalar\n", a->name); break;
    case CODA_IN_ROWPART: put(o, "in %s rowpart\n", a->name); break;
    case CODA_OUT_TILE: put(o, "out %s tile %s%s\n", a->name, dt, space_suffix(a->space)); break;
    case CODA_OUT_ROWRED: put(o, "out %s row%s\n", a->name, red[a->reduce]); break;
    case CODA_OUT_COLRED:
        put(o, "out %s col%s%s\n", a->name, red[a->reduce], space_suffix(a->space));
        break;
    case CODA_OUT_LSE: put(o, "out %s lse\n", a->name); break;
    }
}

static void print_inst(out_t *o, const coda_program_t *p, const coda_inst_t *in) {
    const char *op = coda_op_name(in->op);
    const char *s0 = in->src[0] >= 0 ? p->insts[in->src[0]].name : "";
    const char *s1 = in->src[1] >= 0 ? p->insts[in->src[1]].name : "";
    const char *s2 = in->src[2] >= 0 ? p->insts[in->src[2]].name : "";
    switch (in->op) {
    case CODA_OP_ACC:
    case CODA_OP_ROWIDX: put(o, "%s = %s\n", in->name, op); return;
    case CODA_OP_LOAD: put(o, "%s = load %s\n", in->name, p->args[in->arg].name); return;
    case CODA_OP_CONST: {
        char num[32];
        coda__format_float(num, sizeof num, in->imm);
        put(o, "%s = const %s\n", in->name, num);
        return;
    }
    case CODA_OP_COLIDX: put(o, "%s = colidx%s\n", in->name, space_suffix(in->space)); return;
    case CODA_OP_STORE:
    case CODA_OP_REDUCE: put(o, "%s %s %s\n", op, p->args[in->arg].name, s0); return;
    case CODA_OP_LSE: put(o, "lse %s %s %s\n", p->args[in->arg].name, s0, s1); return;
    default: break;
    }
    switch (coda__op_arity(in->op)) {
    case 1: put(o, "%s = %s %s\n", in->name, op, s0); break;
    case 2: put(o, "%s = %s %s %s\n", in->name, op, s0, s1); break;
    default: put(o, "%s = %s %s %s %s\n", in->name, op, s0, s1, s2); break;
    }
}

coda_status_t coda_program_print(const coda_program_t *p, char *buf, size_t cap, size_t *len) {
    if (!p) return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_print: p is NULL");
    if (!buf && cap > 0)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_print: buf is NULL but cap is %zu",
                          cap);
    /* The printer walks ids and names unchecked: only a verified program has
     * them all in range (and every name filled in). */
    if (!p->verified)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_print: p is not verified (call "
                          "coda_program_finish first)");
    out_t o = {buf, cap, 0};
    put(&o, "program %s\n", p->name[0] ? p->name : CODA__ANON_PROGRAM);
    for (int i = 0; i < p->n_args; i++) print_arg(&o, &p->args[i]);
    for (int i = 0; i < p->n_insts; i++) print_inst(&o, p, &p->insts[i]);
    if (len) *len = o.len;
    if (!buf) return CODA_OK; /* cap == 0: a size query */
    if (cap > 0) buf[o.len < cap ? o.len : cap - 1] = 0;
    if (o.len >= cap)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_print: text needs %zu bytes, "
                          "cap is %zu", o.len + 1, cap);
    return CODA_OK;
}
