/* program.h - helpers shared by the files of src/program (not public).
 *
 * The parser and the C builder both fill a coda_program_t (ir.h); these are
 * the pieces they share: identifier rules, name lookup, made-up names, and the
 * "where" prefix of error messages. */
#ifndef CODA_PROGRAM_PROGRAM_H
#define CODA_PROGRAM_PROGRAM_H

#include "program/ir.h"

#include <stddef.h>

/* A zeroed program with no name, or NULL when out of memory. */
coda_program_t *coda__program_alloc(void);

/* NULL if s[0..len) may name an argument or value, else the reason, e.g.
 * "is not an identifier", "is reserved". Op names, `acc` and the keywords of
 * the text form are reserved. */
const char *coda__name_problem(const char *s, size_t len);
/* Same, but reserved words are fine (the program's own name). */
const char *coda__ident_problem(const char *s, size_t len);

/* Look a name up among the arguments and the named values: *arg receives the
 * argument index or -1, *inst the defining instruction or -1. */
void coda__program_lookup(const coda_program_t *p, const char *s, size_t len, int *arg,
                          int *inst);

/* Give every unnamed argument and value a name ("_a3", "_v7", "_v7_1"...) that
 * no other name in the program uses. Names start with '_' and a letter, so
 * users may well pick them too: the clash check is what makes them unique. */
void coda__program_name_unnamed(coda_program_t *p);

/* strtof and "%.9g" in the "C" locale, whatever the host program set: the
 * text form always writes 1.5, never 1,5 (number.c). Nine significant digits
 * identify every float, so format-then-parse gives the same bits. */
float coda__strtof(const char *s, char **end);
int coda__format_float(char *buf, size_t cap, float f);

/* The made-up name of the program when it has none. */
#define CODA__ANON_PROGRAM "anonymous"

/* Error-message prefix: "line N: " if line > 0, else "<what> I: " (what is
 * "instruction" or "argument"). Returns buf. */
const char *coda__where(char buf[48], int line, const char *what, int index);

#endif
