/* test_lm_loss.c - coda_lm_loss on the CPU backend against a float64
 * reference of coda.h section 10's math, on random data with odd shapes:
 *
 *   - loss, total, dx and dw within twice the error of the unfused bf16
 *     computation (bf16 logits, f32 softmax, bf16 dz: what PyTorch's eager
 *     cross_entropy of a bf16 matmul does) against float64, for every
 *     option (smoothing, z-loss, softcap, sum / mean, grad_scale, ignored
 *     rows, f32 / bf16 gradients), in one chunk and in chunks of 8 rows;
 *   - chunking changes no row's loss or dx (bit for bit), forward-only gives
 *     the same loss, accumulate adds;
 *   - NaN and out-of-range targets poison exactly their rows (and dw);
 *   - i64 targets give i32's results bit for bit; an i64 value that a cast
 *     would wrap into ignore_index or a class stays invalid;
 *     all rows ignored gives a NaN mean and zero gradients;
 *   - bad arguments: the status, a message, and nothing written. */
#include "harness.h"

typedef struct {
    int64_t m, d, v;
    uint16_t *x, *w;   /* (m, d), (v, d) bf16 */
    int32_t *t;        /* (m) */
    int64_t *t64;      /* (m) or NULL: when set, the call's targets are these, as i64 */
} problem_t;

static problem_t make_problem(uint64_t seed, int64_t m, int64_t d, int64_t v, float scale, int n_ignored) {
    problem_t p = {m, d, v, h_alloc((size_t)(m * d * 2)), h_alloc((size_t)(v * d * 2)), h_alloc((size_t)m * 4), NULL};
    h_rng r = rng_new(seed);
    rng_fill_bf16(&r, p.x, m * d, scale);
    rng_fill_bf16(&r, p.w, v * d, scale);
    for (int64_t i = 0; i < m; i++) p.t[i] = (int32_t)((uint32_t)(rng_uniform(&r) * 0.5f * (float)v + 0.5f * v) % v);
    for (int k = 0; k < n_ignored; k++) p.t[(k * 7 + 3) % m] = -100;
    return p;
}
static void free_problem(problem_t *p) {
    free(p->x);
    free(p->w);
    free(p->t);
    free(p->t64);
}

/* ---- the reference (float64) and the unfused bf16 baseline ---- */

typedef struct {
    double *loss, total, *dx, *dw; /* (m), (m, d), (v, d) */
} result64_t;

static double bf(double v) { return (double)h_bf2f(h_f2bf((float)v)); }

/* lo = 1: the bf16 pipeline (bf16 logits, f32-rounded softmax, bf16 dz,
 * gradients rounded to the tested dtypes by the caller); lo = 0: float64. */
static result64_t reference(const problem_t *p, const coda_lm_loss_opts_t *o, int lo) {
    int64_t m = p->m, d = p->d, V = p->v;
    result64_t r = {calloc((size_t)m, 8), 0, calloc((size_t)(m * d), 8), calloc((size_t)(V * d), 8)};
    double *z = malloc((size_t)V * 8), *dz = malloc((size_t)V * 8);
    int64_t count = 0;
    for (int64_t i = 0; i < m; i++) count += p->t[i] != o->ignore_index;
    double s = o->grad_scale / (o->reduction == CODA_LM_MEAN ? (double)count : 1.0);
    for (int64_t i = 0; i < m; i++) {
        if (p->t[i] == o->ignore_index) continue;
        double mx = -INFINITY, sum = 0, sz = 0;
        for (int64_t j = 0; j < V; j++) {
            double a = 0;
            for (int64_t k = 0; k < d; k++) a += (double)h_bf2f(p->x[i * d + k]) * h_bf2f(p->w[j * d + k]);
            if (lo) a = (float)a;
            if (o->softcap > 0) a = o->softcap * tanh(a / o->softcap);
            z[j] = lo ? bf(a) : a;
            mx = fmax(mx, z[j]);
            sz += z[j];
        }
        for (int64_t j = 0; j < V; j++) sum += exp(z[j] - mx);
        double lse = mx + log(sum), eps = o->label_smoothing;
        int64_t t = p->t[i];
        if (t < 0 || t >= V) { /* the tests give no such row to the reference */
            r.loss[i] = NAN;
            continue;
        }
        r.loss[i] = lse - (1 - eps) * z[t] - eps / V * sz + o->z_loss * lse * lse;
        for (int64_t j = 0; j < V; j++) {
            double g = s * ((1 + 2 * o->z_loss * lse) * exp(z[j] - lse) - (j == t ? 1 - eps : 0) - eps / V);
            if (o->softcap > 0) g *= 1 - (z[j] / o->softcap) * (z[j] / o->softcap);
            dz[j] = lo ? bf((float)g) : g;
        }
        for (int64_t j = 0; j < V; j++)
            for (int64_t k = 0; k < d; k++) {
                r.dx[i * d + k] += dz[j] * h_bf2f(p->w[j * d + k]);
                r.dw[j * d + k] += dz[j] * h_bf2f(p->x[i * d + k]);
            }
    }
    for (int64_t i = 0; i < m; i++) r.total += r.loss[i];
    if (o->reduction == CODA_LM_MEAN) r.total /= (double)count;
    free(z);
    free(dz);
    return r;
}
static void free_result(result64_t *r) {
    free(r->loss);
    free(r->dx);
    free(r->dw);
}

/* ||a - b|| / ||b|| over n doubles */
static double rel64(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i])) return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- running coda ---- */

typedef struct {
    float *loss, total;
    void *dx, *dw; /* in dx_dt / dw_dt */
    coda_dtype_t dx_dt, dw_dt;
} result_t;

static coda_tensor_t mat(void *p, coda_dtype_t dt, int64_t r, int64_t c) { return coda_tensor_2d(p, dt, r, c); }

/* Where the call's tensors live: the CPU, or (tests/gpu/test_lm_loss_gpu.c,
 * which includes this file with LM_TEST_CUDA) the GPU, copied there and back
 * around each call. */
#ifdef LM_TEST_CUDA
static coda_device_t dev = CODA_DEVICE_CUDA;
static void *dev_put(const void *h, size_t bytes) {
    void *d;
    CUDA_OK(cudaMalloc(&d, bytes + 256));
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static void dev_get(void *h, const void *d, size_t bytes) { CUDA_OK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost)); }
static void dev_free(void *d) { CUDA_OK(cudaFree(d)); }
#else
static coda_device_t dev = CODA_DEVICE_CPU;
static void *dev_put(const void *h, size_t bytes) {
    void *d = aligned_alloc(256, (bytes + 511) / 256 * 256);
    memcpy(d, h, bytes);
    return d;
}
static void dev_get(void *h, const void *d, size_t bytes) { memcpy(h, d, bytes); }
static void dev_free(void *d) { free(d); }
#endif

static coda_tensor_t on_dev(coda_tensor_t t) {
    t.device = dev;
    return t;
}

/* 1: run() passes the targets as an (M, 1) column instead of (M) */
static int col_targets;

static coda_status_t run(coda_context_t *ctx, const problem_t *p, const coda_lm_loss_opts_t *o, result_t *out,
                         int grads) {
    size_t xb = (size_t)(p->m * p->d) * 2, wb = (size_t)(p->v * p->d) * 2, tb = (size_t)p->m * 4;
    size_t dxb = (size_t)(p->m * p->d) * coda_dtype_size(out->dx_dt);
    size_t dwb = (size_t)(p->v * p->d) * coda_dtype_size(out->dw_dt);
    void *X = dev_put(p->x, xb), *W = dev_put(p->w, wb), *T = p->t64 ? dev_put(p->t64, 2 * tb) : dev_put(p->t, tb);
    void *L = dev_put(out->loss, tb), *TOT = dev_put(&out->total, 4);
    void *DX = dev_put(out->dx, dxb), *DW = dev_put(out->dw, dwb);
    coda_tensor_t x = on_dev(mat(X, CODA_BF16, p->m, p->d)), w = on_dev(mat(W, CODA_BF16, p->v, p->d));
    coda_tensor_t t = on_dev(col_targets ? coda_tensor_2d(T, p->t64 ? CODA_I64 : CODA_I32, p->m, 1)
                                         : coda_tensor_1d(T, p->t64 ? CODA_I64 : CODA_I32, p->m));
    coda_tensor_t loss = on_dev(coda_tensor_1d(L, CODA_F32, p->m));
    coda_tensor_t total = on_dev(coda_tensor_1d(TOT, CODA_F32, 1));
    coda_tensor_t dx = on_dev(mat(DX, out->dx_dt, p->m, p->d)), dw = on_dev(mat(DW, out->dw_dt, p->v, p->d));
    size_t bytes;
    coda_status_t st = coda_lm_loss_workspace_size(ctx, dev, p->m, p->d, p->v, o, &bytes);
    if (st == CODA_OK) {
        void *host_ws = calloc(1, bytes), *ws = dev_put(host_ws, bytes);
        st = coda_lm_loss(ctx, &x, &w, &t, o, &loss, &total, grads ? &dx : NULL, grads ? &dw : NULL, ws, bytes,
                          NULL);
        dev_free(ws);
        free(host_ws);
    }
    dev_get(out->loss, L, tb);
    dev_get(&out->total, TOT, 4);
    dev_get(out->dx, DX, dxb);
    dev_get(out->dw, DW, dwb);
    void *all[] = {X, W, T, L, TOT, DX, DW};
    for (int i = 0; i < 7; i++) dev_free(all[i]);
    return st;
}

static result_t new_result(const problem_t *p, coda_dtype_t dx_dt, coda_dtype_t dw_dt) {
    result_t r = {h_alloc((size_t)p->m * 4), 0, h_alloc((size_t)(p->m * p->d) * 4),
                  h_alloc((size_t)(p->v * p->d) * 4), dx_dt, dw_dt};
    poison_f32(r.loss, p->m);
    poison_f32(r.dx, p->m * p->d);
    poison_f32(r.dw, p->v * p->d);
    return r;
}
static void free_res(result_t *r) {
    free(r->loss);
    free(r->dx);
    free(r->dw);
}

static void to_double(const void *src, coda_dtype_t dt, int64_t n, double *dst) {
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt == CODA_F32 ? ((const float *)src)[i] : h_bf2f(((const uint16_t *)src)[i]);
}

/* The unfused baseline's gradients, rounded to the tested dtypes. */
static void round_to(double *v, int64_t n, coda_dtype_t dt) {
    for (int64_t i = 0; i < n; i++) v[i] = dt == CODA_BF16 ? bf((float)v[i]) : (double)(float)v[i];
}

static void check_against_reference(coda_context_t *ctx, const problem_t *p, const coda_lm_loss_opts_t *o,
                                    coda_dtype_t dx_dt, coda_dtype_t dw_dt, const char *what) {
    result_t r = new_result(p, dx_dt, dw_dt);
    coda_status_t st = run(ctx, p, o, &r, 1);
    CHECK(st == CODA_OK, "%s: %s", what, coda_last_error());
    if (st != CODA_OK) {
        free_res(&r);
        return;
    }
    result64_t ref = reference(p, o, 0), lo = reference(p, o, 1);
    round_to(lo.dx, p->m * p->d, dx_dt);
    round_to(lo.dw, p->v * p->d, dw_dt);
    int64_t nx = p->m * p->d, nw = p->v * p->d;
    double *got = malloc((size_t)(nw > nx ? nw : nx) * 8);
    for (int64_t i = 0; i < p->m; i++) got[i] = r.loss[i];
    double e_loss = rel64(got, ref.loss, p->m), b_loss = rel64(lo.loss, ref.loss, p->m);
    double e_tot = fabs(r.total - ref.total) / fabs(ref.total), b_tot = fabs(lo.total - ref.total) / fabs(ref.total);
    to_double(r.dx, dx_dt, nx, got);
    double e_dx = rel64(got, ref.dx, nx), b_dx = rel64(lo.dx, ref.dx, nx);
    to_double(r.dw, dw_dt, nw, got);
    double e_dw = rel64(got, ref.dw, nw), b_dw = rel64(lo.dw, ref.dw, nw);
    /* a floor of a few f32 roundings where the bf16 baseline happens to be
     * exact (the loss rows are f32 on both sides) */
    CHECK(within_tol(e_loss, b_loss + 1e-6), "%s: loss err %.3g, bf16 baseline %.3g", what, e_loss, b_loss);
    CHECK(within_tol(e_tot, b_tot + 1e-6), "%s: total err %.3g, bf16 baseline %.3g", what, e_tot, b_tot);
    CHECK(within_tol(e_dx, b_dx), "%s: dx err %.3g, bf16 baseline %.3g", what, e_dx, b_dx);
    CHECK(within_tol(e_dw, b_dw), "%s: dw err %.3g, bf16 baseline %.3g", what, e_dw, b_dw);
    CHECK(b_dx > 0 && b_dw > 0, "%s: a baseline error of 0 (the test data is degenerate)", what);
    free(got);
    free_result(&ref);
    free_result(&lo);
    free_res(&r);
}

static void test_options(coda_context_t *ctx) {
    static const struct { int64_t m, d, v; float scale; int ignored; } shapes[] = {
        {37, 24, 101, 0.6f, 3}, {20, 16, 256, 0.5f, 0}, {9, 40, 300, 0.4f, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        problem_t p = make_problem(11 + s, shapes[s].m, shapes[s].d, shapes[s].v, shapes[s].scale, shapes[s].ignored);
        for (int variant = 0; variant < 7; variant++) {
            coda_lm_loss_opts_t o;
            coda_lm_loss_opts_init(&o);
            const char *name = "plain";
            switch (variant) {
            case 1: o.label_smoothing = 0.1f; name = "smoothing"; break;
            case 2: o.z_loss = 1e-2f; name = "z-loss"; break;
            case 3: o.softcap = 3.0f; name = "softcap"; break;
            case 4: o.reduction = CODA_LM_SUM; o.grad_scale = 0.25f; name = "sum, grad_scale"; break;
            case 5: o.label_smoothing = 0.2f; o.z_loss = 1e-3f; o.softcap = 5.0f; name = "all"; break;
            case 6: o.ignore_index = p.t[1]; name = "ignore_index = a live target"; break;
            }
            int32_t *saved = NULL;
            if (variant == 6) { /* the -100 rows become live: give them targets */
                saved = h_alloc((size_t)p.m * 4);
                memcpy(saved, p.t, (size_t)p.m * 4);
                for (int64_t i = 0; i < p.m; i++)
                    if (p.t[i] == -100) p.t[i] = (int32_t)(i % p.v);
            }
            for (int chunked = 0; chunked < 2; chunked++) {
                o.chunk_rows = chunked ? 8 : 0;
                char what[128];
                snprintf(what, sizeof what, "(%lld, %lld, %lld) %s, %s", (long long)p.m, (long long)p.d,
                         (long long)p.v, name, chunked ? "chunks of 8" : "one chunk");
                coda_dtype_t gdt = (variant + chunked) % 2 ? CODA_BF16 : CODA_F32;
                check_against_reference(ctx, &p, &o, gdt, gdt == CODA_F32 ? CODA_BF16 : CODA_F32, what);
            }
            if (saved) {
                memcpy(p.t, saved, (size_t)p.m * 4);
                free(saved);
            }
        }
        free_problem(&p);
    }
}

/* Chunks change no row's loss or dx; forward-only gives the same loss;
 * accumulate adds to what is there. */
static void test_chunks_and_modes(coda_context_t *ctx) {
    problem_t p = make_problem(5, 45, 32, 173, 0.5f, 4);
    coda_lm_loss_opts_t o;
    coda_lm_loss_opts_init(&o);
    o.label_smoothing = 0.05f;
    result_t one = new_result(&p, CODA_F32, CODA_F32), many = new_result(&p, CODA_F32, CODA_F32);
    result_t fwd = new_result(&p, CODA_F32, CODA_F32);
    CHECK_OK(run(ctx, &p, &o, &one, 1));
    o.chunk_rows = 16;
    CHECK_OK(run(ctx, &p, &o, &many, 1));
#ifndef LM_TEST_CUDA
    /* the CPU's sums do not depend on M */
    CHECK(!memcmp(one.loss, many.loss, (size_t)p.m * 4), "chunking changed a row's loss");
    CHECK(!memcmp(one.dx, many.dx, (size_t)(p.m * p.d) * 4), "chunking changed dx");
    CHECK(one.total == many.total, "chunking changed the total: %.9g vs %.9g", one.total, many.total);
#else
    /* the GPU may tile a GEMM of another M otherwise: f32 sums in another order */
    double el = 0, ed = 0;
    for (int64_t i = 0; i < p.m; i++) el = fmax(el, fabs(one.loss[i] - many.loss[i]) / fabs(one.loss[i]));
    for (int64_t i = 0; i < p.m * p.d; i++)
        ed = fmax(ed, fabs(((float *)one.dx)[i] - ((float *)many.dx)[i]) / (fabs(((float *)one.dx)[i]) + 1e-3));
    CHECK(el < 1e-5 && ed < 1e-3, "chunking changed a row's loss by %.3g, dx by %.3g", el, ed);
#endif
    double e = 0;
    for (int64_t i = 0; i < p.v * p.d; i++)
        e = fmax(e, fabs(((float *)one.dw)[i] - ((float *)many.dw)[i]) / (fabs(((float *)one.dw)[i]) + 1e-3));
    CHECK(e < 1e-4, "chunked dw differs from one chunk's by %.3g (f32 sums in another order)", e);

    CHECK_OK(run(ctx, &p, &o, &fwd, 0));
    CHECK(!memcmp(one.loss, fwd.loss, (size_t)p.m * 4) && one.total == fwd.total, "forward-only changed the loss");
    int untouched = 1;
    for (int64_t i = 0; i < p.m * p.d; i++) untouched &= isnan(((float *)fwd.dx)[i]);
    CHECK(untouched, "forward-only wrote dx");

    /* accumulate: many (dx, dw) + one more call = 2x within rounding */
    o.accumulate = 1;
    CHECK_OK(run(ctx, &p, &o, &many, 1));
    double ex = 0, ew = 0;
    for (int64_t i = 0; i < p.m * p.d; i++)
        ex = fmax(ex, fabs(((float *)many.dx)[i] - 2 * ((float *)one.dx)[i]));
    for (int64_t i = 0; i < p.v * p.d; i++)
        ew = fmax(ew, fabs(((float *)many.dw)[i] - 2 * ((float *)one.dw)[i]));
    CHECK(ex < 1e-6 && ew < 1e-5, "accumulate: |dx - 2 dx1| %.3g, |dw - 2 dw1| %.3g", ex, ew);
    free_res(&one);
    free_res(&many);
    free_res(&fwd);
    free_problem(&p);
}

static int all_nan(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isnan(v[i])) return 0;
    return 1;
}
static int none_nan(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (isnan(v[i])) return 0;
    return 1;
}

static void test_nan_and_targets(coda_context_t *ctx) {
    coda_lm_loss_opts_t o;
    coda_lm_loss_opts_init(&o);
    o.chunk_rows = 8;
    for (int kind = 0; kind < 4; kind++) {
        problem_t p = make_problem(21 + kind, 19, 16, 77, 0.5f, 2);
        const char *name = kind == 0 ? "target V" : kind == 1 ? "target -1" : kind == 2 ? "NaN in x" : "NaN in w";
        int64_t bad = 11; /* a live row (3 and 10 are ignored) */
        if (kind == 0) p.t[bad] = (int32_t)p.v;
        if (kind == 1) p.t[bad] = -1;
        if (kind == 2) p.x[bad * p.d + 5] = 0x7fc0;
        if (kind == 3) p.w[4 * p.d + 3] = 0x7fc0;
        result_t r = new_result(&p, CODA_F32, CODA_F32);
        CHECK_OK(run(ctx, &p, &o, &r, 1));
        if (kind < 3) {
            CHECK(isnan(r.loss[bad]) && all_nan((float *)r.dx + bad * p.d, p.d), "%s: row not NaN", name);
            int others = 1;
            for (int64_t i = 0; i < p.m; i++)
                if (i != bad) others &= !isnan(r.loss[i]) && none_nan((float *)r.dx + i * p.d, p.d);
            CHECK(others, "%s: NaN reached another row's loss or dx", name);
        } else {
            int live = 1;
            for (int64_t i = 0; i < p.m; i++)
                if (p.t[i] != -100) live &= isnan(r.loss[i]);
            CHECK(live, "%s: a live row's loss is not NaN", name);
        }
        CHECK(isnan(r.total) && all_nan(r.dw, p.v * p.d), "%s: total %g, or dw not all NaN", name, r.total);
        free_res(&r);
        free_problem(&p);
    }
    /* every row ignored: mean 0/0 = NaN (as PyTorch), gradients 0 */
    problem_t p = make_problem(31, 12, 8, 33, 0.5f, 0);
    for (int64_t i = 0; i < p.m; i++) p.t[i] = -100;
    result_t r = new_result(&p, CODA_F32, CODA_F32);
    CHECK_OK(run(ctx, &p, &o, &r, 1));
    int zero = 1;
    for (int64_t i = 0; i < p.m * p.d; i++) zero &= ((float *)r.dx)[i] == 0.0f;
    for (int64_t i = 0; i < p.v * p.d; i++) zero &= ((float *)r.dw)[i] == 0.0f;
    for (int64_t i = 0; i < p.m; i++) zero &= r.loss[i] == 0.0f;
    CHECK(isnan(r.total) && zero, "all ignored: total %g (want NaN), losses and gradients 0: %d", r.total, zero);
    o.reduction = CODA_LM_SUM;
    CHECK_OK(run(ctx, &p, &o, &r, 1));
    CHECK(r.total == 0.0f, "all ignored, sum: total %g", r.total);
    free_res(&r);
    free_problem(&p);
}

/* i64 targets: the same bits as i32 ones; values a cast to i32 would wrap
 * into ignore_index (ignore_index +- 2^32) or into a class stay invalid */
static void test_i64_targets(coda_context_t *ctx) {
    problem_t p = make_problem(51, 45, 32, 173, 0.5f, 4);
    coda_lm_loss_opts_t o;
    coda_lm_loss_opts_init(&o);
    o.label_smoothing = 0.05f;
    o.chunk_rows = 16;
    result_t a = new_result(&p, CODA_F32, CODA_F32), b = new_result(&p, CODA_F32, CODA_F32);
    CHECK_OK(run(ctx, &p, &o, &a, 1));
    p.t64 = h_alloc((size_t)p.m * 8);
    for (int64_t i = 0; i < p.m; i++) p.t64[i] = p.t[i];
    CHECK_OK(run(ctx, &p, &o, &b, 1));
    CHECK(!memcmp(a.loss, b.loss, (size_t)p.m * 4) && a.total == b.total &&
              !memcmp(a.dx, b.dx, (size_t)(p.m * p.d) * 4) && !memcmp(a.dw, b.dw, (size_t)(p.v * p.d) * 4),
          "i64 targets: results differ from i32's");
    /* targets as an (M, 1) column, i64 and i32 (the i32 column was once
     * accepted by the checks and refused by the first chunk's epilogue) */
    col_targets = 1;
    for (int k = 0; k < 2; k++) {
        int64_t *t64 = p.t64;
        if (k == 1) p.t64 = NULL;
        poison_f32(b.loss, p.m);
        CHECK_OK(run(ctx, &p, &o, &b, 1));
        CHECK(!memcmp(a.loss, b.loss, (size_t)p.m * 4) && a.total == b.total &&
                  !memcmp(a.dx, b.dx, (size_t)(p.m * p.d) * 4) && !memcmp(a.dw, b.dw, (size_t)(p.v * p.d) * 4),
              "%s targets as an (M, 1) column: results differ from (M)'s", k ? "i32" : "i64");
        p.t64 = t64;
    }
    col_targets = 0;
    const int32_t igns[3] = {-100, -1, INT32_MIN};
    const int64_t two32 = (int64_t)1 << 32;
    for (int k = 0; k < 3; k++) {
        int32_t ign = igns[k];
        o.ignore_index = ign;
        for (int64_t i = 0; i < p.m; i++) p.t64[i] = p.t[i] == -100 ? ign : p.t[i];
        const int64_t rows[5] = {5, 7, 9, 11, 13};
        const int64_t vals[5] = {(int64_t)ign + two32, (int64_t)ign - two32, p.v, (int64_t)1 << 40, 17 + two32};
        p.t64[2] = ign;
        for (int j = 0; j < 5; j++) p.t64[rows[j]] = vals[j];
        CHECK_OK(run(ctx, &p, &o, &b, 1));
        int bad_nan = 1, rest_finite = 1, ign_zero = b.loss[2] == 0.0f;
        for (int64_t c = 0; c < p.d; c++) ign_zero &= ((float *)b.dx)[2 * p.d + c] == 0.0f;
        for (int64_t i = 0; i < p.m; i++) {
            int bad = i == 5 || i == 7 || i == 9 || i == 11 || i == 13;
            if (bad) bad_nan &= isnan(b.loss[i]) && all_nan((float *)b.dx + i * p.d, p.d);
            else rest_finite &= !isnan(b.loss[i]) && none_nan((float *)b.dx + i * p.d, p.d);
        }
        CHECK(bad_nan && rest_finite && ign_zero && isnan(b.total),
              "ignore_index %d, i64 targets ign +- 2^32, V, 2^40, 17 + 2^32: bad rows NaN %d, the rest finite %d, "
              "ignored row 0 %d, total %g", ign, bad_nan, rest_finite, ign_zero, b.total);
    }
    free_res(&a);
    free_res(&b);
    free_problem(&p);
}

/* ---- bad input: a status, a message, nothing written ---- */

static void test_bad_input(coda_context_t *ctx) {
    problem_t p = make_problem(41, 16, 8, 24, 0.5f, 0);
    int64_t m = p.m, d = p.d, V = p.v;
    float loss[16], total, dx[16 * 8], dw[24 * 8];
    poison_f32(loss, m);
    poison_f32(dx, m * d);
    poison_f32(dw, V * d);
    total = NAN;
    coda_tensor_t x = mat(p.x, CODA_BF16, m, d), w = mat(p.w, CODA_BF16, V, d), t = coda_tensor_1d(p.t, CODA_I32, m);
    coda_tensor_t lt = coda_tensor_1d(loss, CODA_F32, m), tt = coda_tensor_1d(&total, CODA_F32, 1);
    coda_tensor_t dxt = mat(dx, CODA_F32, m, d), dwt = mat(dw, CODA_F32, V, d);
    coda_lm_loss_opts_t o;
    coda_lm_loss_opts_init(&o);
    size_t bytes;
    REQUIRE_OK(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CPU, m, d, V, &o, &bytes));
    char *ws = aligned_alloc(256, bytes + 512);

#define BAD(want, ...) CHECK_STATUS(coda_lm_loss(ctx, __VA_ARGS__, NULL), want)
    BAD(CODA_ERR_INVALID_ARG, NULL, &w, &t, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    BAD(CODA_ERR_INVALID_ARG, &x, &w, &t, &o, NULL, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t x3 = mat(p.x, CODA_BF16, m, d - 1);
    BAD(CODA_ERR_SHAPE, &x3, &w, &t, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t xf = mat(p.x, CODA_F32, m, d / 2);
    BAD(CODA_ERR_DTYPE, &xf, &w, &t, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t tf = coda_tensor_1d(p.t, CODA_F32, m);
    BAD(CODA_ERR_DTYPE, &x, &w, &tf, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t ts = coda_tensor_1d(p.t, CODA_I32, m - 1);
    BAD(CODA_ERR_SHAPE, &x, &w, &ts, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t t64s = coda_tensor_1d(p.t, CODA_I64, m / 2 - 1); /* i64 accepted; this length is not */
    BAD(CODA_ERR_SHAPE, &x, &w, &t64s, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t dws = mat(dw, CODA_F32, V - 1, d);
    BAD(CODA_ERR_SHAPE, &x, &w, &t, &o, &lt, &tt, &dxt, &dws, ws, bytes);
    coda_tensor_t dx_over_dw = mat(dw, CODA_F32, m, d);
    BAD(CODA_ERR_OVERLAP, &x, &w, &t, &o, &lt, &tt, &dx_over_dw, &dwt, ws, bytes);
    coda_tensor_t loss_in_ws = coda_tensor_1d(ws, CODA_F32, m);
    BAD(CODA_ERR_OVERLAP, &x, &w, &t, &o, &loss_in_ws, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t dx_over_x = mat(p.x, CODA_BF16, m, d);
    BAD(CODA_ERR_OVERLAP, &x, &w, &t, &o, &lt, &tt, &dx_over_x, &dwt, ws, bytes);
    BAD(CODA_ERR_SHAPE, &x, &w, &t, &o, &lt, &tt, &dxt, &dwt, ws, bytes - 1);
    BAD(CODA_ERR_STRIDE, &x, &w, &t, &o, &lt, &tt, &dxt, &dwt, ws + 16, bytes);
    BAD(CODA_ERR_INVALID_ARG, &x, &w, &t, &o, &lt, &tt, &dxt, &dwt, NULL, bytes);
    coda_tensor_t xc = x;
    xc.device = CODA_DEVICE_CUDA;
    BAD(CODA_ERR_DEVICE, &xc, &w, &t, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    /* reviews: a padded (M, 1) i32 column was refused deep inside, after the
     * count was written; d = 2^31 was taken */
    int32_t tpad[2 * 16];
    for (int64_t i = 0; i < m; i++) tpad[2 * i] = ((const int32_t *)p.t)[i], tpad[2 * i + 1] = 0;
    coda_tensor_t tcol = coda_tensor_2d(tpad, CODA_I32, m, 1);
    tcol.stride[0] = 8;
    BAD(CODA_ERR_STRIDE, &x, &w, &tcol, &o, &lt, &tt, &dxt, &dwt, ws, bytes);
    coda_tensor_t xwide = mat(p.x, CODA_BF16, 1, (int64_t)1 << 31);
    coda_tensor_t t1 = coda_tensor_1d(p.t, CODA_I32, 1), l1 = coda_tensor_1d(loss, CODA_F32, 1);
    BAD(CODA_ERR_SHAPE, &xwide, &w, &t1, &o, &l1, &tt, NULL, NULL, ws, bytes);
    const struct { const char *name; coda_lm_loss_opts_t o; } bad_opts[] = {
        {"smoothing 1.5", {-100, 1.5f, 0, 0, 1, CODA_LM_MEAN, 0, 0}},
        {"smoothing NaN", {-100, NAN, 0, 0, 1, CODA_LM_MEAN, 0, 0}},
        {"z_loss < 0", {-100, 0, -1, 0, 1, CODA_LM_MEAN, 0, 0}},
        {"softcap inf", {-100, 0, 0, INFINITY, 1, CODA_LM_MEAN, 0, 0}},
        {"softcap < 0", {-100, 0, 0, -2, 1, CODA_LM_MEAN, 0, 0}},
        {"grad_scale NaN", {-100, 0, 0, 0, NAN, CODA_LM_MEAN, 0, 0}},
        {"reduction 7", {-100, 0, 0, 0, 1, (coda_lm_reduction_t)7, 0, 0}},
        {"accumulate 2", {-100, 0, 0, 0, 1, CODA_LM_MEAN, 2, 0}},
        {"chunk_rows -1", {-100, 0, 0, 0, 1, CODA_LM_MEAN, 0, -1}},
    };
    for (size_t i = 0; i < sizeof bad_opts / sizeof bad_opts[0]; i++) {
        coda_status_t st = coda_lm_loss(ctx, &x, &w, &t, &bad_opts[i].o, &lt, &tt, &dxt, &dwt, ws, bytes, NULL);
        CHECK(st == CODA_ERR_INVALID_ARG, "%s: %s", bad_opts[i].name, coda_status_name(st));
        size_t b2;
        st = coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CPU, m, d, V, &bad_opts[i].o, &b2);
        CHECK(st == CODA_ERR_INVALID_ARG, "workspace_size, %s: %s", bad_opts[i].name, coda_status_name(st));
    }
#undef BAD
    CHECK(all_nan(loss, m) && isnan(total) && all_nan(dx, m * d) && all_nan(dw, V * d),
          "a refused call wrote an output");
    size_t b3;
    CHECK_STATUS(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CPU, 0, d, V, NULL, &b3), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CPU, m, d, CODA_LSE_MAX_COLS + 8, NULL, &b3),
                 CODA_ERR_SHAPE);
    CHECK_OK(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CPU, m, d, CODA_LSE_MAX_COLS, NULL, &b3));
    CHECK_STATUS(coda_lm_loss_workspace_size(NULL, CODA_DEVICE_CPU, m, d, V, NULL, &b3), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_lm_loss_workspace_size(ctx, (coda_device_t)5, m, d, V, NULL, &b3), CODA_ERR_INVALID_ARG);
    /* the default chunk: a 128256-token vocabulary's chunk holds 4096 rows */
    CHECK_OK(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CUDA, 16384, 2048, 128256, NULL, &b3));
    CHECK(b3 >= (size_t)4096 * 128256 * 2 && b3 < ((size_t)1 << 30) + ((size_t)64 << 20),
          "default workspace at M 16384, V 128256: %zu bytes", b3);
    /* twice w's bytes when that is more than 1 GiB: 8192 rows at d = 4096 */
    CHECK_OK(coda_lm_loss_workspace_size(ctx, CODA_DEVICE_CUDA, 16384, 4096, 128256, NULL, &b3));
    CHECK(b3 >= (size_t)8192 * 128256 * 2 && b3 < ((size_t)2 << 30) + ((size_t)128 << 20),
          "default workspace at M 16384, d 4096, V 128256: %zu bytes", b3);
    coda_lm_loss_opts_init(NULL); /* harmless */
    free(ws);
    free_problem(&p);
}

/* ---- coda_scale: grad_output times the gradients the forward call made ---- */

/* What t[i] * s must become: s rounded to t's dtype, the product of two
 * floats exact in double, rounded once to t's dtype. */
static double scaled_ref(double v, float s, coda_dtype_t dt) {
    const double g = dt == CODA_BF16 ? (double)h_bf2f(h_f2bf(s)) : (double)s;
    return dt == CODA_BF16 ? (double)h_bf2f(h_f2bf((float)(v * g))) : (double)(float)(v * g);
}

/* One case: t (rows, cols) of dtype dt with row stride ld elements (ld >
 * cols: the pad between rows must stay as it was), one NaN with a payload
 * PyTorch would not make (kept bit for bit only when nothing is written). */
static void scale_case(coda_context_t *ctx, coda_dtype_t dt, int64_t rows, int64_t cols, int64_t ld, float s,
                       uint64_t seed) {
    const size_t es = coda_dtype_size(dt), n = (size_t)(rows * ld);
    unsigned char *h = h_alloc(n * es), *got = h_alloc(n * es);
    h_rng r = rng_new(seed);
    if (dt == CODA_BF16) rng_fill_bf16(&r, (uint16_t *)h, (int64_t)n, 3.0f);
    else rng_fill_f32(&r, (float *)h, (int64_t)n, 3.0f);
    if (dt == CODA_BF16) ((uint16_t *)h)[1] = 0x7f81;
    else ((uint32_t *)h)[1] = 0x7f800001u;
    void *dt_ = dev_put(h, n * es), *ds = dev_put(&s, 4);
    coda_tensor_t t = on_dev(rows > 1 ? mat(dt_, dt, rows, cols) : coda_tensor_1d(dt_, dt, cols));
    if (rows > 1) t.stride[0] = ld * (int64_t)es;
    coda_tensor_t st = on_dev(coda_tensor_1d(ds, CODA_F32, 1));
    CHECK_OK(coda_scale(ctx, &t, &st, NULL));
    dev_get(got, dt_, n * es);
    const float g = dt == CODA_BF16 ? h_bf2f(h_f2bf(s)) : s;
    int64_t bad = 0, pad = 0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < ld; j++) {
            const size_t k = (size_t)(i * ld + j);
            const double v = dt == CODA_BF16 ? h_bf2f(((uint16_t *)h)[k]) : ((float *)h)[k];
            const double o = dt == CODA_BF16 ? h_bf2f(((uint16_t *)got)[k]) : ((float *)got)[k];
            if (j >= cols) { pad += memcmp(h + k * es, got + k * es, es) != 0; continue; }
            if (g == 1.0f) { bad += memcmp(h + k * es, got + k * es, es) != 0; continue; }
            const double want = scaled_ref(v, s, dt);
            bad += isnan(want) ? !isnan(o) : o != want;
        }
    const int nan_kept = memcmp(h + es, got + es, es) == 0;
    CHECK(bad == 0 && pad == 0, "coda_scale %s (%lld, %lld) ld %lld by %g: %lld wrong, %lld pad elements written",
          coda_dtype_name(dt), (long long)rows, (long long)cols, (long long)ld, (double)s, (long long)bad,
          (long long)pad);
    if (g == 1.0f) CHECK(nan_kept, "coda_scale by 1: t untouched (a NaN's payload kept)");
    dev_free(dt_);
    dev_free(ds);
    free(h);
    free(got);
}

static void test_scale(coda_context_t *ctx) {
    /* vectors (cols a multiple of 4 / 8, aligned rows) and element by element */
    static const struct { coda_dtype_t dt; int64_t rows, cols, ld; } shapes[] = {
        {CODA_BF16, 7, 64, 72}, {CODA_BF16, 5, 37, 40}, {CODA_F32, 3, 64, 64}, {CODA_F32, 4, 33, 35},
        {CODA_BF16, 1, 5001, 5001}, {CODA_F32, 1, 4099, 4099}, {CODA_BF16, 300, 2056, 2056}};
    /* 1 + 2^-10 is 1 in bf16 (no write) but not in f32 */
    const float scales[] = {0.37f, -2.0f, 1.0f, 1.0f + 1.0f / 1024, 1.0f / 16384, 3e38f, NAN};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++)
            scale_case(ctx, shapes[i].dt, shapes[i].rows, shapes[i].cols, shapes[i].ld, scales[k], 300 + i * 16 + k);

    /* refusals: nothing written */
    float hb[64], one = 0.5f, two[2] = {0.5f, 0.5f};
    for (int i = 0; i < 64; i++) hb[i] = (float)i;
    void *d = dev_put(hb, sizeof hb), *ds = dev_put(&one, 4), *d2 = dev_put(two, 8);
    coda_tensor_t t = on_dev(mat(d, CODA_F32, 8, 8)), st = on_dev(coda_tensor_1d(ds, CODA_F32, 1));
    coda_tensor_t s2 = on_dev(coda_tensor_1d(d2, CODA_F32, 2)), sb = on_dev(coda_tensor_1d(ds, CODA_BF16, 1));
    coda_tensor_t t3 = on_dev(coda_tensor_3d(d, CODA_F32, 2, 4, 8)), ti = on_dev(mat(d, CODA_I32, 8, 8));
    coda_tensor_t s_in_t = on_dev(coda_tensor_1d((float *)d + 9, CODA_F32, 1));
    coda_tensor_t s_host = coda_tensor_1d(&one, CODA_F32, 1);
    CHECK_STATUS(coda_scale(NULL, &t, &st, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_scale(ctx, NULL, &st, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_scale(ctx, &t, NULL, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_scale(ctx, &t3, &st, NULL), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_scale(ctx, &ti, &st, NULL), CODA_ERR_DTYPE);
    CHECK_STATUS(coda_scale(ctx, &t, &s2, NULL), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_scale(ctx, &t, &sb, NULL), CODA_ERR_DTYPE);
    CHECK_STATUS(coda_scale(ctx, &t, &s_in_t, NULL), CODA_ERR_OVERLAP);
    if (dev != CODA_DEVICE_CPU) CHECK_STATUS(coda_scale(ctx, &t, &s_host, NULL), CODA_ERR_DEVICE);
    coda_tensor_t tbad = t;
    tbad.stride[1] = 8;
    CHECK_STATUS(coda_scale(ctx, &tbad, &st, NULL), CODA_ERR_STRIDE);
    float after[64];
    dev_get(after, d, sizeof after);
    CHECK(memcmp(hb, after, sizeof hb) == 0, "a refused coda_scale wrote t");
    dev_free(d);
    dev_free(ds);
    dev_free(d2);
}

/* A +inf logit with the z-loss off gives a +inf loss, as coda_finish_lse's
 * rule (coda.h section 7), not NaN: the absent z-loss term was 0 * lse^2 =
 * 0 * inf (a review). Row 0's logit 2 is 1e60 (+inf in f32); its target is
 * another class, so the loss is lse - z_t = +inf. Both backends. */
static void test_inf_logit(coda_context_t *ctx) {
    problem_t p = make_problem(71, 2, 8, 16, 0.3f, 0);
    p.x[0] = h_f2bf(1e30f), p.w[2 * p.d] = h_f2bf(1e30f);
    p.t[0] = 5, p.t[1] = 3;
    coda_lm_loss_opts_t o;
    coda_lm_loss_opts_init(&o);
    result_t r = new_result(&p, CODA_F32, CODA_F32);
    CHECK_OK(run(ctx, &p, &o, &r, 0));
    CHECK(isinf(r.loss[0]) && r.loss[0] > 0, "+inf logit, z-loss off: loss %g, expected +inf", r.loss[0]);
    CHECK(isfinite(r.loss[1]), "the other row's loss %g", r.loss[1]);
    free_res(&r);
    free_problem(&p);
}

#ifndef LM_TEST_CUDA
int main(void) {
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    test_inf_logit(ctx);
    test_options(ctx);
    test_chunks_and_modes(ctx);
    test_nan_and_targets(ctx);
    test_i64_targets(ctx);
    test_scale(ctx);
    test_bad_input(ctx);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
#endif
