/* test_program.c - epilogue programs: parser, printer, verifier, C builder.
 *
 *   1. round trips of LLaMA-style programs and of every op and declaration
 *   2. the verifier's shape/space annotations
 *   3. the builder gives the parser's text; made-up names never clash
 *   4. malformed programs: status, line number and a key phrase
 *   5. builder misuse, introspection, print buffer sizes, limits
 *   6. random valid programs (builder -> print -> parse -> print)
 *   7. random mutations of good programs never crash, and round-trip if OK
 *   8. the example files in tests/programs/
 */
#include "harness.h"

#include <dirent.h>
#include <locale.h>

#define BUF 65536
static char buf_a[BUF], buf_b[BUF];

/* Print p into buf (BUF bytes); "" on failure (a CHECK fails). */
static const char *print_into(const coda_program_t *p, char *buf) {
    size_t len = 0;
    coda_status_t st = coda_program_print(p, buf, BUF, &len);
    CHECK(st == CODA_OK, "print: %s", coda_last_error());
    CHECK(st != CODA_OK || strlen(buf) == len, "print: len %zu, strlen %zu", len, strlen(buf));
    if (st != CODA_OK) buf[0] = 0;
    return buf;
}

/* parse(text) is OK; print it; parse and print again: identical. If canonical
 * is given, the first print must equal it. Returns the parsed program. */
static coda_program_t *round_trip(const char *what, const char *text, const char *canonical) {
    coda_program_t *p = NULL, *q = NULL;
    coda_status_t st = coda_program_parse(text, &p);
    CHECK(st == CODA_OK, "%s: parse -> %s: %s", what, coda_status_name(st), coda_last_error());
    if (st != CODA_OK) return NULL;
    print_into(p, buf_a);
    if (canonical)
        CHECK(strcmp(buf_a, canonical) == 0, "%s: printed\n%s\nwanted\n%s", what, buf_a,
              canonical);
    st = coda_program_parse(buf_a, &q);
    CHECK(st == CODA_OK, "%s: re-parse -> %s: %s\n%s", what, coda_status_name(st),
          coda_last_error(), buf_a);
    if (st == CODA_OK) {
        print_into(q, buf_b);
        CHECK(strcmp(buf_a, buf_b) == 0, "%s: second print differs\n%s\n---\n%s", what, buf_a,
              buf_b);
    }
    coda_program_free(q);
    return p;
}

/* ---- 1. programs of the LLaMA block ---- */

/* O-proj: residual add, store h and h*g2, partial sums of squares of the
 * stored (rounded) h. */
static const char *oproj_text =
    "program oproj\n"
    "in  x   tile bf16        # residual stream\n"
    "in  g2  col  bf16\n"
    "out h   tile bf16\n"
    "out hg  tile bf16\n"
    "out ss  rowsum\n"
    "a  = acc\n"
    "xr = load x\n"
    "s  = add a xr\n"
    "h1 = round_bf16 s\n"
    "store h h1\n"
    "gv = load g2\n"
    "n  = mul h1 gv\n"
    "store hg n\n"
    "sq = mul h1 h1\n"
    "reduce ss sq\n";
static const char *oproj_canonical =
    "program oproj\n"
    "in x tile bf16\n"
    "in g2 col bf16\n"
    "out h tile bf16\n"
    "out hg tile bf16\n"
    "out ss rowsum\n"
    "a = acc\n"
    "xr = load x\n"
    "s = add a xr\n"
    "h1 = round_bf16 s\n"
    "store h h1\n"
    "gv = load g2\n"
    "n = mul h1 gv\n"
    "store hg n\n"
    "sq = mul h1 h1\n"
    "reduce ss sq\n";

/* gate/up: z = r2 * acc (saved), c = silu(z_even) * z_odd in the half space. */
static const char *swiglu_text =
    "program gate_up\n"
    "in r2 row f32\n"
    "out z tile bf16\n"
    "out c tile bf16 half\n"
    "a = acc\n"
    "r = load r2\n"
    "zz = mul a r\n"
    "store z zz\n"
    "g = even zz\n"
    "u = odd zz\n"
    "sg = silu g\n"
    "cc = mul sg u\n"
    "store c cc\n";

/* down dgrad + SwiGLU backward: z pairs are read from a (M, 2I) tensor, so
 * they sit in the double space; (dg, du) are interleaved back into it. */
static const char *swiglu_bwd_text =
    "program swiglu_bwd\n"
    "in z tile bf16 double\n"
    "out dz tile bf16 double\n"
    "out c tile bf16\n"
    "out s2 rowsum\n"
    "dc = acc\n"
    "zv = load z\n"
    "g = even zv\n"
    "u = odd zv\n"
    "sg = silu g\n"
    "ds = dsilu g\n"
    "t = mul dc u\n"
    "dg = mul t ds\n"
    "du = mul dc sg\n"
    "dzv = interleave dg du\n"
    "store dz dzv\n"
    "cv = mul sg u\n"
    "store c cv\n"
    "p1 = mul dg g\n"
    "p2 = fma du u p1\n"
    "reduce s2 p2\n";

/* QKV + RoPE: z = r1 * acc; angle = pos * theta^(-2i/D), pairs (2j, 2j+1). */
static const char *rope_text =
    "program qkv_rope\n"
    "in r1 row f32\n"
    "in theta scalar\n"
    "out q tile bf16\n"
    "a = acc\n"
    "r = load r1\n"
    "z = mul a r\n"
    "ri = rowidx\n"
    "seq = const 8192\n"
    "pos = mod ri seq\n"
    "j = colidx half\n"
    "hd = const 64\n"
    "i = mod j hd\n"
    "k = const -0.015625\n"
    "e = mul i k\n"
    "th = load theta\n"
    "f = pow th e\n"
    "ang = mul pos f\n"
    "cs = cos ang\n"
    "sn = sin ang\n"
    "x0 = even z\n"
    "x1 = odd z\n"
    "m0 = mul x1 sn\n"
    "n0 = neg m0\n"
    "y0 = fma x0 cs n0\n"
    "m1 = mul x1 cs\n"
    "y1 = fma x0 sn m1\n"
    "y = interleave y0 y1\n"
    "store q y\n";

/* RoPE with swap: y = z*cos + swap(z)*sign*sin, sign = -1 on even columns. */
static const char *rope_swap_text =
    "program rope_swap\n"
    "in cosv tile f32\n"
    "in sinv tile f32\n"
    "out q tile bf16\n"
    "z = acc\n"
    "zs = swap z\n"
    "c = colidx\n"
    "two = const 2\n"
    "par = mod c two\n"
    "one = const 1\n"
    "mone = const -1\n"
    "sign = select par one mone\n"
    "cv = load cosv\n"
    "sv = load sinv\n"
    "t = mul zs sv\n"
    "t2 = mul t sign\n"
    "y = fma z cv t2\n"
    "store q y\n";

/* LM head: z = rf * acc; online log-sum-exp with the target pick. */
static const char *lse_text =
    "program lm_head\n"
    "in rf row f32\n"
    "in tgt row i32\n"
    "out l lse\n"
    "a = acc\n"
    "r = load rf\n"
    "z = mul a r\n"
    "t = load tgt\n"
    "lse l z t\n";

/* Every op and every declaration form. */
static const char *all_ops_text =
    "program all_ops\n"
    "in ta tile bf16\n"
    "in tb tile f32 half\n"
    "in tc tile bf16 double\n"
    "in ra row bf16\n"
    "in rb row f32\n"
    "in rc row i32\n"
    "in ca col bf16\n"
    "in cb col f32 half\n"
    "in cc col f32 double\n"
    "in s scalar\n"
    "out o1 tile bf16\n"
    "out o2 tile f32 half\n"
    "out o3 tile bf16 double\n"
    "out r1 rowsum\n"
    "out r2 rowmax\n"
    "out r3 rowsumsq\n"
    "out c1 colsum\n"
    "out c2 colmax half\n"
    "out c3 colsumsq double\n"
    "out l lse\n"
    "a = acc\n"
    "vta = load ta\n"
    "vtb = load tb\n"
    "vtc = load tc\n"
    "vra = load ra\n"
    "vrb = load rb\n"
    "vrc = load rc\n"
    "vca = load ca\n"
    "vcb = load cb\n"
    "vcc = load cc\n"
    "vs = load s\n"
    "k = const 0.5\n"
    "ri = rowidx\n"
    "ci = colidx\n"
    "cih = colidx half\n"
    "cid = colidx double\n"
    "u1 = neg a\n"
    "u2 = abs u1\n"
    "u3 = exp u2\n"
    "u4 = log u3\n"
    "u5 = sqrt u3\n"
    "u6 = rsqrt u3\n"
    "u7 = recip u6\n"
    "u8 = sin u7\n"
    "u9 = cos u8\n"
    "u10 = tanh u9\n"
    "u11 = sigmoid u10\n"
    "u12 = silu u11\n"
    "u13 = dsilu u12\n"
    "u14 = square u13\n"
    "u15 = round_bf16 u14\n"
    "b1 = add u15 vta\n"
    "b2 = sub b1 vra\n"
    "b3 = mul b2 vca\n"
    "b4 = div b3 vs\n"
    "b5 = max b4 k\n"
    "b6 = min b5 ri\n"
    "b7 = pow b6 k\n"
    "b8 = eq b7 ci\n"
    "b9 = lt b8 vrb\n"
    "b10 = mod b9 vrc\n"
    "f1 = fma b10 a vta\n"
    "f2 = select b8 f1 a\n"
    "e1 = even f2\n"
    "e2 = odd f2\n"
    "e3 = add e1 vtb\n"
    "e4 = mul e3 vcb\n"
    "e5 = add e4 cih\n"
    "e6 = even vtc\n"
    "e7 = odd vcc\n"
    "e8 = mul e6 e7\n"
    "e9 = add e8 ci\n"
    "w1 = swap f2\n"
    "w2 = interleave e5 e2\n"
    "w3 = interleave w1 e9\n"
    "w4 = add w3 cid\n"
    "store o1 w2\n"
    "store o2 e5\n"
    "store o3 w4\n"
    "reduce r1 f2\n"
    "reduce r2 w1\n"
    "reduce r3 a\n"
    "reduce c1 f1\n"
    "reduce c2 e4\n"
    "reduce c3 w3\n"
    "lse l a vs\n";

/* Consts: printed with %.9g, read back bit for bit. Broadcast stores. */
static const char *consts_text =
    "program consts\n"
    "out o1 tile f32\n"
    "out o2 tile f32 half\n"
    "out o3 tile bf16 double\n"
    "out o4 tile bf16\n"
    "out o5 tile f32\n"
    "out o6 tile f32\n"
    "out o7 tile f32\n"
    "a = const 0.1\n"
    "b = const -0\n"
    "c = const 3.40282347e+38\n"
    "d = const 1.40129846e-45\n"
    "e = const 1.17549435e-38\n"
    "f = const 16777217\n"
    "g = const -2.5e-05\n"
    "store o1 a\n"
    "store o2 b\n"
    "store o3 c\n"
    "store o4 d\n"
    "store o5 e\n"
    "store o6 f\n"
    "store o7 g\n";

static void test_round_trips(void) {
    coda_program_t *p = round_trip("oproj", oproj_text, oproj_canonical);
    coda_program_free(p);
    const char *progs[][2] = {
        {"gate_up", swiglu_text},  {"swiglu_bwd", swiglu_bwd_text}, {"qkv_rope", rope_text},
        {"rope_swap", rope_swap_text}, {"lm_head", lse_text}, {"all_ops", all_ops_text},
    };
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
        /* these are written canonically already */
        p = round_trip(progs[i][0], progs[i][1], progs[i][1]);
        coda_program_free(p);
    }

    /* consts: the printed text is canonical and the floats survive exactly */
    p = round_trip("consts", consts_text, NULL);
    if (p) {
        const float want[] = {0.1f, -0.0f, 3.40282347e+38f, 1.40129846e-45f, 1.17549435e-38f,
                              16777216.0f, -2.5e-05f};
        coda_program_t *q = NULL;
        print_into(p, buf_a);
        CHECK_OK(coda_program_parse(buf_a, &q));
        for (int i = 0; q && i < 7; i++) {
            /* find value i by its (single-letter) name through the print */
            char line[64];
            snprintf(line, sizeof line, "%c = const %.9g\n", 'a' + i, (double)want[i]);
            CHECK(strstr(buf_a, line) != NULL, "const %d: '%s' not in\n%s", i, line, buf_a);
        }
        CHECK(strstr(buf_a, "b = const -0\n") != NULL, "negative zero lost:\n%s", buf_a);
        coda_program_free(q);
    }
    coda_program_free(p);

    /* Layout freedom: tabs, \r\n, comments, blank lines, '=' without spaces,
     * explicit 'full', no program line. */
    const char *loose =
        "\n# leading comment\n\t\n"
        "in\tx tile bf16 full   # explicit full space\r\n"
        "out h tile f32 full\r\n"
        "out cs colsum full\n"
        "a=acc\n"
        "  b =load x#comment right after a token\n"
        "c= colidx full\n"
        "d = add a b\n"
        "e = add d c\n"
        "store h e\n"
        "reduce cs e";
    const char *loose_canonical =
        "program anonymous\n"
        "in x tile bf16\n"
        "out h tile f32\n"
        "out cs colsum\n"
        "a = acc\n"
        "b = load x\n"
        "c = colidx\n"
        "d = add a b\n"
        "e = add d c\n"
        "store h e\n"
        "reduce cs e\n";
    p = round_trip("loose", loose, loose_canonical);
    coda_program_free(p);

    /* declarations may follow instructions; the printer moves them first */
    p = round_trip("late declaration", "a = acc\nout h tile bf16\nb = neg a\nstore h b\n",
                   "program anonymous\nout h tile bf16\na = acc\nb = neg a\nstore h b\n");
    coda_program_free(p);

    /* limits that are fine: 31-char names, 64 args, 1024 instructions */
    char *big = h_alloc(200000);
    size_t n = 0;
    n += sprintf(big + n, "program abcdefghijklmnopqrstuvwxyz01234\n");
    n += sprintf(big + n, "out abcdefghijklmnopqrstuvwxyz01234 tile f32\n");
    for (int i = 1; i < 64; i++) n += sprintf(big + n, "in a%d scalar\n", i);
    n += sprintf(big + n, "v0 = acc\n");
    for (int i = 1; i < 1023; i++) n += sprintf(big + n, "v%d = neg v%d\n", i, i - 1);
    n += sprintf(big + n, "store abcdefghijklmnopqrstuvwxyz01234 v1022\n");
    p = round_trip("limits", big, NULL);
    CHECK(p && coda_program_num_args(p) == 64, "64 args");
    coda_program_free(p);

    /* the longest lines: ternary ops on 31-character names */
#define L31(c) c "bcdefghijklmnopqrstuvwxyz01234"
    const char *longest =
        "program " L31("p") "\n"
        "in " L31("x") " tile bf16 double\n"
        "out " L31("o") " tile bf16 double\n"
        "out " L31("r") " colsumsq double\n"
        L31("a") " = load " L31("x") "\n"
        L31("b") " = colidx double\n"
        L31("c") " = select " L31("a") " " L31("b") " " L31("a") "\n"
        L31("d") " = fma " L31("c") " " L31("c") " " L31("c") "\n"
        L31("e") " = const -1.17549435e-38\n"
        L31("f") " = even " L31("d") "\n"
        L31("g") " = interleave " L31("f") " " L31("f") "\n"
        "store " L31("o") " " L31("g") "\n"
        "reduce " L31("r") " " L31("g") "\n";
#undef L31
    p = round_trip("longest lines", longest, longest);
    coda_program_free(p);
    free(big);
}

/* ---- 2. annotations ---- */

/* Shape and space the verifier gave value `name` (found through the printer's
 * order: the n-th instruction). We reach the IR through the internal header. */
#include "program/ir.h"

static const coda_inst_t *inst_named(const coda_program_t *p, const char *name) {
    for (int i = 0; i < p->n_insts; i++)
        if (strcmp(p->insts[i].name, name) == 0) return &p->insts[i];
    return NULL;
}

static void expect_shape(const coda_program_t *p, const char *name, coda_shape_t shape,
                         coda_space_t space) {
    const coda_inst_t *in = inst_named(p, name);
    CHECK(in != NULL, "no value %s", name);
    if (!in) return;
    CHECK(in->shape == shape, "%s: shape %d, want %d", name, in->shape, shape);
    if (shape & CODA_SHAPE_COL)
        CHECK(in->vspace == space, "%s: space %d, want %d", name, in->vspace, space);
}

static void test_annotations(void) {
    coda_program_t *p = NULL;
    CHECK_OK(coda_program_parse(rope_text, &p));
    if (p) {
        expect_shape(p, "a", CODA_SHAPE_TILE, CODA_SPACE_FULL);
        expect_shape(p, "r", CODA_SHAPE_ROW, 0);
        expect_shape(p, "seq", CODA_SHAPE_SCALAR, 0);
        expect_shape(p, "pos", CODA_SHAPE_ROW, 0);
        expect_shape(p, "j", CODA_SHAPE_COL, CODA_SPACE_HALF);
        expect_shape(p, "f", CODA_SHAPE_COL, CODA_SPACE_HALF);
        expect_shape(p, "ang", CODA_SHAPE_TILE, CODA_SPACE_HALF);
        expect_shape(p, "x0", CODA_SHAPE_TILE, CODA_SPACE_HALF);
        expect_shape(p, "y", CODA_SHAPE_TILE, CODA_SPACE_FULL);
        expect_shape(p, "th", CODA_SHAPE_SCALAR, 0);
    }
    coda_program_free(p);
    p = NULL;
    CHECK_OK(coda_program_parse(all_ops_text, &p));
    if (p) {
        expect_shape(p, "vtb", CODA_SHAPE_TILE, CODA_SPACE_HALF);
        expect_shape(p, "vtc", CODA_SHAPE_TILE, CODA_SPACE_DOUBLE);
        expect_shape(p, "vcc", CODA_SHAPE_COL, CODA_SPACE_DOUBLE);
        expect_shape(p, "vrc", CODA_SHAPE_ROW, 0);
        expect_shape(p, "e6", CODA_SHAPE_TILE, CODA_SPACE_FULL);
        expect_shape(p, "e7", CODA_SHAPE_COL, CODA_SPACE_FULL);
        expect_shape(p, "e8", CODA_SHAPE_TILE, CODA_SPACE_FULL);
        expect_shape(p, "cid", CODA_SHAPE_COL, CODA_SPACE_DOUBLE);
        expect_shape(p, "w3", CODA_SHAPE_TILE, CODA_SPACE_DOUBLE);
        expect_shape(p, "b6", CODA_SHAPE_TILE, CODA_SPACE_FULL);
        CHECK(p->insts[p->n_insts - 1].op == CODA_OP_LSE, "last op is lse");
    }
    coda_program_free(p);
    p = NULL;
    /* a row op a scalar stays a row; row op col is a tile */
    CHECK_OK(coda_program_parse("in r row f32\nin c col f32 half\nout o tile f32 half\n"
                                "x = load r\ny = const 2\nz = mul x y\nw = load c\nt = add z w\n"
                                "store o t\n", &p));
    if (p) {
        expect_shape(p, "z", CODA_SHAPE_ROW, 0);
        expect_shape(p, "t", CODA_SHAPE_TILE, CODA_SPACE_HALF);
    }
    coda_program_free(p);
}

/* ---- 3. the builder ---- */

static coda_program_t *build_oproj(int named) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_new(named ? "oproj" : NULL, &p));
#define N(s) (named ? (s) : NULL)
    int x = coda_program_arg(p, N("x"), CODA_IN_TILE, CODA_BF16, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int g2 = coda_program_arg(p, N("g2"), CODA_IN_COL, CODA_BF16, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int h = coda_program_arg(p, N("h"), CODA_OUT_TILE, CODA_BF16, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int hg = coda_program_arg(p, N("hg"), CODA_OUT_TILE, CODA_BF16, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    /* dtype and space are ignored for partials: pass odd but valid values */
    int ss = coda_program_arg(p, N("ss"), CODA_OUT_ROWRED, CODA_BF16, CODA_SPACE_HALF,
                              CODA_REDUCE_SUM);
    int a = coda_program_value(p, N("a"), CODA_OP_ACC, -1, -1, -1);
    int xr = coda_program_load(p, N("xr"), x);
    int s = coda_program_value(p, N("s"), CODA_OP_ADD, a, xr, -1);
    int h1 = coda_program_value(p, N("h1"), CODA_OP_ROUND_BF16, s, -1, -1);
    CHECK(coda_program_store(p, h, h1) >= 0, "store h");
    int gv = coda_program_load(p, N("gv"), g2);
    int n = coda_program_value(p, N("n"), CODA_OP_MUL, h1, gv, -1);
    CHECK(coda_program_store(p, hg, n) >= 0, "store hg");
    int sq = coda_program_value(p, N("sq"), CODA_OP_MUL, h1, h1, -1);
    CHECK(coda_program_store(p, ss, sq) >= 0, "reduce ss");
#undef N
    CHECK(x == 0 && g2 == 1 && h == 2 && hg == 3 && ss == 4, "arg indices");
    CHECK(a == 0 && xr == 1 && s == 2 && h1 == 3 && gv == 5 && n == 6 && sq == 8, "value ids");
    return p;
}

/* coda__program_acc_bf16: the accumulator read only through round_bf16
 * (the GPU may then hold finished tiles as bf16: gemm_overlap.cuh) */
static void test_acc_bf16(void) {
    static const struct {
        const char *text;
        int want;
    } cases[] = {
        {"program p\nout y tile f32\na = acc\nb = round_bf16 a\nstore y b\n", 1},
        {"program p\nout y tile f32\na = acc\nb = round_bf16 a\nc = round_bf16 a\nd = add b c\nstore y d\n", 1},
        {"program p\nout y tile f32\nc = const 1\nstore y c\n", 1}, /* no accumulator read */
        {"program p\nout y tile f32\na = acc\nstore y a\n", 0},
        {"program p\nout y tile f32\na = acc\nb = round_bf16 a\nc = add a b\nstore y c\n", 0},
        {"program p\nout s rowsum\na = acc\nreduce s a\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        coda_program_t *p = NULL;
        CHECK_OK(coda_program_parse(cases[i].text, &p));
        if (p) CHECK(coda__program_acc_bf16(p) == cases[i].want, "acc_bf16 case %zu: got %d", i, !cases[i].want);
        coda_program_free(p);
    }
    /* the built-ins: gate/up and QKV + RoPE round first (docs/gpu.md), the rest read acc as it is */
    for (const char *const *name = coda_builtin_program_names(); *name; name++) {
        coda_program_t *p = NULL;
        CHECK_OK(coda_program_parse(coda_builtin_program(*name), &p));
        const int want = strncmp(*name, "gateup_swiglu", 13) == 0 || strcmp(*name, "qkv_rope") == 0;
        if (p) CHECK(coda__program_acc_bf16(p) == want, "%s: acc_bf16 %d, want %d", *name, !want, want);
        coda_program_free(p);
    }
}

static void test_builder(void) {
    /* same text as the parser */
    coda_program_t *p = build_oproj(1);
    CHECK_OK(coda_program_finish(p));
    CHECK(strcmp(print_into(p, buf_a), oproj_canonical) == 0, "builder text:\n%s", buf_a);
    coda_program_free(p);

    /* gate/up with pairs, built in C: the parser's text again */
    REQUIRE_OK(coda_program_new("gate_up", &p));
    int r2 = coda_program_arg(p, "r2", CODA_IN_ROW, CODA_F32, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int z = coda_program_arg(p, "z", CODA_OUT_TILE, CODA_BF16, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int c = coda_program_arg(p, "c", CODA_OUT_TILE, CODA_BF16, CODA_SPACE_HALF, CODA_REDUCE_SUM);
    int a = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    int r = coda_program_load(p, "r", r2);
    int zz = coda_program_value(p, "zz", CODA_OP_MUL, a, r, -1);
    coda_program_store(p, z, zz);
    int g = coda_program_value(p, "g", CODA_OP_EVEN, zz, -1, -1);
    int u = coda_program_value(p, "u", CODA_OP_ODD, zz, -1, -1);
    int sg = coda_program_value(p, "sg", CODA_OP_SILU, g, -1, -1);
    int cc = coda_program_value(p, "cc", CODA_OP_MUL, sg, u, -1);
    coda_program_store(p, c, cc);
    CHECK_OK(coda_program_finish(p));
    CHECK(strcmp(print_into(p, buf_a), swiglu_text) == 0, "builder gate_up:\n%s", buf_a);
    coda_program_free(p);

    /* made-up names: the printed program parses and prints the same */
    p = build_oproj(0);
    CHECK_OK(coda_program_finish(p));
    print_into(p, buf_a);
    coda_program_t *q = NULL;
    CHECK_OK(coda_program_parse(buf_a, &q));
    if (q) CHECK(strcmp(print_into(q, buf_b), buf_a) == 0, "unnamed:\n%s\n---\n%s", buf_a, buf_b);
    CHECK(strncmp(buf_a, "program anonymous\n", 18) == 0, "anonymous program:\n%s", buf_a);
    coda_program_free(q);
    coda_program_free(p);

    /* made-up names avoid the user's, including ones that look made up */
    REQUIRE_OK(coda_program_new(NULL, &p));
    int o = coda_program_arg(p, "_a1", CODA_OUT_TILE, CODA_F32, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int o2 = coda_program_arg(p, NULL, CODA_OUT_TILE, CODA_F32, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int v0 = coda_program_value(p, "_v1", CODA_OP_ACC, -1, -1, -1);
    int v1 = coda_program_value(p, NULL, CODA_OP_NEG, v0, -1, -1);
    int v2 = coda_program_value(p, "_v1_1", CODA_OP_NEG, v1, -1, -1);
    int v3 = coda_program_value(p, "", CODA_OP_NEG, v2, -1, -1);
    coda_program_store(p, o, v3);
    coda_program_store(p, o2, v1);
    CHECK_OK(coda_program_finish(p));
    print_into(p, buf_a);
    CHECK(strstr(buf_a, "_v1_2 = neg _v1\n") != NULL, "made-up names:\n%s", buf_a);
    CHECK(strstr(buf_a, "out _a1_1 tile f32\n") != NULL, "made-up arg names:\n%s", buf_a);
    q = NULL;
    CHECK_OK(coda_program_parse(buf_a, &q));
    if (q) CHECK(strcmp(print_into(q, buf_b), buf_a) == 0, "clash:\n%s\n---\n%s", buf_a, buf_b);
    coda_program_free(q);
    coda_program_free(p);

    /* introspection */
    p = NULL;
    CHECK_OK(coda_program_parse(all_ops_text, &p));
    if (p) {
        CHECK(coda_program_num_args(p) == 20, "num_args %d", coda_program_num_args(p));
        const char *name = NULL;
        coda_arg_kind_t kind;
        coda_dtype_t dtype;
        coda_space_t space;
        coda_reduce_t red;
        int i = coda_program_find_arg(p, "c2");
        CHECK(i == 17, "find_arg c2 = %d", i);
        CHECK_OK(coda_program_arg_info(p, i, &name, &kind, &dtype, &space, &red));
        CHECK(strcmp(name, "c2") == 0 && kind == CODA_OUT_COLRED && dtype == CODA_F32 &&
              space == CODA_SPACE_HALF && red == CODA_REDUCE_MAX, "arg_info c2");
        CHECK_OK(coda_program_arg_info(p, 5, NULL, &kind, &dtype, NULL, NULL));
        CHECK(kind == CODA_IN_ROW && dtype == CODA_I32, "arg_info rc");
        CHECK(coda_program_find_arg(p, "nope") == -1, "find_arg nope");
        CHECK(coda_program_find_arg(p, "a") == -1, "find_arg of a value");
        CHECK(coda_program_find_arg(p, NULL) == -1, "find_arg NULL");
        CHECK_STATUS(coda_program_arg_info(p, 20, &name, NULL, NULL, NULL, NULL),
                     CODA_ERR_INVALID_ARG);
        CHECK_STATUS(coda_program_arg_info(p, -1, &name, NULL, NULL, NULL, NULL),
                     CODA_ERR_INVALID_ARG);
    }
    coda_program_free(p);
    CHECK(coda_program_num_args(NULL) == -1, "num_args NULL");
    CHECK(coda_program_find_arg(NULL, "x") == -1, "find_arg on NULL");
    CHECK_STATUS(coda_program_arg_info(NULL, 0, NULL, NULL, NULL, NULL, NULL),
                 CODA_ERR_INVALID_ARG);
    coda_program_free(NULL);
}

/* ---- 4. malformed programs ---- */

typedef struct bad {
    const char *text;
    coda_status_t status;
    int line;
    const char *phrase;
} bad_t;

#define P CODA_ERR_PARSE
#define V CODA_ERR_VERIFY
#define HDR "in x tile bf16\nout h tile bf16\na = acc\n" /* lines 1-3 */
static const bad_t bads[] = {
    /* declarations */
    {"in x tile\n", P, 1, "expected a dtype after 'tile'"},
    {"in x tile bf17\n", P, 1, "got 'bf17'"},
    {"in x rowsum\n", P, 1, "'rowsum' is an output kind"},
    {"out x row bf16\n", P, 1, "'row' is an input kind"},
    {"in x blob bf16\n", P, 1, "unknown kind 'blob'"},
    {"in eps scalar f32\n", P, 1, "scalar takes no dtype"},
    {"in ss rowpart f32\n", P, 1, "rowpart takes no dtype"},
    {"out ss rowpart\n", P, 1, "'rowpart' is an input kind"},
    {"out s rowsum half\n", P, 1, "rowsum takes no column space"},
    {"out l lse f32\n", P, 1, "lse takes no dtype"},
    {"in r row bf16 half\n", P, 1, "row takes no column space"},
    {"in x tile bf16 half extra\n", P, 1, "unexpected 'extra'"},
    {"in x tile bf16 half double\n", P, 1, "unexpected 'double'"},
    {"in x\n", P, 1, "expected 'in NAME KIND"},
    {"\n\nin 1x tile bf16\n", P, 3, "is not an identifier"},
    {"in x-y tile bf16\n", P, 1, "is not an identifier"},
    {"in acc tile bf16\n", P, 1, "'acc' is a reserved word"},
    {"out add tile bf16\n", P, 1, "reserved word (an op name)"},
    {"in tile tile bf16\n", P, 1, "reserved"},
    {"in f32 scalar\n", P, 1, "reserved"},
    {"in abcdefghijklmnopqrstuvwxyz0123456 scalar\n", P, 1, "longer than 31 characters"},
    /* values */
    {HDR "b = frob a\n", P, 4, "unknown op 'frob'"},
    {HDR "b = add a\n", P, 4, "add takes 2 operands, got 1"},
    {HDR "b = neg a a\n", P, 4, "neg takes 1 operand, got 2"},
    {HDR "b = fma a a\n", P, 4, "fma takes 3 operands, got 2"},
    {HDR "b = acc a\n", P, 4, "acc takes no operands"},
    {HDR "b = const 1e39\n", P, 4, "is not a finite float"},
    {HDR "b = const nan\n", P, 4, "is not a finite float"},
    {HDR "b = const inf\n", P, 4, "is not a finite float"},
    {HDR "b = const 1.5x\n", P, 4, "'1.5x' is not a number"},
    {HDR "b = const\n", P, 4, "expected 'const NUMBER'"},
    {HDR "b = const a\n", P, 4, "'a' is not a number"},
    {HDR "b = colidx quarter\n", P, 4, "is not a column space"},
    {HDR "b = load\n", P, 4, "expected 'load ARG'"},
    {HDR "b = add 1 a\n", P, 4, "'1' is not a name"},
    {HDR "b = store h a\n", P, 4, "is a statement and defines no value"},
    {HDR "b =\n", P, 4, "expected an op after '='"},
    {HDR "= acc\n", P, 4, "expected a name before '='"},
    {HDR "b = = acc\n", P, 4, "unknown op '='"},
    {HDR "b = acc\nprogram late\n", P, 5, "'program' must be the first statement"},
    {"program\n", P, 1, "expected 'program NAME'"},
    {"program 9lives\n", P, 1, "is not an identifier"},
    {HDR "frob a b\n", P, 4, "unknown statement 'frob'"},
    {HDR "add a a\n", P, 4, "unknown statement 'add'"},
    {HDR "b = neg a\x01\n", P, 4, "unexpected byte 0x01"},
    {HDR "b = neg a\xc3\xa9\n", P, 4, "unexpected byte 0xc3"},
    {HDR "b\r= neg a\n", P, 4, "unexpected byte 0x0d"},
    {HDR "b = neg a a a a a a a a a\n", P, 4, "too many tokens"},
    {HDR "store h\n", P, 4, "expected 'store OUT VALUE'"},
    {HDR "reduce h a a\n", P, 4, "expected 'reduce OUT VALUE'"},
    {HDR "lse h a\n", P, 4, "expected 'lse OUT VALUE TARGET'"},
    {HDR "store h 2\n", P, 4, "'2' is not a name"},
    {"out h tile bf16\r\n# c\r\n\r\na = acc\r\nb = frob a\r\n", P, 5, "unknown op 'frob'"},
    {"\tin x tile bf16 # c\n\n  \n\tx = acc # again\n", V, 4, "name 'x' is already defined (line 1)"},
    {HDR "b = add acc a\n", P, 4, "add: 'acc' is a reserved word, not a name (write 'a = acc'"},
    {HDR "b = load tile\n", P, 4, "load: 'tile' is a reserved word"},
    {HDR "store lse a\n", P, 4, "store: 'lse' is a reserved word"},
    /* names */
    {HDR "x = neg a\n", V, 4, "name 'x' is already defined (line 1)"},
    {HDR "a = neg a\n", V, 4, "name 'a' is already defined (line 3)"},
    {HDR "out a tile f32\n", V, 4, "already defined (line 3)"},
    {HDR "b = add a q\n", V, 4, "add: 'q' is not defined"},
    {HDR "b = add a x\n", V, 4, "'x' is an argument, not a value"},
    {HDR "b = load a\n", V, 4, "'a' is a value, not an argument"},
    {HDR "b = load q\n", V, 4, "load: 'q' is not defined"},
    {HDR "store a a\n", V, 4, "'a' is a value, not an argument"},
    {HDR "store h x\n", V, 4, "'x' is an argument, not a value"},
    {HDR "store q a\n", V, 4, "store: 'q' is not defined"},
    /* kinds of arguments */
    {HDR "b = load h\n", V, 4, "load h: h is an out tile; loads read inputs only"},
    {HDR "store x a\n", V, 4, "store into x: x is an in tile; store writes outputs only"},
    {"in p rowpart\n" HDR "reduce p a\n", V, 5, "reduce into p: p is an in rowpart; reduce writes outputs only"},
    {HDR "out s rowsum\nreduce h a\n", V, 5, "reduce into h: h is an out tile, not a reduction"},
    {HDR "out s rowsum\nstore s a\n", V, 5, "store into s: s is an out rowsum, not an out tile"},
    {HDR "out l lse\nstore l a\n", V, 5, "not an out tile (use lse)"},
    {HDR "in t row i32\nout s colmax\nb = load t\nlse s a b\n", V, 7,
     "lse into s: s is an out colmax, not an out lse"},
    /* shapes and spaces */
    {HDR "in g col bf16 half\nb = load g\nc = add a b\n", V, 6,
     "add: operands are in column spaces full and half"},
    {HDR "in g col bf16 double\nb = load g\nc = fma a a b\n", V, 6,
     "fma: operands are in column spaces full and double"},
    {HDR "b = colidx half\nc = select b a a\n", V, 5, "select: operands are in column spaces"},
    {HDR "in r row f32\nb = load r\nc = even b\n", V, 6,
     "even: operand b is a row value; pairwise ops need a value that varies along columns"},
    {HDR "b = const 1\nc = swap b\n", V, 5, "swap: operand b is a scalar"},
    {HDR "e = even a\nc = swap e\n", V, 5, "swap: operand is in the half column space"},
    {HDR "b = even a\nc = odd b\n", V, 5, "odd: operand is in the half space"},
    {HDR "in z tile bf16 double\nb = load z\nc = interleave b b\n", V, 6,
     "interleave: operand is in the double space"},
    {HDR "b = even a\nc = interleave a b\n", V, 5,
     "interleave: operands are in column spaces full and half"},
    {HDR "b = rowidx\nc = interleave a b\n", V, 5, "operand b is a row value"},
    {HDR "b = even a\nstore h b\n", V, 5, "store h: value b is in the half space, h is in the full"},
    {HDR "out c colsum half\nreduce c a\n", V, 5,
     "reduce c: value a is in the full space, c is in the half space"},
    {HDR "out s rowsum\nb = rowidx\nreduce s b\n", V, 6,
     "reduce s: value b is a row value; reduce needs a tile value"},
    {HDR "out c colsum\nb = colidx\nreduce c b\n", V, 6, "value b is a col value"},
    {HDR "out l lse\nlse l a a\n", V, 5, "lse l: target a is a tile value; it must be a row"},
    {HDR "out l lse\nb = rowidx\nlse l b b\n", V, 6, "lse l: value b is a row value"},
    /* outputs */
    {HDR "store h a\nstore h a\n", V, 5, "store h: h is already written (line 4)"},
    {HDR "out l lse\nb = const 3\nlse l a b\nlse l a b\n", V, 7, "already written (line 6)"},
    {HDR "out k tile bf16\nstore h a\n", V, 4, "out k: output is never written"},
    {"in x tile bf16\na = acc\n", V, 2, "program writes no output"},
    {"", V, 1, "program is empty"},
    {"# only a comment\n\n", V, 3, "program is empty"},
    /* dtypes */
    /* reserved dtypes: CODA_ERR_DTYPE, as coda.h's enum says (CODA_ERR_VERIFY
     * before stop 49) */
    {"in x tile f16\n", CODA_ERR_DTYPE, 1, "dtype f16 is reserved, not supported yet"},
    {"out y tile fp8e4m3\n", CODA_ERR_DTYPE, 1, "dtype fp8e4m3 is reserved, not supported yet"},
    {"in x tile i32\n", V, 1, "dtype i32 is only allowed for in row"},
    {"in g col i32\n", V, 1, "dtype i32 is only allowed for in row"},
    {"out y tile i32\n", V, 1, "dtype i32 is only allowed for in row"},
};
#undef P
#undef V

static void expect_fail(const char *what, const char *text, coda_status_t status, int line,
                        const char *phrase) {
    coda_program_t *p = (coda_program_t *)&p; /* not NULL: must be reset */
    coda_status_t st = coda_program_parse(text, &p);
    const char *msg = coda_last_error();
    char prefix[32];
    snprintf(prefix, sizeof prefix, "line %d: ", line);
    CHECK(st == status, "%s: status %s, want %s (%s)", what, coda_status_name(st),
          coda_status_name(status), msg);
    CHECK(p == NULL, "%s: *out not NULL after an error", what);
    CHECK(strncmp(msg, prefix, strlen(prefix)) == 0, "%s: message '%s' does not start with '%s'",
          what, msg, prefix);
    CHECK(strstr(msg, phrase) != NULL, "%s: message '%s' lacks '%s'", what, msg, phrase);
    if (st == CODA_OK) coda_program_free(p);
}

static void test_malformed(void) {
    int n = (int)(sizeof bads / sizeof bads[0]);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "bad[%d]", i);
        expect_fail(what, bads[i].text, bads[i].status, bads[i].line, bads[i].phrase);
    }
    printf("malformed programs: %d\n", n);

    /* limits: 65 arguments, 1025 instructions */
    char *big = h_alloc(200000);
    size_t k = 0;
    k += sprintf(big + k, "out o tile f32\n");
    for (int i = 1; i <= 64; i++) k += sprintf(big + k, "in a%d scalar\n", i);
    expect_fail("65 args", big, CODA_ERR_VERIFY, 65, "too many arguments (limit 64)");
    k = 0;
    k += sprintf(big + k, "out o tile f32\nv0 = acc\n");
    for (int i = 1; i < 1024; i++) k += sprintf(big + k, "v%d = neg v%d\n", i, i - 1);
    k += sprintf(big + k, "store o v1023\n");
    expect_fail("1025 insts", big, CODA_ERR_VERIFY, 1026, "too many instructions (limit 1024)");
    free(big);

    /* API misuse */
    coda_program_t *p = NULL;
    CHECK_STATUS(coda_program_parse(NULL, &p), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_program_parse(oproj_text, NULL), CODA_ERR_INVALID_ARG);
    CHECK(p == NULL, "parse(NULL) set *out");
}

/* ---- 5. builder misuse, print buffers ---- */

/* finish(p) fails with status and a message containing phrase; frees p. */
static void expect_finish_fail(const char *what, coda_program_t *p, coda_status_t status,
                               const char *phrase) {
    coda_status_t st = coda_program_finish(p);
    CHECK(st == status, "%s: finish -> %s, want %s (%s)", what, coda_status_name(st),
          coda_status_name(status), coda_last_error());
    CHECK(strstr(coda_last_error(), phrase) != NULL, "%s: message '%s' lacks '%s'", what,
          coda_last_error(), phrase);
    CHECK_STATUS(coda_program_print(p, buf_a, BUF, NULL), CODA_ERR_INVALID_ARG);
    coda_program_free(p);
}

static coda_program_t *fresh(void) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_new("t", &p));
    return p;
}

static void test_builder_errors(void) {
    coda_program_t *p;
    int o, x, a, b;
    /* an i64 argument: a tensor dtype, no program dtype (the text form has
     * no word for it; a review's builder program loaded zeros on the CPU) */
    p = fresh();
    x = coda_program_arg(p, "x", CODA_IN_TILE, CODA_I64, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    o = coda_program_arg(p, "o", CODA_OUT_TILE, CODA_F32, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    a = coda_program_load(p, "xl", x);
    coda_program_store(p, o, a);
    expect_finish_fail("i64 argument", p, CODA_ERR_VERIFY, "bf16, f32 or (in row) i32");
    CHECK_STATUS(coda_program_new(NULL, NULL), CODA_ERR_INVALID_ARG);
    p = (coda_program_t *)&p;
    CHECK_STATUS(coda_program_new("9x", &p), CODA_ERR_INVALID_ARG);
    CHECK(p == NULL, "new: a failed call leaves NULL in *out (coda.h section 1), got %p", (void *)p);
    CHECK_STATUS(coda_program_new("abcdefghijklmnopqrstuvwxyz0123456", &p), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_program_finish(NULL), CODA_ERR_INVALID_ARG);
    CHECK(coda_program_arg(NULL, "x", CODA_IN_TILE, CODA_BF16, 0, 0) == -1, "arg(NULL)");
    CHECK(coda_program_value(NULL, "x", CODA_OP_ACC, -1, -1, -1) == -1, "value(NULL)");
    CHECK(coda_program_load(NULL, "x", 0) == -1, "load(NULL)");
    CHECK(coda_program_const(NULL, "x", 1) == -1, "const(NULL)");
    CHECK(coda_program_colidx(NULL, "x", 0) == -1, "colidx(NULL)");
    CHECK(coda_program_store(NULL, 0, 0) == -1, "store(NULL)");
    CHECK(coda_program_lse(NULL, 0, 0, 0) == -1, "lse(NULL)");
    CHECK_STATUS(coda_program_print(NULL, buf_a, BUF, NULL), CODA_ERR_INVALID_ARG);

    /* a bad call: -1, later calls do nothing, finish reports the first error */
    p = fresh();
    CHECK(coda_program_arg(p, "x", (coda_arg_kind_t)99, CODA_BF16, 0, 0) == -1, "bad kind");
    CHECK(coda_program_arg(p, "y", CODA_OUT_TILE, CODA_BF16, 0, 0) == -1, "after an error");
    CHECK(coda_program_num_args(p) == 0, "nothing added after an error");
    expect_finish_fail("bad kind", p, CODA_ERR_INVALID_ARG, "argument 0: kind 99");
    p = fresh();
    CHECK(coda_program_arg(p, "x", (coda_arg_kind_t)(CODA_IN_ROWPART + 1), CODA_BF16, 0, 0) == -1,
          "the first kind past the last");
    expect_finish_fail("kind past the last", p, CODA_ERR_INVALID_ARG, "argument 0: kind 9");
    /* the builder's rowpart: an input, f32, no dtype of its own */
    p = fresh();
    int rp = coda_program_arg(p, "pp", CODA_IN_ROWPART, CODA_BF16, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int out = coda_program_arg(p, "y", CODA_OUT_TILE, CODA_F32, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int va = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1), vq = coda_program_load(p, "q", rp);
    coda_program_store(p, out, coda_program_value(p, "s", CODA_OP_ADD, va, vq, -1));
    CHECK_OK(coda_program_finish(p));
    coda_arg_kind_t kk;
    coda_dtype_t kd;
    CHECK_OK(coda_program_arg_info(p, rp, NULL, &kk, &kd, NULL, NULL));
    CHECK(kk == CODA_IN_ROWPART && kd == CODA_F32, "builder rowpart: kind %d dtype %d", (int)kk, (int)kd);
    coda_program_free(p);

    p = fresh();
    CHECK(coda_program_arg(p, "x", CODA_IN_TILE, (coda_dtype_t)7, 0, 0) == -1, "bad dtype");
    expect_finish_fail("bad dtype", p, CODA_ERR_INVALID_ARG, "dtype 7");
    p = fresh();
    CHECK(coda_program_arg(p, "x", CODA_IN_TILE, CODA_BF16, (coda_space_t)2, 0) == -1, "space");
    expect_finish_fail("bad space", p, CODA_ERR_INVALID_ARG, "space 2");
    p = fresh();
    CHECK(coda_program_arg(p, "x", CODA_OUT_ROWRED, CODA_F32, 0, (coda_reduce_t)3) == -1, "red");
    expect_finish_fail("bad reduce", p, CODA_ERR_INVALID_ARG, "reduce 3");
    p = fresh();
    CHECK(coda_program_arg(p, "acc", CODA_IN_TILE, CODA_BF16, 0, 0) == -1, "reserved");
    expect_finish_fail("reserved", p, CODA_ERR_INVALID_ARG, "'acc' is a reserved word");
    p = fresh();
    CHECK(coda_program_arg(p, "a b", CODA_IN_TILE, CODA_BF16, 0, 0) == -1, "not ident");
    expect_finish_fail("not ident", p, CODA_ERR_INVALID_ARG, "is not an identifier");
    p = fresh();
    coda_program_arg(p, "x", CODA_IN_TILE, CODA_BF16, 0, 0);
    CHECK(coda_program_value(p, "x", CODA_OP_ACC, -1, -1, -1) == -1, "redefined");
    expect_finish_fail("redefined", p, CODA_ERR_VERIFY, "instruction 0: name 'x' is already");

    p = fresh();
    CHECK(coda_program_value(p, "a", CODA_OP_LOAD, -1, -1, -1) == -1, "value(load)");
    expect_finish_fail("value(load)", p, CODA_ERR_INVALID_ARG, "use coda_program_load");
    p = fresh();
    CHECK(coda_program_value(p, "a", CODA_OP_STORE, 0, -1, -1) == -1, "value(store)");
    expect_finish_fail("value(store)", p, CODA_ERR_INVALID_ARG, "is a statement");
    p = fresh();
    CHECK(coda_program_value(p, "a", (coda_op_t)77, -1, -1, -1) == -1, "value(77)");
    expect_finish_fail("value(77)", p, CODA_ERR_INVALID_ARG, "op 77");
    p = fresh();
    a = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    CHECK(coda_program_value(p, "b", CODA_OP_NEG, a, a, -1) == -1, "neg with 2 operands");
    expect_finish_fail("neg 2 operands", p, CODA_ERR_INVALID_ARG, "src1 must be -1");
    p = fresh();
    CHECK(coda_program_const(p, "c", NAN) == -1, "const NaN");
    expect_finish_fail("const NaN", p, CODA_ERR_INVALID_ARG, "not finite");
    p = fresh();
    CHECK(coda_program_colidx(p, "c", (coda_space_t)-2) == -1, "colidx -2");
    expect_finish_fail("colidx -2", p, CODA_ERR_INVALID_ARG, "space -2");
    p = fresh();
    CHECK(coda_program_load(p, "c", 0) == -1, "load of no arg");
    expect_finish_fail("load arg 0", p, CODA_ERR_INVALID_ARG, "arg 0 out of range");
    p = fresh();
    CHECK(coda_program_store(p, 3, 0) == -1, "store arg 3");
    expect_finish_fail("store arg 3", p, CODA_ERR_INVALID_ARG, "arg 3 out of range");
    p = fresh();
    CHECK(coda_program_lse(p, -1, 0, 0) == -1, "lse arg -1");
    expect_finish_fail("lse arg -1", p, CODA_ERR_INVALID_ARG, "arg -1 out of range");

    /* errors only the verifier sees: "instruction I" / "argument I" */
    p = fresh();
    o = coda_program_arg(p, "o", CODA_OUT_TILE, CODA_F32, 0, 0);
    a = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    b = coda_program_value(p, "b", CODA_OP_ADD, a, 5, -1);
    coda_program_store(p, o, b);
    expect_finish_fail("bad operand id", p, CODA_ERR_VERIFY,
                       "instruction 1: add: operand 2 (value id 5) is not a value defined");
    p = fresh();
    o = coda_program_arg(p, "o", CODA_OUT_TILE, CODA_F32, 0, 0);
    a = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    b = coda_program_store(p, o, a);
    coda_program_value(p, "c", CODA_OP_NEG, b, -1, -1);
    expect_finish_fail("statement operand", p, CODA_ERR_VERIFY,
                       "instruction 2: neg: operand 1 (id 1) is a statement");
    p = fresh();
    x = coda_program_arg(p, "x", CODA_IN_TILE, CODA_BF16, 0, 0);
    o = coda_program_arg(p, "o", CODA_OUT_TILE, CODA_F32, 0, 0);
    a = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    coda_program_store(p, x, a);
    coda_program_store(p, o, a);
    expect_finish_fail("store into input", p, CODA_ERR_VERIFY,
                       "instruction 1: store into x: x is an in tile");
    p = fresh();
    o = coda_program_arg(p, "l", CODA_OUT_LSE, CODA_F32, 0, 0);
    a = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    coda_program_store(p, o, a);
    expect_finish_fail("store into lse", p, CODA_ERR_VERIFY, "(use lse)");
    p = fresh();
    coda_program_arg(p, "x", CODA_IN_TILE, CODA_F16, 0, 0);
    expect_finish_fail("f16", p, CODA_ERR_DTYPE, "argument 0: in x: dtype f16 is reserved");
    p = fresh();
    coda_program_arg(p, "x", CODA_IN_TILE, CODA_BF16, 0, 0);
    coda_program_arg(p, "o", CODA_OUT_TILE, CODA_F32, 0, 0);
    expect_finish_fail("unwritten", p, CODA_ERR_VERIFY, "argument 1: out o: output is never");
    p = fresh();
    coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    expect_finish_fail("no output", p, CODA_ERR_VERIFY, "program: writes no output");

    /* limits */
    p = fresh();
    for (int i = 0; i < 64; i++)
        CHECK(coda_program_arg(p, NULL, CODA_IN_SCALAR, CODA_F32, 0, 0) == i, "arg %d", i);
    CHECK(coda_program_arg(p, NULL, CODA_IN_SCALAR, CODA_F32, 0, 0) == -1, "65th arg");
    expect_finish_fail("65 args", p, CODA_ERR_VERIFY, "argument 64: too many arguments");
    p = fresh();
    a = coda_program_value(p, NULL, CODA_OP_ACC, -1, -1, -1);
    for (int i = 1; i < 1024; i++) a = coda_program_value(p, NULL, CODA_OP_NEG, a, -1, -1);
    CHECK(a == 1023, "1024 instructions");
    CHECK(coda_program_value(p, NULL, CODA_OP_NEG, a, -1, -1) == -1, "1025th instruction");
    expect_finish_fail("1025 insts", p, CODA_ERR_VERIFY, "instruction 1024: too many");

    /* a finished program changed afterwards must be finished again */
    p = build_oproj(1);
    CHECK_OK(coda_program_finish(p));
    coda_program_value(p, "extra", CODA_OP_ACC, -1, -1, -1);
    CHECK_STATUS(coda_program_print(p, buf_a, BUF, NULL), CODA_ERR_INVALID_ARG);
    CHECK_OK(coda_program_finish(p));
    CHECK_OK(coda_program_print(p, buf_a, BUF, NULL));
    coda_program_free(p);
}

static void test_print_buffers(void) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse(oproj_text, &p));
    size_t full = strlen(oproj_canonical), len = 0;
    char small[64];
    memset(small, 'Z', sizeof small);
    CHECK_STATUS(coda_program_print(p, small, 10, &len), CODA_ERR_INVALID_ARG);
    CHECK(len == full, "len %zu want %zu", len, full);
    CHECK(strlen(small) == 9 && memcmp(small, oproj_canonical, 9) == 0, "truncated prefix");
    CHECK(small[10] == 'Z', "wrote past cap");
    len = 0;
    CHECK_OK(coda_program_print(p, NULL, 0, &len)); /* the size query of coda.h */
    CHECK(len == full, "length query %zu", len);
    CHECK_STATUS(coda_program_print(p, NULL, 5, &len), CODA_ERR_INVALID_ARG);
    char *exact = h_alloc(full + 1);
    CHECK_OK(coda_program_print(p, exact, full + 1, &len));
    CHECK(strcmp(exact, oproj_canonical) == 0, "exact fit");
    CHECK_STATUS(coda_program_print(p, exact, full, &len), CODA_ERR_INVALID_ARG);
    CHECK(strlen(exact) == full - 1, "one short: %zu", strlen(exact));
    free(exact);
    CHECK_STATUS(coda_program_print(p, small, 1, NULL), CODA_ERR_INVALID_ARG);
    CHECK(small[0] == 0, "cap 1 gives an empty string");
    coda_program_free(p);

    /* op names */
    CHECK(strcmp(coda_op_name(CODA_OP_ROUND_BF16), "round_bf16") == 0, "op name");
    CHECK(strcmp(coda_op_name(CODA_OP_LSE), "lse") == 0, "op name lse");
    CHECK(coda_op_name(CODA_OP_COUNT_) == NULL, "op name out of range");
    CHECK(coda_op_name((coda_op_t)-1) == NULL, "op name -1");
    for (int op = 0; op < CODA_OP_COUNT_; op++) {
        CHECK(coda__op_from_name(coda_op_name((coda_op_t)op)) == op, "op %d round trip", op);
        int ar = coda__op_arity((coda_op_t)op);
        int want = op <= CODA_OP_COLIDX ? 0 : op <= CODA_OP_ROUND_BF16 ? 1
                 : op <= CODA_OP_MOD ? 2 : op <= CODA_OP_SELECT ? 3
                 : op == CODA_OP_INTERLEAVE ? 2 : op <= CODA_OP_SWAP ? 1 : -1;
        CHECK(ar == want, "arity of %s: %d, want %d", coda_op_name((coda_op_t)op), ar, want);
        coda_op_kind_t kind = op <= CODA_OP_COLIDX ? CODA_OPK_SOURCE : op <= CODA_OP_SELECT ? CODA_OPK_MAP
                            : op <= CODA_OP_SWAP ? CODA_OPK_PAIR : CODA_OPK_STATEMENT;
        int n_src = op == CODA_OP_LSE ? 2 : kind == CODA_OPK_STATEMENT ? 1 : want;
        CHECK(coda__ops[op].kind == kind && coda__ops[op].n_src == n_src, "kind and operands of %s",
              coda_op_name((coda_op_t)op));
    }
    CHECK(coda__op_from_name("nope") == -1 && coda__op_from_name(NULL) == -1, "op_from_name");
}

/* ---- 6. random valid programs through the builder ---- */

typedef struct gv {
    int id;
    coda_shape_t shape;
    coda_space_t space;
} gv_t;

static int rnd(h_rng *r, int n) { return (int)((rng_uniform(r) + 1.0f) * 0.5f * (float)n) % n; }

/* Pick a value compatible with column space sp (or any, sp == 9). */
static int pick(h_rng *r, const gv_t *v, int n, int sp, int need_cols, int need_tile) {
    int cand[CODA_MAX_INSTS], k = 0;
    for (int i = 0; i < n; i++) {
        int cols = (v[i].shape & CODA_SHAPE_COL) != 0;
        if (need_cols && !cols) continue;
        if (need_tile && v[i].shape != CODA_SHAPE_TILE) continue;
        if (sp != 9 && cols && (int)v[i].space != sp) continue;
        cand[k++] = i;
    }
    return k ? cand[rnd(r, k)] : -1;
}

static void random_program(h_rng *r, int named) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_new(named ? "rnd" : NULL, &p));
    static gv_t v[CODA_MAX_INSTS];
    int nv = 0;
    char nm[32];
#define NAME(fmt, i) (named || rnd(r, 3) ? (snprintf(nm, sizeof nm, fmt, i), nm) : NULL)
    /* inputs */
    int n_in = 1 + rnd(r, 8), ins[16];
    coda_arg_kind_t in_kinds[16];
    coda_space_t in_space[16];
    for (int i = 0; i < n_in; i++) {
        coda_arg_kind_t k = (coda_arg_kind_t)rnd(r, 4);
        coda_space_t s = (coda_space_t)(rnd(r, 3) - 1);
        coda_dtype_t dt = k == CODA_IN_ROW && rnd(r, 3) == 0 ? CODA_I32 : rnd(r, 2) ? CODA_BF16 : CODA_F32;
        ins[i] = coda_program_arg(p, NAME("in%d", i), k, dt, s, CODA_REDUCE_SUM);
        in_kinds[i] = k;
        in_space[i] = (k == CODA_IN_TILE || k == CODA_IN_COL) ? s : CODA_SPACE_FULL;
    }
    /* outputs */
    int n_out = 1 + rnd(r, 6), outs[16];
    coda_arg_kind_t out_kinds[16];
    coda_space_t out_space[16];
    for (int i = 0; i < n_out; i++) {
        coda_arg_kind_t k = (coda_arg_kind_t)(CODA_OUT_TILE + rnd(r, 4));
        coda_space_t s = (coda_space_t)(rnd(r, 3) - 1);
        outs[i] = coda_program_arg(p, NAME("out%d", i), k, rnd(r, 2) ? CODA_BF16 : CODA_F32, s,
                                   (coda_reduce_t)rnd(r, 3));
        out_kinds[i] = k;
        out_space[i] = (k == CODA_OUT_TILE || k == CODA_OUT_COLRED) ? s : CODA_SPACE_FULL;
    }
    v[nv++] = (gv_t){coda_program_value(p, NAME("v%d", 0), CODA_OP_ACC, -1, -1, -1),
                     CODA_SHAPE_TILE, CODA_SPACE_FULL};
    int n_steps = 1 + rnd(r, 40);
    for (int s = 0; s < n_steps; s++) {
        int kind = rnd(r, 8);
        gv_t nvv = {-1, CODA_SHAPE_SCALAR, CODA_SPACE_FULL};
        if (kind == 0) {
            int i = rnd(r, n_in);
            nvv.id = coda_program_load(p, NAME("v%d", nv), ins[i]);
            nvv.shape = in_kinds[i] == CODA_IN_TILE ? CODA_SHAPE_TILE
                      : in_kinds[i] == CODA_IN_ROW ? CODA_SHAPE_ROW
                      : in_kinds[i] == CODA_IN_COL ? CODA_SHAPE_COL : CODA_SHAPE_SCALAR;
            nvv.space = in_space[i];
        } else if (kind == 1) {
            float f = rng_uniform(r) * powf(10.0f, (float)(rnd(r, 20) - 10));
            nvv.id = coda_program_const(p, NAME("v%d", nv), f);
        } else if (kind == 2) {
            if (rnd(r, 2)) {
                nvv.id = coda_program_value(p, NAME("v%d", nv), CODA_OP_ROWIDX, -1, -1, -1);
                nvv.shape = CODA_SHAPE_ROW;
            } else {
                nvv.space = (coda_space_t)(rnd(r, 3) - 1);
                nvv.id = coda_program_colidx(p, NAME("v%d", nv), nvv.space);
                nvv.shape = CODA_SHAPE_COL;
            }
        } else if (kind <= 5) { /* maps */
            int arity = kind - 2, n_maps = 0;
            coda_op_t maps[CODA_OP_COUNT_]; /* from the op table: a new map is fuzzed too */
            for (int o = 0; o < CODA_OP_COUNT_; o++)
                if (coda__ops[o].kind == CODA_OPK_MAP && coda__ops[o].n_src == arity) maps[n_maps++] = (coda_op_t)o;
            coda_op_t op = maps[rnd(r, n_maps)];
            int a = rnd(r, nv), src[3] = {-1, -1, -1};
            int sp = (v[a].shape & CODA_SHAPE_COL) ? (int)v[a].space : 9;
            src[0] = a;
            int shape = v[a].shape;
            for (int k = 1; k < arity; k++) {
                int b = pick(r, v, nv, sp, 0, 0);
                src[k] = b;
                shape |= v[b].shape;
                if ((v[b].shape & CODA_SHAPE_COL) && sp == 9) sp = v[b].space;
            }
            int perm = rnd(r, arity); /* operand order must not matter */
            int t = src[0]; src[0] = src[perm]; src[perm] = t;
            nvv.id = coda_program_value(p, NAME("v%d", nv), op, v[src[0]].id,
                                        src[1] >= 0 ? v[src[1]].id : -1,
                                        src[2] >= 0 ? v[src[2]].id : -1);
            nvv.shape = (coda_shape_t)shape;
            nvv.space = sp == 9 ? CODA_SPACE_FULL : (coda_space_t)sp;
        } else { /* pairwise */
            int which = rnd(r, 4);
            if (which <= 1) { /* even/odd from full or double */
                int a = rnd(r, 2) ? pick(r, v, nv, CODA_SPACE_FULL, 1, 0)
                                  : pick(r, v, nv, CODA_SPACE_DOUBLE, 1, 0);
                if (a < 0) continue;
                nvv.id = coda_program_value(p, NAME("v%d", nv), which ? CODA_OP_ODD : CODA_OP_EVEN,
                                            v[a].id, -1, -1);
                nvv.shape = v[a].shape;
                nvv.space = (coda_space_t)(v[a].space - 1);
            } else if (which == 2) {
                int a = rnd(r, 2) ? pick(r, v, nv, CODA_SPACE_FULL, 1, 0)
                                  : pick(r, v, nv, CODA_SPACE_HALF, 1, 0);
                if (a < 0) continue;
                int b = pick(r, v, nv, v[a].space, 1, 0);
                nvv.id = coda_program_value(p, NAME("v%d", nv), CODA_OP_INTERLEAVE, v[a].id,
                                            v[b].id, -1);
                nvv.shape = (coda_shape_t)(v[a].shape | v[b].shape);
                nvv.space = (coda_space_t)(v[a].space + 1);
            } else {
                int a = rnd(r, 2) ? pick(r, v, nv, CODA_SPACE_FULL, 1, 0)
                                  : pick(r, v, nv, CODA_SPACE_DOUBLE, 1, 0);
                if (a < 0) continue;
                nvv.id = coda_program_value(p, NAME("v%d", nv), CODA_OP_SWAP, v[a].id, -1, -1);
                nvv.shape = v[a].shape;
                nvv.space = v[a].space;
            }
        }
        CHECK(nvv.id >= 0, "random builder call failed: %s", coda_last_error());
        if (nvv.id < 0) break;
        v[nv++] = nvv;
    }
    /* write every output once, making a fitting value where needed */
    for (int i = 0; i < n_out; i++) {
        coda_space_t s = out_space[i];
        int a;
        if (out_kinds[i] == CODA_OUT_TILE) {
            a = pick(r, v, nv, s, 0, 0);
            coda_program_store(p, outs[i], a >= 0 ? v[a].id : coda_program_const(p, NULL, 1.0f));
        } else if (out_kinds[i] == CODA_OUT_ROWRED || out_kinds[i] == CODA_OUT_LSE) {
            a = pick(r, v, nv, 9, 0, 1);
            if (out_kinds[i] == CODA_OUT_LSE) {
                int t = coda_program_value(p, NULL, CODA_OP_ROWIDX, -1, -1, -1);
                coda_program_lse(p, outs[i], v[a].id, t);
            } else {
                coda_program_store(p, outs[i], v[a].id);
            }
        } else {
            a = pick(r, v, nv, s, 0, 1);
            int id = a >= 0 ? v[a].id : 0; /* value 0 is acc: full space */
            if (a < 0 && s == CODA_SPACE_HALF)
                id = coda_program_value(p, NULL, CODA_OP_EVEN, 0, -1, -1);
            if (a < 0 && s == CODA_SPACE_DOUBLE)
                id = coda_program_value(p, NULL, CODA_OP_INTERLEAVE, 0, 0, -1);
            coda_program_store(p, outs[i], id);
        }
    }
#undef NAME
    coda_status_t st = coda_program_finish(p);
    CHECK(st == CODA_OK, "random program: %s", coda_last_error());
    if (st == CODA_OK) {
        for (int i = 0; i < nv; i++) {
            const coda_inst_t *in = &p->insts[v[i].id];
            int ok = in->shape == v[i].shape &&
                     (!(v[i].shape & CODA_SHAPE_COL) || in->vspace == v[i].space);
            CHECK(ok, "value %d (%s): shape %d space %d, want %d %d", v[i].id,
                  coda_op_name(in->op), in->shape, in->vspace, v[i].shape, v[i].space);
        }
        print_into(p, buf_a);
        coda_program_t *q = NULL;
        st = coda_program_parse(buf_a, &q);
        CHECK(st == CODA_OK, "random program re-parse: %s\n%s", coda_last_error(), buf_a);
        if (q) CHECK(strcmp(print_into(q, buf_b), buf_a) == 0, "random round trip\n%s", buf_a);
        coda_program_free(q);
    }
    coda_program_free(p);
}

static void test_random_programs(void) {
    h_rng r = rng_new(42);
    int n = 5000;
    for (int i = 0; i < n; i++) random_program(&r, i & 1);
    printf("random programs: %d\n", n);
}

/* ---- 7. mutations ---- */

static void test_mutations(void) {
    const char *seeds[] = {oproj_text, swiglu_text, swiglu_bwd_text, rope_text, lse_text,
                           all_ops_text, consts_text};
    static const char *pieces[] = {" ", "\n", "#", "=", "a", "x", "0", ".", "-", "e", "\t", "\r",
                                   "half", "double", "acc", "add ", "even ", "store ", "lse ",
                                   "out ", "in ", "1e40", "_v1", "\x7f", "\xff", "tile ", "i32"};
    h_rng r = rng_new(7);
    static char text[8192];
    int n = 100000, ok = 0;
    for (int it = 0; it < n; it++) {
        const char *seed = seeds[rnd(&r, (int)(sizeof seeds / sizeof seeds[0]))];
        size_t len = strlen(seed);
        memcpy(text, seed, len + 1);
        int muts = 1 + rnd(&r, 4);
        for (int m = 0; m < muts; m++) {
            len = strlen(text);
            size_t at = (size_t)rnd(&r, (int)len + 1);
            int what = rnd(&r, 3);
            if (what == 0 && at < len) { /* delete a run */
                size_t k = 1 + (size_t)rnd(&r, 8);
                if (at + k > len) k = len - at;
                memmove(text + at, text + at + k, len - at - k + 1);
            } else { /* insert or overwrite a piece */
                const char *pc = pieces[rnd(&r, (int)(sizeof pieces / sizeof pieces[0]))];
                size_t k = strlen(pc);
                if (len + k + 1 >= sizeof text) continue;
                if (what == 1 || at + k > len) memmove(text + at + k, text + at, len - at + 1);
                memcpy(text + at, pc, k);
            }
        }
        coda_program_t *p = (coda_program_t *)&p;
        coda_status_t st = coda_program_parse(text, &p);
        if (st == CODA_OK) {
            ok++;
            print_into(p, buf_a);
            coda_program_t *q = NULL;
            st = coda_program_parse(buf_a, &q);
            CHECK(st == CODA_OK, "mutant re-parse: %s\n%s", coda_last_error(), buf_a);
            if (q) CHECK(strcmp(print_into(q, buf_b), buf_a) == 0, "mutant round trip\n%s", buf_a);
            coda_program_free(q);
            coda_program_free(p);
        } else {
            CHECK(p == NULL, "mutant: *out set on error");
            CHECK(st == CODA_ERR_PARSE || st == CODA_ERR_VERIFY || st == CODA_ERR_DTYPE, "mutant status %s",
                  coda_status_name(st));
            CHECK(strncmp(coda_last_error(), "line ", 5) == 0, "mutant message '%s'",
                  coda_last_error());
        }
    }
    printf("mutants: %d, of which parsed: %d\n", n, ok);
}

/* ---- 8. example files ---- */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = h_alloc(1 << 16);
    size_t n = fread(s, 1, (1 << 16) - 1, f);
    s[n] = 0;
    fclose(f);
    return s;
}

/* Good files parse and round-trip. A bad file's first line reads
 * "# expect: STATUS line N: phrase". */
static void test_example_files(void) {
    const char *dir = "tests/programs";
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s (run from the repository root)", dir);
    if (!d) return;
    int n_good = 0, n_bad = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".coda") != 0) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *text = read_text(path);
        CHECK(text != NULL, "read %s", path);
        if (!text) continue;
        if (strncmp(e->d_name, "bad_", 4) == 0) {
            char status[64] = "", phrase[256] = "";
            int line = 0;
            int got = sscanf(text, "# expect: %63s line %d: %255[^\n]", status, &line, phrase);
            CHECK(got == 3, "%s: no '# expect: STATUS line N: phrase' header", path);
            coda_status_t want = strcmp(status, "CODA_ERR_PARSE") == 0 ? CODA_ERR_PARSE
                                                                      : CODA_ERR_VERIFY;
            if (got == 3) expect_fail(path, text, want, line, phrase);
            n_bad++;
        } else {
            coda_program_t *p = round_trip(path, text, NULL);
            coda_program_free(p);
            n_good++;
        }
        free(text);
    }
    closedir(d);
    CHECK(n_good >= 3 && n_bad >= 3, "example files: %d good, %d bad", n_good, n_bad);
    printf("example files: %d good, %d bad\n", n_good, n_bad);
}

/* Consts read and print with '.' even under a locale whose decimal point is
 * ','. Needs such a locale installed; skipped (and said so) otherwise. */
static void test_locale(void) {
    const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ru_RU.UTF-8"};
    const char *got = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !got; i++)
        got = setlocale(LC_NUMERIC, names[i]);
    if (!got) {
        printf("locale test skipped: no locale with a ',' decimal point installed\n");
        return;
    }
    char name[64];
    snprintf(name, sizeof name, "%s", got); /* setlocale's string dies with the next call */
    coda_program_t *p = round_trip("consts under a ',' locale", consts_text, NULL);
    CHECK(p == NULL || strstr(buf_a, "a = const 0.100000001\n") != NULL, "locale:\n%s", buf_a);
    coda_program_free(p);
    setlocale(LC_NUMERIC, "C");
    printf("locale test ran under %s\n", name);
}

int main(void) {
    test_round_trips();
    test_annotations();
    test_acc_bf16();
    test_builder();
    test_malformed();
    test_builder_errors();
    test_print_buffers();
    test_random_programs();
    test_mutations();
    test_example_files();
    test_locale();
    TEST_MAIN_END();
}
