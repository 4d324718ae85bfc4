/* parse.c - the text form of an epilogue program -> IR (then verified).
 *
 * One statement per line. A line is cut into tokens at spaces and tabs; '='
 * is a token of its own (so "a=acc" reads like "a = acc"); '#' starts a
 * comment that runs to the end of the line; a '\r' just before the newline is
 * ignored. Any other byte outside printable ASCII is an error.
 *
 * Errors in the grammar are CODA_ERR_PARSE; names that are undefined, defined
 * twice or of the wrong sort (an argument where a value belongs), limits, and
 * everything the verifier finds are CODA_ERR_VERIFY. Within a line the syntax
 * is checked before the names. */
#include "program/program.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_TOKENS 8 /* the longest statement, "v = fma a b c", has 6 */

typedef struct token {
    const char *s;
    size_t n;
} token_t;

typedef struct parser {
    coda_program_t *p;
    int line;
    int n_statements;   /* non-empty lines seen before this one */
    int nt;
    token_t t[MAX_TOKENS];
} parser_t;

static coda_status_t perr(const parser_t *ps, coda_status_t st, const char *fmt, ...)
    CODA_PRINTF(3, 4);
static coda_status_t perr(const parser_t *ps, coda_status_t st, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return coda__fail(st, "line %d: %s", ps->line, msg);
}

/* For messages: a token, cut to 40 bytes. */
#define TOK(tk) (int)((tk).n > 40 ? 40 : (tk).n), (tk).s

static int is(token_t tk, const char *word) {
    return strlen(word) == tk.n && memcmp(tk.s, word, tk.n) == 0;
}

/* ---- lexing ---- */

/* Cut the line [s, end) into tokens. */
static coda_status_t tokenize(parser_t *ps, const char *s, const char *end) {
    ps->nt = 0;
    while (s < end) {
        unsigned char c = (unsigned char)*s;
        if (c == ' ' || c == '\t') { s++; continue; }
        if (c == '#') break;
        if (c == '\r' && s + 1 == end) break;
        if (c < 0x21 || c > 0x7e)
            return perr(ps, CODA_ERR_PARSE, "unexpected byte 0x%02x (only printable ASCII, "
                        "spaces and tabs are allowed)", c);
        if (ps->nt == MAX_TOKENS)
            return perr(ps, CODA_ERR_PARSE, "too many tokens (a statement has at most 6)");
        token_t *tk = &ps->t[ps->nt++];
        tk->s = s;
        if (c == '=') {
            s++;
        } else {
            while (s < end && (unsigned char)*s > 0x20 && (unsigned char)*s < 0x7f &&
                   *s != '#' && *s != '=')
                s++;
        }
        tk->n = (size_t)(s - tk->s);
    }
    return CODA_OK;
}

/* ---- words ---- */

static int space_word(token_t tk, coda_space_t *space) {
    if (is(tk, "full")) *space = CODA_SPACE_FULL;
    else if (is(tk, "half")) *space = CODA_SPACE_HALF;
    else if (is(tk, "double")) *space = CODA_SPACE_DOUBLE;
    else return 0;
    return 1;
}

static int dtype_word(token_t tk, coda_dtype_t *dt) {
    static const coda_dtype_t all[] = {CODA_BF16, CODA_F32, CODA_F16, CODA_FP8_E4M3, CODA_I32};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (is(tk, coda_dtype_name(all[i]))) { *dt = all[i]; return 1; }
    return 0;
}

typedef struct kind_word {
    const char *word;
    coda_arg_kind_t kind;
    coda_reduce_t reduce;
    int has_dtype, has_space;
} kind_word_t;

static const kind_word_t in_kinds[] = {
    {"tile", CODA_IN_TILE, CODA_REDUCE_SUM, 1, 1},
    {"row", CODA_IN_ROW, CODA_REDUCE_SUM, 1, 0},
    {"col", CODA_IN_COL, CODA_REDUCE_SUM, 1, 1},
    {"scalar", CODA_IN_SCALAR, CODA_REDUCE_SUM, 0, 0},
    {"rowpart", CODA_IN_ROWPART, CODA_REDUCE_SUM, 0, 0},
};
static const kind_word_t out_kinds[] = {
    {"tile", CODA_OUT_TILE, CODA_REDUCE_SUM, 1, 1},
    {"rowsum", CODA_OUT_ROWRED, CODA_REDUCE_SUM, 0, 0},
    {"rowmax", CODA_OUT_ROWRED, CODA_REDUCE_MAX, 0, 0},
    {"rowsumsq", CODA_OUT_ROWRED, CODA_REDUCE_SUMSQ, 0, 0},
    {"colsum", CODA_OUT_COLRED, CODA_REDUCE_SUM, 0, 1},
    {"colmax", CODA_OUT_COLRED, CODA_REDUCE_MAX, 0, 1},
    {"colsumsq", CODA_OUT_COLRED, CODA_REDUCE_SUMSQ, 0, 1},
    {"lse", CODA_OUT_LSE, CODA_REDUCE_SUM, 0, 0},
};

#define N_IN_KINDS (sizeof in_kinds / sizeof in_kinds[0])
#define N_OUT_KINDS (sizeof out_kinds / sizeof out_kinds[0])

static const kind_word_t *find_kind(token_t tk, const kind_word_t *kinds, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (is(tk, kinds[i].word)) return &kinds[i];
    return NULL;
}

/* ---- names ---- */

/* A token used to define a new argument or value: a valid, unreserved name. */
static coda_status_t check_new_name(const parser_t *ps, token_t tk) {
    const char *why = coda__name_problem(tk.s, tk.n);
    if (why) return perr(ps, CODA_ERR_PARSE, "name '%.*s' %s", TOK(tk), why);
    return CODA_OK;
}

/* A token that refers to a name: must look like one, and not be a keyword
 * (`add acc x` is a common slip: acc is an op, not a value). */
static coda_status_t check_ref_syntax(const parser_t *ps, token_t tk, const char *opname) {
    if (coda__ident_problem(tk.s, tk.n))
        return perr(ps, CODA_ERR_PARSE, "%s: '%.*s' is not a name", opname, TOK(tk));
    if (coda__name_problem(tk.s, tk.n))
        return perr(ps, CODA_ERR_PARSE, "%s: '%.*s' is a reserved word, not a name%s", opname,
                    TOK(tk), is(tk, "acc") ? " (write 'a = acc', then use a)" : "");
    return CODA_OK;
}

static int def_line(const coda_program_t *p, int arg, int inst) {
    return arg >= 0 ? p->args[arg].line : p->insts[inst].line;
}

static coda_status_t check_undefined(const parser_t *ps, token_t tk) {
    int a, v;
    coda__program_lookup(ps->p, tk.s, tk.n, &a, &v);
    if (a >= 0 || v >= 0)
        return perr(ps, CODA_ERR_VERIFY, "name '%.*s' is already defined (line %d)", TOK(tk),
                    def_line(ps->p, a, v));
    return CODA_OK;
}

/* Resolve a value operand to its instruction id. */
static coda_status_t resolve_value(const parser_t *ps, token_t tk, const char *opname, int *id) {
    int a, v;
    coda__program_lookup(ps->p, tk.s, tk.n, &a, &v);
    if (v >= 0) { *id = v; return CODA_OK; }
    if (a >= 0)
        return perr(ps, CODA_ERR_VERIFY, "%s: '%.*s' is an argument, not a value (load it "
                    "first)", opname, TOK(tk));
    return perr(ps, CODA_ERR_VERIFY, "%s: '%.*s' is not defined", opname, TOK(tk));
}

/* Resolve an argument name to its index. */
static coda_status_t resolve_arg(const parser_t *ps, token_t tk, const char *opname, int *idx) {
    int a, v;
    coda__program_lookup(ps->p, tk.s, tk.n, &a, &v);
    if (a >= 0) { *idx = a; return CODA_OK; }
    if (v >= 0)
        return perr(ps, CODA_ERR_VERIFY, "%s: '%.*s' is a value, not an argument", opname,
                    TOK(tk));
    return perr(ps, CODA_ERR_VERIFY, "%s: '%.*s' is not defined", opname, TOK(tk));
}

static void set_name(char dst[CODA_NAME_MAX], token_t tk) {
    memcpy(dst, tk.s, tk.n); /* n <= 31: checked by coda__name_problem */
    dst[tk.n] = 0;
}

/* ---- statements ---- */

static coda_status_t parse_program(parser_t *ps) {
    if (ps->n_statements > 0)
        return perr(ps, CODA_ERR_PARSE, "'program' must be the first statement");
    if (ps->nt != 2)
        return perr(ps, CODA_ERR_PARSE, "expected 'program NAME'");
    const char *why = coda__ident_problem(ps->t[1].s, ps->t[1].n);
    if (why) return perr(ps, CODA_ERR_PARSE, "program name '%.*s' %s", TOK(ps->t[1]), why);
    set_name(ps->p->name, ps->t[1]);
    return CODA_OK;
}

/* in NAME KIND [DTYPE] [SPACE]   /   out NAME KIND [DTYPE] [SPACE] */
static coda_status_t parse_decl(parser_t *ps, int is_in) {
    const char *dir = is_in ? "in" : "out";
    if (ps->nt < 3) return perr(ps, CODA_ERR_PARSE, "expected '%s NAME KIND ...'", dir);
    token_t name = ps->t[1], kw = ps->t[2];
    CODA_TRY(check_new_name(ps, name));
    const kind_word_t *k = is_in ? find_kind(kw, in_kinds, N_IN_KINDS) : find_kind(kw, out_kinds, N_OUT_KINDS);
    if (!k) {
        const kind_word_t *other = is_in ? find_kind(kw, out_kinds, N_OUT_KINDS) : find_kind(kw, in_kinds, N_IN_KINDS);
        if (other)
            return perr(ps, CODA_ERR_PARSE, "%s %.*s: '%.*s' is %s kind", dir, TOK(name),
                        TOK(kw), is_in ? "an output" : "an input");
        return perr(ps, CODA_ERR_PARSE, "%s %.*s: unknown kind '%.*s' (expected %s)", dir,
                    TOK(name), TOK(kw),
                    is_in ? "tile, row, col, scalar or rowpart"
                          : "tile, rowsum, rowmax, rowsumsq, colsum, colmax, colsumsq or lse");
    }
    coda_dtype_t dtype = CODA_F32;
    coda_space_t space = CODA_SPACE_FULL;
    int at = 3;
    if (k->has_dtype) {
        if (at >= ps->nt || !dtype_word(ps->t[at], &dtype)) {
            if (at >= ps->nt)
                return perr(ps, CODA_ERR_PARSE, "%s %.*s: expected a dtype after '%s'", dir,
                            TOK(name), k->word);
            return perr(ps, CODA_ERR_PARSE, "%s %.*s: expected a dtype after '%s', got '%.*s'",
                        dir, TOK(name), k->word, TOK(ps->t[at]));
        }
        at++;
    }
    if (k->has_space && at < ps->nt && space_word(ps->t[at], &space)) at++;
    if (at < ps->nt) {
        coda_dtype_t d2;
        coda_space_t s2;
        if (!k->has_dtype && dtype_word(ps->t[at], &d2))
            return perr(ps, CODA_ERR_PARSE, "%s %.*s: %s takes no dtype (it is f32)", dir,
                        TOK(name), k->word);
        if (!k->has_space && space_word(ps->t[at], &s2))
            return perr(ps, CODA_ERR_PARSE, "%s %.*s: %s takes no column space", dir, TOK(name),
                        k->word);
        return perr(ps, CODA_ERR_PARSE, "%s %.*s: unexpected '%.*s'", dir, TOK(name),
                    TOK(ps->t[at]));
    }
    CODA_TRY(check_undefined(ps, name));
    coda_program_t *p = ps->p;
    if (p->n_args >= CODA_MAX_ARGS)
        return perr(ps, CODA_ERR_VERIFY, "too many arguments (limit %d)", CODA_MAX_ARGS);
    coda_arg_t *a = &p->args[p->n_args++];
    set_name(a->name, name);
    a->kind = k->kind;
    a->dtype = dtype;
    a->space = space;
    a->reduce = k->reduce;
    a->line = ps->line;
    return CODA_OK;
}

static coda_inst_t *new_inst(parser_t *ps, coda_op_t op) {
    coda_program_t *p = ps->p;
    coda_inst_t *in = &p->insts[p->n_insts++];
    memset(in, 0, sizeof *in);
    in->op = op;
    in->src[0] = in->src[1] = in->src[2] = -1;
    in->arg = -1;
    in->space = CODA_SPACE_FULL;
    in->line = ps->line;
    return in;
}

static coda_status_t check_room(const parser_t *ps) {
    if (ps->p->n_insts >= CODA_MAX_INSTS)
        return perr(ps, CODA_ERR_VERIFY, "too many instructions (limit %d)", CODA_MAX_INSTS);
    return CODA_OK;
}

/* store OUT v  /  reduce OUT v  /  lse OUT v t */
static coda_status_t parse_write(parser_t *ps, coda_op_t op) {
    const char *opname = coda_op_name(op);
    int n_vals = coda__ops[op].n_src;
    if (ps->nt != 2 + n_vals)
        return perr(ps, CODA_ERR_PARSE, "expected '%s %s'", opname, coda__ops[op].syntax);
    for (int k = 1; k < ps->nt; k++) CODA_TRY(check_ref_syntax(ps, ps->t[k], opname));
    int arg, src[2] = {-1, -1};
    CODA_TRY(resolve_arg(ps, ps->t[1], opname, &arg));
    for (int k = 0; k < n_vals; k++) CODA_TRY(resolve_value(ps, ps->t[2 + k], opname, &src[k]));
    CODA_TRY(check_room(ps));
    coda_inst_t *in = new_inst(ps, op);
    in->arg = arg;
    in->src[0] = src[0];
    in->src[1] = src[1];
    return CODA_OK;
}

static coda_status_t parse_number(const parser_t *ps, token_t tk, float *out) {
    char buf[128];
    if (tk.n >= sizeof buf)
        return perr(ps, CODA_ERR_PARSE, "const: number '%.*s...' is too long", TOK(tk));
    memcpy(buf, tk.s, tk.n);
    buf[tk.n] = 0;
    char *end;
    float f = coda__strtof(buf, &end);
    if (end == buf || *end != 0)
        return perr(ps, CODA_ERR_PARSE, "const: '%.*s' is not a number", TOK(tk));
    if (!isfinite(f))
        return perr(ps, CODA_ERR_PARSE, "const: '%.*s' is not a finite float", TOK(tk));
    *out = f;
    return CODA_OK;
}

/* NAME = OP operands... */
static coda_status_t parse_value(parser_t *ps) {
    token_t name = ps->t[0];
    CODA_TRY(check_new_name(ps, name));
    if (ps->nt < 3) return perr(ps, CODA_ERR_PARSE, "expected an op after '='");
    token_t optk = ps->t[2];
    char opbuf[16] = "";
    if (optk.n < sizeof opbuf) { memcpy(opbuf, optk.s, optk.n); opbuf[optk.n] = 0; }
    int op = coda__op_from_name(opbuf);
    if (op < 0) return perr(ps, CODA_ERR_PARSE, "unknown op '%.*s'", TOK(optk));
    int arity = coda__op_arity((coda_op_t)op);
    if (arity < 0)
        return perr(ps, CODA_ERR_PARSE, "'%s' is a statement and defines no value (write "
                    "'%s OUT ...')", opbuf, opbuf);
    int n_opnd = ps->nt - 3;

    /* syntax */
    float imm = 0;
    coda_space_t space = CODA_SPACE_FULL;
    switch (op) {
    case CODA_OP_ACC:
    case CODA_OP_ROWIDX:
        if (n_opnd != 0) return perr(ps, CODA_ERR_PARSE, "%s takes no operands", opbuf);
        break;
    case CODA_OP_LOAD:
        if (n_opnd != 1) return perr(ps, CODA_ERR_PARSE, "expected 'load ARG'");
        CODA_TRY(check_ref_syntax(ps, ps->t[3], "load"));
        break;
    case CODA_OP_CONST:
        if (n_opnd != 1) return perr(ps, CODA_ERR_PARSE, "expected 'const NUMBER'");
        CODA_TRY(parse_number(ps, ps->t[3], &imm));
        break;
    case CODA_OP_COLIDX:
        if (n_opnd > 1) return perr(ps, CODA_ERR_PARSE, "expected 'colidx [SPACE]'");
        if (n_opnd == 1 && !space_word(ps->t[3], &space))
            return perr(ps, CODA_ERR_PARSE, "colidx: '%.*s' is not a column space (half, full, "
                        "double)", TOK(ps->t[3]));
        break;
    default:
        if (n_opnd != arity)
            return perr(ps, CODA_ERR_PARSE, "%s takes %d operand%s, got %d", opbuf, arity,
                        arity == 1 ? "" : "s", n_opnd);
        for (int k = 0; k < arity; k++) CODA_TRY(check_ref_syntax(ps, ps->t[3 + k], opbuf));
        break;
    }

    /* names */
    CODA_TRY(check_undefined(ps, name));
    int arg = -1, src[3] = {-1, -1, -1};
    if (op == CODA_OP_LOAD) CODA_TRY(resolve_arg(ps, ps->t[3], "load", &arg));
    if (arity > 0)
        for (int k = 0; k < arity; k++) CODA_TRY(resolve_value(ps, ps->t[3 + k], opbuf, &src[k]));
    CODA_TRY(check_room(ps));
    coda_inst_t *in = new_inst(ps, (coda_op_t)op);
    set_name(in->name, name);
    memcpy(in->src, src, sizeof src);
    in->arg = arg;
    in->imm = imm;
    in->space = space;
    return CODA_OK;
}

static coda_status_t parse_statement(parser_t *ps) {
    token_t t0 = ps->t[0];
    if (is(t0, "program")) return parse_program(ps);
    if (is(t0, "in")) return parse_decl(ps, 1);
    if (is(t0, "out")) return parse_decl(ps, 0);
    if (is(t0, "store")) return parse_write(ps, CODA_OP_STORE);
    if (is(t0, "reduce")) return parse_write(ps, CODA_OP_REDUCE);
    if (is(t0, "lse")) return parse_write(ps, CODA_OP_LSE);
    if (ps->nt >= 2 && is(ps->t[1], "=")) return parse_value(ps);
    if (is(t0, "="))
        return perr(ps, CODA_ERR_PARSE, "expected a name before '='");
    return perr(ps, CODA_ERR_PARSE, "unknown statement '%.*s' (expected in, out, store, "
                "reduce, lse or NAME = OP ...)", TOK(t0));
}

static coda_status_t parse_all(parser_t *ps, const char *text) {
    const char *s = text;
    for (;;) {
        if (ps->line == INT_MAX) return perr(ps, CODA_ERR_PARSE, "too many lines");
        ps->line++;
        const char *end = strchr(s, '\n');
        if (!end) end = s + strlen(s);
        CODA_TRY(tokenize(ps, s, end));
        if (ps->nt > 0) {
            CODA_TRY(parse_statement(ps));
            ps->n_statements++;
        }
        if (!*end) break;
        s = end + 1;
    }
    return CODA_OK;
}

coda_status_t coda_program_parse(const char *text, coda_program_t **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_parse: out is NULL");
    *out = NULL;
    if (!text) return coda__fail(CODA_ERR_INVALID_ARG, "coda_program_parse: text is NULL");
    parser_t ps;
    memset(&ps, 0, sizeof ps);
    ps.p = coda__program_alloc();
    if (!ps.p) return coda__fail(CODA_ERR_NO_MEMORY, "coda_program_parse: out of memory");
    coda_status_t st = parse_all(&ps, text);
    if (st == CODA_OK && ps.p->n_args == 0 && ps.p->n_insts == 0)
        st = perr(&ps, CODA_ERR_VERIFY, "program is empty (it must write an output)");
    if (st == CODA_OK) st = coda__program_verify(ps.p);
    if (st != CODA_OK) {
        coda_program_free(ps.p);
        return st;
    }
    *out = ps.p;
    return CODA_OK;
}
