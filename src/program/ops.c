/* ops.c - the op table (ops.def) as data: names, kinds, operand counts. */
#include "program/ir.h"

#include <string.h>

const coda_op_info_t coda__ops[CODA_OP_COUNT_] = {
#define CODA_SOURCE(ID, name, syntax, doc) [CODA_OP_##ID] = {name, CODA_OPK_SOURCE, 0, 0, syntax},
#define CODA_MAP(ID, name, n, cpu, cuda, doc) [CODA_OP_##ID] = {name, CODA_OPK_MAP, n, 0, ""},
#define CODA_PAIR(ID, name, n, dspace, from, at, doc) [CODA_OP_##ID] = {name, CODA_OPK_PAIR, n, dspace, ""},
#define CODA_STMT(ID, name, n, syntax, doc) [CODA_OP_##ID] = {name, CODA_OPK_STATEMENT, n, 0, syntax},
#include "program/ops.def"
};

/* The rows and enum coda_op (coda.h, public: its values are the ABI) must
 * name the same ops. A row whose ID is not in the enum does not compile
 * above; a row given twice is a second enumerator of the same name here;
 * and as many rows as ops then means none is missing. */
enum op_rows {
#define CODA_SOURCE(ID, name, syntax, doc) OP_ROW_##ID,
#define CODA_MAP(ID, name, n, cpu, cuda, doc) OP_ROW_##ID,
#define CODA_PAIR(ID, name, n, dspace, from, at, doc) OP_ROW_##ID,
#define CODA_STMT(ID, name, n, syntax, doc) OP_ROW_##ID,
#include "program/ops.def"
    OP_ROWS
};
_Static_assert((int)OP_ROWS == (int)CODA_OP_COUNT_, "src/program/ops.def has one row for every coda_op_t");

const char *coda_op_name(coda_op_t op) {
    if ((int)op < 0 || op >= CODA_OP_COUNT_) return NULL;
    return coda__ops[op].name;
}

int coda__op_arity(coda_op_t op) {
    /* unknown ops are statements as far as anyone may assume: they define nothing */
    if ((int)op < 0 || op >= CODA_OP_COUNT_) return -1;
    const coda_op_info_t *o = &coda__ops[op];
    return o->kind == CODA_OPK_STATEMENT ? -1 : o->n_src;
}

int coda__op_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < CODA_OP_COUNT_; i++)
        if (strcmp(coda__ops[i].name, name) == 0) return i;
    return -1;
}
