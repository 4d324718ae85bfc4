/* test_epilogue_nan.c - the NaN rule of coda.h sections 5 and 7 on the CPU
 * backend: a NaN reaches every output computed from it, and no other.
 *
 * One case per primitive class, each checked element by element against
 * the class (finite, NaN, +inf, -inf) the documented rule gives:
 *   maps        every unary map; every binary map with the NaN on either
 *               side (max and min too: fmaxf / fminf would drop it); fma
 *               in each slot; select of the NaN; the documented exceptions
 *               (eq, lt, a NaN select condition, pow x 0, pow 1 y)
 *   pairs       even, odd, swap, interleave; tile loads f32 / bf16 in the
 *               half, full and double spaces; tile stores f32 / bf16 in
 *               each space
 *   vectors     row loads (f32, bf16), column loads (f32, bf16; half,
 *               full, double), a row value stored as a tile; a NaN or
 *               infinite scalar is refused (CODA_ERR_INVALID_ARG)
 *   reductions  rowsum / rowmax / rowsumsq and colsum / colmax / colsumsq
 *               in every space: a NaN element, a row of NaN (the max's
 *               partial must not come out -inf), a column of NaN, a NaN
 *               row or column of the accumulator (from A or B), a row of
 *               -inf (max -inf, not NaN)
 *   lse         a NaN row, one NaN column, NaN at the target, NaN beside
 *               it, +inf (at and off the target), rows of -inf, an
 *               ignored row, a target outside the row, in the full and
 *               the half space
 *   rowpart     a NaN partial
 *   finishing   coda_finish_reduce (sum, max, sumsq), coda_finish_rstd and
 *               coda_finish_lse on those partials, and on hand-made ones
 * Outputs start as a finite sentinel: an element left unwritten shows.
 * tests/gpu/test_nan_gpu.c runs the same programs on the GPU against this
 * backend. */
#include "harness.h"
#include "nan_programs.h"

static coda_context_t *ctx;

enum { F = 0, NAN_ = 1, PINF = 2, NINF = 3 }; /* element classes */
static const char *const cls_name[] = {"finite", "NaN", "+inf", "-inf"};
static int cls(float v) { return isnan(v) ? NAN_ : v == INFINITY ? PINF : v == -INFINITY ? NINF : F; }
#define SENTINEL (-7777.0f)

/* ---- a program run: every argument bound to a host tensor ---- */

enum { MAXA = 20 };
typedef struct tb {
    const char *name;
    coda_arg_kind_t kind;
    coda_dtype_t dt;
    int nd;
    int64_t sh[3];
    void *data;
} tb_t;

typedef struct run {
    coda_program_t *p;
    int na;
    tb_t a[MAXA];
    float scalar[MAXA];
    int64_t m, n, k;
    coda_tiling_t tl;
    uint16_t *A, *B; /* (m, k), (n, k) bf16: NT layout */
} run_t;

static int64_t numel(const tb_t *t) {
    int64_t e = 1;
    for (int d = 0; d < t->nd; d++) e *= t->sh[d];
    return e;
}

static void run_new(run_t *r, const char *text, int64_t m, int64_t n, int64_t k, int tm, int tn, uint64_t seed) {
    memset(r, 0, sizeof *r);
    REQUIRE_OK(coda_program_parse(text, &r->p));
    r->m = m, r->n = n, r->k = k;
    r->tl.tile_m = tm, r->tl.tile_n = tn;
    h_rng g = rng_new(seed);
    r->A = h_alloc((size_t)(m * k) * 2);
    r->B = h_alloc((size_t)(n * k) * 2);
    rng_fill_bf16(&g, r->A, m * k, 1.0f);
    rng_fill_bf16(&g, r->B, n * k, 1.0f);
    r->na = coda_program_num_args(r->p);
    if (r->na > MAXA) {
        fprintf(stderr, "FATAL: too many arguments\n");
        exit(1);
    }
    for (int i = 0; i < r->na; i++) {
        tb_t *t = &r->a[i];
        coda_space_t sp;
        coda_reduce_t red;
        REQUIRE_OK(coda_program_arg_info(r->p, i, &t->name, &t->kind, &t->dt, &sp, &red));
        REQUIRE_OK(coda_program_arg_shape(r->p, i, m, n, &r->tl, &t->nd, t->sh, &t->dt));
        if (t->kind == CODA_IN_ROWPART) t->sh[1] = 5;
        if (t->nd == 0) t->nd = 1, t->sh[0] = 1;
        int64_t e = numel(t);
        t->data = h_alloc((size_t)e * coda_dtype_size(t->dt));
        int out = t->kind >= CODA_OUT_TILE && t->kind <= CODA_OUT_LSE;
        for (int64_t j = 0; j < e; j++) {
            float v = out ? SENTINEL : rng_uniform(&g);
            if (t->dt == CODA_BF16) ((uint16_t *)t->data)[j] = h_f2bf(v);
            else if (t->dt == CODA_I32) ((int32_t *)t->data)[j] = (int32_t)(j % 7); /* targets: set by the case */
            else ((float *)t->data)[j] = v;
        }
        r->scalar[i] = 0.5f;
    }
}

static void run_free(run_t *r) {
    for (int i = 0; i < r->na; i++) free(r->a[i].data);
    free(r->A);
    free(r->B);
    coda_program_free(r->p);
}

static tb_t *arg(run_t *r, const char *name) {
    for (int i = 0; i < r->na; i++)
        if (strcmp(r->a[i].name, name) == 0) return &r->a[i];
    fprintf(stderr, "FATAL: no argument %s\n", name);
    exit(1);
}

/* Element (i, j) (j ignored for 1-D, i ignored for scalars) of an input. */
static void put(run_t *r, const char *name, int64_t i, int64_t j, float v) {
    tb_t *t = arg(r, name);
    if (t->kind == CODA_IN_SCALAR) {
        r->scalar[t - r->a] = v;
        return;
    }
    int64_t e = t->nd == 1 ? i : i * t->sh[1] + j;
    if (t->dt == CODA_BF16) ((uint16_t *)t->data)[e] = h_f2bf(v);
    else if (t->dt == CODA_I32) ((int32_t *)t->data)[e] = (int32_t)v;
    else ((float *)t->data)[e] = v;
}

static float get(const tb_t *t, int64_t e) {
    return t->dt == CODA_BF16 ? h_bf2f(((const uint16_t *)t->data)[e]) : ((const float *)t->data)[e];
}

static void run_go(run_t *r) {
    coda_binding_t bd[MAXA];
    for (int i = 0; i < r->na; i++) {
        tb_t *t = &r->a[i];
        bd[i].name = t->name;
        bd[i].scalar = r->scalar[i];
        bd[i].tensor = t->nd == 1 ? coda_tensor_1d(t->data, t->dt, t->sh[0])
                     : t->nd == 2 ? coda_tensor_2d(t->data, t->dt, t->sh[0], t->sh[1])
                                  : coda_tensor_3d(t->data, t->dt, t->sh[0], t->sh[1], t->sh[2]);
    }
    coda_tensor_t A = coda_tensor_2d(r->A, CODA_BF16, r->m, r->k), B = coda_tensor_2d(r->B, CODA_BF16, r->n, r->k);
    CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &A, &B, r->p, bd, r->na, &r->tl, NULL));
}

/* Output `name` (all its elements, row-major) against the classes want[];
 * every element written (no sentinel left). One check per output. */
static void check_cls(run_t *r, const char *what, const char *name, const char *want) {
    const tb_t *t = arg(r, name);
    int64_t n = numel(t), bad = 0, first = -1, unwritten = 0;
    for (int64_t e = 0; e < n; e++) {
        float v = get(t, e);
        unwritten += v == SENTINEL || (t->dt == CODA_BF16 && v == h_bf2f(h_f2bf(SENTINEL)));
        if (cls(v) != want[e]) {
            if (first < 0) first = e;
            bad++;
        }
    }
    CHECK(bad == 0 && unwritten == 0, "%s: %s: %lld elements of the wrong class (first: element %lld is %g, want %s), "
          "%lld unwritten", what, name, (long long)bad, (long long)first, first >= 0 ? get(t, first) : 0.0,
          first >= 0 ? cls_name[(int)want[first]] : "-", (long long)unwritten);
}

/* ---- the classes a value takes, as (rows, cols) matrices ---- */

typedef struct mat { int64_t r, c; char *v; } mat_t;
static mat_t mat_new(int64_t r, int64_t c) {
    mat_t m = {r, c, h_alloc((size_t)(r * c))};
    memset(m.v, F, (size_t)(r * c));
    return m;
}
static char *at(mat_t *m, int64_t i, int64_t j) { return &m->v[i * m->c + j]; }

static mat_t m_even(mat_t *s, int o) { /* even (o = 0) / odd (o = 1) */
    mat_t h = mat_new(s->r, s->c / 2);
    for (int64_t i = 0; i < h.r; i++)
        for (int64_t j = 0; j < h.c; j++) *at(&h, i, j) = *at(s, i, 2 * j + o);
    return h;
}
static mat_t m_swap(mat_t *s) {
    mat_t w = mat_new(s->r, s->c);
    for (int64_t i = 0; i < w.r; i++)
        for (int64_t j = 0; j < w.c; j++) *at(&w, i, j) = *at(s, i, j ^ 1);
    return w;
}
static mat_t m_inter(mat_t *a, mat_t *b) {
    mat_t d = mat_new(a->r, 2 * a->c);
    for (int64_t i = 0; i < a->r; i++)
        for (int64_t j = 0; j < a->c; j++) *at(&d, i, 2 * j) = *at(a, i, j), *at(&d, i, 2 * j + 1) = *at(b, i, j);
    return d;
}
/* a op b elementwise for add-like maps: NaN wins, +inf + -inf is NaN */
static char add_cls(char a, char b) {
    if (a == NAN_ || b == NAN_ || (a == PINF && b == NINF) || (a == NINF && b == PINF)) return NAN_;
    return a != F ? a : b;
}
static mat_t m_add(mat_t *a, mat_t *b) {
    mat_t s = mat_new(a->r, a->c);
    for (int64_t e = 0; e < a->r * a->c; e++) s.v[e] = add_cls(a->v[e], b->v[e]);
    return s;
}

/* A reduction's class over classes x[0..n-1], stride st. */
static char red_cls(coda_reduce_t op, const char *x, int64_t n, int64_t st) {
    int nan = 0, pinf = 0, ninf = 0;
    for (int64_t e = 0; e < n; e++) nan |= x[e * st] == NAN_, pinf |= x[e * st] == PINF, ninf += x[e * st] == NINF;
    if (nan) return NAN_;
    if (op == CODA_REDUCE_MAX) return pinf ? PINF : ninf == n ? NINF : F;
    if (op == CODA_REDUCE_SUMSQ) return pinf || ninf ? PINF : F;
    return pinf && ninf ? NAN_ : pinf ? PINF : ninf ? NINF : F;
}
/* row partials (rows, ceil(cols / tw)), column partials (cols, ceil(rows / tm)) */
static char *want_rowred(mat_t *v, coda_reduce_t op, int64_t tw) {
    int64_t nt = (v->c + tw - 1) / tw;
    char *w = h_alloc((size_t)(v->r * nt));
    for (int64_t i = 0; i < v->r; i++)
        for (int64_t t = 0; t < nt; t++) {
            int64_t c0 = t * tw, n = v->c - c0 < tw ? v->c - c0 : tw;
            w[i * nt + t] = red_cls(op, at(v, i, c0), n, 1);
        }
    return w;
}
static char *want_colred(mat_t *v, coda_reduce_t op, int64_t tm) {
    int64_t nt = (v->r + tm - 1) / tm;
    char *w = h_alloc((size_t)(v->c * nt));
    for (int64_t j = 0; j < v->c; j++)
        for (int64_t t = 0; t < nt; t++) {
            int64_t r0 = t * tm, n = v->r - r0 < tm ? v->r - r0 : tm;
            w[j * nt + t] = red_cls(op, at(v, r0, j), n, v->c);
        }
    return w;
}

/* ---- shapes: 3 x 3 tiles of 8 x 8, the last row tile short ---- */
enum { M = 20, N = 24, K = 8, TM = 8, TN = 8 };

/* ---- maps ---- */

static const int64_t nan_at[][2] = {{0, 0}, {5, 17}, {9, 8}, {19, 23}, {12, 3}};
#define N_NAN_AT (int)(sizeof nan_at / sizeof nan_at[0])

static void test_maps(void) {
    const char *progs[] = {prog_unary, prog_binary_l, prog_binary_r, prog_except};
    const char *names[] = {"unary maps", "binary maps, NaN left", "binary maps, NaN right; fma, select",
                           "comparisons, select condition, pow"};
    for (int pi = 0; pi < 4; pi++) {
        run_t r;
        run_new(&r, progs[pi], M, N, K, TM, TN, 100 + pi);
        mat_t px = mat_new(M, N);
        for (int q = 0; q < N_NAN_AT; q++) {
            put(&r, "x", nan_at[q][0], nan_at[q][1], NAN);
            *at(&px, nan_at[q][0], nan_at[q][1]) = NAN_;
        }
        run_go(&r);
        mat_t none = mat_new(M, N);
        for (int i = 0; i < r.na; i++) {
            const tb_t *t = &r.a[i];
            if (t->kind != CODA_OUT_TILE) continue;
            int keep = strncmp(t->name, "k_", 2) == 0;
            check_cls(&r, names[pi], t->name, keep ? none.v : px.v);
        }
        if (pi == 3) { /* the exceptions' values: as documented */
            const tb_t *eq = arg(&r, "k_eq"), *lt = arg(&r, "k_lt"), *sel = arg(&r, "k_sel");
            const tb_t *p0 = arg(&r, "k_pow0"), *p1 = arg(&r, "k_pow1");
            int64_t bad = 0;
            for (int64_t e = 0; e < M * N; e++) {
                int isn = px.v[e] == NAN_;
                bad += get(eq, e) != (isn ? 0.0f : 1.0f);
                bad += isn && get(lt, e) != 0.0f;
                bad += isn ? !(get(sel, e) > 0.0f) : !(get(sel, e) < 0.0f);
                bad += get(p0, e) != 1.0f || get(p1, e) != 1.0f;
            }
            CHECK(bad == 0, "exceptions: eq/lt give 0, select picks a, pow gives 1 for NaN: %lld wrong", (long long)bad);
        }
        free(px.v);
        free(none.v);
        run_free(&r);
    }
}

/* ---- pairwise maps, tile loads and stores in every space ---- */

static void test_pairs(void) {
    run_t r;
    run_new(&r, prog_pairs, M, N, K, TM, TN, 200);
    mat_t s = mat_new(M, N), xb = mat_new(M, N), xd = mat_new(M, 2 * N), xh = mat_new(M, N / 2);
    static const int64_t at_s[][2] = {{2, 5}, {3, 10}, {17, 23}, {8, 0}}, at_b[][2] = {{4, 6}, {15, 19}},
                         at_d[][2] = {{6, 33}, {6, 34}, {19, 0}}, at_h[][2] = {{11, 7}, {0, 11}};
    for (int q = 0; q < 4; q++) put(&r, "x", at_s[q][0], at_s[q][1], NAN), *at(&s, at_s[q][0], at_s[q][1]) = NAN_;
    for (int q = 0; q < 2; q++) put(&r, "xb", at_b[q][0], at_b[q][1], NAN), *at(&xb, at_b[q][0], at_b[q][1]) = NAN_;
    for (int q = 0; q < 3; q++) put(&r, "xd", at_d[q][0], at_d[q][1], NAN), *at(&xd, at_d[q][0], at_d[q][1]) = NAN_;
    for (int q = 0; q < 2; q++) put(&r, "xh", at_h[q][0], at_h[q][1], NAN), *at(&xh, at_h[q][0], at_h[q][1]) = NAN_;
    run_go(&r);
    mat_t ev = m_even(&s, 0), ov = m_even(&s, 1), wv = m_swap(&s), il = m_inter(&s, &s), ie = m_inter(&ev, &ov);
    mat_t de = m_even(&xd, 0), dq = m_even(&xd, 1), sd = m_add(&de, &dq);
    check_cls(&r, "pairs", "e", ev.v);
    check_cls(&r, "pairs", "o", ov.v);
    check_cls(&r, "pairs", "w", wv.v);
    check_cls(&r, "pairs", "il", il.v);
    check_cls(&r, "pairs", "ieo", ie.v);
    check_cls(&r, "pairs", "sb", xb.v);
    check_cls(&r, "pairs", "sd", sd.v);
    check_cls(&r, "pairs", "dd", xd.v);
    check_cls(&r, "pairs", "sh", xh.v);
    mat_t all[] = {s, xb, xd, xh, ev, ov, wv, il, ie, de, dq, sd};
    for (int i = 0; i < 12; i++) free(all[i].v);
    run_free(&r);
}

/* ---- row, column and scalar loads ---- */

static void test_vectors(void) {
    for (int scalar_nan = 0; scalar_nan < 1; scalar_nan++) {
        run_t r;
        run_new(&r, prog_vectors, M, N, K, TM, TN, 300 + scalar_nan);
        put(&r, "r", 6, 0, NAN);
        put(&r, "rb", 13, 0, NAN);
        put(&r, "g", 3, 0, NAN);
        put(&r, "gb", 20, 0, NAN);
        put(&r, "gh", 9, 0, NAN);
        put(&r, "gd", 40, 0, NAN);
        if (scalar_nan) put(&r, "sc", 0, 0, NAN);
        run_go(&r);
        mat_t y1 = mat_new(M, N), y2 = mat_new(M, N), y3 = mat_new(M, N), y4 = mat_new(M, N);
        mat_t y5 = mat_new(M, N / 2), y6 = mat_new(M, 2 * N), y7 = mat_new(M, N);
        for (int64_t j = 0; j < N; j++) *at(&y1, 6, j) = NAN_, *at(&y2, 13, j) = NAN_;
        for (int64_t i = 0; i < M; i++) {
            *at(&y3, i, 3) = NAN_, *at(&y4, i, 20) = NAN_, *at(&y5, i, 9) = NAN_, *at(&y6, i, 40) = NAN_;
            for (int64_t j = 0; j < N; j++) *at(&y7, i, j) = scalar_nan ? NAN_ : F;
        }
        const char *what = scalar_nan ? "vectors, NaN scalar" : "vectors";
        check_cls(&r, what, "y1", y1.v);
        check_cls(&r, what, "y2", y2.v);
        check_cls(&r, what, "y3", y3.v);
        check_cls(&r, what, "y4", y4.v);
        check_cls(&r, what, "y5", y5.v);
        check_cls(&r, what, "y6", y6.v);
        check_cls(&r, what, "y7", y7.v);
        check_cls(&r, what, "y8", y1.v); /* the row value itself, broadcast */
        mat_t all[] = {y1, y2, y3, y4, y5, y6, y7};
        for (int i = 0; i < 7; i++) free(all[i].v);
        run_free(&r);
    }
    /* a scalar is bound by value and must be finite: a NaN (or inf) one is
     * refused before anything runs (coda.h section 5), outputs untouched */
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++) {
        run_t r;
        run_new(&r, prog_vectors, M, N, K, TM, TN, 310 + b);
        put(&r, "sc", 0, 0, bad[b]);
        coda_binding_t bd[MAXA];
        for (int i = 0; i < r.na; i++) {
            tb_t *t = &r.a[i];
            bd[i].name = t->name;
            bd[i].scalar = r.scalar[i];
            bd[i].tensor = t->nd == 1 ? coda_tensor_1d(t->data, t->dt, t->sh[0])
                                      : coda_tensor_2d(t->data, t->dt, t->sh[0], t->sh[1]);
        }
        coda_tensor_t A = coda_tensor_2d(r.A, CODA_BF16, M, K), B = coda_tensor_2d(r.B, CODA_BF16, N, K);
        CHECK_STATUS(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &A, &B, r.p, bd, r.na, &r.tl, NULL), CODA_ERR_INVALID_ARG);
        int64_t touched = 0;
        const tb_t *y7 = arg(&r, "y7");
        for (int64_t e = 0; e < M * N; e++) touched += get(y7, e) != SENTINEL;
        CHECK(touched == 0, "refused non-finite scalar %g: %lld output elements written", bad[b], (long long)touched);
        run_free(&r);
    }
}

/* ---- reductions, then coda_finish_reduce / coda_finish_rstd on them ---- */

static const char prog_red_spaces[] =
    "program nan_red_spaces\nin x tile f32\n"
    "out rmh rowmax\nout rmd rowmax\nout rqh rowsumsq\nout csh colsum half\nout cmh colmax half\n"
    "out cqh colsumsq half\nout cmd colmax double\nout csd colsum double\n"
    "a = acc\nxv = load x\ns = add a xv\ne = even s\nd = interleave s s\n"
    "reduce rmh e\nreduce rmd d\nreduce rqh e\nreduce csh e\nreduce cmh e\nreduce cqh e\nreduce cmd d\n"
    "reduce csd d\n";

/* finish_reduce (and finish_rstd for sumsq) of partials p (rows, T): a
 * result is of the class of the partials' reduction */
static void check_finish_reduce(run_t *r, const char *what, const char *name, coda_reduce_t op, const char *want_part) {
    const tb_t *t = arg(r, name);
    int64_t rows = t->sh[0], T = t->sh[1];
    float *out = h_alloc((size_t)rows * 4);
    for (int64_t i = 0; i < rows; i++) out[i] = SENTINEL;
    coda_tensor_t pt = coda_tensor_2d(t->data, CODA_F32, rows, T), ot = coda_tensor_1d(out, CODA_F32, rows);
    CHECK_OK(coda_finish_reduce(ctx, op, &pt, &ot, NULL));
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < rows; i++) {
        /* the partials' classes reduced again (sumsq partials are summed) */
        char c = red_cls(op == CODA_REDUCE_MAX ? CODA_REDUCE_MAX : CODA_REDUCE_SUM, want_part + i * T, T, 1);
        if (cls(out[i]) != c) bad++, first = first < 0 ? i : first;
    }
    CHECK(bad == 0, "%s: finish_reduce(%s, op %d): %lld rows of the wrong class (first %lld: %g)", what, name, (int)op,
          (long long)bad, (long long)first, first >= 0 ? out[first] : 0.0);
    if (op == CODA_REDUCE_SUMSQ) {
        for (int64_t i = 0; i < rows; i++) out[i] = SENTINEL;
        CHECK_OK(coda_finish_rstd(ctx, &pt, 64, 1e-5f, &ot, NULL));
        bad = 0;
        for (int64_t i = 0; i < rows; i++) {
            char c = red_cls(CODA_REDUCE_SUM, want_part + i * T, T, 1);
            /* rstd of a NaN sum is NaN, of +inf 0, else finite */
            bad += cls(out[i]) != (c == NAN_ ? NAN_ : F) || out[i] == SENTINEL;
        }
        CHECK(bad == 0, "%s: finish_rstd(%s): %lld rows of the wrong class", what, name, (long long)bad);
    }
    free(out);
}

/* The value s = acc + x of the reduction programs, with NaN (or -inf) put
 * in by `how`: 0 points and a column of x, 1 a row of x, 2 a row of A (a
 * NaN accumulator row), 3 a row of B (a NaN accumulator column), 4 a row
 * of x of -inf */
static void test_reductions(int how) {
    static const char *const hows[] = {"NaN points and a NaN column", "a NaN row", "A row NaN (acc row)",
                                       "B row NaN (acc column)", "a row of -inf"};
    for (int pi = 0; pi < 2; pi++) {
        run_t r;
        run_new(&r, pi ? prog_red_spaces : prog_red_full, M, N, K, TM, TN, 400 + 10 * how + pi);
        mat_t s = mat_new(M, N);
        if (how == 0) {
            put(&r, "x", 5, 17, NAN), *at(&s, 5, 17) = NAN_;
            put(&r, "x", 19, 0, NAN), *at(&s, 19, 0) = NAN_;
            for (int64_t i = 0; i < M; i++) put(&r, "x", i, 10, NAN), *at(&s, i, 10) = NAN_;
        } else if (how == 1 || how == 4) {
            for (int64_t j = 0; j < N; j++) put(&r, "x", 12, j, how == 1 ? NAN : -INFINITY), *at(&s, 12, j) = how == 1 ? NAN_ : NINF;
        } else if (how == 2) {
            r.A[3 * K + 5] = 0x7fc0;
            for (int64_t j = 0; j < N; j++) *at(&s, 3, j) = NAN_;
        } else {
            r.B[9 * K + 0] = 0x7fc0;
            for (int64_t i = 0; i < M; i++) *at(&s, i, 9) = NAN_;
        }
        run_go(&r);
        mat_t sq = mat_new(M, N); /* s * s: -inf squares to +inf */
        for (int64_t e = 0; e < M * N; e++) sq.v[e] = s.v[e] == NINF ? PINF : s.v[e];
        char what[96];
        snprintf(what, sizeof what, "reductions (%s), %s", hows[how], pi ? "half and double" : "full");
        if (!pi) {
            struct { const char *name; coda_reduce_t op; int col; } outs[] = {
                {"rs", CODA_REDUCE_SUM, 0}, {"rm", CODA_REDUCE_MAX, 0}, {"rq", CODA_REDUCE_SUMSQ, 0},
                {"cs", CODA_REDUCE_SUM, 1}, {"cm", CODA_REDUCE_MAX, 1}, {"cq", CODA_REDUCE_SUMSQ, 1}};
            for (int o = 0; o < 6; o++) {
                mat_t *v = outs[o].op == CODA_REDUCE_SUMSQ ? &sq : &s;
                char *w = outs[o].col ? want_colred(v, outs[o].op == CODA_REDUCE_SUMSQ ? CODA_REDUCE_SUM : outs[o].op, TM)
                                      : want_rowred(v, outs[o].op == CODA_REDUCE_SUMSQ ? CODA_REDUCE_SUM : outs[o].op, TN);
                check_cls(&r, what, outs[o].name, w);
                check_finish_reduce(&r, what, outs[o].name, outs[o].op, w);
                free(w);
            }
        } else {
            mat_t e = m_even(&s, 0), d = m_inter(&s, &s), eq = m_even(&sq, 0), dq = m_inter(&sq, &sq);
            struct { const char *name; coda_reduce_t op; int col; mat_t *v; int64_t tw; } outs[] = {
                {"rmh", CODA_REDUCE_MAX, 0, &e, TN / 2}, {"rmd", CODA_REDUCE_MAX, 0, &d, 2 * TN},
                {"rqh", CODA_REDUCE_SUM, 0, &eq, TN / 2}, {"csh", CODA_REDUCE_SUM, 1, &e, 0},
                {"cmh", CODA_REDUCE_MAX, 1, &e, 0}, {"cqh", CODA_REDUCE_SUM, 1, &eq, 0},
                {"cmd", CODA_REDUCE_MAX, 1, &d, 0}, {"csd", CODA_REDUCE_SUM, 1, &d, 0}};
            (void)dq;
            for (int o = 0; o < 8; o++) {
                char *w = outs[o].col ? want_colred(outs[o].v, outs[o].op, TM) : want_rowred(outs[o].v, outs[o].op, outs[o].tw);
                check_cls(&r, what, outs[o].name, w);
                free(w);
            }
            free(e.v), free(d.v), free(eq.v), free(dq.v);
        }
        free(s.v), free(sq.v);
        run_free(&r);
    }
}

/* ---- lse, then coda_finish_lse ---- */

/* representative values of the classes (finite: `fin`) */
static float rep(char c, float fin) { return c == NAN_ ? NAN : c == PINF ? INFINITY : c == NINF ? -INFINITY : fin; }

/* Check lse partials `name` (M, T, 3) of a value of classes v (M, W) cut
 * into tiles of tw, with targets tg[] (columns of W), then coda_finish_lse
 * on them: the classes coda.h sections 5 and 7 give. */
static void check_lse(run_t *r, const char *what, const char *name, mat_t *v, int64_t tw, const int32_t *tg,
                      const char *tname) {
    const tb_t *t = arg(r, name);
    int64_t T = t->sh[1];
    char *w = h_alloc((size_t)(M * T * 3));
    char *lse_w = h_alloc(M), *loss_w = h_alloc(M);
    for (int64_t i = 0; i < M; i++) {
        int nan = 0, pinf = 0, ninf = 0;
        for (int64_t q = 0; q < T; q++) {
            int64_t c0 = q * tw, n = v->c - c0 < tw ? v->c - c0 : tw;
            int tn = 0, tp = 0, ti = 0;
            for (int64_t j = c0; j < c0 + n; j++) tn |= *at(v, i, j) == NAN_, tp |= *at(v, i, j) == PINF, ti += *at(v, i, j) == NINF;
            char *e = w + (i * T + q) * 3;
            e[0] = e[1] = tn ? NAN_ : tp ? PINF : ti == n ? NINF : F;
            if (e[1] == NINF) e[1] = F; /* l = 0 */
            e[2] = tg[i] >= c0 && tg[i] < c0 + n ? *at(v, i, tg[i]) : F;
            nan |= tn, pinf |= tp, ninf += ti;
        }
        lse_w[i] = nan ? NAN_ : pinf ? PINF : ninf == v->c ? NINF : F;
        float pk = tg[i] >= 0 && tg[i] < v->c ? rep(*at(v, i, tg[i]), 0.5f) : 0.0f;
        loss_w[i] = tg[i] == -100 ? F : (char)cls(rep(lse_w[i], 1.0f) - pk);
    }
    check_cls(r, what, name, w);
    /* l of a finite maximum is in [1, width]; of -inf exactly 0 */
    int64_t bad_l = 0;
    for (int64_t e = 0; e < M * T; e++) {
        float m = get(t, 3 * e), l = get(t, 3 * e + 1);
        if (cls(m) == F) bad_l += !(l >= 1.0f && l <= (float)tw);
        if (cls(m) == NINF) bad_l += l != 0.0f;
    }
    CHECK(bad_l == 0, "%s: %s: %lld partials with l out of range", what, name, (long long)bad_l);

    float *lse = h_alloc(M * 4), *loss = h_alloc(M * 4);
    for (int64_t i = 0; i < M; i++) lse[i] = loss[i] = SENTINEL;
    coda_tensor_t pt = coda_tensor_3d(t->data, CODA_F32, M, T, 3), tt = coda_tensor_1d(arg(r, tname)->data, CODA_I32, M);
    coda_tensor_t lt = coda_tensor_1d(lse, CODA_F32, M), st = coda_tensor_1d(loss, CODA_F32, M);
    CHECK_OK(coda_finish_lse(ctx, &pt, &tt, -100, &lt, &st, NULL));
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < M; i++)
        if (cls(lse[i]) != lse_w[i] || cls(loss[i]) != loss_w[i] || (tg[i] == -100 && loss[i] != 0.0f))
            bad++, first = first < 0 ? i : first;
    CHECK(bad == 0, "%s: finish_lse(%s): %lld rows wrong (first: row %lld lse %g loss %g, want %s and %s)", what, name,
          (long long)bad, (long long)first, first >= 0 ? lse[first] : 0.0, first >= 0 ? loss[first] : 0.0,
          first >= 0 ? cls_name[(int)lse_w[first]] : "-", first >= 0 ? cls_name[(int)loss_w[first]] : "-");
    free(w), free(lse_w), free(loss_w), free(lse), free(loss);
}

static void test_lse(void) {
    run_t r;
    run_new(&r, prog_lse, M, N, K, TM, TN, 500);
    int32_t tg[M], th[M];
    for (int i = 0; i < M; i++) {
        tg[i] = (i * 5 + 3) % N;
        th[i] = (i * 7 + 1) % (N / 2);
    }
    tg[17] = -100;  /* ignored */
    tg[13] = 1000;  /* outside the row: picks nothing */
    mat_t z = mat_new(M, N);
    /* row 1: NaN row (r); 2: NaN column in another tile than the target;
     * 3: NaN at the target; 4: NaN beside the target, its tile; 5: +inf
     * off the target; 6: +inf at the target; 7: all -inf; 8: a tile of
     * -inf, not the target's; 9: -inf at the target; 10: three +inf in two
     * tiles; 11: +inf and NaN; 13: all -inf, target outside; 17: NaN,
     * ignored; 0, 12, 14..16, 18, 19: finite */
    tg[2] = 3, tg[3] = 12, tg[4] = 12, tg[5] = 20, tg[6] = 20, tg[7] = 9, tg[8] = 1, tg[9] = 22;
    put(&r, "r", 1, 0, NAN);
    for (int64_t j = 0; j < N; j++) *at(&z, 1, j) = NAN_;
    struct { int64_t i, j; float v; } inj[] = {{2, 17, NAN}, {3, 12, NAN}, {4, 14, NAN}, {5, 2, INFINITY},
                                               {6, 20, INFINITY}, {9, 22, -INFINITY}, {10, 0, INFINITY},
                                               {10, 7, INFINITY}, {10, 23, INFINITY}, {11, 5, INFINITY},
                                               {11, 6, NAN}, {17, 4, NAN}};
    for (size_t q = 0; q < sizeof inj / sizeof inj[0]; q++) {
        put(&r, "x", inj[q].i, inj[q].j, inj[q].v);
        *at(&z, inj[q].i, inj[q].j) = (char)cls(inj[q].v);
    }
    for (int64_t j = 0; j < N; j++) {
        put(&r, "x", 7, j, -INFINITY), *at(&z, 7, j) = NINF;
        put(&r, "x", 13, j, -INFINITY), *at(&z, 13, j) = NINF;
    }
    for (int64_t j = 16; j < 24; j++) put(&r, "x", 8, j, -INFINITY), *at(&z, 8, j) = NINF;
    for (int i = 0; i < M; i++) put(&r, "t", i, 0, (float)tg[i]), put(&r, "th", i, 0, (float)th[i]);
    run_go(&r);
    check_lse(&r, "lse", "part", &z, TN, tg, "t");
    mat_t e = m_even(&z, 0);
    check_lse(&r, "lse, half space", "parth", &e, TN / 2, th, "th");
    /* the rows the issue is about, by value: a NaN row gives NaN (not -inf) */
    const tb_t *pt = arg(&r, "part");
    CHECK(isnan(get(pt, (1 * 3 + 0) * 3)) && isnan(get(pt, (1 * 3 + 0) * 3 + 1)), "NaN row: partials (m, l) = (%g, %g), want NaN",
          get(pt, (1 * 3 + 0) * 3), get(pt, (1 * 3 + 0) * 3 + 1));
    free(z.v), free(e.v);
    run_free(&r);
}

/* ---- rowpart ---- */

static void test_rowpart(void) {
    run_t r;
    run_new(&r, prog_rowpart, M, N, K, TM, TN, 600);
    put(&r, "ss", 4, 2, NAN);
    put(&r, "ss", 19, 4, NAN); /* the last partial of the last row */
    run_go(&r);
    mat_t y = mat_new(M, N);
    for (int64_t j = 0; j < N; j++) *at(&y, 4, j) = NAN_, *at(&y, 19, j) = NAN_;
    check_cls(&r, "rowpart", "y", y.v);
    check_cls(&r, "rowpart", "sv", y.v);
    free(y.v);
    run_free(&r);
}

/* ---- finishing steps on hand-made partials: where in t the NaN is, and
 * infinities ---- */

static void test_finish_direct(void) {
    enum { R = 8, T = 5 };
    float p[R][T], out[R];
    for (int i = 0; i < R; i++)
        for (int t = 0; t < T; t++) p[i][t] = 1.0f + (float)(i + t) / 8;
    p[0][0] = NAN;                               /* first */
    p[1][2] = NAN;                               /* middle */
    p[2][T - 1] = NAN;                           /* last (after the maximum) */
    for (int t = 0; t < T; t++) p[3][t] = NAN;   /* all */
    p[4][1] = INFINITY, p[4][3] = NAN;           /* NaN after +inf */
    for (int t = 0; t < T; t++) p[5][t] = -INFINITY; /* all -inf: max -inf, sum -inf */
    p[6][2] = INFINITY;                          /* +inf: max and sum +inf */
    coda_tensor_t pt = coda_tensor_2d(p, CODA_F32, R, T), ot = coda_tensor_1d(out, CODA_F32, R);
    static const char want_max[R] = {NAN_, NAN_, NAN_, NAN_, NAN_, NINF, PINF, F};
    static const char want_sum[R] = {NAN_, NAN_, NAN_, NAN_, NAN_, NINF, PINF, F};
    for (int op = 0; op < 3; op++) {
        for (int i = 0; i < R; i++) out[i] = SENTINEL;
        CHECK_OK(coda_finish_reduce(ctx, (coda_reduce_t)op, &pt, &ot, NULL));
        for (int i = 0; i < R; i++)
            CHECK(cls(out[i]) == (op == CODA_REDUCE_MAX ? want_max : want_sum)[i] && out[i] != SENTINEL,
                  "finish_reduce op %d row %d: %g", op, i, out[i]);
    }
    for (int i = 0; i < R; i++) out[i] = SENTINEL;
    CHECK_OK(coda_finish_rstd(ctx, &pt, 16, 1e-5f, &ot, NULL));
    for (int i = 0; i < 5; i++) CHECK(isnan(out[i]), "finish_rstd row %d: %g, want NaN", i, out[i]);
    CHECK(out[6] == 0.0f && cls(out[7]) == F, "finish_rstd: +inf sum gives %g (want 0), finite %g", out[6], out[7]);

    /* lse partials (m, l, p), T = 3 tiles, one row per case */
    enum { RL = 9, TL = 3 };
    float q[RL][TL][3], lse[RL], loss[RL];
    int32_t tg[RL];
    for (int i = 0; i < RL; i++) {
        tg[i] = 5;
        for (int t = 0; t < TL; t++) q[i][t][0] = 0.5f * (float)t, q[i][t][1] = 2.0f, q[i][t][2] = t == 0 ? 0.25f : 0.0f;
    }
    q[0][1][0] = NAN, q[0][1][1] = NAN;            /* a NaN tile: lse, loss NaN */
    q[1][0][2] = NAN;                              /* only p NaN: lse finite, loss NaN */
    q[2][2][0] = INFINITY, q[2][2][1] = INFINITY;  /* +inf tile, finite target: +inf, +inf */
    q[3][0][0] = INFINITY, q[3][0][1] = INFINITY, q[3][0][2] = INFINITY; /* +inf target: +inf, NaN */
    for (int t = 0; t < TL; t++) q[4][t][0] = -INFINITY, q[4][t][1] = 0.0f; /* all -inf, target p = -inf */
    q[4][0][2] = -INFINITY;
    for (int t = 0; t < TL; t++) q[5][t][0] = -INFINITY, q[5][t][1] = 0.0f, q[5][t][2] = 0.0f; /* target outside */
    q[6][1][0] = -INFINITY, q[6][1][1] = 0.0f;     /* one -inf tile: no effect */
    q[7][2][0] = NAN, q[7][2][1] = NAN;            /* NaN, ignored: loss 0 */
    tg[7] = -100;
    q[8][0][0] = INFINITY, q[8][0][1] = INFINITY, q[8][2][0] = INFINITY, q[8][2][1] = INFINITY; /* two +inf tiles */
    static const char want_lse[RL] = {NAN_, F, PINF, PINF, NINF, NINF, F, NAN_, PINF};
    static const char want_loss[RL] = {NAN_, NAN_, PINF, NAN_, NAN_, NINF, F, F, PINF};
    coda_tensor_t qt = coda_tensor_3d(q, CODA_F32, RL, TL, 3), tt = coda_tensor_1d(tg, CODA_I32, RL);
    coda_tensor_t lt = coda_tensor_1d(lse, CODA_F32, RL), st = coda_tensor_1d(loss, CODA_F32, RL);
    CHECK_OK(coda_finish_lse(ctx, &qt, &tt, -100, &lt, &st, NULL));
    for (int i = 0; i < RL; i++)
        CHECK(cls(lse[i]) == want_lse[i] && cls(loss[i]) == want_loss[i], "finish_lse row %d: lse %g loss %g, want %s %s",
              i, lse[i], loss[i], cls_name[(int)want_lse[i]], cls_name[(int)want_loss[i]]);
    CHECK(loss[7] == 0.0f, "ignored row: loss %g, want 0", loss[7]);
    /* one -inf tile drops out: lse of the two others, 0.0 + log(2 e^-1 + 2) ... exactly as without it */
    float q6 = 1.0f + logf(2.0f * expf(-1.0f) + 2.0f);
    CHECK(fabsf(lse[6] - q6) < 1e-5f, "a -inf tile changed lse: %g, want %g", lse[6], q6);
}

int main(void) {
    coda_context_options_t o = {2, NULL};
    REQUIRE_OK(coda_context_create(&o, &ctx));
    test_maps();
    test_pairs();
    test_vectors();
    for (int how = 0; how < 5; how++) test_reductions(how);
    test_lse();
    test_rowpart();
    test_finish_direct();
    coda_context_free(ctx);
    TEST_MAIN_END();
}
