/* fuzz_program.c - libFuzzer target for the program parser, verifier and
 * printer.
 *
 * Any input: parse must return (no crash, no leak, no UB). If it parses,
 * print it, parse the printed text (must succeed) and print again (must be
 * identical): the canonical form is a fixed point. A mismatch aborts, which
 * is how a fuzz target reports a finding. Build and run: make fuzz. */
#include "coda.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char text_a[1 << 17], text_b[1 << 17];

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
        if (st != CODA_ERR_PARSE && st != CODA_ERR_VERIFY) fail("unexpected status", input, NULL);
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

    coda_program_free(q);
    coda_program_free(p);
    free(input);
    return 0;
}
