/* builder.c - building a program from C, freeing it, and asking it about its
 * arguments.
 *
 * Builder calls never fail loudly: a bad call returns -1 and the program keeps
 * the first error (later calls then do nothing), which coda_program_finish()
 * reports. That lets callers write a whole program without checking each call.
 * Checks that need the whole program (operand ids, shapes, outputs written
 * once) are the verifier's, so they read the same for built and parsed
 * programs. */
#include "program/program.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Remember the first error and make it the thread's last error too. */
static int build_error(coda_program_t *p, coda_status_t st, const char *fmt, ...)
    CODA_PRINTF(3, 4);
static int build_error(coda_program_t *p, coda_status_t st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error_msg, sizeof p->error_msg, fmt, ap);
    va_end(ap);
    p->error = st;
    coda__fail(st, "%s", p->error_msg);
    return -1;
}

/* Common preamble: p usable and error-free. */
static int usable(coda_program_t *p, const char *fn) {
    if (!p) {
        coda__fail(CODA_ERR_INVALID_ARG, "%s: p is NULL", fn);
        return 0;
    }
    if (p->error != CODA_OK) {
        coda__fail(p->error, "%s", p->error_msg);
        return 0;
    }
    return 1;
}

/* A name for a new argument or value: NULL or "" (made up at finish), or a
 * valid, unreserved identifier not yet used. */
static int check_name(coda_program_t *p, const char *name, const char *where) {
    if (!name || !name[0]) return 1;
    size_t len = strnlen(name, CODA_NAME_MAX + 1);
    const char *why = coda__name_problem(name, len);
    if (why) {
        build_error(p, CODA_ERR_INVALID_ARG, "%sname '%.40s' %s", where, name, why);
        return 0;
    }
    int a, v;
    coda__program_lookup(p, name, len, &a, &v);
    if (a >= 0 || v >= 0) {
        build_error(p, CODA_ERR_VERIFY, "%sname '%s' is already defined (%s %d)", where, name,
                    a >= 0 ? "argument" : "instruction", a >= 0 ? a : v);
        return 0;
    }
    return 1;
}

/* Code generated from the program (codegen's cached CUDA source per form). */
static void drop_generated(coda_program_t *p) {
    for (size_t f = 0; f < sizeof p->cuda_src / sizeof p->cuda_src[0]; f++)
        free(atomic_exchange(&p->cuda_src[f], NULL));
}

/* The program changed: it must be verified again, and its generated code
 * must go, or a CUDA launch after the next finish would run the old one. */
static void changed(coda_program_t *p) {
    p->verified = 0;
    drop_generated(p);
}

/* Append an instruction; -1 (error recorded) when the program is full. */
static int push_inst(coda_program_t *p, const char *name, coda_op_t op, int s0, int s1,
                     int s2) {
    char where[48];
    coda__where(where, 0, "instruction", p->n_insts);
    if (p->n_insts >= CODA_MAX_INSTS)
        return build_error(p, CODA_ERR_VERIFY, "%stoo many instructions (limit %d)", where,
                           CODA_MAX_INSTS);
    if (!check_name(p, name, where)) return -1;
    coda_inst_t *in = &p->insts[p->n_insts];
    memset(in, 0, sizeof *in);
    in->op = op;
    if (name) snprintf(in->name, sizeof in->name, "%s", name);
    in->src[0] = s0;
    in->src[1] = s1;
    in->src[2] = s2;
    in->arg = -1;
    in->space = CODA_SPACE_FULL;
    changed(p);
    return p->n_insts++;
}

coda_status_t coda_program_new(const char *name, coda_program_t **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_new: out is NULL");
    *out = NULL; /* coda.h: a failed call that makes an object leaves NULL */
    if (name && name[0]) {
        size_t len = strnlen(name, CODA_NAME_MAX + 1);
        const char *why = coda__ident_problem(name, len);
        if (why)
            return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_new: name '%.40s' %s", name,
                              why);
    }
    coda_program_t *p = coda__program_alloc();
    if (!p) return coda__fail(CODA_ERR_NO_MEMORY, "coda_program_new: out of memory");
    if (name) snprintf(p->name, sizeof p->name, "%s", name);
    *out = p;
    return CODA_OK;
}

void coda_program_free(coda_program_t *p) {
    if (!p) return;
    drop_generated(p);
    free(p);
}

int coda_program_arg(coda_program_t *p, const char *name, coda_arg_kind_t kind,
                     coda_dtype_t dtype, coda_space_t space, coda_reduce_t reduce) {
    if (!usable(p, "coda_program_arg")) return -1;
    char where[48];
    coda__where(where, 0, "argument", p->n_args);
    if (p->n_args >= CODA_MAX_ARGS)
        return build_error(p, CODA_ERR_VERIFY, "%stoo many arguments (limit %d)", where,
                           CODA_MAX_ARGS);
    if (!coda__arg_kind_ok(kind))
        return build_error(p, CODA_ERR_INVALID_ARG, "%skind %d is not a coda_arg_kind_t", where,
                           (int)kind);
    /* dtype, space and reduce are ignored (normalised) for kinds that have
     * none, but must still be values of their enums. */
    if (!coda_dtype_name(dtype))
        return build_error(p, CODA_ERR_INVALID_ARG, "%sdtype %d is not a coda_dtype_t", where,
                           (int)dtype);
    if ((int)space < CODA_SPACE_HALF || space > CODA_SPACE_DOUBLE)
        return build_error(p, CODA_ERR_INVALID_ARG, "%sspace %d is not a coda_space_t", where,
                           (int)space);
    if ((int)reduce < CODA_REDUCE_SUM || reduce > CODA_REDUCE_SUMSQ)
        return build_error(p, CODA_ERR_INVALID_ARG, "%sreduce %d is not a coda_reduce_t", where,
                           (int)reduce);
    if (!check_name(p, name, where)) return -1;
    int has_dtype = kind == CODA_IN_TILE || kind == CODA_IN_ROW || kind == CODA_IN_COL ||
                    kind == CODA_OUT_TILE;
    int has_space = kind == CODA_IN_TILE || kind == CODA_IN_COL || kind == CODA_OUT_TILE ||
                    kind == CODA_OUT_COLRED;
    coda_arg_t *a = &p->args[p->n_args];
    memset(a, 0, sizeof *a);
    if (name) snprintf(a->name, sizeof a->name, "%s", name);
    a->kind = kind;
    a->dtype = has_dtype ? dtype : CODA_F32;
    a->space = has_space ? space : CODA_SPACE_FULL;
    a->reduce = (kind == CODA_OUT_ROWRED || kind == CODA_OUT_COLRED) ? reduce : CODA_REDUCE_SUM;
    a->line = 0;
    changed(p);
    return p->n_args++;
}

int coda_program_value(coda_program_t *p, const char *name, coda_op_t op, int src0, int src1,
                       int src2) {
    if (!usable(p, "coda_program_value")) return -1;
    char where[48];
    coda__where(where, 0, "instruction", p->n_insts);
    const char *opname = coda_op_name(op);
    if (!opname)
        return build_error(p, CODA_ERR_INVALID_ARG, "%sop %d is not a coda_op_t", where,
                           (int)op);
    if (op == CODA_OP_LOAD || op == CODA_OP_CONST || op == CODA_OP_COLIDX)
        return build_error(p, CODA_ERR_INVALID_ARG, "%s%s: use coda_program_%s", where, opname,
                           opname);
    int arity = coda__op_arity(op);
    if (arity < 0)
        return build_error(p, CODA_ERR_INVALID_ARG, "%s%s is a statement: use coda_program_%s",
                           where, opname, op == CODA_OP_LSE ? "lse" : "store");
    int src[3] = {src0, src1, src2};
    for (int k = arity; k < 3; k++)
        if (src[k] != -1)
            return build_error(p, CODA_ERR_INVALID_ARG, "%s%s takes %d operand%s: src%d must be "
                               "-1, not %d", where, opname, arity, arity == 1 ? "" : "s", k,
                               src[k]);
    return push_inst(p, name, op, src0, src1, src2);
}

int coda_program_load(coda_program_t *p, const char *name, int arg) {
    if (!usable(p, "coda_program_load")) return -1;
    if (arg < 0 || arg >= p->n_args)
        return build_error(p, CODA_ERR_INVALID_ARG, "instruction %d: load: arg %d out of range "
                           "(%d arguments declared)", p->n_insts, arg, p->n_args);
    int i = push_inst(p, name, CODA_OP_LOAD, -1, -1, -1);
    if (i >= 0) p->insts[i].arg = arg;
    return i;
}

int coda_program_const(coda_program_t *p, const char *name, float value) {
    if (!usable(p, "coda_program_const")) return -1;
    if (!isfinite(value))
        return build_error(p, CODA_ERR_INVALID_ARG, "instruction %d: const: value is not finite",
                           p->n_insts);
    int i = push_inst(p, name, CODA_OP_CONST, -1, -1, -1);
    if (i >= 0) p->insts[i].imm = value;
    return i;
}

int coda_program_colidx(coda_program_t *p, const char *name, coda_space_t space) {
    if (!usable(p, "coda_program_colidx")) return -1;
    if ((int)space < CODA_SPACE_HALF || space > CODA_SPACE_DOUBLE)
        return build_error(p, CODA_ERR_INVALID_ARG, "instruction %d: colidx: space %d is not a "
                           "coda_space_t", p->n_insts, (int)space);
    int i = push_inst(p, name, CODA_OP_COLIDX, -1, -1, -1);
    if (i >= 0) p->insts[i].space = space;
    return i;
}

/* store into an out tile, reduce into a reduction: the argument's kind picks
 * the statement. Anything else is recorded as a store, which the verifier
 * then rejects with a message naming the argument. */
int coda_program_store(coda_program_t *p, int arg, int value) {
    if (!usable(p, "coda_program_store")) return -1;
    if (arg < 0 || arg >= p->n_args)
        return build_error(p, CODA_ERR_INVALID_ARG, "instruction %d: store: arg %d out of range "
                           "(%d arguments declared)", p->n_insts, arg, p->n_args);
    coda_arg_kind_t k = p->args[arg].kind;
    coda_op_t op = (k == CODA_OUT_ROWRED || k == CODA_OUT_COLRED) ? CODA_OP_REDUCE : CODA_OP_STORE;
    int i = push_inst(p, NULL, op, value, -1, -1);
    if (i >= 0) p->insts[i].arg = arg;
    return i;
}

int coda_program_lse(coda_program_t *p, int arg, int value, int target) {
    if (!usable(p, "coda_program_lse")) return -1;
    if (arg < 0 || arg >= p->n_args)
        return build_error(p, CODA_ERR_INVALID_ARG, "instruction %d: lse: arg %d out of range "
                           "(%d arguments declared)", p->n_insts, arg, p->n_args);
    int i = push_inst(p, NULL, CODA_OP_LSE, value, target, -1);
    if (i >= 0) p->insts[i].arg = arg;
    return i;
}

coda_status_t coda_program_finish(coda_program_t *p) {
    if (!p) return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_finish: p is NULL");
    if (p->error != CODA_OK) return coda__fail(p->error, "%s", p->error_msg);
    coda__program_name_unnamed(p);
    return coda__program_verify(p);
}

/* ---- introspection ---- */

int coda_program_num_args(const coda_program_t *p) {
    if (!p) {
        coda__fail(CODA_ERR_INVALID_ARG, "coda_program_num_args: p is NULL");
        return -1;
    }
    return p->n_args;
}

coda_status_t coda_program_arg_info(const coda_program_t *p, int index, const char **name,
                                    coda_arg_kind_t *kind, coda_dtype_t *dtype,
                                    coda_space_t *space, coda_reduce_t *reduce) {
    if (!p) return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_arg_info: p is NULL");
    if (index < 0 || index >= p->n_args)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_arg_info: index %d out of range "
                          "(%d arguments)", index, p->n_args);
    const coda_arg_t *a = &p->args[index];
    if (name) *name = a->name;
    if (kind) *kind = a->kind;
    if (dtype) *dtype = a->dtype;
    if (space) *space = a->space;
    if (reduce) *reduce = a->reduce;
    return CODA_OK;
}

int coda_program_find_arg(const coda_program_t *p, const char *name) {
    if (!p || !name || !name[0]) return -1;
    for (int i = 0; i < p->n_args; i++)
        if (strcmp(p->args[i].name, name) == 0) return i;
    return -1;
}
