/* test_finish.c - the finishing steps on the CPU: coda_finish_reduce,
 * coda_finish_rstd, coda_finish_lse against float64 and against the exact
 * f32 order the contract fixes (t = 0..T-1), padded strides, NaN and
 * infinity handling (coda.h section 7; every case of the NaN rule is in
 * test_epilogue_nan.c), ignore_index. */
#include "harness.h"

static coda_context_t *g_ctx;

/* (R, T) f32 partials with a padded row stride (pad floats). */
typedef struct part { float *buf; coda_tensor_t t; } part_t;
static part_t part_new(int64_t r, int64_t t, int64_t pad, h_rng *rng, float scale) {
    part_t p;
    p.buf = h_alloc((size_t)(r * (t + pad) + 1) * 4);
    for (int64_t i = 0; i < r * (t + pad); i++) p.buf[i] = rng_uniform(rng) * scale;
    p.t = coda_tensor_2d(p.buf, CODA_F32, r, t);
    p.t.stride[0] = (t + pad) * 4;
    return p;
}
static float pat(const part_t *p, int64_t i, int64_t t) { return p->buf[i * (p->t.stride[0] / 4) + t]; }

static void test_reduce(int64_t R, int64_t T, int64_t pad, uint64_t seed) {
    h_rng rng = rng_new(seed);
    part_t p = part_new(R, T, pad, &rng, 3.0f);
    /* the output is followed by guard floats that must stay untouched
     * (1-D tensors are contiguous: innermost stride == element size) */
    float *out = h_alloc((size_t)(2 * R + 1) * 4);
    for (int op = 0; op < 3; op++) {
        for (int64_t i = 0; i < 2 * R; i++) out[i] = i >= R ? 12345.0f : NAN;
        coda_tensor_t o = coda_tensor_1d(out, CODA_F32, R);
        CHECK_OK(coda_finish_reduce(g_ctx, (coda_reduce_t)op, &p.t, &o, NULL));
        int64_t bad_exact = 0, bad_ref = 0, bad_gap = 0;
        for (int64_t i = 0; i < R; i++) {
            float f = op == CODA_REDUCE_MAX ? -INFINITY : 0.0f;
            double d = op == CODA_REDUCE_MAX ? -INFINITY : 0.0, da = 0;
            for (int64_t t = 0; t < T; t++) {
                float x = pat(&p, i, t);
                if (op == CODA_REDUCE_MAX) { f = fmaxf(f, x); d = x > d ? x : d; }
                else { f += x; d += x; da += fabs(x); }
            }
            bad_exact += memcmp(&f, &out[i], 4) != 0;
            bad_ref += !(fabs(out[i] - d) <= 1.2e-7 * T * da + 1e-30);
            bad_gap += out[R + i] != 12345.0f;
        }
        CHECK(bad_exact == 0, "reduce op %d R=%lld T=%lld: %lld rows differ from the fixed f32 order", op,
              (long long)R, (long long)T, (long long)bad_exact);
        CHECK(bad_ref == 0, "reduce op %d R=%lld T=%lld: %lld rows off float64", op, (long long)R, (long long)T,
              (long long)bad_ref);
        CHECK(bad_gap == 0, "reduce op %d: wrote past the output", op);
    }
    /* a NaN partial gives a NaN result for every op (max does not swallow it) */
    if (T > 1) {
        p.buf[(R / 2) * (T + pad) + T - 1] = NAN;
        for (int op = 0; op < 3; op++) {
            coda_tensor_t o = coda_tensor_1d(out, CODA_F32, R);
            CHECK_OK(coda_finish_reduce(g_ctx, (coda_reduce_t)op, &p.t, &o, NULL));
            CHECK(isnan(out[R / 2]), "reduce op %d: NaN partial did not give NaN", op);
            if (R > 1) CHECK(!isnan(out[(R / 2 + 1) % R]), "reduce op %d: NaN leaked into another row", op);
        }
    }
    free(p.buf); free(out);
}

static void test_rstd(int64_t M, int64_t T, int64_t d, float eps, uint64_t seed) {
    h_rng rng = rng_new(seed);
    part_t p = part_new(M, T, 3, &rng, 1.0f);
    for (int64_t i = 0; i < M * (T + 3); i++) p.buf[i] = fabsf(p.buf[i]) * (float)d / (float)T; /* sums of squares >= 0 */
    float *r = h_alloc((size_t)M * 4);
    poison_f32(r, M);
    coda_tensor_t rt = coda_tensor_1d(r, CODA_F32, M);
    CHECK_OK(coda_finish_rstd(g_ctx, &p.t, d, eps, &rt, NULL));
    int64_t bad = 0;
    for (int64_t i = 0; i < M; i++) {
        double s = 0;
        for (int64_t t = 0; t < T; t++) s += pat(&p, i, t);
        double ref = 1.0 / sqrt(s / (double)d + eps);
        bad += !(fabs(r[i] - ref) <= 1e-6 * ref);
    }
    CHECK(bad == 0, "rstd M=%lld T=%lld d=%lld: %lld rows off", (long long)M, (long long)T, (long long)d, (long long)bad);
    free(p.buf); free(r);
}

/* lse partials made from a float64 logit matrix exactly as a fused kernel
 * would (per tile: max, sum exp(v - max), v at the target), then finished. */
static void test_lse(int64_t M, int64_t N, int64_t tn, uint64_t seed) {
    h_rng rng = rng_new(seed);
    int64_t T = (N + tn - 1) / tn;
    double *z = h_alloc((size_t)(M * N) * 8);
    for (int64_t i = 0; i < M * N; i++) z[i] = rng_uniform(&rng) * 8.0;
    int32_t *tg = h_alloc((size_t)M * 4);
    for (int64_t i = 0; i < M; i++) tg[i] = (int32_t)((rng_uniform(&rng) + 1.0f) * 0.5f * (float)(N - 1));
    for (int64_t i = 0; i < M; i += 4) tg[i] = -100;
    float *part = h_alloc((size_t)(M * T * 3) * 4);
    for (int64_t i = 0; i < M; i++)
        for (int64_t t = 0; t < T; t++) {
            float m = -INFINITY, l = 0, pk = 0;
            for (int64_t j = t * tn; j < (t + 1) * tn && j < N; j++) m = fmaxf(m, (float)z[i * N + j]);
            for (int64_t j = t * tn; j < (t + 1) * tn && j < N; j++) {
                l += expf((float)z[i * N + j] - m);
                if (j == tg[i]) pk = (float)z[i * N + j];
            }
            float *e = part + (i * T + t) * 3;
            e[0] = m; e[1] = l; e[2] = pk;
        }
    /* row 1 (if any): one tile entirely -inf (m = -inf, l = 0): must not give NaN */
    if (M > 1 && T > 1) { float *e = part + (1 * T + 0) * 3; e[0] = -INFINITY; e[1] = 0; e[2] = 0; }
    float *lse = h_alloc((size_t)M * 4), *loss = h_alloc((size_t)M * 4);
    poison_f32(lse, M);
    poison_f32(loss, M);
    coda_tensor_t pt = coda_tensor_3d(part, CODA_F32, M, T, 3), tt = coda_tensor_1d(tg, CODA_I32, M),
                  lt = coda_tensor_1d(lse, CODA_F32, M), st = coda_tensor_1d(loss, CODA_F32, M);
    if (M > 1) {
        /* rows on top of each other behind a size-1 dimension: (M, 1, 3)
         * with byte strides (4, 4, 4) is refused, not read (a review found
         * it accepted: the check compared each stride with the next
         * dimension's alone, and a size-1 one checks nothing) */
        coda_tensor_t ov = coda_tensor_3d(part, CODA_F32, M, 1, 3);
        ov.stride[0] = ov.stride[1] = 4;
        CHECK_STATUS(coda_finish_lse(g_ctx, &ov, &tt, -100, &lt, &st, NULL), CODA_ERR_STRIDE);
        int untouched = 1;
        for (int64_t i = 0; i < M; i++) untouched &= isnan(lse[i]) && isnan(loss[i]);
        CHECK(untouched, "a refused coda_finish_lse wrote lse or loss");
    }
    CHECK_OK(coda_finish_lse(g_ctx, &pt, &tt, -100, &lt, &st, NULL));
    int64_t bad_lse = 0, bad_loss = 0;
    for (int64_t i = 0; i < M; i++) {
        double m = -INFINITY, s = 0;
        int64_t j0 = (i == 1 && T > 1) ? tn : 0; /* the -inf tile drops out */
        for (int64_t j = j0; j < N; j++) if ((float)z[i * N + j] > m) m = (float)z[i * N + j];
        for (int64_t j = j0; j < N; j++) s += exp((double)(float)z[i * N + j] - m);
        double ref = m + log(s);
        double pick = tg[i] >= j0 ? (double)(float)z[i * N + tg[i]] : 0.0;
        double rl = tg[i] == -100 ? 0.0 : ref - pick;
        bad_lse += !(fabs(lse[i] - ref) <= 1e-5 * (1 + fabs(ref)));
        bad_loss += tg[i] == -100 ? loss[i] != 0.0f : !(fabs(loss[i] - rl) <= 1e-5 * (1 + fabs(ref)));
    }
    CHECK(bad_lse == 0, "lse M=%lld N=%lld tn=%lld: %lld rows off", (long long)M, (long long)N, (long long)tn, (long long)bad_lse);
    CHECK(bad_loss == 0, "loss M=%lld N=%lld tn=%lld: %lld rows off", (long long)M, (long long)N, (long long)tn, (long long)bad_loss);

    /* a row whose tiles are all -inf: lse = -inf, no NaN; a NaN partial: NaN */
    for (int64_t t = 0; t < T; t++) { float *e = part + t * 3; e[0] = -INFINITY; e[1] = 0; e[2] = 0; }
    if (M > 2) part[(2 * T + T - 1) * 3] = NAN;
    CHECK_OK(coda_finish_lse(g_ctx, &pt, &tt, 12345, &lt, &st, NULL));
    CHECK(lse[0] == -INFINITY, "all -inf row: lse %g, want -inf", lse[0]);
    if (M > 2) CHECK(isnan(lse[2]) && isnan(loss[2]), "NaN partial: lse %g loss %g, want NaN", lse[2], loss[2]);
    /* a +inf tile (m = l = +inf, as the epilogue makes it): lse = +inf, not
     * NaN (m_t == m is taken as 1, never exp(inf - inf)); loss +inf with a
     * finite pick, NaN with a +inf one */
    if (M > 3) {
        float *e = part + (3 * T + T / 2) * 3;
        e[0] = INFINITY; e[1] = INFINITY;
        CHECK_OK(coda_finish_lse(g_ctx, &pt, &tt, 12345, &lt, &st, NULL));
        CHECK(lse[3] == INFINITY && loss[3] == INFINITY, "+inf tile: lse %g loss %g, want +inf +inf",
              lse[3], loss[3]);
        e[2] = INFINITY;
        CHECK_OK(coda_finish_lse(g_ctx, &pt, &tt, 12345, &lt, &st, NULL));
        CHECK(lse[3] == INFINITY && isnan(loss[3]), "+inf target: lse %g loss %g, want +inf NaN", lse[3], loss[3]);
    }
    free(z); free(tg); free(part); free(lse); free(loss);
}

int main(void) {
    coda_context_options_t o = {2, NULL};
    REQUIRE_OK(coda_context_create(&o, &g_ctx));
    const int64_t rs[4] = {1, 7, 127, 1000}, ts[4] = {1, 3, 17, 200};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) test_reduce(rs[a], ts[b], (a + b) % 3, 10 + 4 * a + b);
    test_rstd(1, 1, 64, 1e-5f, 1);
    test_rstd(127, 9, 1000, 1e-6f, 2);
    test_rstd(1000, 16, 4096, 0.0f, 3);
    test_lse(1, 72, 16, 4);
    test_lse(7, 1000, 128, 5);
    test_lse(127, 264, 64, 6);
    test_lse(1000, 136, 128, 7);
    coda_context_free(g_ctx);
    TEST_MAIN_END();
}
