/* ir.h - the in-memory form of an epilogue program (not public).
 *
 * A program is a list of argument declarations and a list of instructions in
 * SSA form: instruction i defines value i (statements define nothing). Source
 * operands are value ids, i.e. indices of earlier instructions. The parser and
 * the C builder produce it, the verifier fills in each value's shape class and
 * column space, the printer, the CPU interpreter and the CUDA code generator
 * read it.
 */
#ifndef CODA_PROGRAM_IR_H
#define CODA_PROGRAM_IR_H

#include "core/internal.h"

#include <stdatomic.h>

#define CODA_NAME_MAX 32      /* identifier length, including the NUL      */
#define CODA_MAX_ARGS 64      /* argument declarations per program          */
#define CODA_MAX_INSTS 1024   /* instructions per program                   */

/* Shape class of a value: which of (row, column) it varies along. */
typedef enum coda_shape {
    CODA_SHAPE_SCALAR = 0,  /* 0b00 */
    CODA_SHAPE_ROW = 1,     /* 0b01: varies along rows (one per row)   */
    CODA_SHAPE_COL = 2,     /* 0b10: varies along columns              */
    CODA_SHAPE_TILE = 3     /* 0b11: both; broadcast = bitwise or      */
} coda_shape_t;

typedef struct coda_arg {
    char name[CODA_NAME_MAX];
    coda_arg_kind_t kind;
    coda_dtype_t dtype;     /* tensors; f32 for partials and scalars         */
    coda_space_t space;     /* tile/col inputs and outputs, col reductions   */
    coda_reduce_t reduce;   /* OUT_ROWRED / OUT_COLRED                       */
    int line;               /* source line, 0 if built in C                  */
} coda_arg_t;

typedef struct coda_inst {
    coda_op_t op;
    char name[CODA_NAME_MAX]; /* defined value's name ("" for statements) */
    int src[3];               /* operand value ids, -1 if unused          */
    int arg;                  /* LOAD / STORE / REDUCE / LSE: arg index    */
    float imm;                /* CONST                                     */
    coda_space_t space;       /* COLIDX: which column space to count in    */
    int line;                 /* source line, 0 if built in C              */
    /* Filled by the verifier, for value-defining instructions: */
    coda_shape_t shape;
    coda_space_t vspace;      /* column space (meaningful if shape has COL) */
} coda_inst_t;

struct coda_cg_text; /* codegen/codegen.h */

struct coda_program {
    char name[CODA_NAME_MAX];
    int n_args;
    coda_arg_t args[CODA_MAX_ARGS];
    int n_insts;
    coda_inst_t insts[CODA_MAX_INSTS];
    coda_status_t error;     /* builder: first error, CODA_OK if none      */
    char error_msg[256];
    int verified;            /* 1 once coda_program_finish / parse passed  */
    /* Generated CUDA C, one per form (coda_cg_form_t in codegen/codegen.h):
     * made on first use by coda__codegen_cuda_cached and freed with the
     * program. A cache in a const program, so set once, atomically
     * (threads may share p). */
    _Atomic(struct coda_cg_text *) cuda_src[4]; /* CODA_CG_NFORMS (checked in codegen) */
};

/* Does p read the accumulator only through round_bf16 (or not at all)?
 * Then it sees acc rounded to bf16 wherever it looks, and a GPU kernel that
 * holds a finished tile as bf16 pairs (the epilogue overlap,
 * src/cuda/kernels/gemm_overlap.cuh) gives it the same bits. */
static inline int coda__program_acc_bf16(const struct coda_program *p) {
    for (int i = 0; i < p->n_insts; i++)
        for (int s = 0; s < 3; s++) {
            const int v = p->insts[i].src[s];
            if (v >= 0 && p->insts[v].op == CODA_OP_ACC && p->insts[i].op != CODA_OP_ROUND_BF16) return 0;
        }
    return 1;
}

/* Is an argument kind one the program reads (an input)? */
static inline int coda__arg_is_input(coda_arg_kind_t k) { return k <= CODA_IN_SCALAR || k == CODA_IN_ROWPART; }
/* Is it a valid coda_arg_kind_t? */
static inline int coda__arg_kind_ok(coda_arg_kind_t k) { return k >= CODA_IN_TILE && k <= CODA_IN_ROWPART; }

/* What an op is, from the op table (src/program/ops.def). The kind is the
 * verifier's shape rule. */
typedef enum coda_op_kind {
    CODA_OPK_SOURCE,    /* no value operands; a shape rule of its own      */
    CODA_OPK_MAP,       /* element-wise: operands broadcast, one space     */
    CODA_OPK_PAIR,      /* moves columns within pairs; the space moves     */
    CODA_OPK_STATEMENT  /* writes an output, defines no value              */
} coda_op_kind_t;

typedef struct coda_op_info {
    const char *name;    /* the text form's                                */
    coda_op_kind_t kind;
    int n_src;           /* value operands (a statement's value and target) */
    int dspace;          /* pairs: result space = operand space + dspace    */
    const char *syntax;  /* sources and statements: what follows the name   */
} coda_op_info_t;

/* Indexed by coda_op_t; every op has its row. */
extern const coda_op_info_t coda__ops[CODA_OP_COUNT_];

/* Operand count of a map op (1..3), 0 for sources, -1 for statements. */
int coda__op_arity(coda_op_t op);
/* Op from its text name, or -1. */
int coda__op_from_name(const char *name);

/* Verify and annotate (shape, vspace) a program; message "line N: ...". */
coda_status_t coda__program_verify(coda_program_t *p);

/* Column count of space s for a GEMM with n accumulator columns. */
static inline int64_t coda__space_width(coda_space_t s, int64_t n) {
    return s == CODA_SPACE_HALF ? n / 2 : s == CODA_SPACE_DOUBLE ? 2 * n : n;
}

#endif
