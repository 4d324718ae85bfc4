/* names.c - identifiers: validity, reserved words, lookup, made-up names. */
#include "program/program.h"

#include <stdio.h>
#include <stdlib.h>

coda_program_t *coda__program_alloc(void) {
    coda_program_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->error = CODA_OK;
    return p;
}

/* Keywords of the text form that are not op names. */
static const char *const keywords[] = {
    "in", "out", "program", "tile", "row", "col", "scalar", "half", "full", "double",
    "bf16", "f32", "f16", "fp8e4m3", "i32",
};

static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_alnum(int c) { return is_alpha(c) || (c >= '0' && c <= '9'); }

static int eq(const char *s, size_t len, const char *word) {
    return strlen(word) == len && memcmp(s, word, len) == 0;
}

const char *coda__ident_problem(const char *s, size_t len) {
    if (len == 0) return "is empty";
    if (!is_alpha((unsigned char)s[0])) return "is not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
    for (size_t i = 1; i < len; i++)
        if (!is_alnum((unsigned char)s[i])) return "is not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
    if (len > CODA_NAME_MAX - 1) return "is longer than 31 characters";
    return NULL;
}

const char *coda__name_problem(const char *s, size_t len) {
    const char *why = coda__ident_problem(s, len);
    if (why) return why;
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if (eq(s, len, keywords[i])) return "is a reserved word";
    for (int op = 0; op < CODA_OP_COUNT_; op++)
        if (eq(s, len, coda_op_name((coda_op_t)op))) return "is a reserved word (an op name)";
    return NULL;
}

void coda__program_lookup(const coda_program_t *p, const char *s, size_t len, int *arg,
                          int *inst) {
    *arg = -1;
    *inst = -1;
    if (len == 0 || len >= CODA_NAME_MAX) return;
    for (int i = 0; i < p->n_args; i++)
        if (eq(s, len, p->args[i].name)) { *arg = i; break; }
    for (int i = 0; i < p->n_insts; i++)
        if (p->insts[i].name[0] && eq(s, len, p->insts[i].name)) { *inst = i; break; }
}

static int name_taken(const coda_program_t *p, const char *name) {
    int a, v;
    coda__program_lookup(p, name, strlen(name), &a, &v);
    return a >= 0 || v >= 0;
}

/* First of  <prefix><index>, <prefix><index>_1, _2, ...  not in use. Distinct
 * (prefix, index) pairs never give the same string (digits end at '_'), and at
 * most n_args + n_insts candidates can be taken, so this ends. */
static void make_name(const coda_program_t *p, char *dst, const char *prefix, int index) {
    char buf[CODA_NAME_MAX];
    for (int k = 0;; k++) {
        if (k == 0) snprintf(buf, sizeof buf, "%s%d", prefix, index);
        else snprintf(buf, sizeof buf, "%s%d_%d", prefix, index, k);
        if (!name_taken(p, buf)) break;
    }
    memcpy(dst, buf, sizeof buf);
}

void coda__program_name_unnamed(coda_program_t *p) {
    for (int i = 0; i < p->n_args; i++)
        if (!p->args[i].name[0]) make_name(p, p->args[i].name, "_a", i);
    for (int i = 0; i < p->n_insts; i++) {
        coda_inst_t *in = &p->insts[i];
        if (!in->name[0] && coda__op_arity(in->op) >= 0) make_name(p, in->name, "_v", i);
    }
}

const char *coda__where(char buf[48], int line, const char *what, int index) {
    if (line > 0) snprintf(buf, 48, "line %d: ", line);
    else snprintf(buf, 48, "%s %d: ", what, index);
    return buf;
}
