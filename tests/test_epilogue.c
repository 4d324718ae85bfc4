/* test_epilogue.c - the CPU interpreter of epilogue programs (coda_gemm_epilogue)
 * against float64 computations written out here, one per primitive class:
 * elementwise maps and scalars, pairwise maps (even/odd/interleave/swap),
 * row/col vector loads, tile loads and stores in bf16 and f32 with several
 * outputs, row/col reductions + coda_finish_reduce, online log-sum-exp +
 * coda_finish_lse with ignore_index, rowidx/colidx. Several tilings, N not a
 * tile multiple, every layout; outputs are NaN-poisoned before each run. */
#include "harness.h"

/* ---- a GEMM problem with a float64 accumulator ---- */

typedef struct prob {
    coda_layout_t layout;
    int64_t M, N, K;
    uint16_t *A, *B;        /* bf16 operands, stored as the layout wants */
    coda_tensor_t a, b;
    double *acc;            /* (M, N) float64 op(A) op(B)                */
} prob_t;

static prob_t prob_new(coda_layout_t layout, int64_t M, int64_t N, int64_t K, uint64_t seed) {
    prob_t p = {layout, M, N, K, NULL, NULL, {0}, {0}, NULL};
    h_rng r = rng_new(seed);
    p.A = h_alloc((size_t)(M * K) * 2);
    p.B = h_alloc((size_t)(N * K) * 2);
    rng_fill_bf16(&r, p.A, M * K, 1.0f);
    rng_fill_bf16(&r, p.B, N * K, 1.0f);
    p.a = layout == CODA_LAYOUT_TN ? coda_tensor_2d(p.A, CODA_BF16, K, M) : coda_tensor_2d(p.A, CODA_BF16, M, K);
    p.b = layout == CODA_LAYOUT_NT ? coda_tensor_2d(p.B, CODA_BF16, N, K) : coda_tensor_2d(p.B, CODA_BF16, K, N);
    p.acc = h_alloc((size_t)(M * N) * sizeof(double));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) {
                double x = h_bf2f(layout == CODA_LAYOUT_TN ? p.A[k * M + i] : p.A[i * K + k]);
                double y = h_bf2f(layout == CODA_LAYOUT_NT ? p.B[j * K + k] : p.B[k * N + j]);
                s += x * y;
            }
            p.acc[i * N + j] = s;
        }
    return p;
}
static void prob_free(prob_t *p) { free(p->A); free(p->B); free(p->acc); }

/* ---- outputs: NaN-poisoned buffers ---- */

static float *out_f32(int64_t n) { float *p = h_alloc((size_t)(n + 1) * 4); poison_f32(p, n); return p; }
static uint16_t *out_bf16(int64_t n) { uint16_t *p = h_alloc((size_t)(n + 1) * 2); poison_bf16(p, n); return p; }
static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n + 1), sizeof(double));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
    return p;
}

static char g_case[160]; /* printed with every failure */

/* |out - ref| <= atol + rtol |ref| everywhere (NaN fails). */
static void cmp_f32(const char *what, const float *out, const double *ref, int64_t n, double atol, double rtol) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)out[i] - ref[i]) <= atol + rtol * fabs(ref[i]))) { if (!bad++) first = i; }
    CHECK(bad == 0, "%s %s: %lld of %lld off, first [%lld] %.9g vs %.9g", g_case, what, (long long)bad,
          (long long)n, (long long)first, first >= 0 ? out[first] : 0.0, first >= 0 ? ref[first] : 0.0);
}
static void cmp_bf16(const char *what, const uint16_t *out, const double *ref, int64_t n, double atol) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        double o = h_bf2f(out[i]);
        if (!(fabs(o - ref[i]) <= atol + fabs(ref[i]) / 128.0)) { if (!bad++) first = i; }
    }
    CHECK(bad == 0, "%s %s: %lld of %lld off, first [%lld] %.6g vs %.6g", g_case, what, (long long)bad,
          (long long)n, (long long)first, first >= 0 ? h_bf2f(out[first]) : 0.0, first >= 0 ? ref[first] : 0.0);
}

static coda_program_t *parse(const char *text) {
    coda_program_t *p = NULL;
    coda_status_t s = coda_program_parse(text, &p);
    if (s != CODA_OK) {
        fprintf(stderr, "FATAL: program does not parse: %s\n%s\n", coda_last_error(), text);
        exit(1);
    }
    return p;
}

static coda_binding_t bind(const char *name, coda_tensor_t t) { coda_binding_t b = {name, t, 0.0f}; return b; }
static coda_binding_t bind_scalar(const char *name, float v) { coda_binding_t b = {name, {0}, v}; return b; }

static coda_context_t *g_ctx;

/* The tiling the call will use: 0 fields (or NULL) take the default. */
static coda_tiling_t resolve_tiling(const prob_t *P, const coda_tiling_t *tl) {
    coda_tiling_t def;
    REQUIRE_OK(coda_choose_tiling(g_ctx, CODA_DEVICE_CPU, P->layout, P->M, P->N, P->K, &def));
    if (tl && tl->tile_m) def.tile_m = tl->tile_m;
    if (tl && tl->tile_n) def.tile_n = tl->tile_n;
    return def;
}

/* ======================================================================
 * 1. elementwise maps and scalars
 * ==================================================================== */


/* The unary ops, their float64 meaning, and a safe argument. */
typedef struct unary { const char *name; double (*f)(double); int safe; } unary_t;
static double d_neg(double x) { return -x; }
static double d_exp(double x) { return exp(x); }
static double d_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double d_silu(double x) { return x / (1.0 + exp(-x)); }
static double d_dsilu(double x) { double s = 1.0 / (1.0 + exp(-x)); return s * (1.0 + x * (1.0 - s)); }
static double d_square(double x) { return x * x; }
static double d_rsqrt(double x) { return 1.0 / sqrt(x); }
static double d_recip(double x) { return 1.0 / x; }
/* safe: 0 any x, 1 needs x >= 1 (log, sqrt, rsqrt, recip: fed 1 + |x|) */
static const unary_t unaries[] = {
    {"neg", d_neg, 0}, {"abs", fabs, 0}, {"exp", d_exp, 0}, {"log", log, 1}, {"sqrt", sqrt, 1},
    {"rsqrt", d_rsqrt, 1}, {"recip", d_recip, 1}, {"sin", sin, 0}, {"cos", cos, 0},
    {"tanh", tanh, 0}, {"sigmoid", d_sigmoid, 0}, {"silu", d_silu, 0}, {"dsilu", d_dsilu, 0},
    {"square", d_square, 0},
};
#define N_UNARY (int)(sizeof unaries / sizeof unaries[0])

static void test_maps(const prob_t *P, const coda_tiling_t *tl) {
    int64_t M = P->M, N = P->N, MN = M * N;
    char text[4096];
    int len = snprintf(text, sizeof text,
                       "program maps\nin sc scalar\nin y tile f32\n");
    for (int u = 0; u < N_UNARY; u++) len += snprintf(text + len, sizeof text - len, "out u_%s tile f32\n", unaries[u].name);
    const char *bins[] = {"add", "sub", "mul", "div", "max", "min", "pow"};
    for (int q = 0; q < 7; q++) len += snprintf(text + len, sizeof text - len, "out b_%s tile f32\n", bins[q]);
    len += snprintf(text + len, sizeof text - len,
                    "out o_eq tile f32\nout o_lt tile f32\nout o_mod tile f32\nout o_fma tile f32\n"
                    "out o_sel tile f32\nout o_rnd tile f32\n"
                    "a = acc\nscv = load sc\nx = mul a scv\nax = abs x\none = const 1\nx1 = add ax one\nyv = load y\n");
    for (int u = 0; u < N_UNARY; u++)
        len += snprintf(text + len, sizeof text - len, "v_%s = %s %s\nstore u_%s v_%s\n", unaries[u].name,
                        unaries[u].name, unaries[u].safe ? "x1" : "x", unaries[u].name, unaries[u].name);
    for (int q = 0; q < 7; q++)
        len += snprintf(text + len, sizeof text - len, "w_%s = %s %s yv\nstore b_%s w_%s\n", bins[q], bins[q],
                        q == 3 || q == 6 ? "x1" : "x", bins[q], bins[q]);
    len += snprintf(text + len, sizeof text - len,
                    "ci = colidx\nthree = const 3\ncm = mod ci three\nzero = const 0\nce = eq cm zero\nstore o_eq ce\n"
                    "q = const 0.25\nyl = lt yv q\nstore o_lt yl\n"
                    "ym = mod yv q\nstore o_mod ym\n"
                    "f = fma x yv a\nstore o_fma f\n"
                    "s = select yl x yv\nstore o_sel s\n"
                    "r = round_bf16 x\nstore o_rnd r\n");
    coda_program_t *prog = parse(text);

    h_rng rng = rng_new(99);
    float *y = h_alloc((size_t)MN * 4);
    rng_fill_f32(&rng, y, MN, 1.0f);
    const float sc = 0.25f;
    int n_out = N_UNARY + 7 + 6;
    float *outs[64];
    coda_binding_t bd[64];
    int nb = 0;
    bd[nb++] = bind_scalar("sc", sc);
    bd[nb++] = bind("y", coda_tensor_2d(y, CODA_F32, M, N));
    char names[64][32];
    for (int o = 0; o < n_out; o++) {
        outs[o] = out_f32(MN);
        if (o < N_UNARY) snprintf(names[o], 32, "u_%s", unaries[o].name);
        else if (o < N_UNARY + 7) snprintf(names[o], 32, "b_%s", bins[o - N_UNARY]);
        else {
            static const char *const rest[6] = {"o_eq", "o_lt", "o_mod", "o_fma", "o_sel", "o_rnd"};
            snprintf(names[o], 32, "%s", rest[o - N_UNARY - 7]);
        }
        bd[nb++] = bind(names[o], coda_tensor_2d(outs[o], CODA_F32, M, N));
    }
    CHECK_OK(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, nb, tl, NULL));

    double *ref = dalloc(MN);
    /* x carries the f32 accumulator's rounding (relative ~1e-7 of sum |a b|,
     * absolute ~1e-6 here); maps amplify it by at most their slope. */
    const double atol = 2e-5, rtol = 2e-5;
    for (int u = 0; u < N_UNARY; u++) {
        for (int64_t i = 0; i < MN; i++) {
            double x = P->acc[i] * sc;
            ref[i] = unaries[u].f(unaries[u].safe ? 1.0 + fabs(x) : x);
        }
        cmp_f32(names[u], outs[u], ref, MN, atol, unaries[u].f == d_exp || unaries[u].f == d_square ? 1e-4 : rtol);
    }
    for (int q = 0; q < 7; q++) {
        for (int64_t i = 0; i < MN; i++) {
            double x = P->acc[i] * sc, x1 = 1.0 + fabs(x), yy = y[i];
            switch (q) {
            case 0: ref[i] = x + yy; break;
            case 1: ref[i] = x - yy; break;
            case 2: ref[i] = x * yy; break;
            case 3: ref[i] = x1 / yy; break;
            case 4: ref[i] = x > yy ? x : yy; break;
            case 5: ref[i] = x < yy ? x : yy; break;
            default: ref[i] = pow(x1, yy); break;
            }
        }
        /* division by y near 0 amplifies: compare relative only there */
        cmp_f32(names[N_UNARY + q], outs[N_UNARY + q], ref, MN, q == 3 ? 0 : atol, q == 3 ? 1e-4 : rtol);
    }
    int o = N_UNARY + 7;
    for (int64_t i = 0; i < MN; i++) ref[i] = (i % N) % 3 == 0 ? 1.0 : 0.0;
    cmp_f32("eq", outs[o], ref, MN, 0, 0);
    for (int64_t i = 0; i < MN; i++) ref[i] = y[i] < 0.25 ? 1.0 : 0.0;
    cmp_f32("lt", outs[o + 1], ref, MN, 0, 0);
    for (int64_t i = 0; i < MN; i++) ref[i] = fmod((double)y[i], 0.25);
    cmp_f32("mod", outs[o + 2], ref, MN, 0, 0);
    for (int64_t i = 0; i < MN; i++) ref[i] = P->acc[i] * sc * y[i] + P->acc[i];
    cmp_f32("fma", outs[o + 3], ref, MN, 4 * atol, rtol);
    for (int64_t i = 0; i < MN; i++) ref[i] = y[i] < 0.25 ? P->acc[i] * sc : y[i];
    cmp_f32("select", outs[o + 4], ref, MN, atol, rtol);
    for (int64_t i = 0; i < MN; i++) ref[i] = P->acc[i] * sc;
    cmp_f32("round_bf16", outs[o + 5], ref, MN, atol, 1.0 / 256);
    /* round_bf16 really rounds: its result has no bits below bf16's */
    int64_t unrounded = 0;
    for (int64_t i = 0; i < MN; i++) {
        uint32_t u; memcpy(&u, &outs[o + 5][i], 4);
        unrounded += (u & 0xffff) != 0;
    }
    CHECK(unrounded == 0, "%s round_bf16: %lld values keep low bits", g_case, (long long)unrounded);

    for (int q = 0; q < n_out; q++) free(outs[q]);
    free(y); free(ref);
    coda_program_free(prog);
}

/* ======================================================================
 * 2. pairwise maps and vector loads (row bf16/f32/i32, col full/half)
 * ==================================================================== */

static const char prog_pairs[] =
    "program pairs\n"
    "in  r   row f32\n"
    "in  rb  row bf16\n"
    "in  ri  row i32\n"
    "in  g   col bf16\n"
    "in  h   col f32 half\n"
    "out ev  tile f32 half      # even(acc) * h\n"
    "out od  tile bf16 half     # odd(acc) + ri\n"
    "out il  tile f32 double    # interleave(acc * r, acc * g)\n"
    "out sw  tile f32           # swap(acc) * rb\n"
    "out id  tile f32           # interleave(even acc, odd acc) == acc\n"
    "out dd  tile f32           # even(interleave(acc, acc)) == acc\n"
    "a   = acc\n"
    "hv  = load h\n"
    "e   = even a\n"
    "eh  = mul e hv\n"
    "store ev eh\n"
    "o   = odd a\n"
    "riv = load ri\n"
    "oi  = add o riv\n"
    "store od oi\n"
    "rv  = load r\n"
    "ar  = mul a rv\n"
    "gv  = load g\n"
    "ag  = mul a gv\n"
    "x   = interleave ar ag\n"
    "store il x\n"
    "s   = swap a\n"
    "rbv = load rb\n"
    "sr  = mul s rbv\n"
    "store sw sr\n"
    "y   = interleave e o\n"
    "store id y\n"
    "z   = interleave a a\n"
    "ze  = even z\n"
    "store dd ze\n";

static void test_pairs(const prob_t *P, const coda_tiling_t *tl) {
    int64_t M = P->M, N = P->N, H = N / 2;
    coda_program_t *prog = parse(prog_pairs);
    h_rng rng = rng_new(7);
    float *r = h_alloc((size_t)M * 4), *h = h_alloc((size_t)H * 4);
    uint16_t *rb = h_alloc((size_t)M * 2), *g = h_alloc((size_t)N * 2);
    int32_t *ri = h_alloc((size_t)M * 4);
    rng_fill_f32(&rng, r, M, 2.0f);
    rng_fill_f32(&rng, h, H, 2.0f);
    rng_fill_bf16(&rng, rb, M, 2.0f);
    rng_fill_bf16(&rng, g, N, 2.0f);
    for (int64_t i = 0; i < M; i++) ri[i] = (int32_t)(rng_uniform(&rng) * 50);
    float *ev = out_f32(M * H), *il = out_f32(M * 2 * N), *sw = out_f32(M * N), *id = out_f32(M * N),
          *dd = out_f32(M * N);
    uint16_t *od = out_bf16(M * H);
    coda_binding_t bd[] = {
        bind("r", coda_tensor_1d(r, CODA_F32, M)),      bind("rb", coda_tensor_1d(rb, CODA_BF16, M)),
        bind("ri", coda_tensor_1d(ri, CODA_I32, M)),    bind("g", coda_tensor_1d(g, CODA_BF16, N)),
        bind("h", coda_tensor_1d(h, CODA_F32, H)),      bind("ev", coda_tensor_2d(ev, CODA_F32, M, H)),
        bind("od", coda_tensor_2d(od, CODA_BF16, M, H)), bind("il", coda_tensor_2d(il, CODA_F32, M, 2 * N)),
        bind("sw", coda_tensor_2d(sw, CODA_F32, M, N)),  bind("id", coda_tensor_2d(id, CODA_F32, M, N)),
        bind("dd", coda_tensor_2d(dd, CODA_F32, M, N)),
    };
    CHECK_OK(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, (int)(sizeof bd / sizeof bd[0]), tl, NULL));
    const double atol = 2e-5, rtol = 2e-5;
    double *ref = dalloc(M * 2 * N);
    const double *acc = P->acc;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < H; j++) ref[i * H + j] = acc[i * N + 2 * j] * h[j];
    cmp_f32("even*h", ev, ref, M * H, 2 * atol, rtol);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < H; j++) ref[i * H + j] = acc[i * N + 2 * j + 1] + ri[i];
    cmp_bf16("odd+ri", od, ref, M * H, atol);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            ref[i * 2 * N + 2 * j] = acc[i * N + j] * r[i];
            ref[i * 2 * N + 2 * j + 1] = acc[i * N + j] * h_bf2f(g[j]);
        }
    cmp_f32("interleave", il, ref, M * 2 * N, 2 * atol, rtol);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) ref[i * N + j] = acc[i * N + (j ^ 1)] * h_bf2f(rb[i]);
    cmp_f32("swap*rb", sw, ref, M * N, 2 * atol, rtol);
    cmp_f32("interleave(even,odd)", id, acc, M * N, atol, rtol);
    /* and exactly the accumulator coda_gemm computes */
    float *c = out_f32(M * N);
    coda_tensor_t ct = coda_tensor_2d(c, CODA_F32, M, N);
    CHECK_OK(coda_gemm(g_ctx, P->layout, &P->a, &P->b, &ct, 1.0f, 0.0f, NULL));
    CHECK(memcmp(c, id, (size_t)(M * N) * 4) == 0, "%s fused acc differs bitwise from coda_gemm", g_case);
    CHECK(memcmp(c, dd, (size_t)(M * N) * 4) == 0, "%s even(interleave(a, a)) != a", g_case);
    free(c); free(r); free(h); free(rb); free(g); free(ri);
    free(ev); free(il); free(sw); free(id); free(dd); free(od); free(ref);
    coda_program_free(prog);
}

/* ======================================================================
 * 3. tile loads and stores, bf16 and f32, several outputs; row reductions
 *    (the O-projection program) + coda_finish_reduce / coda_finish_rstd
 * ==================================================================== */

static const char prog_oproj[] =
    "program oproj\n"
    "in  x   tile bf16\n"
    "in  x2  tile f32 double\n"
    "in  g   col  bf16\n"
    "out h   tile bf16\n"
    "out hg  tile bf16\n"
    "out af  tile f32\n"
    "out dbl tile bf16 double\n"
    "out ss  rowsum\n"
    "out sq  rowsumsq\n"
    "out mx  rowmax\n"
    "out hs  rowsum          # over the half space\n"
    "out cs  colsum\n"
    "out cq  colsumsq\n"
    "out cm  colmax\n"
    "out ch  colsum half\n"
    "a  = acc\n"
    "xr = load x\n"
    "s  = add a xr\n"
    "h1 = round_bf16 s\n"
    "store h h1\n"
    "gv = load g\n"
    "hg1 = mul h1 gv\n"
    "store hg hg1\n"
    "store af a\n"
    "x2v = load x2\n"
    "d  = interleave a a\n"
    "dx = add d x2v\n"
    "store dbl dx\n"
    "reduce ss h1\n"
    "reduce sq h1\n"
    "reduce mx a\n"
    "e  = even a\n"
    "reduce hs e\n"
    "reduce cs a\n"
    "reduce cq hg1\n"
    "reduce cm s\n"
    "o  = odd a\n"
    "reduce ch o\n";

static void test_oproj(const prob_t *P, const coda_tiling_t *tl_in) {
    int64_t M = P->M, N = P->N, H = N / 2;
    coda_tiling_t tl = resolve_tiling(P, tl_in);
    int64_t tm = tl.tile_m, tn = tl.tile_n, NT = (N + tn - 1) / tn, MT = (M + tm - 1) / tm;
    coda_program_t *prog = parse(prog_oproj);
    h_rng rng = rng_new(11);
    uint16_t *x = h_alloc((size_t)(M * N) * 2), *g = h_alloc((size_t)N * 2);
    float *x2 = h_alloc((size_t)(M * 2 * N) * 4);
    rng_fill_bf16(&rng, x, M * N, 4.0f);
    rng_fill_bf16(&rng, g, N, 2.0f);
    rng_fill_f32(&rng, x2, M * 2 * N, 1.0f);
    uint16_t *h = out_bf16(M * N), *hg = out_bf16(M * N), *dbl = out_bf16(M * 2 * N);
    float *af = out_f32(M * N), *ss = out_f32(M * NT), *sq = out_f32(M * NT), *mx = out_f32(M * NT),
          *hs = out_f32(M * NT), *cs = out_f32(N * MT), *cq = out_f32(N * MT), *cm = out_f32(N * MT),
          *ch = out_f32(H * MT);
    coda_binding_t bd[] = {
        bind("x", coda_tensor_2d(x, CODA_BF16, M, N)),      bind("x2", coda_tensor_2d(x2, CODA_F32, M, 2 * N)),
        bind("g", coda_tensor_1d(g, CODA_BF16, N)),         bind("h", coda_tensor_2d(h, CODA_BF16, M, N)),
        bind("hg", coda_tensor_2d(hg, CODA_BF16, M, N)),    bind("af", coda_tensor_2d(af, CODA_F32, M, N)),
        bind("dbl", coda_tensor_2d(dbl, CODA_BF16, M, 2 * N)), bind("ss", coda_tensor_2d(ss, CODA_F32, M, NT)),
        bind("sq", coda_tensor_2d(sq, CODA_F32, M, NT)),    bind("mx", coda_tensor_2d(mx, CODA_F32, M, NT)),
        bind("hs", coda_tensor_2d(hs, CODA_F32, M, NT)),    bind("cs", coda_tensor_2d(cs, CODA_F32, N, MT)),
        bind("cq", coda_tensor_2d(cq, CODA_F32, N, MT)),    bind("cm", coda_tensor_2d(cm, CODA_F32, N, MT)),
        bind("ch", coda_tensor_2d(ch, CODA_F32, H, MT)),
    };
    /* bindings in a different order than declared: names, not positions, count */
    for (int i = 0; i < 7; i++) { coda_binding_t t = bd[i]; bd[i] = bd[14 - i]; bd[14 - i] = t; }
    CHECK_OK(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 15, tl_in, NULL));

    const double *acc = P->acc;
    const double atol = 2e-5, rtol = 2e-5;
    double *ref = dalloc(M * 2 * N), *h64 = dalloc(M * N);
    /* h: what the fused kernel stores is round_bf16(f32(acc) + x). Use the
     * kernel's own h (checked to be within rounding of float64) for what
     * follows, so that a bf16 rounding flip does not cascade. */
    for (int64_t i = 0; i < M * N; i++) ref[i] = acc[i] + h_bf2f(x[i]);
    cmp_bf16("h", h, ref, M * N, atol);
    for (int64_t i = 0; i < M * N; i++) h64[i] = h_bf2f(h[i]);
    for (int64_t i = 0; i < M * N; i++) ref[i] = h64[i] * h_bf2f(g[i % N]);
    cmp_bf16("hg", hg, ref, M * N, 0);
    cmp_f32("af", af, acc, M * N, atol, rtol);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < 2 * N; j++) ref[i * 2 * N + j] = acc[i * N + j / 2] + x2[i * 2 * N + j];
    cmp_bf16("dbl", dbl, ref, M * 2 * N, atol);

    /* row partials: tile t covers columns [t tn, (t+1) tn) (half space: tn/2) */
    double *rp = dalloc(M * NT * 4);
    for (int64_t i = 0; i < M; i++)
        for (int64_t t = 0; t < NT; t++) {
            double s1 = 0, s2 = 0, m = -INFINITY, s4 = 0;
            for (int64_t j = t * tn; j < (t + 1) * tn && j < N; j++) {
                s1 += h64[i * N + j];
                s2 += h64[i * N + j] * h64[i * N + j];
                if (acc[i * N + j] > m) m = acc[i * N + j];
            }
            for (int64_t j = t * tn / 2; j < (t + 1) * tn / 2 && j < H; j++) s4 += acc[i * N + 2 * j];
            rp[(0 * M + i) * NT + t] = s1;
            rp[(1 * M + i) * NT + t] = s2;
            rp[(2 * M + i) * NT + t] = m;
            rp[(3 * M + i) * NT + t] = s4;
        }
    double tol_s = 1e-5 * tn * 4; /* sums of up to tn terms of size ~4-16 */
    cmp_f32("rowsum partials", ss, rp, M * NT, tol_s, rtol);
    cmp_f32("rowsumsq partials", sq, rp + M * NT, M * NT, tol_s * 16, rtol);
    cmp_f32("rowmax partials", mx, rp + 2 * M * NT, M * NT, atol, rtol);
    cmp_f32("rowsum(half) partials", hs, rp + 3 * M * NT, M * NT, tol_s, rtol);
    /* max partials are exactly an element of the f32 accumulator */
    float *fin = out_f32(M > N ? M : N);
    double *fref = dalloc(M > N ? M : N);
    coda_tensor_t ssT = coda_tensor_2d(ss, CODA_F32, M, NT), sqT = coda_tensor_2d(sq, CODA_F32, M, NT),
                  mxT = coda_tensor_2d(mx, CODA_F32, M, NT);
    coda_tensor_t finT = coda_tensor_1d(fin, CODA_F32, M);
    CHECK_OK(coda_finish_reduce(g_ctx, CODA_REDUCE_SUM, &ssT, &finT, NULL));
    for (int64_t i = 0; i < M; i++) { fref[i] = 0; for (int64_t t = 0; t < NT; t++) fref[i] += rp[i * NT + t]; }
    cmp_f32("finish rowsum", fin, fref, M, tol_s * NT, rtol);
    poison_f32(fin, M);
    CHECK_OK(coda_finish_reduce(g_ctx, CODA_REDUCE_MAX, &mxT, &finT, NULL));
    for (int64_t i = 0; i < M; i++) {
        fref[i] = -INFINITY;
        for (int64_t j = 0; j < N; j++) if (acc[i * N + j] > fref[i]) fref[i] = acc[i * N + j];
    }
    cmp_f32("finish rowmax", fin, fref, M, atol, rtol);
    poison_f32(fin, M);
    CHECK_OK(coda_finish_rstd(g_ctx, &sqT, N, 1e-5f, &finT, NULL));
    for (int64_t i = 0; i < M; i++) {
        double s = 0;
        for (int64_t j = 0; j < N; j++) s += h64[i * N + j] * h64[i * N + j];
        fref[i] = 1.0 / sqrt(s / N + 1e-5);
    }
    cmp_f32("finish rstd", fin, fref, M, 0, 1e-5);

    /* column partials: tile t covers rows [t tm, (t+1) tm) */
    double *cp = dalloc(N * MT * 3 + H * MT);
    for (int64_t j = 0; j < N; j++)
        for (int64_t t = 0; t < MT; t++) {
            double s1 = 0, s2 = 0, m = -INFINITY;
            for (int64_t i = t * tm; i < (t + 1) * tm && i < M; i++) {
                double hgv = h_bf2f(hg[i * N + j]); /* fused: hg1 = f32 h1 * g, before the bf16 store */
                hgv = h64[i * N + j] * h_bf2f(g[j]);
                s1 += acc[i * N + j];
                s2 += hgv * hgv;
                double sv = acc[i * N + j] + h_bf2f(x[i * N + j]);
                if (sv > m) m = sv;
            }
            cp[(0 * N + j) * MT + t] = s1;
            cp[(1 * N + j) * MT + t] = s2;
            cp[(2 * N + j) * MT + t] = m;
        }
    for (int64_t j = 0; j < H; j++)
        for (int64_t t = 0; t < MT; t++) {
            double s = 0;
            for (int64_t i = t * tm; i < (t + 1) * tm && i < M; i++) s += acc[i * N + 2 * j + 1];
            cp[3 * N * MT + j * MT + t] = s;
        }
    double tol_c = 1e-5 * tm * 4;
    cmp_f32("colsum partials", cs, cp, N * MT, tol_c, rtol);
    cmp_f32("colsumsq partials", cq, cp + N * MT, N * MT, tol_c * 64, 1e-5);
    cmp_f32("colmax partials", cm, cp + 2 * N * MT, N * MT, atol, rtol);
    cmp_f32("colsum(half) partials", ch, cp + 3 * N * MT, H * MT, tol_c, rtol);
    coda_tensor_t csT = coda_tensor_2d(cs, CODA_F32, N, MT), fcol = coda_tensor_1d(fin, CODA_F32, N);
    poison_f32(fin, N);
    CHECK_OK(coda_finish_reduce(g_ctx, CODA_REDUCE_SUM, &csT, &fcol, NULL));
    for (int64_t j = 0; j < N; j++) { fref[j] = 0; for (int64_t i = 0; i < M; i++) fref[j] += acc[i * N + j]; }
    cmp_f32("finish colsum", fin, fref, N, tol_c * MT, rtol);

    free(x); free(g); free(x2); free(h); free(hg); free(dbl); free(af); free(ss); free(sq); free(mx);
    free(hs); free(cs); free(cq); free(cm); free(ch); free(ref); free(h64); free(rp); free(cp); free(fin); free(fref);
    coda_program_free(prog);
}

/* ======================================================================
 * 4. online log-sum-exp + target pick, coda_finish_lse with ignore_index
 * ==================================================================== */

static const char prog_lse[] =
    "program ce\n"
    "in  sc  scalar\n"
    "in  tg  row i32\n"
    "out L   lse\n"
    "out L2  lse            # over the double space\n"
    "a  = acc\n"
    "scv = load sc\n"
    "z  = mul a scv\n"
    "t  = load tg\n"
    "lse L z t\n"
    "ng = neg z\n"
    "d  = interleave z ng\n"
    "two = const 2\n"
    "t2 = mul t two\n"
    "one = const 1\n"
    "t3 = add t2 one\n"
    "lse L2 d t3\n";

static void test_lse(const prob_t *P, const coda_tiling_t *tl_in) {
    int64_t M = P->M, N = P->N;
    coda_tiling_t tl = resolve_tiling(P, tl_in);
    int64_t NT = (N + tl.tile_n - 1) / tl.tile_n;
    coda_program_t *prog = parse(prog_lse);
    h_rng rng = rng_new(13);
    int32_t *tg = h_alloc((size_t)M * 4);
    const int32_t ignore = -100;
    for (int64_t i = 0; i < M; i++) {
        double u = (rng_uniform(&rng) + 1.0) * 0.5;
        tg[i] = (int32_t)(u * N) < N ? (int32_t)(u * N) : (int32_t)N - 1;
        if (i % 5 == 3) tg[i] = ignore;
    }
    const float sc = 1.5f;
    float *L = out_f32(M * NT * 3), *L2 = out_f32(M * NT * 3);
    coda_binding_t bd[] = {bind_scalar("sc", sc), bind("tg", coda_tensor_1d(tg, CODA_I32, M)),
                           bind("L", coda_tensor_3d(L, CODA_F32, M, NT, 3)),
                           bind("L2", coda_tensor_3d(L2, CODA_F32, M, NT, 3))};
    CHECK_OK(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 4, tl_in, NULL));
    /* per-tile partials against float64 */
    double *ref = dalloc(M * NT * 3);
    for (int pass = 0; pass < 2; pass++) {
        int64_t w = pass ? 2 * N : N, tw = pass ? 2 * tl.tile_n : tl.tile_n;
        for (int64_t i = 0; i < M; i++)
            for (int64_t t = 0; t < NT; t++) {
                double m = -INFINITY, l = 0, pk = 0;
                int64_t target = pass ? 2 * (int64_t)tg[i] + 1 : tg[i];
                for (int64_t j = t * tw; j < (t + 1) * tw && j < w; j++) {
                    double v = pass ? (j % 2 ? -1 : 1) * P->acc[i * N + j / 2] * sc : P->acc[i * N + j] * sc;
                    if (v > m) m = v;
                }
                for (int64_t j = t * tw; j < (t + 1) * tw && j < w; j++) {
                    double v = pass ? (j % 2 ? -1 : 1) * P->acc[i * N + j / 2] * sc : P->acc[i * N + j] * sc;
                    l += exp(v - m);
                    if (j == target) pk = v;
                }
                ref[(i * NT + t) * 3] = m;
                ref[(i * NT + t) * 3 + 1] = l;
                ref[(i * NT + t) * 3 + 2] = pk;
            }
        cmp_f32(pass ? "lse partials (double)" : "lse partials", pass ? L2 : L, ref, M * NT * 3, 1e-4, 1e-4);
    }
    /* finish: lse and loss against float64 over the whole row */
    float *lse = out_f32(M), *loss = out_f32(M);
    coda_tensor_t LT = coda_tensor_3d(L, CODA_F32, M, NT, 3), tgT = coda_tensor_1d(tg, CODA_I32, M),
                  lseT = coda_tensor_1d(lse, CODA_F32, M), lossT = coda_tensor_1d(loss, CODA_F32, M);
    CHECK_OK(coda_finish_lse(g_ctx, &LT, &tgT, ignore, &lseT, &lossT, NULL));
    double *rl = dalloc(M), *rs = dalloc(M);
    for (int64_t i = 0; i < M; i++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < N; j++) if (P->acc[i * N + j] * sc > m) m = P->acc[i * N + j] * sc;
        for (int64_t j = 0; j < N; j++) s += exp(P->acc[i * N + j] * sc - m);
        rl[i] = m + log(s);
        rs[i] = tg[i] == ignore ? 0.0 : rl[i] - P->acc[i * N + tg[i]] * sc;
    }
    cmp_f32("finish lse", lse, rl, M, 1e-4, 1e-5);
    cmp_f32("finish loss", loss, rs, M, 1e-4, 1e-5);
    int64_t zero_ok = 0, n_ign = 0;
    for (int64_t i = 0; i < M; i++)
        if (tg[i] == ignore) { n_ign++; zero_ok += loss[i] == 0.0f; }
    CHECK(zero_ok == n_ign, "%s ignore_index rows: %lld of %lld have loss 0", g_case, (long long)zero_ok, (long long)n_ign);
    free(tg); free(L); free(L2); free(ref); free(lse); free(loss); free(rl); free(rs);
    coda_program_free(prog);
}

/* ======================================================================
 * 5. rowidx / colidx in every space
 * ==================================================================== */

static const char prog_idx[] =
    "program idx\n"
    "out f  tile f32\n"
    "out hf tile f32 half\n"
    "out db tile f32 double\n"
    "out bc tile bf16         # a row value stored: broadcast along the row\n"
    "r  = rowidx\n"
    "c  = colidx\n"
    "k  = const 4096\n"
    "rk = mul r k\n"
    "v  = add rk c\n"
    "store f v\n"
    "ch = colidx half\n"
    "vh = add rk ch\n"
    "store hf vh\n"
    "cd = colidx double\n"
    "vd = sub rk cd\n"
    "store db vd\n"
    "store bc r\n";

static void test_idx(const prob_t *P, const coda_tiling_t *tl) {
    int64_t M = P->M, N = P->N, H = N / 2;
    coda_program_t *prog = parse(prog_idx);
    float *f = out_f32(M * N), *hf = out_f32(M * H), *db = out_f32(M * 2 * N);
    uint16_t *bc = out_bf16(M * N);
    coda_binding_t bd[] = {bind("f", coda_tensor_2d(f, CODA_F32, M, N)), bind("hf", coda_tensor_2d(hf, CODA_F32, M, H)),
                           bind("db", coda_tensor_2d(db, CODA_F32, M, 2 * N)),
                           bind("bc", coda_tensor_2d(bc, CODA_BF16, M, N))};
    CHECK_OK(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 4, tl, NULL));
    double *ref = dalloc(M * 2 * N);
    for (int64_t i = 0; i < M * N; i++) ref[i] = (double)(i / N) * 4096 + (double)(i % N);
    cmp_f32("rowidx*4096+colidx", f, ref, M * N, 0, 0);
    for (int64_t i = 0; i < M * H; i++) ref[i] = (double)(i / H) * 4096 + (double)(i % H);
    cmp_f32("colidx half", hf, ref, M * H, 0, 0);
    for (int64_t i = 0; i < M * 2 * N; i++) ref[i] = (double)(i / (2 * N)) * 4096 - (double)(i % (2 * N));
    cmp_f32("colidx double", db, ref, M * 2 * N, 0, 0);
    for (int64_t i = 0; i < M * N; i++) ref[i] = (double)(i / N);
    cmp_bf16("rowidx broadcast", bc, ref, M * N, 0);
    free(f); free(hf); free(db); free(bc); free(ref);
    coda_program_free(prog);
}

/* ======================================================================
 * 5b. row partials read by the next GEMM (in NAME rowpart): the load is
 *     the row's partials summed as coda_finish_reduce sums them (the same
 *     bits), any T, padded rows; bad bindings change nothing
 * ==================================================================== */

static const char prog_rowpart[] =
    "program rowpart\n"
    "in  ss  rowpart\n"
    "in  inv scalar\n"
    "in  eps scalar\n"
    "out y   tile f32\n"
    "out sv  tile f32\n"
    "a = acc\n"
    "s = load ss\n"
    "i = load inv\n"
    "m = mul s i\n"
    "e = load eps\n"
    "w = add m e\n"
    "r = rsqrt w\n"
    "y1 = mul a r\n"
    "store y y1\n"
    "store sv s\n";

static void test_rowpart(const prob_t *P, const coda_tiling_t *tl) {
    const int64_t M = P->M, N = P->N, T = 1 + M % 5, ld = T + 3;
    coda_program_t *prog = parse(prog_rowpart);
    int nd;
    int64_t sh[3];
    coda_dtype_t dt;
    CHECK_OK(coda_program_arg_shape(prog, 0, M, N, tl, &nd, sh, &dt));
    CHECK(nd == 2 && sh[0] == M && sh[1] == 0 && dt == CODA_F32, "%s rowpart arg_shape (M, 0) f32: %d (%lld, %lld)",
          g_case, nd, (long long)sh[0], (long long)sh[1]);
    h_rng rr = rng_new(77 + (uint64_t)M);
    float *ss = h_alloc((size_t)(M * ld) * 4), *sum = out_f32(M);
    for (int64_t i = 0; i < M * ld; i++) ss[i] = 1.0f + 0.5f * rng_uniform(&rr); /* positive, like sums of squares */
    coda_tensor_t pt = coda_tensor_2d(ss, CODA_F32, M, T);
    pt.stride[0] = ld * 4;
    float *y = out_f32(M * N), *sv = out_f32(M * N);
    const float inv = 1.0f / 64, eps = 1e-5f;
    coda_binding_t bd[] = {bind("ss", pt), bind_scalar("inv", inv), bind_scalar("eps", eps),
                           bind("y", coda_tensor_2d(y, CODA_F32, M, N)), bind("sv", coda_tensor_2d(sv, CODA_F32, M, N))};

    /* bad bindings: T = 0, wrong M, bf16, one dim; nothing is written */
    const coda_tensor_t good = pt;
    bd[0].tensor = coda_tensor_2d(ss, CODA_F32, M, 0);
    CHECK_STATUS(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 5, tl, NULL), CODA_ERR_SHAPE);
    bd[0].tensor = coda_tensor_2d(ss, CODA_F32, M + 1, T);
    CHECK_STATUS(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 5, tl, NULL), CODA_ERR_SHAPE);
    bd[0].tensor = coda_tensor_2d(ss, CODA_BF16, M, T);
    CHECK_STATUS(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 5, tl, NULL), CODA_ERR_DTYPE);
    bd[0].tensor = coda_tensor_1d(ss, CODA_F32, M);
    CHECK_STATUS(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 5, tl, NULL), CODA_ERR_SHAPE);
    bd[0].tensor = coda_tensor_2d(ss, CODA_F32, M, (int64_t)1 << 31); /* a descriptor: refused before any read */
    CHECK_STATUS(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 5, tl, NULL), CODA_ERR_SHAPE);
    CHECK(isnan(y[0]) && isnan(sv[M * N - 1]), "%s rowpart: a refused call writes nothing", g_case);

    bd[0].tensor = good;
    CHECK_OK(coda_gemm_epilogue(g_ctx, P->layout, &P->a, &P->b, prog, bd, 5, tl, NULL));
    coda_tensor_t st = coda_tensor_1d(sum, CODA_F32, M);
    CHECK_OK(coda_finish_reduce(g_ctx, CODA_REDUCE_SUM, &good, &st, NULL));
    int64_t diff = 0;
    for (int64_t i = 0; i < M * N; i++) diff += memcmp(&sv[i], &sum[i / N], 4) != 0;
    CHECK(diff == 0, "%s rowpart: %lld loaded sums differ from coda_finish_reduce's bits", g_case, (long long)diff);
    double *ref = dalloc(M * N);
    for (int64_t i = 0; i < M * N; i++) {
        double s = 0;
        for (int64_t t = 0; t < T; t++) s += ss[(i / N) * ld + t];
        ref[i] = P->acc[i] / sqrt(s * inv + eps);
    }
    cmp_f32("acc * rstd from rowpart", y, ref, M * N, 1e-4, 1e-4);
    free(ss); free(sum); free(y); free(sv); free(ref);
    coda_program_free(prog);
}

/* ======================================================================
 * 6. padded row strides everywhere (A, B, tile inputs, outputs, partials),
 *    f32 A and B, odd N for a program without pairs: the padding must stay
 *    untouched and the results equal the contiguous case
 * ==================================================================== */

static const char prog_strided[] =
    "program strided\n"
    "in  x   tile bf16\n"
    "in  c   col f32\n"
    "out h   tile f32\n"
    "out hb  tile bf16\n"
    "out ss  rowsumsq\n"
    "out cs  colmax\n"
    "a  = acc\n"
    "xv = load x\n"
    "cv = load c\n"
    "t  = fma a cv xv\n"
    "store h t\n"
    "store hb t\n"
    "reduce ss t\n"
    "reduce cs t\n";

/* A (rows, cols) matrix of element size es with row stride ld elements,
 * the padding filled with 0x5A bytes. */
static void *padded(int64_t rows, int64_t cols, int64_t ld, int es) {
    unsigned char *p = h_alloc((size_t)(rows * ld * es + 64));
    memset(p, 0x5A, (size_t)(rows * ld * es + 64));
    (void)cols;
    return p;
}
static int64_t pad_damage(const void *buf, int64_t rows, int64_t cols, int64_t ld, int es) {
    const unsigned char *p = buf;
    int64_t bad = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t b = cols * es; b < ld * es; b++) bad += p[i * ld * es + b] != 0x5A;
    for (int64_t b = rows * ld * es; b < rows * ld * es + 64; b++) bad += p[b] != 0x5A;
    return bad;
}

static void test_strided(coda_layout_t layout, int64_t M, int64_t N, int64_t K, coda_tiling_t tl, uint64_t seed) {
    h_rng rng = rng_new(seed);
    int64_t ar = layout == CODA_LAYOUT_TN ? K : M, ac = layout == CODA_LAYOUT_TN ? M : K;
    int64_t br = layout == CODA_LAYOUT_NT ? N : K, bc = layout == CODA_LAYOUT_NT ? K : N;
    int64_t lda = ac + 3, ldb = bc + 5, ldx = N + 7, ldh = N + 1, ldhb = N + 9;
    int64_t NT = (N + tl.tile_n - 1) / tl.tile_n, MT = (M + tl.tile_m - 1) / tl.tile_m, ldp = NT + 2, ldq = MT + 1;
    float *A = padded(ar, ac, lda, 4), *B = padded(br, bc, ldb, 4), *c = h_alloc((size_t)N * 4);
    uint16_t *X = padded(M, N, ldx, 2), *HB = padded(M, N, ldhb, 2);
    float *Hh = padded(M, N, ldh, 4), *SS = padded(M, NT, ldp, 4), *CS = padded(N, MT, ldq, 4);
    for (int64_t i = 0; i < ar; i++) for (int64_t j = 0; j < ac; j++) A[i * lda + j] = rng_uniform(&rng);
    for (int64_t i = 0; i < br; i++) for (int64_t j = 0; j < bc; j++) B[i * ldb + j] = rng_uniform(&rng);
    for (int64_t i = 0; i < M; i++) for (int64_t j = 0; j < N; j++) X[i * ldx + j] = h_f2bf(rng_uniform(&rng));
    rng_fill_f32(&rng, c, N, 2.0f);
    for (int64_t i = 0; i < M; i++) for (int64_t j = 0; j < N; j++) { Hh[i * ldh + j] = NAN; HB[i * ldhb + j] = 0x7fc1; }
    for (int64_t i = 0; i < M; i++) for (int64_t j = 0; j < NT; j++) SS[i * ldp + j] = NAN;
    for (int64_t i = 0; i < N; i++) for (int64_t j = 0; j < MT; j++) CS[i * ldq + j] = NAN;
    coda_tensor_t a = coda_tensor_2d(A, CODA_F32, ar, ac), b = coda_tensor_2d(B, CODA_F32, br, bc);
    a.stride[0] = lda * 4; b.stride[0] = ldb * 4;
    coda_binding_t bd[6] = {bind("x", coda_tensor_2d(X, CODA_BF16, M, N)), bind("c", coda_tensor_1d(c, CODA_F32, N)),
                            bind("h", coda_tensor_2d(Hh, CODA_F32, M, N)), bind("hb", coda_tensor_2d(HB, CODA_BF16, M, N)),
                            bind("ss", coda_tensor_2d(SS, CODA_F32, M, NT)), bind("cs", coda_tensor_2d(CS, CODA_F32, N, MT))};
    bd[0].tensor.stride[0] = ldx * 2; bd[2].tensor.stride[0] = ldh * 4; bd[3].tensor.stride[0] = ldhb * 2;
    bd[4].tensor.stride[0] = ldp * 4; bd[5].tensor.stride[0] = ldq * 4;
    coda_program_t *prog = parse(prog_strided);
    CHECK_OK(coda_gemm_epilogue(g_ctx, layout, &a, &b, prog, bd, 6, &tl, NULL));
    snprintf(g_case, sizeof g_case, "[strided layout %d M=%lld N=%lld K=%lld tile %dx%d]", (int)layout,
             (long long)M, (long long)N, (long long)K, tl.tile_m, tl.tile_n);
    CHECK(pad_damage(X, M, N, ldx, 2) == 0 && pad_damage(Hh, M, N, ldh, 4) == 0 &&
          pad_damage(HB, M, N, ldhb, 2) == 0 && pad_damage(SS, M, NT, ldp, 4) == 0 &&
          pad_damage(CS, N, MT, ldq, 4) == 0 && pad_damage(A, ar, ac, lda, 4) == 0 && pad_damage(B, br, bc, ldb, 4) == 0,
          "%s padding bytes changed", g_case);
    /* float64 reference */
    double *t = dalloc(M * N), *ref = dalloc(M * N + N * MT + M * NT);
    float *h32 = h_alloc((size_t)(M * N + 1) * 4);
    uint16_t *hb = h_alloc((size_t)(M * N + 1) * 2);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (double)(layout == CODA_LAYOUT_TN ? A[k * lda + i] : A[i * lda + k]) *
                     (double)(layout == CODA_LAYOUT_NT ? B[j * ldb + k] : B[k * ldb + j]);
            t[i * N + j] = s * c[j] + h_bf2f(X[i * ldx + j]);
            h32[i * N + j] = Hh[i * ldh + j];
            hb[i * N + j] = HB[i * ldhb + j];
        }
    cmp_f32("h (padded)", h32, t, M * N, 1e-4, 1e-5);
    cmp_bf16("hb (padded)", hb, t, M * N, 1e-4);
    float *pp = h_alloc((size_t)(M * NT + N * MT + 1) * 4);
    for (int64_t i = 0; i < M; i++)
        for (int64_t q = 0; q < NT; q++) {
            double s = 0;
            for (int64_t j = q * tl.tile_n; j < (q + 1) * tl.tile_n && j < N; j++) s += t[i * N + j] * t[i * N + j];
            ref[i * NT + q] = s;
            pp[i * NT + q] = SS[i * ldp + q];
        }
    cmp_f32("rowsumsq (padded)", pp, ref, M * NT, 1e-3, 1e-5);
    for (int64_t j = 0; j < N; j++)
        for (int64_t q = 0; q < MT; q++) {
            double m = -INFINITY;
            for (int64_t i = q * tl.tile_m; i < (q + 1) * tl.tile_m && i < M; i++) m = t[i * N + j] > m ? t[i * N + j] : m;
            ref[j * MT + q] = m;
            pp[j * MT + q] = CS[j * ldq + q];
        }
    cmp_f32("colmax (padded)", pp, ref, N * MT, 1e-4, 1e-5);
    free(A); free(B); free(c); free(X); free(HB); free(Hh); free(SS); free(CS); free(t); free(ref); free(h32); free(hb); free(pp);
    coda_program_free(prog);
}

/* Thread count must not change a single bit of any output. */
static void test_threads(void) {
    prob_t P = prob_new(CODA_LAYOUT_NT, 300, 264, 72, 1234);
    coda_program_t *prog = parse(prog_oproj);
    int64_t M = P.M, N = P.N, H = N / 2, NT = 3, MT = 3;
    coda_tiling_t tl = {128, 128};
    h_rng rng = rng_new(3);
    uint16_t *x = h_alloc((size_t)(M * N) * 2), *g = h_alloc((size_t)N * 2);
    float *x2 = h_alloc((size_t)(M * 2 * N) * 4);
    rng_fill_bf16(&rng, x, M * N, 4.0f);
    rng_fill_bf16(&rng, g, N, 2.0f);
    rng_fill_f32(&rng, x2, M * 2 * N, 1.0f);
    size_t total = (size_t)(M * N * 2 * 2 + M * 2 * N * 2 + M * N * 4 + M * NT * 4 * 4 + N * MT * 3 * 4 + H * MT * 4);
    unsigned char *outs[2];
    for (int run = 0; run < 2; run++) {
        coda_context_options_t o = {run ? 3 : 1, NULL};
        coda_context_t *ctx;
        REQUIRE_OK(coda_context_create(&o, &ctx));
        unsigned char *buf = outs[run] = h_alloc(total);
        memset(buf, 0xff, total);
        unsigned char *q = buf;
#define TAKE(bytes) (q += (bytes), (void *)(q - (bytes)))
        coda_binding_t bd[] = {
            bind("x", coda_tensor_2d(x, CODA_BF16, M, N)), bind("x2", coda_tensor_2d(x2, CODA_F32, M, 2 * N)),
            bind("g", coda_tensor_1d(g, CODA_BF16, N)),
            bind("h", coda_tensor_2d(TAKE(M * N * 2), CODA_BF16, M, N)),
            bind("hg", coda_tensor_2d(TAKE(M * N * 2), CODA_BF16, M, N)),
            bind("dbl", coda_tensor_2d(TAKE(M * 2 * N * 2), CODA_BF16, M, 2 * N)),
            bind("af", coda_tensor_2d(TAKE(M * N * 4), CODA_F32, M, N)),
            bind("ss", coda_tensor_2d(TAKE(M * NT * 4), CODA_F32, M, NT)),
            bind("sq", coda_tensor_2d(TAKE(M * NT * 4), CODA_F32, M, NT)),
            bind("mx", coda_tensor_2d(TAKE(M * NT * 4), CODA_F32, M, NT)),
            bind("hs", coda_tensor_2d(TAKE(M * NT * 4), CODA_F32, M, NT)),
            bind("cs", coda_tensor_2d(TAKE(N * MT * 4), CODA_F32, N, MT)),
            bind("cq", coda_tensor_2d(TAKE(N * MT * 4), CODA_F32, N, MT)),
            bind("cm", coda_tensor_2d(TAKE(N * MT * 4), CODA_F32, N, MT)),
            bind("ch", coda_tensor_2d(TAKE(H * MT * 4), CODA_F32, H, MT)),
        };
#undef TAKE
        CHECK((size_t)(q - buf) == total, "test_threads: buffer bookkeeping");
        CHECK_OK(coda_gemm_epilogue(ctx, P.layout, &P.a, &P.b, prog, bd, 15, &tl, NULL));
        coda_context_free(ctx);
    }
    CHECK(memcmp(outs[0], outs[1], total) == 0, "oproj outputs differ between 1 and 3 threads");
    free(outs[0]); free(outs[1]); free(x); free(g); free(x2);
    coda_program_free(prog);
    prob_free(&P);
}

/* The lse pick takes a whole-number target only: 2.5 and 0.25 name no
 * column (the CPU had cut them to columns 2 and 0; the GPU compares
 * (float)col == t). acc[i][j] = 10 (j + 1). */
static void lse_fraction(void) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse("program lse_fraction\n"
                                  "in  t row f32\n"
                                  "out l lse\n"
                                  "a = acc\n"
                                  "tv = load t\n"
                                  "lse l a tv\n",
                                  &p));
    float a[3] = {1, 1, 1}, b[4] = {10, 20, 30, 40}, tg[3] = {2.5f, 0.25f, 2.0f}, l[9];
    coda_tensor_t ta = coda_tensor_2d(a, CODA_F32, 3, 1), tb = coda_tensor_2d(b, CODA_F32, 4, 1);
    coda_binding_t bd[2] = {{"t", coda_tensor_1d(tg, CODA_F32, 3), 0}, {"l", coda_tensor_3d(l, CODA_F32, 3, 1, 3), 0}};
    coda_tiling_t tl = {2, 4};
    CHECK_OK(coda_gemm_epilogue(g_ctx, CODA_LAYOUT_NT, &ta, &tb, p, bd, 2, &tl, NULL));
    CHECK(l[2] == 0.0f && l[5] == 0.0f && l[8] == 30.0f, "lse pick of targets 2.5, 0.25, 2: %g %g %g, want 0 0 30",
          l[2], l[5], l[8]);
    coda_program_free(p);
}

int main(void) {
    coda_context_options_t o = {2, NULL};
    REQUIRE_OK(coda_context_create(&o, &g_ctx));
    lse_fraction();
    const coda_tiling_t tilings[5] = {{16, 16}, {64, 32}, {128, 128}, {7, 6}, {0, 0}};
    struct { coda_layout_t l; int64_t m, n, k; int tiling; } cases[] = {
        {CODA_LAYOUT_NT, 1, 72, 40, 0},     {CODA_LAYOUT_NN, 7, 136, 24, 1},
        {CODA_LAYOUT_TN, 127, 200, 8, 2},   {CODA_LAYOUT_NT, 128, 264, 56, 3},
        {CODA_LAYOUT_NT, 1000, 136, 40, 2}, {CODA_LAYOUT_NN, 1000, 264, 16, 4},
        {CODA_LAYOUT_TN, 7, 8, 136, 0},     {CODA_LAYOUT_NN, 127, 72, 72, -1},
        {CODA_LAYOUT_TN, 300, 40, 0, 1},
        {CODA_LAYOUT_NT, 127, 13, 5, 0},    {CODA_LAYOUT_TN, 1, 1, 3, 3}, /* odd N: no pair programs */
    };
    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int c = 0; c < n_cases; c++) {
        prob_t P = prob_new(cases[c].l, cases[c].m, cases[c].n, cases[c].k, 100 + c);
        const coda_tiling_t *tl = cases[c].tiling >= 0 ? &tilings[cases[c].tiling] : NULL;
        snprintf(g_case, sizeof g_case, "[layout %d M=%lld N=%lld K=%lld tile %dx%d]", (int)cases[c].l,
                 (long long)P.M, (long long)P.N, (long long)P.K, tl ? tl->tile_m : 0, tl ? tl->tile_n : 0);
        int before = h_failures;
        test_maps(&P, tl);
        test_lse(&P, tl);
        test_rowpart(&P, tl);
        if (P.N % 2 == 0) {
            test_pairs(&P, tl);
            test_oproj(&P, tl);
            test_idx(&P, tl);
        }
        printf("%s %s\n", g_case, h_failures == before ? "ok" : "FAILED");
        prob_free(&P);
    }
    test_threads();
    const coda_tiling_t st[3] = {{16, 16}, {64, 32}, {5, 128}};
    test_strided(CODA_LAYOUT_NT, 127, 72, 40, st[0], 501);
    test_strided(CODA_LAYOUT_NN, 1, 13, 7, st[1], 502);   /* odd N, odd K */
    test_strided(CODA_LAYOUT_TN, 1000, 264, 24, st[2], 503);
    test_strided(CODA_LAYOUT_NN, 7, 136, 1, st[1], 504);
    coda_context_free(g_ctx);
    TEST_MAIN_END();
}
