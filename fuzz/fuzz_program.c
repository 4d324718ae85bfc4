/* fuzz_program.c - libFuzzer target for the program parser, verifier and
 * printer.
 *
 * Any input: parse must return (no crash, no leak, no UB). If it parses,
 * print it, parse the printed text (must succeed) and print again (must be
 * identical): the canonical form is a fixed point. Then rebuild it with the C
 * builder: same text, same shapes. A mismatch aborts, which
 * is how a fuzz target reports a finding. Build and run: make fuzz. */
#include "coda.h"
#include "program/ir.h" /* to rebuild a parsed program with the builder */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char text_a[1 << 17], text_b[1 << 17], text_c[1 << 17];

/* The same program through the C builder, from the parsed IR. */
static coda_program_t *rebuild(const coda_program_t *p) {
    coda_program_t *q = NULL;
    if (coda_program_new(p->name, &q) != CODA_OK) return NULL;
    for (int i = 0; i < p->n_args; i++) {
        const coda_arg_t *a = &p->args[i];
        coda_program_arg(q, a->name, a->kind, a->dtype, a->space, a->reduce);
    }
    for (int i = 0; i < p->n_insts; i++) {
        const coda_inst_t *in = &p->insts[i];
        switch (in->op) {
        case CODA_OP_LOAD: coda_program_load(q, in->name, in->arg); break;
        case CODA_OP_CONST: coda_program_const(q, in->name, in->imm); break;
        case CODA_OP_COLIDX: coda_program_colidx(q, in->name, in->space); break;
        case CODA_OP_STORE:
        case CODA_OP_REDUCE: coda_program_store(q, in->arg, in->src[0]); break;
        case CODA_OP_LSE: coda_program_lse(q, in->arg, in->src[0], in->src[1]); break;
        default: coda_program_value(q, in->name, in->op, in->src[0], in->src[1], in->src[2]);
        }
    }
    return q;
}

static void fail(const char *what, const char *input, const char *printed) {
    fprintf(stderr, "fuzz_program: %s: %s\n--- input\n%s\n--- printed\n%s\n", what,
            coda_last_error(), input, printed ? printed : "");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *input = malloc(size + 1); /* NUL-terminated copy: parse takes a C string */
    if (!input) return 0;
    memcpy(input, data, size);
    input[size] = 0;

    coda_program_t *p = (coda_program_t *)input; /* must come back NULL on error */
    coda_status_t st = coda_program_parse(input, &p);
    if (st != CODA_OK) {
        if (p != NULL) fail("*out not NULL after an error", input, NULL);
        if (st != CODA_ERR_PARSE && st != CODA_ERR_VERIFY && st != CODA_ERR_DTYPE) fail("unexpected status", input, NULL);
        if (strncmp(coda_last_error(), "line ", 5) != 0) fail("message without a line", input, NULL);
        free(input);
        return 0;
    }
    size_t len_a = 0, len_b = 0;
    if (coda_program_print(p, text_a, sizeof text_a, &len_a) != CODA_OK)
        fail("print", input, NULL);
    if (strlen(text_a) != len_a) fail("print length", input, text_a);

    coda_program_t *q = NULL;
    if (coda_program_parse(text_a, &q) != CODA_OK) fail("re-parse of printed text", input, text_a);
    if (coda_program_print(q, text_b, sizeof text_b, &len_b) != CODA_OK)
        fail("second print", input, text_a);
    if (len_a != len_b || strcmp(text_a, text_b) != 0)
        fail("second print differs", text_a, text_b);
    if (coda_program_num_args(q) != coda_program_num_args(p)) fail("arg count", input, text_a);

    /* the builder makes the same program: same text, same annotations */
    coda_program_t *b = rebuild(p);
    if (!b || coda_program_finish(b) != CODA_OK) fail("builder rejects a parsed program", input, text_a);
    if (coda_program_print(b, text_c, sizeof text_c, NULL) != CODA_OK || strcmp(text_a, text_c) != 0)
        fail("builder prints differently", text_a, text_c);
    for (int i = 0; i < p->n_insts; i++)
        if (b->insts[i].shape != p->insts[i].shape || b->insts[i].vspace != p->insts[i].vspace)
            fail("builder annotations differ", input, text_a);
    coda_program_free(b);

    coda_program_free(q);
    coda_program_free(p);
    free(input);
    return 0;
}
