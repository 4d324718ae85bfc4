/* op_docs.c - the op tables of docs/programs.md, made from the op table
 * src/program/ops.def, so that the reference cannot drift from the code.
 *
 *   op_docs                          print the tables (markdown)
 *   op_docs --write DOC              replace the tables in DOC (between the
 *                                    markers below)
 *   op_docs --check DOC [HEADER]     exit 1 if DOC's tables are not the
 *                                    printed ones, or an op's name is not
 *                                    in HEADER's section 5 (include/coda.h,
 *                                    which lists the ops by hand)
 *
 * `make docs` writes, `make test-c` checks. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BEGIN "<!-- op tables: made from src/program/ops.def by `make docs` (tools/op_docs.c); make test-c checks them -->\n"
#define END "<!-- end of op tables -->\n"

enum kind { SOURCE, MAP, PAIR, STMT };

typedef struct row {
    enum kind kind;
    const char *name;
    int n;
    const char *syntax, *cpu, *cuda, *from, *at, *doc;
} row_t;

static const row_t rows[] = {
#define CODA_SOURCE(ID, name, syntax, doc) {SOURCE, name, 0, syntax, NULL, NULL, NULL, NULL, doc},
#define CODA_MAP(ID, name, n, cpu, cuda, doc) {MAP, name, n, NULL, #cpu, cuda, NULL, NULL, doc},
#define CODA_PAIR(ID, name, n, dspace, from, at, doc) {PAIR, name, n, NULL, NULL, NULL, #from, #at, doc},
#define CODA_STMT(ID, name, n, syntax, doc) {STMT, name, n, syntax, NULL, NULL, NULL, NULL, doc},
#include "program/ops.def"
};
#define N_ROWS (int)(sizeof rows / sizeof rows[0])

typedef struct text {
    char *s;
    size_t len, cap;
} text_t;

static void put(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text_t *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap = 2 * (t->len + (size_t)n + 1);
        t->s = realloc(t->s, t->cap);
        if (!t->s) exit(2);
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* A table cell: '|' would end it. */
static void cell(text_t *t, const char *s) {
    for (; *s; s++) {
        if (*s == '|') put(t, "\\|");
        else put(t, "%c", *s);
    }
}

static const char *const operand[3] = {"x", "y", "z"};

/* The CUDA format with the operands' names in place of its %s. */
static void cuda_expr(text_t *t, const char *fmt) {
    int k = 0;
    for (const char *s = fmt; *s; s++) {
        if (s[0] == '%' && s[1] == 's') put(t, "%s", operand[k++ % 3]), s++;
        else put(t, "%c", *s);
    }
}

static void operands(text_t *t, int n) {
    for (int k = 0; k < n; k++) put(t, " %s", operand[k]);
}

static void tables(text_t *t) {
    put(t, BEGIN "\nSources (each has its own shape rule):\n\n| value | gives |\n|---|---|\n");
    for (int i = 0; i < N_ROWS; i++) {
        const row_t *r = &rows[i];
        if (r->kind != SOURCE) continue;
        put(t, "| `NAME = %s%s%s` | ", r->name, r->syntax[0] ? " " : "", r->syntax);
        cell(t, r->doc);
        put(t, " |\n");
    }
    put(t, "\nMaps, element by element: the operands broadcast (see Shapes below). The CPU\n"
           "column is the f32 C the interpreter evaluates, the GPU column the CUDA the\n"
           "code generator writes (`cg_*`: src/codegen/epi_prelude.cuh):\n\n"
           "| value | meaning | CPU | GPU |\n|---|---|---|---|\n");
    for (int i = 0; i < N_ROWS; i++) {
        const row_t *r = &rows[i];
        if (r->kind != MAP) continue;
        put(t, "| `NAME = %s", r->name);
        operands(t, r->n);
        put(t, "` | ");
        cell(t, r->doc);
        put(t, " | `");
        cell(t, r->cpu);
        put(t, "` | `");
        text_t g = {0};
        cuda_expr(&g, r->cuda);
        cell(t, g.s);
        free(g.s);
        put(t, "` |\n");
    }
    put(t, "\nPairwise maps, on columns (2j, 2j+1), which a GPU thread holds in adjacent\n"
           "registers; element c of the value is a copy of the element shown, on both\n"
           "backends:\n\n| value | meaning | element c |\n|---|---|---|\n");
    for (int i = 0; i < N_ROWS; i++) {
        const row_t *r = &rows[i];
        if (r->kind != PAIR) continue;
        put(t, "| `NAME = %s", r->name);
        operands(t, r->n);
        put(t, "` | ");
        cell(t, r->doc);
        if (strcmp(r->from, "0") == 0) put(t, " | `x[%s]` |\n", r->at);
        else if (strcmp(r->from, "1") == 0) put(t, " | `y[%s]` |\n", r->at);
        else put(t, " | `(%s ? y : x)[%s]` |\n", r->from, r->at);
    }
    put(t, "\nStatements (they define no value):\n\n| statement | does |\n|---|---|\n");
    for (int i = 0; i < N_ROWS; i++) {
        const row_t *r = &rows[i];
        if (r->kind != STMT) continue;
        put(t, "| `%s %s` | ", r->name, r->syntax);
        cell(t, r->doc);
        put(t, " |\n");
    }
    put(t, "\n" END);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    text_t t = {0};
    char buf[4096];
    size_t n;
    put(&t, "%s", "");
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) put(&t, "%.*s", (int)n, buf);
    fclose(f);
    return t.s;
}

/* Is `word` in s[0..len) as a whole word? */
static int has_word(const char *s, size_t len, const char *word) {
    size_t w = strlen(word);
    for (size_t i = 0; i + w <= len; i++) {
        if (memcmp(s + i, word, w) != 0) continue;
        int before = i > 0 && (s[i - 1] == '_' || (s[i - 1] >= 'a' && s[i - 1] <= 'z'));
        int after = i + w < len && (s[i + w] == '_' || (s[i + w] >= 'a' && s[i + w] <= 'z'));
        if (!before && !after) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    text_t t = {0};
    tables(&t);
    if (argc == 1) {
        fputs(t.s, stdout);
        return 0;
    }
    int write = argc >= 3 && strcmp(argv[1], "--write") == 0;
    int check = argc >= 3 && strcmp(argv[1], "--check") == 0;
    if (!write && !check) {
        fprintf(stderr, "usage: op_docs [--write DOC | --check DOC [HEADER]]\n");
        return 2;
    }
    const char *path = argv[2];
    char *doc = slurp(path);
    char *b = doc ? strstr(doc, BEGIN) : NULL, *e = b ? strstr(b, END) : NULL;
    if (!b || !e) {
        fprintf(stderr, "op_docs: %s has no op tables (the markers are:\n%s...\n%s)\n", path, BEGIN, END);
        return 1;
    }
    e += strlen(END);
    int same = (size_t)(e - b) == t.len && memcmp(b, t.s, t.len) == 0;
    int status = 0;
    if (write) {
        if (same) return 0;
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(doc, 1, (size_t)(b - doc), f) != (size_t)(b - doc) || fputs(t.s, f) < 0 ||
            fputs(e, f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "op_docs: cannot write %s\n", path);
            return 1;
        }
        printf("op_docs: wrote the op tables of %s\n", path);
        return 0;
    }
    if (!same) {
        fprintf(stderr, "op_docs: the op tables of %s are not those of src/program/ops.def: run make docs\n", path);
        status = 1;
    }
    if (argc >= 4) {
        char *h = slurp(argv[3]);
        char *s5 = h ? strstr(h, "5. Epilogue programs") : NULL, *s6 = s5 ? strstr(s5, "\n * 6. ") : NULL;
        if (!s5 || !s6) {
            fprintf(stderr, "op_docs: %s has no section 5 (\"5. Epilogue programs\" ... \" * 6. \")\n", argv[3]);
            return 1;
        }
        for (int i = 0; i < N_ROWS; i++)
            if (!has_word(s5, (size_t)(s6 - s5), rows[i].name)) {
                fprintf(stderr, "op_docs: op %s is not in section 5 of %s\n", rows[i].name, argv[3]);
                status = 1;
            }
        free(h);
    }
    if (!status) printf("op_docs: %s: the op tables are ops.def's (%d ops)\n", path, N_ROWS);
    free(doc);
    free(t.s);
    return status;
}
