/* test_nan_gpu.c - the NaN rule (coda.h sections 5 and 7) on the GPU: the
 * programs of tests/nan_programs.h, one per primitive class, with NaN
 * (and infinities) put into their inputs and accumulators, run on the GPU
 * and on the CPU backend with the same tiling; every output element must
 * be of the same class on both (finite, NaN, +inf, -inf: NaN exactly where
 * the CPU has NaN), and finite elements close (loosely: accuracy is
 * test_epilogue_gpu's business). Then the finishing steps on the GPU's
 * partials against the CPU's on its own, and on hand-made partials.
 * tests/test_epilogue_nan.c checks the CPU's classes against the rule
 * itself. Shapes: N a multiple of 16 (N16 form), N % 16 == 8 (even form),
 * N odd (general form, programs without column pairs); tile_n 128 and 256;
 * ping-pong and cooperative schedules. Needs an sm_90a GPU. */
#include "harness.h"

#include "gpu/cuda_check.h"
#include "tuning.h"

static coda_context_t *ctx;

enum { F = 0, NAN_ = 1, PINF = 2, NINF = 3 };
static const char *const cls_name[] = {"finite", "NaN", "+inf", "-inf"};
static int cls(float v) { return isnan(v) ? NAN_ : v == INFINITY ? PINF : v == -INFINITY ? NINF : F; }
#define SENTINEL (-7777.0f)

/* ---- the programs: tests/nan_programs.h, and the column reductions
 * spread over programs so that their per-thread state stays small ---- */
#include "nan_programs.h"

static const char prog_red_half[] =
    "program nan_red_half\nin x tile f32\n"
    "out rmh rowmax\nout rqh rowsumsq\nout csh colsum half\nout cmh colmax half\nout cqh colsumsq half\n"
    "a = acc\nxv = load x\ns = add a xv\ne = even s\n"
    "reduce rmh e\nreduce rqh e\nreduce csh e\nreduce cmh e\nreduce cqh e\n";

static const char prog_red_double[] =
    "program nan_red_double\nin x tile f32\n"
    "out rmd rowmax\nout cmd colmax double\nout csd colsum double\n"
    "a = acc\nxv = load x\ns = add a xv\nd = interleave s s\n"
    "reduce rmd d\nreduce cmd d\nreduce csd d\n";

/* the same without the half space, for odd N */
static const char prog_lse_full[] =
    "program nan_lse_full\nin r row f32\nin x tile f32\nin t row i32\nout part lse\n"
    "a = acc\nrv = load r\nz0 = mul a rv\nxv = load x\nz = add z0 xv\ntv = load t\nlse part z tv\n";

/* ---- a run: host and device copies of every argument ---- */

enum { MAXA = 20 };
typedef struct tb {
    const char *name;
    coda_arg_kind_t kind;
    coda_dtype_t dt;
    int nd, out;
    int64_t sh[3], ld; /* ld: elements per row (2-D: padded to 16 bytes) */
    size_t bytes;
    void *h, *d;
} tb_t;

typedef struct run {
    coda_program_t *p;
    const char *title;
    int na;
    tb_t a[MAXA];
    float scalar[MAXA];
    int64_t m, n, k;
    coda_tiling_t tl;
    uint16_t *A, *B;
    void *dA, *dB;
} run_t;

static int64_t n_elems(const tb_t *t) { return t->nd == 2 ? t->sh[0] * t->ld : t->nd == 3 ? t->sh[0] * t->sh[1] * t->sh[2] : t->sh[0]; }

static void hset(tb_t *t, int64_t e, float v) {
    if (t->dt == CODA_BF16) ((uint16_t *)t->h)[e] = h_f2bf(v);
    else if (t->dt == CODA_I32) ((int32_t *)t->h)[e] = (int32_t)v;
    else ((float *)t->h)[e] = v;
}
static float hget(const tb_t *t, const void *buf, int64_t e) {
    return t->dt == CODA_BF16 ? h_bf2f(((const uint16_t *)buf)[e]) : ((const float *)buf)[e];
}

/* tile_n 0: the backend's choice */
static void run_new(run_t *r, const char *text, int64_t m, int64_t n, int64_t k, int tile_n, uint64_t seed) {
    memset(r, 0, sizeof *r);
    REQUIRE_OK(coda_program_parse(text, &r->p));
    r->title = text + 8;
    r->m = m, r->n = n, r->k = k;
    REQUIRE_OK(coda_choose_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, m, n, k, &r->tl));
    if (tile_n) r->tl.tile_n = tile_n;
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
        size_t es = coda_dtype_size(t->dt);
        t->ld = t->nd == 2 ? (int64_t)((t->sh[1] * (int64_t)es + 15) / 16 * 16 / (int64_t)es) : 0;
        t->out = t->kind >= CODA_OUT_TILE && t->kind <= CODA_OUT_LSE;
        int64_t e = n_elems(t);
        t->bytes = (size_t)e * es;
        t->h = h_alloc(t->bytes);
        for (int64_t j = 0; j < e; j++) hset(t, j, t->out ? SENTINEL : t->dt == CODA_I32 ? (float)(j % 7) : rng_uniform(&g));
        r->scalar[i] = 0.5f;
    }
}

static void run_free(run_t *r) {
    for (int i = 0; i < r->na; i++) {
        free(r->a[i].h);
        if (r->a[i].d) CUDA_OK(cudaFree(r->a[i].d));
    }
    free(r->A), free(r->B);
    if (r->dA) CUDA_OK(cudaFree(r->dA));
    if (r->dB) CUDA_OK(cudaFree(r->dB));
    coda_program_free(r->p);
}

static tb_t *arg(run_t *r, const char *name) {
    for (int i = 0; i < r->na; i++)
        if (strcmp(r->a[i].name, name) == 0) return &r->a[i];
    return NULL;
}

/* element (i, j) of input `name` (j ignored for 1-D); i or j < 0 count
 * from the end; positions outside the tensor are skipped */
static void put(run_t *r, const char *name, int64_t i, int64_t j, float v) {
    tb_t *t = arg(r, name);
    if (!t) return;
    int64_t rows = t->sh[0], cols = t->nd == 2 ? t->sh[1] : 1;
    if (i < 0) i += rows;
    if (j < 0) j += cols;
    if (t->nd == 1) j = 0;
    if (i < 0 || i >= rows || j < 0 || j >= cols) return;
    hset(t, t->nd == 2 ? i * t->ld + j : i, v);
}

static coda_tensor_t desc(const tb_t *t, void *data, int dev) {
    coda_tensor_t x = t->nd == 1 ? coda_tensor_1d(data, t->dt, t->sh[0])
                    : t->nd == 2 ? coda_tensor_2d(data, t->dt, t->sh[0], t->sh[1])
                                 : coda_tensor_3d(data, t->dt, t->sh[0], t->sh[1], t->sh[2]);
    if (t->nd == 2) x.stride[0] = t->ld * (int64_t)coda_dtype_size(t->dt);
    if (dev) x.device = CODA_DEVICE_CUDA;
    return x;
}

/* Both backends; then every output compared, class for class. */
static void run_go(run_t *r, int expect_nan) {
    CUDA_OK(cudaMalloc(&r->dA, (size_t)(r->m * r->k) * 2));
    CUDA_OK(cudaMalloc(&r->dB, (size_t)(r->n * r->k) * 2));
    CUDA_OK(cudaMemcpy(r->dA, r->A, (size_t)(r->m * r->k) * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(r->dB, r->B, (size_t)(r->n * r->k) * 2, cudaMemcpyHostToDevice));
    coda_binding_t bc[MAXA], bg[MAXA];
    for (int i = 0; i < r->na; i++) {
        tb_t *t = &r->a[i];
        CUDA_OK(cudaMalloc(&t->d, t->bytes));
        CUDA_OK(cudaMemcpy(t->d, t->h, t->bytes, cudaMemcpyHostToDevice));
        bc[i].name = bg[i].name = t->name;
        bc[i].scalar = bg[i].scalar = r->scalar[i];
        bc[i].tensor = desc(t, t->h, 0);
        bg[i].tensor = desc(t, t->d, 1);
    }
    coda_tensor_t A = coda_tensor_2d(r->A, CODA_BF16, r->m, r->k), B = coda_tensor_2d(r->B, CODA_BF16, r->n, r->k);
    coda_tensor_t dA = A, dB = B;
    dA.data = r->dA, dA.device = CODA_DEVICE_CUDA;
    dB.data = r->dB, dB.device = CODA_DEVICE_CUDA;
    CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &A, &B, r->p, bc, r->na, &r->tl, NULL));
    coda_status_t s = coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &dA, &dB, r->p, bg, r->na, &r->tl, NULL);
    CHECK(s == CODA_OK, "%.20s: GPU run: %s", r->title, coda_last_error());
    CUDA_OK(cudaDeviceSynchronize());
    printf("  %-16.*s m %lld n %lld tile %dx%d%s\n", (int)strcspn(r->title, "\n"), r->title, (long long)r->m,
           (long long)r->n, r->tl.tile_m, r->tl.tile_n, coda__get_tuning(ctx).gemm_cfg >= 0 ? " (cooperative)" : "");
    fflush(stdout);
    if (s != CODA_OK) return;
    int64_t cpu_nan = 0;
    for (int i = 0; i < r->na; i++) {
        tb_t *t = &r->a[i];
        if (!t->out) continue;
        void *g = h_alloc(t->bytes);
        CUDA_OK(cudaMemcpy(g, t->d, t->bytes, cudaMemcpyDeviceToHost));
        int64_t n = n_elems(t), bad_cls = 0, bad_val = 0, first = -1, nan_here = 0;
        double tol = t->dt == CODA_BF16 ? 1e-2 : 2e-3;
        for (int64_t e = 0; e < n; e++) {
            float c = hget(t, t->h, e), v = hget(t, g, e);
            nan_here += isnan(c);
            if (cls(c) != cls(v)) {
                bad_cls++;
                if (first < 0) first = e;
            } else if (cls(c) == F && !(fabs((double)v - c) <= tol * (1.0 + fabs((double)c)))) {
                bad_val++;
                if (first < 0) first = e;
            }
        }
        cpu_nan += nan_here;
        int64_t w = t->nd == 2 ? t->ld : t->nd == 3 ? t->sh[1] * t->sh[2] : 1;
        CHECK(bad_cls == 0 && bad_val == 0,
              "%.16s m %lld n %lld tile_n %d: %s: %lld elements of another class than the CPU's, %lld finite ones off "
              "(first: row %lld, element %lld: GPU %g (%s), CPU %g (%s))",
              r->title, (long long)r->m, (long long)r->n, r->tl.tile_n, t->name, (long long)bad_cls, (long long)bad_val,
              (long long)(first / w), (long long)(first % w), first >= 0 ? hget(t, g, first) : 0.0,
              first >= 0 ? cls_name[cls(hget(t, g, first))] : "-", first >= 0 ? hget(t, t->h, first) : 0.0,
              first >= 0 ? cls_name[cls(hget(t, t->h, first))] : "-");
        free(g);
    }
    if (expect_nan) CHECK(cpu_nan > 0, "%.16s: no NaN in any output: the case tests nothing", r->title);
}

/* The finishing steps of GPU partials (device) against the CPU's of the
 * CPU's partials: same classes, close values. */
static void cmp_vec(const char *what, const float *c, const float *g, int64_t n) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (cls(c[i]) != cls(g[i]) || (cls(c[i]) == F && !(fabs((double)g[i] - c[i]) <= 2e-3 * (1.0 + fabs((double)c[i])))))
            bad++, first = first < 0 ? i : first;
    CHECK(bad == 0, "%s: %lld rows differ from the CPU's (first %lld: GPU %g, CPU %g)", what, (long long)bad,
          (long long)first, first >= 0 ? g[first] : 0.0, first >= 0 ? c[first] : 0.0);
}

static void finish_reduce_both(run_t *r, const char *name, coda_reduce_t op) {
    tb_t *t = arg(r, name);
    int64_t rows = t->sh[0];
    float *c = h_alloc((size_t)rows * 4), *g = h_alloc((size_t)rows * 4), *d;
    CUDA_OK(cudaMalloc((void **)&d, (size_t)rows * 4));
    coda_tensor_t pc = desc(t, t->h, 0), pg = desc(t, t->d, 1);
    coda_tensor_t oc = coda_tensor_1d(c, CODA_F32, rows), og = oc;
    og.data = d, og.device = CODA_DEVICE_CUDA;
    char what[96];
    CHECK_OK(coda_finish_reduce(ctx, op, &pc, &oc, NULL));
    CHECK_OK(coda_finish_reduce(ctx, op, &pg, &og, NULL));
    CUDA_OK(cudaMemcpy(g, d, (size_t)rows * 4, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "%.14s n %lld: finish_reduce(%s, op %d)", r->title, (long long)r->n, name, (int)op);
    cmp_vec(what, c, g, rows);
    if (op == CODA_REDUCE_SUMSQ) {
        CHECK_OK(coda_finish_rstd(ctx, &pc, 64, 1e-5f, &oc, NULL));
        CHECK_OK(coda_finish_rstd(ctx, &pg, 64, 1e-5f, &og, NULL));
        CUDA_OK(cudaMemcpy(g, d, (size_t)rows * 4, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "%.14s n %lld: finish_rstd(%s)", r->title, (long long)r->n, name);
        cmp_vec(what, c, g, rows);
    }
    free(c), free(g);
    CUDA_OK(cudaFree(d));
}

static void finish_lse_both(run_t *r, const char *name, const char *tname) {
    tb_t *t = arg(r, name), *tt = arg(r, tname);
    int64_t rows = t->sh[0];
    float *c = h_alloc((size_t)rows * 8), *g = h_alloc((size_t)rows * 8), *d;
    CUDA_OK(cudaMalloc((void **)&d, (size_t)rows * 8));
    coda_tensor_t pc = desc(t, t->h, 0), pg = desc(t, t->d, 1), tc = desc(tt, tt->h, 0), tgd = desc(tt, tt->d, 1);
    coda_tensor_t lc = coda_tensor_1d(c, CODA_F32, rows), sc = coda_tensor_1d(c + rows, CODA_F32, rows);
    coda_tensor_t lg = lc, sg = sc;
    lg.data = d, lg.device = CODA_DEVICE_CUDA;
    sg.data = d + rows, sg.device = CODA_DEVICE_CUDA;
    CHECK_OK(coda_finish_lse(ctx, &pc, &tc, -100, &lc, &sc, NULL));
    CHECK_OK(coda_finish_lse(ctx, &pg, &tgd, -100, &lg, &sg, NULL));
    CUDA_OK(cudaMemcpy(g, d, (size_t)rows * 8, cudaMemcpyDeviceToHost));
    char what[96];
    snprintf(what, sizeof what, "%.14s n %lld: finish_lse(%s): lse", r->title, (long long)r->n, name);
    cmp_vec(what, c, g, rows);
    snprintf(what, sizeof what, "%.14s n %lld: finish_lse(%s): loss", r->title, (long long)r->n, name);
    cmp_vec(what, c + rows, g + rows, rows);
    free(c), free(g);
    CUDA_OK(cudaFree(d));
}

/* ---- the cases ---- */

static uint64_t seed = 1;
static const int64_t pts[][2] = {{0, 0}, {5, 17}, {70, 127}, {70, 128}, {130, 200}, {-1, -1}, {-1, 255}, {127, 1}};
#define N_PTS (int)(sizeof pts / sizeof pts[0])

static void case_maps(int64_t m, int64_t n, int tile_n) {
    const char *progs[] = {prog_unary, prog_binary_l, prog_binary_r, prog_except};
    for (int pi = 0; pi < 4; pi++) {
        run_t r;
        run_new(&r, progs[pi], m, n, 64, tile_n, seed++);
        for (int q = 0; q < N_PTS; q++) put(&r, "x", pts[q][0], pts[q][1], NAN);
        run_go(&r, progs[pi] != prog_except); /* its outputs test, and keep no NaN */
        run_free(&r);
    }
}

static void case_pairs(int64_t m, int64_t n, int tile_n) {
    run_t r;
    run_new(&r, prog_pairs, m, n, 64, tile_n, seed++);
    for (int q = 0; q < N_PTS; q++) {
        put(&r, "x", pts[q][0], pts[q][1], NAN);
        put(&r, "xb", pts[q][0] + 1, pts[q][1], NAN);
        put(&r, "xd", pts[q][0], 2 * pts[q][1] + 1, NAN);
        put(&r, "xh", pts[q][0], pts[q][1] / 2, NAN);
    }
    run_go(&r, 1);
    run_free(&r);
}

static void case_vectors(int64_t m, int64_t n, int tile_n) {
    run_t r;
    run_new(&r, prog_vectors, m, n, 64, tile_n, seed++);
    put(&r, "r", 6, 0, NAN), put(&r, "r", -1, 0, NAN);
    put(&r, "rb", 130, 0, NAN);
    put(&r, "g", 3, 0, NAN), put(&r, "g", -1, 0, NAN);
    put(&r, "gb", 129, 0, NAN);
    put(&r, "gh", 9, 0, NAN), put(&r, "gh", -1, 0, NAN);
    put(&r, "gd", 40, 0, NAN), put(&r, "gd", -1, 0, NAN);
    run_go(&r, 1);
    run_free(&r);
}

/* how: 0 points and a NaN column of x, 1 a NaN row of x, 2 a NaN row of A
 * (accumulator row), 3 a NaN row of B (accumulator column), 4 a -inf row */
static void case_reductions(int64_t m, int64_t n, int tile_n, int how) {
    const char *progs[] = {prog_red_full, prog_red_half, prog_red_double};
    for (int pi = 0; pi < 3; pi++) {
        run_t r;
        run_new(&r, progs[pi], m, n, 64, tile_n, seed++);
        if (how == 0) {
            for (int q = 0; q < N_PTS; q++) put(&r, "x", pts[q][0], pts[q][1], NAN);
            for (int64_t i = 0; i < m; i++) put(&r, "x", i, 10, NAN);
        } else if (how == 1 || how == 4) {
            for (int64_t j = 0; j < n; j++) put(&r, "x", 12, j, how == 1 ? NAN : -INFINITY), put(&r, "x", -1, j, how == 1 ? NAN : -INFINITY);
        } else if (how == 2) {
            r.A[3 * r.k + 5] = 0x7fc0;
            r.A[(m - 1) * r.k] = 0x7fc0;
        } else {
            r.B[8 * r.k] = 0x7fc0; /* an even column: even() (the half space) sees it */
            r.B[(n - 1) * r.k + 7] = 0x7fc0;
        }
        run_go(&r, how != 4);
        if (pi == 0) {
            static const char *const names[] = {"rs", "rm", "rq", "cs", "cm", "cq"};
            static const coda_reduce_t ops[] = {CODA_REDUCE_SUM, CODA_REDUCE_MAX, CODA_REDUCE_SUMSQ};
            for (int o = 0; o < 6; o++) finish_reduce_both(&r, names[o], ops[o % 3]);
        }
        run_free(&r);
    }
}

/* the rows of tests/test_epilogue_nan.c's lse case, by column counted from
 * the target (targets kept away from the row's ends) */
static void case_lse(int64_t m, int64_t n, int tile_n, int half) {
    run_t r;
    run_new(&r, half ? prog_lse : prog_lse_full, m, n, 64, tile_n, seed++);
    int32_t *tg = h_alloc((size_t)m * 4);
    for (int64_t i = 0; i < m; i++) {
        tg[i] = (int32_t)((i * 37 + 20) % (n - 40) + 20);
        put(&r, "t", i, 0, (float)tg[i]);
        put(&r, "th", i, 0, (float)((i * 13 + 5) % (n / 2)));
    }
    tg[17] = -100, put(&r, "t", 17, 0, -100.0f);
    tg[13] = 100000, put(&r, "t", 13, 0, 100000.0f);
    put(&r, "r", 1, 0, NAN);                                   /* NaN row */
    put(&r, "x", 2, (tg[2] + n / 2) % n, NAN);                 /* NaN column, far from the target */
    put(&r, "x", 3, tg[3], NAN);                               /* NaN at the target */
    put(&r, "x", 4, tg[4] + 1, NAN);                           /* NaN beside it */
    put(&r, "x", 5, (tg[5] + n / 2) % n, INFINITY);            /* +inf off the target */
    put(&r, "x", 6, tg[6], INFINITY);                          /* +inf at the target */
    for (int64_t j = 0; j < n; j++) put(&r, "x", 7, j, -INFINITY), put(&r, "x", 13, j, -INFINITY); /* all -inf */
    for (int64_t j = 0; j < n / 2; j++) put(&r, "x", 8, tg[8] < n / 2 ? n - 1 - j : j, -INFINITY); /* half a row of -inf, not the target's half */
    put(&r, "x", 9, tg[9], -INFINITY);                         /* -inf at the target */
    put(&r, "x", 10, 0, INFINITY), put(&r, "x", 10, 7, INFINITY), put(&r, "x", 10, -1, INFINITY);
    put(&r, "x", 11, 5, INFINITY), put(&r, "x", 11, -3, NAN);  /* +inf and NaN */
    put(&r, "x", 17, 4, NAN);                                  /* NaN, ignored row */
    put(&r, "x", -1, tg[m - 1], NAN);                          /* NaN at the target, last row */
    for (int64_t i = 140; i < m; i += 9) put(&r, "x", i, (i * 11) % n, NAN); /* the second row tile */
    run_go(&r, 1);
    { /* the rule itself, not only the CPU's agreement (issue #18: a NaN row
       * gave m = -inf, l = 0 on both backends) */
        tb_t *pt = arg(&r, "part");
        float *g = h_alloc(pt->bytes);
        CUDA_OK(cudaMemcpy(g, pt->d, pt->bytes, cudaMemcpyDeviceToHost));
        int64_t T = pt->sh[1], bad = 0;
        for (int64_t q = 0; q < T; q++) {
            const float *e1 = g + (1 * T + q) * 3, *e7 = g + (7 * T + q) * 3;
            bad += !isnan(e1[0]) || !isnan(e1[1]);                 /* NaN row: (NaN, NaN) */
            bad += e7[0] != -INFINITY || e7[1] != 0.0f;            /* -inf row: (-inf, 0) */
        }
        CHECK(bad == 0, "%.12s n %lld: GPU lse partials of the NaN row / the -inf row: %lld wrong", r.title,
              (long long)n, (long long)bad);
        free(g);
    }
    finish_lse_both(&r, "part", "t");
    if (half) finish_lse_both(&r, "parth", "th");
    free(tg);
    run_free(&r);
}

static void case_rowpart(int64_t m, int64_t n, int tile_n) {
    run_t r;
    run_new(&r, prog_rowpart, m, n, 64, tile_n, seed++);
    put(&r, "ss", 4, 2, NAN);
    put(&r, "ss", 130, 0, NAN);
    put(&r, "ss", -1, 4, NAN);
    run_go(&r, 1);
    run_free(&r);
}

/* hand-made partials: where in t the NaN is, infinities */
static void case_finish_direct(void) {
    enum { R = 8, T = 5, RL = 9, TL = 3 };
    float p[R][T], q[RL][TL][3];
    int32_t tg[RL];
    for (int i = 0; i < R; i++)
        for (int t = 0; t < T; t++) p[i][t] = 1.0f + (float)(i + t) / 8;
    p[0][0] = NAN, p[1][2] = NAN, p[2][T - 1] = NAN;
    for (int t = 0; t < T; t++) p[3][t] = NAN, p[5][t] = -INFINITY;
    p[4][1] = INFINITY, p[4][3] = NAN, p[6][2] = INFINITY;
    for (int i = 0; i < RL; i++) {
        tg[i] = 5;
        for (int t = 0; t < TL; t++) q[i][t][0] = 0.5f * (float)t, q[i][t][1] = 2.0f, q[i][t][2] = t == 0 ? 0.25f : 0.0f;
    }
    q[0][1][0] = NAN, q[0][1][1] = NAN;
    q[1][0][2] = NAN;
    q[2][2][0] = INFINITY, q[2][2][1] = INFINITY;
    q[3][0][0] = INFINITY, q[3][0][1] = INFINITY, q[3][0][2] = INFINITY;
    for (int t = 0; t < TL; t++) q[4][t][0] = q[5][t][0] = -INFINITY, q[4][t][1] = q[5][t][1] = 0.0f, q[5][t][2] = 0.0f;
    q[4][0][2] = -INFINITY;
    q[6][1][0] = -INFINITY, q[6][1][1] = 0.0f;
    q[7][2][0] = NAN, q[7][2][1] = NAN, tg[7] = -100;
    q[8][0][0] = q[8][0][1] = q[8][2][0] = q[8][2][1] = INFINITY;
    float *dp, *dq, *dout;
    int32_t *dt;
    CUDA_OK(cudaMalloc((void **)&dp, sizeof p));
    CUDA_OK(cudaMalloc((void **)&dq, sizeof q));
    CUDA_OK(cudaMalloc((void **)&dt, sizeof tg));
    CUDA_OK(cudaMalloc((void **)&dout, 2 * RL * 4));
    CUDA_OK(cudaMemcpy(dp, p, sizeof p, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dq, q, sizeof q, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dt, tg, sizeof tg, cudaMemcpyHostToDevice));
    float c[2 * RL], g[2 * RL];
    coda_tensor_t pc = coda_tensor_2d(p, CODA_F32, R, T), pg = pc;
    pg.data = dp, pg.device = CODA_DEVICE_CUDA;
    coda_tensor_t oc = coda_tensor_1d(c, CODA_F32, R), og = oc;
    og.data = dout, og.device = CODA_DEVICE_CUDA;
    for (int op = 0; op < 3; op++) {
        CHECK_OK(coda_finish_reduce(ctx, (coda_reduce_t)op, &pc, &oc, NULL));
        CHECK_OK(coda_finish_reduce(ctx, (coda_reduce_t)op, &pg, &og, NULL));
        CUDA_OK(cudaMemcpy(g, dout, R * 4, cudaMemcpyDeviceToHost));
        char what[64];
        snprintf(what, sizeof what, "hand-made partials: finish_reduce op %d", op);
        cmp_vec(what, c, g, R);
    }
    CHECK_OK(coda_finish_rstd(ctx, &pc, 16, 1e-5f, &oc, NULL));
    CHECK_OK(coda_finish_rstd(ctx, &pg, 16, 1e-5f, &og, NULL));
    CUDA_OK(cudaMemcpy(g, dout, R * 4, cudaMemcpyDeviceToHost));
    cmp_vec("hand-made partials: finish_rstd", c, g, R);
    coda_tensor_t qc = coda_tensor_3d(q, CODA_F32, RL, TL, 3), qg = qc, tc = coda_tensor_1d(tg, CODA_I32, RL), tgg = tc;
    qg.data = dq, qg.device = CODA_DEVICE_CUDA;
    tgg.data = dt, tgg.device = CODA_DEVICE_CUDA;
    coda_tensor_t lc = coda_tensor_1d(c, CODA_F32, RL), sc = coda_tensor_1d(c + RL, CODA_F32, RL), lg = lc, sg = sc;
    lg.data = dout, lg.device = CODA_DEVICE_CUDA;
    sg.data = dout + RL, sg.device = CODA_DEVICE_CUDA;
    CHECK_OK(coda_finish_lse(ctx, &qc, &tc, -100, &lc, &sc, NULL));
    CHECK_OK(coda_finish_lse(ctx, &qg, &tgg, -100, &lg, &sg, NULL));
    CUDA_OK(cudaMemcpy(g, dout, 2 * RL * 4, cudaMemcpyDeviceToHost));
    cmp_vec("hand-made partials: finish_lse lse", c, g, RL);
    cmp_vec("hand-made partials: finish_lse loss", c + RL, g + RL, RL);
    static const char want_lse[RL] = {NAN_, F, PINF, PINF, NINF, NINF, F, NAN_, PINF};
    for (int i = 0; i < RL; i++) CHECK(cls(g[i]) == want_lse[i], "GPU finish_lse row %d: lse %g", i, g[i]);
    printf("  finishing steps on hand-made partials: checked\n");
    CUDA_OK(cudaFree(dp));
    CUDA_OK(cudaFree(dq));
    CUDA_OK(cudaFree(dt));
    CUDA_OK(cudaFree(dout));
}

int main(void) {
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "test_nan_gpu: no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    /* N 272: N16 form; 264: even form; both with 128- and 256-wide tiles,
     * ping-pong (default for 128) and cooperative */
    static const struct { int64_t n; int tile_n; const char *cfg; } shapes[] = {
        {272, 128, NULL}, {264, 128, NULL}, {272, 256, NULL}, {264, 256, NULL}, {272, 128, "1"}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t m = 200, n = shapes[s].n;
        const int tn = shapes[s].tile_n;
        if (shapes[s].cfg) tune_cfg_str(ctx, shapes[s].cfg);
        else tune_cfg(ctx, -1);
        case_maps(m, n, tn);
        case_pairs(m, n, tn);
        case_vectors(m, n, tn);
        for (int how = 0; how < 5; how++) case_reductions(m, n, tn, how);
        case_lse(m, n, tn, 1);
        case_rowpart(m, n, tn);
    }
    tune_cfg(ctx, -1);
    /* N odd: the general form, for the programs without column pairs */
    case_maps(200, 131, 0);
    case_lse(200, 131, 0, 0);
    case_lse(127, 1003, 256, 0);
    case_rowpart(200, 131, 0);
    case_finish_direct();
    coda_context_free(ctx);
    TEST_MAIN_END();
}
