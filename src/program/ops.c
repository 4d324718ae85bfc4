/* ops.c - the op table: text names and operand counts. */
#include "program/ir.h"

#include <string.h>

/* Indexed by coda_op_t; the text form uses exactly these names. */
static const char *const op_names[CODA_OP_COUNT_] = {
    [CODA_OP_ACC] = "acc",         [CODA_OP_LOAD] = "load",
    [CODA_OP_CONST] = "const",     [CODA_OP_ROWIDX] = "rowidx",
    [CODA_OP_COLIDX] = "colidx",   [CODA_OP_NEG] = "neg",
    [CODA_OP_ABS] = "abs",         [CODA_OP_EXP] = "exp",
    [CODA_OP_LOG] = "log",         [CODA_OP_SQRT] = "sqrt",
    [CODA_OP_RSQRT] = "rsqrt",     [CODA_OP_RECIP] = "recip",
    [CODA_OP_SIN] = "sin",         [CODA_OP_COS] = "cos",
    [CODA_OP_TANH] = "tanh",       [CODA_OP_SIGMOID] = "sigmoid",
    [CODA_OP_SILU] = "silu",       [CODA_OP_DSILU] = "dsilu",
    [CODA_OP_SQUARE] = "square",   [CODA_OP_ROUND_BF16] = "round_bf16",
    [CODA_OP_ADD] = "add",         [CODA_OP_SUB] = "sub",
    [CODA_OP_MUL] = "mul",         [CODA_OP_DIV] = "div",
    [CODA_OP_MAX] = "max",         [CODA_OP_MIN] = "min",
    [CODA_OP_POW] = "pow",         [CODA_OP_EQ] = "eq",
    [CODA_OP_LT] = "lt",           [CODA_OP_MOD] = "mod",
    [CODA_OP_FMA] = "fma",         [CODA_OP_SELECT] = "select",
    [CODA_OP_EVEN] = "even",       [CODA_OP_ODD] = "odd",
    [CODA_OP_INTERLEAVE] = "interleave", [CODA_OP_SWAP] = "swap",
    [CODA_OP_STORE] = "store",     [CODA_OP_REDUCE] = "reduce",
    [CODA_OP_LSE] = "lse",
};

const char *coda_op_name(coda_op_t op) {
    if ((int)op < 0 || op >= CODA_OP_COUNT_) return NULL;
    return op_names[op];
}

int coda__op_arity(coda_op_t op) {
    switch (op) {
    case CODA_OP_ACC: case CODA_OP_LOAD: case CODA_OP_CONST:
    case CODA_OP_ROWIDX: case CODA_OP_COLIDX:
        return 0;
    case CODA_OP_NEG: case CODA_OP_ABS: case CODA_OP_EXP: case CODA_OP_LOG:
    case CODA_OP_SQRT: case CODA_OP_RSQRT: case CODA_OP_RECIP: case CODA_OP_SIN:
    case CODA_OP_COS: case CODA_OP_TANH: case CODA_OP_SIGMOID: case CODA_OP_SILU:
    case CODA_OP_DSILU: case CODA_OP_SQUARE: case CODA_OP_ROUND_BF16:
    case CODA_OP_EVEN: case CODA_OP_ODD: case CODA_OP_SWAP:
        return 1;
    case CODA_OP_ADD: case CODA_OP_SUB: case CODA_OP_MUL: case CODA_OP_DIV:
    case CODA_OP_MAX: case CODA_OP_MIN: case CODA_OP_POW: case CODA_OP_EQ:
    case CODA_OP_LT: case CODA_OP_MOD: case CODA_OP_INTERLEAVE:
        return 2;
    case CODA_OP_FMA: case CODA_OP_SELECT:
        return 3;
    case CODA_OP_STORE: case CODA_OP_REDUCE: case CODA_OP_LSE:
        return -1;
    case CODA_OP_COUNT_:
        break;
    }
    return -1; /* unknown ops are statements as far as anyone may assume: they define nothing */
}

int coda__op_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < CODA_OP_COUNT_; i++)
        if (strcmp(op_names[i], name) == 0) return i;
    return -1;
}
