/* test_steps_gpu.c - the layer's non-GEMM steps on the GPU (src/cuda/layer_steps.c,
 * kernels/layer_steps.cuh) against their CPU versions (src/layer/llama_cpu.c)
 * and float64:
 *
 *   norm prologue   xg bit for bit equal to the CPU's; ss within 1e-5
 *                   (relative) of the float64 sum of squares
 *   RoPE backward   dz equal to the CPU's, but for elements one bf16 ulp
 *                   apart where the f32 value sits at a rounding boundary
 *                   (within 2^-20 (|de| + |dd|) of the midpoint: where the
 *                   GPU's cosf/sinf, within 2 ulp, differ from the host's);
 *                   s within 1e-5 of the float64 sum, relative to sum |y dy|
 *                   (s may cancel to near 0: the bound is that of the terms)
 *   convert         bf16 bit for bit as the CPU rounds (NaN as NaN), f32 the
 *                   same bits; specials (NaN, inf, -0, subnormals, ties)
 *   targets check   the first bad index, or -1, for valid, ignored and bad
 *                   targets of every kind
 *
 * Random data (never all zeros), rows M = 1, 3, 127, 1000 and lengths 1..4098
 * (warp-per-row and block-per-row forms, with and without a tail chunk);
 * every tensor in a guarded block (tests/guard.h: sentinel bytes before,
 * after and in the row padding, checked unchanged; inputs unchanged), in 8
 * layouts: 16-byte aligned views (vector loads) and element-aligned ones
 * (element loads), tight, padded, column slices, offset bases. The row sums
 * must be the same bits in every layout and run to run (one fixed order).
 * NaN in, NaN out; bad input refused with nothing written (host memory in a
 * CUDA descriptor, shapes, overlap, CPU descriptors); a non-blocking stream.
 * Then (not with `small`) the time of each step at LLaMA-3-8B sizes.
 *
 *   test_steps_gpu          everything
 *   test_steps_gpu small    no M = 1000 shapes, no timing (compute-sanitizer)
 *
 * Needs an sm_90a GPU. The output ends with "N checks, 0 failures". */
#include "guard.h"

#ifdef CODA_WITH_CUDA
#include "gpu/guard_dev.h"
#include "cuda/layer_steps.h"
#include "layer/llama.h"

#include <limits.h>

static coda_context_t *ctx;
static int small;


/* ---- guarded views holding given data ---- */

#define NLAYOUTS 8
/* Layout L: views 16-byte aligned (L < 4: vector loads) or only
 * element-aligned (L >= 4); buffer k of a call placed (L + k) % 4 (tight,
 * padded, column slice, offset base), so each call mixes placements. */
static g_place_t place_of(int L, int k) { return (g_place_t)((L + k) % G_NPLACES); }
static int64_t align_of(int L, coda_dtype_t dt) { return L < 4 ? 16 : (int64_t)coda_dtype_size(dt); }

/* The view's elements := src (contiguous rows), in the block and its image. */
static void put_view(g_buf_t *b, const void *src) {
    for (int64_t i = 0; i < b->rows; i++)
        memcpy(b->init + b->off + i * b->ld, (const char *)src + i * b->row_bytes, (size_t)b->row_bytes);
    b->mem->put(b->block, b->init, b->bytes);
}
static void mk_in(g_buf_t *b, const char *name, coda_dtype_t dt, int ndim, int64_t r, int64_t c, int L, int k,
                  const void *data, h_rng *rng) {
    int64_t shape[2] = {r, c};
    g_make(b, &dev_mem, name, dt, ndim, shape, place_of(L, k), align_of(L, dt), G_IN, G_RANDOM, 1.0f, 0, rng);
    put_view(b, data);
}
static void mk_out(g_buf_t *b, const char *name, coda_dtype_t dt, int ndim, int64_t r, int64_t c, int L, int k,
                   h_rng *rng) {
    int64_t shape[2] = {r, c};
    g_make(b, &dev_mem, name, dt, ndim, shape, place_of(L, k), align_of(L, dt), G_OUT, G_RANDOM, 1.0f, 0, rng);
}
static void free_all(g_buf_t *b, int n) {
    for (int i = 0; i < n; i++) g_free(&b[i]);
}
static void check_all(g_buf_t *b, int n, const char *what) {
    for (int i = 0; i < n; i++) g_check(&b[i], what);
}
static void same_all(g_buf_t *b, int n, const char *what) {
    for (int i = 0; i < n; i++) g_same(&b[i], what);
}

static uint64_t seed_of(int kind, int64_t a, int64_t b, int mode) {
    return (uint64_t)kind * 1000003u + (uint64_t)a * 7919u + (uint64_t)b * 104729u + (uint64_t)mode * 31u + 1;
}
/* uniform in [-scale, scale), never exactly 0 */
static float nz(h_rng *r, float scale) {
    float v = rng_uniform(r) * scale;
    return v != 0.0f ? v : scale * 0.5f;
}

static int bf_nan(uint16_t b) { return (b & 0x7fff) > 0x7f80; }

/* bf16 arrays bit for bit, NaN as NaN (payloads may differ) */
static void cmp_bf16_exact(const char *what, const uint16_t *got, const uint16_t *want, int64_t n, int64_t cols) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == want[i] || (bf_nan(got[i]) && bf_nan(want[i]))) continue;
        if (!bad) first = i;
        bad++;
    }
    CHECK(bad == 0, "%s: %lld of %lld elements differ from the CPU; first (%lld, %lld): 0x%04x, CPU 0x%04x", what,
          (long long)bad, (long long)n, (long long)(first / cols), (long long)(first % cols),
          first >= 0 ? got[first] : 0, first >= 0 ? want[first] : 0);
}

/* ---- norm prologue ---- */

/* mode 0: random; 1: a NaN in x (and a +inf in another row); 2: a NaN in g */
static void norm_case(int64_t M, int64_t d, int mode, unsigned layouts) {
    h_rng r = rng_new(seed_of(1, M, d, mode));
    uint16_t *x = h_alloc((size_t)(M * d) * 2), *g = h_alloc((size_t)d * 2);
    for (int64_t i = 0; i < M * d; i++) x[i] = h_f2bf(nz(&r, 2.0f));
    for (int64_t j = 0; j < d; j++) g[j] = h_f2bf(nz(&r, 1.5f));
    int64_t nr = M / 2, nc = d / 3, ir = (nr + 1) % M;
    if (mode == 1) {
        x[nr * d + nc] = 0x7fc0;
        if (M > 1) x[ir * d + (d - 1)] = 0x7f80; /* +inf */
    }
    if (mode == 2) g[d / 2] = 0xffc0;
    /* the CPU's results, and float64 sums of squares */
    uint16_t *xg_ref = h_alloc((size_t)(M * d) * 2);
    float *ss_ref = h_alloc((size_t)M * 4);
    double *dss = h_alloc((size_t)M * 8);
    coda_tensor_t hx = coda_tensor_2d(x, CODA_BF16, M, d), hg = coda_tensor_1d(g, CODA_BF16, d);
    coda_tensor_t hxg = coda_tensor_2d(xg_ref, CODA_BF16, M, d), hss = coda_tensor_2d(ss_ref, CODA_F32, M, 1);
    coda__llama_norm_prologue(&hx, &hg, &hxg, &hss);
    for (int64_t i = 0; i < M; i++) {
        double s = 0;
        for (int64_t j = 0; j < d; j++) s += (double)h_bf2f(x[i * d + j]) * h_bf2f(x[i * d + j]);
        dss[i] = s;
    }
    char what[160];
    float *ss_first = NULL;
    double max_rel = 0;
    for (int L = 0; L < NLAYOUTS; L++) {
        if (!(layouts >> L & 1)) continue;
        snprintf(what, sizeof what, "norm prologue M %lld d %lld mode %d layout %d", (long long)M, (long long)d,
                 mode, L);
        g_buf_t b[4];
        mk_in(&b[0], "x", CODA_BF16, 2, M, d, L, 0, x, &r);
        mk_in(&b[1], "g", CODA_BF16, 1, d, 0, L, 1, g, &r);
        mk_out(&b[2], "xg", CODA_BF16, 2, M, d, L, 2, &r);
        mk_out(&b[3], "ss", CODA_F32, L % 2 ? 2 : 1, M, 1, L, 3, &r); /* (M) or (M, 1) */
        coda_status_t s = coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &b[2].t, &b[3].t, NULL);
        CHECK(s == CODA_OK, "%s: %s: %s", what, coda_status_name(s), coda_last_error());
        if (s != CODA_OK) {
            free_all(b, 4);
            continue;
        }
        check_all(b, 4, what);
        uint16_t *xg = g_view(&b[2], 1);
        float *ss = g_view(&b[3], 1);
        cmp_bf16_exact(what, xg, xg_ref, M * d, d);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < M; i++) {
            int ok;
            if (isnan(dss[i])) ok = isnan(ss[i]);
            else if (isinf(dss[i])) ok = ss[i] == (float)dss[i];
            else {
                double rel = fabs((double)ss[i] - dss[i]) / dss[i];
                if (rel > max_rel) max_rel = rel;
                ok = rel <= 1e-5;
            }
            if (!ok && !bad++) first = i;
        }
        CHECK(bad == 0, "%s: ss: %lld rows off; row %lld: %.9g, float64 %.9g, CPU %.9g", what, (long long)bad,
              (long long)first, first >= 0 ? ss[first] : 0.0, first >= 0 ? dss[first] : 0.0,
              first >= 0 ? ss_ref[first] : 0.0);
        if (mode == 1) {
            CHECK(isnan(ss[nr]) && bf_nan(xg[nr * d + nc]), "%s: NaN x[%lld][%lld] gave ss %g, xg 0x%04x", what,
                  (long long)nr, (long long)nc, ss[nr], xg[nr * d + nc]);
            if (M > 1 && ir != nr) CHECK(isinf(ss[ir]) && ss[ir] > 0, "%s: +inf x gave ss %g", what, ss[ir]);
        }
        if (mode == 2) {
            int64_t nan_col = 0, nan_ss = 0;
            for (int64_t i = 0; i < M; i++) nan_col += bf_nan(xg[i * d + d / 2]), nan_ss += isnan(ss[i]);
            CHECK(nan_col == M && nan_ss == 0, "%s: NaN g: %lld of %lld xg column NaN, %lld ss NaN", what,
                  (long long)nan_col, (long long)M, (long long)nan_ss);
        }
        /* one order: the same bits in every layout, and run to run */
        if (!ss_first) {
            ss_first = h_alloc((size_t)M * 4);
            memcpy(ss_first, ss, (size_t)M * 4);
            CHECK_OK(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &b[2].t, &b[3].t, NULL));
            float *again = g_view(&b[3], 1);
            CHECK(memcmp(again, ss, (size_t)M * 4) == 0, "%s: ss differs run to run", what);
            free(again);
        } else {
            CHECK(memcmp(ss_first, ss, (size_t)M * 4) == 0, "%s: ss differs from layout 0's bits", what);
        }
        free(xg);
        free(ss);
        free_all(b, 4);
    }
    if (mode == 0)
        printf("norm prologue M %5lld d %5lld: xg = CPU, ss max rel err %.2e (%d layouts, same bits)\n",
               (long long)M, (long long)d, max_rel, __builtin_popcount(layouts));
    free(ss_first);
    free(x), free(g), free(xg_ref), free(ss_ref), free(dss);
}

/* ---- RoPE backward ---- */

static float *rope_freq(int64_t pairs) {
    float *f = h_alloc((size_t)(pairs > 0 ? pairs : 1) * 4);
    for (int64_t p = 0; p < pairs; p++)
        f[p] = p % 4 == 3 ? 0.0f : (float)pow(10000.0, -2.0 * (double)(p % 64) / 128.0); /* 0: v columns */
    return f;
}
static float *rope_pos(int64_t M) {
    float *p = h_alloc((size_t)M * 4);
    for (int64_t i = 0; i < M; i++) p[i] = (float)((i * 7919) % 8192);
    if (M > 2) p[M - 1] = 1048579.0f; /* an angle for cosf's slow path */
    return p;
}

/* One element of dz that differs from the CPU's within what f32 cosf/sinf
 * allow: the GPU's and glibc's are each within a few f32 ulps of the exact
 * value, so c and s may differ by ~2^-22 absolutely, and de c + dd s by
 * 2^-20 (|de| + |dd|); where that sum cancels to a small dz (measured on the
 * H200: 4 bf16 ulps at 5e-7 from inputs of size 1) this is many bf16 ulps.
 * Accepted: |got - v| <= 2^-20 (|de| + |dd|) + 2^-8 |v|, v the CPU's f32
 * value before rounding (the second term: bf16 rounding). */
static int at_boundary(const float *dy, const float *pos, const float *freq, int64_t N, int64_t i, int64_t j,
                       uint16_t got, uint16_t want) {
    (void)want;
    int64_t p = j / 2;
    float th = pos[i] * freq[p], c = cosf(th), sn = sinf(th);
    double de = dy[i * N + 2 * p], dd = dy[i * N + 2 * p + 1];
    double v = j % 2 == 0 ? de * c + dd * sn : dd * c - de * sn;
    return fabs((double)h_bf2f(got) - v) <= ldexp(fabs(de) + fabs(dd), -20) + ldexp(fabs(v), -8);
}

static int64_t rope_ulps, rope_elems;

/* mode 0: random; 1: a NaN in dy; 2: a NaN in y; 3: a NaN position; 4: dy in
 * bf16 (as an attention library gives it; the values rounded to bf16, so
 * the f32 reference sees the same numbers) */
static void rope_case(int64_t M, int64_t N, int mode, unsigned layouts) {
    h_rng r = rng_new(seed_of(2, M, N, mode));
    float *dy = h_alloc((size_t)(M * N) * 4);
    uint16_t *y = h_alloc((size_t)(M * N) * 2);
    for (int64_t i = 0; i < M * N; i++) dy[i] = nz(&r, 1.0f), y[i] = h_f2bf(nz(&r, 2.0f));
    float *pos = rope_pos(M), *freq = rope_freq(N / 2);
    int64_t nr = M / 2, np = N / 4; /* pair np of row nr */
    if (mode == 1) dy[nr * N + 2 * np + 1] = NAN;
    if (mode == 2) y[nr * N + 1] = 0x7fc0;
    if (mode == 3) pos[nr] = NAN;
    uint16_t *dy16 = h_alloc((size_t)(M * N) * 2);
    for (int64_t i = 0; mode == 4 && i < M * N; i++) dy16[i] = h_f2bf(dy[i]), dy[i] = h_bf2f(dy16[i]);
    uint16_t *dz_ref = h_alloc((size_t)(M * N) * 2);
    float *s_ref = h_alloc((size_t)M * 4);
    double *ds = h_alloc((size_t)M * 8), *dabs = h_alloc((size_t)M * 8);
    coda_tensor_t hdy = coda_tensor_2d(dy, CODA_F32, M, N), hy = coda_tensor_2d(y, CODA_BF16, M, N);
    coda_tensor_t hdz = coda_tensor_2d(dz_ref, CODA_BF16, M, N);
    coda_tensor_t hpos = coda_tensor_1d(pos, CODA_F32, M), hfreq = coda_tensor_1d(freq, CODA_F32, N / 2);
    coda_tensor_t hs = coda_tensor_1d(s_ref, CODA_F32, M);
    coda__llama_rope_backward(&hdy, 1, &hy, &hpos, &hfreq, &hdz, &hs);
    for (int64_t i = 0; i < M; i++) {
        double s = 0, a = 0;
        for (int64_t j = 0; j < N; j++) {
            double t = (double)h_bf2f(y[i * N + j]) * dy[i * N + j];
            s += t;
            a += fabs(t);
        }
        ds[i] = s, dabs[i] = a;
    }
    char what[160];
    float *s_first = NULL;
    uint16_t *dz_first = NULL;
    double max_err = 0;
    int64_t ulps = 0;
    for (int L = 0; L < NLAYOUTS; L++) {
        if (!(layouts >> L & 1)) continue;
        snprintf(what, sizeof what, "RoPE backward M %lld N %lld mode %d layout %d", (long long)M, (long long)N,
                 mode, L);
        g_buf_t b[6];
        if (mode == 4) mk_in(&b[0], "dy", CODA_BF16, 2, M, N, L, 0, dy16, &r);
        else mk_in(&b[0], "dy", CODA_F32, 2, M, N, L, 0, dy, &r);
        mk_in(&b[1], "y", CODA_BF16, 2, M, N, L, 1, y, &r);
        mk_in(&b[2], "pos", CODA_F32, 1, M, 0, L, 2, pos, &r);
        mk_in(&b[3], "freq", CODA_F32, 1, N / 2, 0, L, 3, freq, &r);
        mk_out(&b[4], "dz", CODA_BF16, 2, M, N, L, 4, &r);
        mk_out(&b[5], "s", CODA_F32, L % 2 ? 1 : 2, M, 1, L, 5, &r);
        coda_status_t s = coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &b[2].t, &b[3].t, &b[4].t, &b[5].t, NULL);
        CHECK(s == CODA_OK, "%s: %s: %s", what, coda_status_name(s), coda_last_error());
        if (s != CODA_OK) {
            free_all(b, 6);
            continue;
        }
        check_all(b, 6, what);
        uint16_t *dz = g_view(&b[4], 1);
        float *sv = g_view(&b[5], 1);
        int64_t bad = 0, first = -1, here = 0;
        for (int64_t e = 0; e < M * N; e++) {
            if (dz[e] == dz_ref[e] || (bf_nan(dz[e]) && bf_nan(dz_ref[e]))) continue;
            if (at_boundary(dy, pos, freq, N, e / N, e % N, dz[e], dz_ref[e])) {
                here++;
                continue;
            }
            if (!bad++) first = e;
        }
        CHECK(bad == 0, "%s: dz: %lld elements differ from the CPU by more than f32 cos/sin error allows; "
              "first (%lld, %lld): 0x%04x, CPU 0x%04x", what, (long long)bad, (long long)(first / N),
              (long long)(first % N), first >= 0 ? dz[first] : 0, first >= 0 ? dz_ref[first] : 0);
        if (L == 0) ulps = here;
        int64_t sbad = 0, sfirst = -1;
        for (int64_t i = 0; i < M; i++) {
            int ok;
            if (isnan(ds[i])) ok = isnan(sv[i]);
            else {
                double err = fabs((double)sv[i] - ds[i]) / (dabs[i] > 0 ? dabs[i] : 1.0);
                if (err > max_err) max_err = err;
                ok = err <= 1e-5;
            }
            if (!ok && !sbad++) sfirst = i;
        }
        CHECK(sbad == 0, "%s: s: %lld rows off; row %lld: %.9g, float64 %.9g (sum |terms| %.3g), CPU %.9g", what,
              (long long)sbad, (long long)sfirst, sfirst >= 0 ? sv[sfirst] : 0.0, sfirst >= 0 ? ds[sfirst] : 0.0,
              sfirst >= 0 ? dabs[sfirst] : 0.0, sfirst >= 0 ? s_ref[sfirst] : 0.0);
        if (mode == 1)
            CHECK(isnan(sv[nr]) && bf_nan(dz[nr * N + 2 * np]) && bf_nan(dz[nr * N + 2 * np + 1]),
                  "%s: NaN dy gave s %g, dz 0x%04x 0x%04x", what, sv[nr], dz[nr * N + 2 * np], dz[nr * N + 2 * np + 1]);
        if (mode == 2) {
            int64_t nan_dz = 0;
            for (int64_t j = 0; j < N; j++) nan_dz += bf_nan(dz[nr * N + j]);
            CHECK(isnan(sv[nr]) && nan_dz == 0, "%s: NaN y gave s %g and %lld NaN dz", what, sv[nr], (long long)nan_dz);
        }
        if (mode == 3) {
            int64_t nan_dz = 0;
            for (int64_t j = 0; j < N; j++) nan_dz += bf_nan(dz[nr * N + j]);
            CHECK(nan_dz == N && !isnan(sv[nr]), "%s: NaN pos gave %lld of %lld NaN dz, s %g", what, (long long)nan_dz,
                  (long long)N, sv[nr]);
        }
        if (!s_first) {
            s_first = h_alloc((size_t)M * 4);
            dz_first = h_alloc((size_t)(M * N) * 2);
            memcpy(s_first, sv, (size_t)M * 4);
            memcpy(dz_first, dz, (size_t)(M * N) * 2);
            CHECK_OK(coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &b[2].t, &b[3].t, &b[4].t, &b[5].t, NULL));
            float *again = g_view(&b[5], 1);
            CHECK(memcmp(again, sv, (size_t)M * 4) == 0, "%s: s differs run to run", what);
            free(again);
        } else {
            CHECK(memcmp(s_first, sv, (size_t)M * 4) == 0, "%s: s differs from layout 0's bits", what);
            CHECK(memcmp(dz_first, dz, (size_t)(M * N) * 2) == 0, "%s: dz differs from layout 0's", what);
        }
        free(dz);
        free(sv);
        free_all(b, 6);
    }
    /* dy cut into three parts (dq, dk, dv as an attention returns them),
     * each its own buffer: the same bits as the whole matrix, for widths
     * that split 8-column chunks and for every layout */
    int64_t h = N / 2, w[3] = {2 * (h / 3), 2 * ((h - h / 3) / 2), 0};
    w[2] = N - w[0] - w[1];
    const int cut = s_first && w[0] > 0 && w[1] > 0 && w[2] > 0;
    for (int np = 3, L = 0; cut && L < NLAYOUTS; L++) {
        if (!(layouts >> L & 1)) continue;
        if (L > 0 && np == 3) np = 2, w[1] += w[2], w[2] = 0; /* after the first layout, two parts (dq and dkv) */
        snprintf(what, sizeof what, "RoPE backward in parts %lld+%lld+%lld, M %lld mode %d layout %d",
                 (long long)w[0], (long long)w[1], (long long)w[2], (long long)M, mode, L);
        g_buf_t b[8];
        const coda_dtype_t dt = mode == 4 ? CODA_BF16 : CODA_F32;
        const size_t es = coda_dtype_size(dt);
        for (int q = 0, off = 0; q < np; off += (int)w[q], q++) {
            char *part = h_alloc((size_t)(M * w[q]) * es); /* columns off.. of dy, as the kernel reads them */
            for (int64_t i = 0; i < M; i++)
                memcpy(part + (size_t)(i * w[q]) * es, (mode == 4 ? (char *)dy16 : (char *)dy) + (size_t)(i * N + off) * es,
                       (size_t)w[q] * es);
            mk_in(&b[5 + q], q == 0 ? "dq" : q == 1 ? "dk" : "dv", dt, 2, M, w[q], L, 6 + q, part, &r);
            free(part);
        }
        mk_in(&b[0], "y", CODA_BF16, 2, M, N, L, 1, y, &r);
        mk_in(&b[1], "pos", CODA_F32, 1, M, 0, L, 2, pos, &r);
        mk_in(&b[2], "freq", CODA_F32, 1, N / 2, 0, L, 3, freq, &r);
        mk_out(&b[3], "dz", CODA_BF16, 2, M, N, L, 4, &r);
        mk_out(&b[4], "s", CODA_F32, L % 2 ? 1 : 2, M, 1, L, 5, &r);
        coda_tensor_t parts[3] = {b[5].t, b[6].t, b[7].t};
        CHECK_OK(coda__cuda_rope_backward(ctx, parts, np, &b[0].t, &b[1].t, &b[2].t, &b[3].t, &b[4].t, NULL));
        check_all(b, 5 + np, what);
        uint16_t *dz = g_view(&b[3], 1);
        float *sv = g_view(&b[4], 1);
        CHECK(memcmp(s_first, sv, (size_t)M * 4) == 0, "%s: s differs from the whole matrix's bits", what);
        CHECK(memcmp(dz_first, dz, (size_t)(M * N) * 2) == 0, "%s: dz differs from the whole matrix's", what);
        free(dz);
        free(sv);
        free_all(b, 5 + np);
    }
    if (mode == 0) {
        rope_ulps += ulps;
        rope_elems += M * N;
        printf("RoPE backward M %5lld N %5lld: dz = CPU but %lld elements apart within cos/sin error, "
               "s max err %.2e of sum |y dy| (%d layouts, same bits)\n",
               (long long)M, (long long)N, (long long)ulps, max_err, __builtin_popcount(layouts));
    }
    free(s_first), free(dz_first);
    free(dy), free(dy16), free(y), free(pos), free(freq), free(dz_ref), free(s_ref), free(ds), free(dabs);
}

/* ---- vector convert ---- */

static void convert_case(int64_t n) {
    h_rng r = rng_new(seed_of(3, n, 0, 0));
    float *in = h_alloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) in[i] = nz(&r, 3.0f);
    /* specials where they fit: NaN, +-inf, -0, subnormals, bf16 ties (to even
     * both ways), the largest float (rounds to inf in bf16) */
    static const uint32_t special[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x80000000u, 0x00000001u,
                                       0x807fffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xbf80c000u,
                                       0x7f800001u, 0x0080ffffu};
    for (size_t k = 0; k < sizeof special / sizeof special[0] && (int64_t)k * 3 < n; k++)
        memcpy(&in[k * 3], &special[k], 4);
    for (int od = 0; od < 2; od++) {
        coda_dtype_t dt = od ? CODA_F32 : CODA_BF16;
        size_t es = coda_dtype_size(dt);
        void *ref = h_alloc((size_t)n * es);
        coda_tensor_t hout = coda_tensor_1d(ref, dt, n);
        coda_tensor_t hin = coda_tensor_1d(in, CODA_F32, n);
        coda__llama_copy_vec(&hin, &hout);
        for (int L = 0; L < NLAYOUTS; L++) {
            char what[128];
            snprintf(what, sizeof what, "convert n %lld to %s layout %d", (long long)n, coda_dtype_name(dt), L);
            g_buf_t b[2];
            /* 1-D, or a column view (n, 1) whose padded rows are an element stride */
            mk_in(&b[0], "in", CODA_F32, L % 2 ? 2 : 1, n, 1, L, 1, in, &r);
            mk_out(&b[1], "out", dt, L % 4 >= 2 ? 2 : 1, n, 1, L, 1, &r);
            coda_status_t s = coda__cuda_convert_vec(ctx, &b[0].t, &b[1].t, NULL);
            CHECK(s == CODA_OK, "%s: %s: %s", what, coda_status_name(s), coda_last_error());
            if (s == CODA_OK) {
                check_all(b, 2, what);
                void *got = g_view(&b[1], 1);
                if (dt == CODA_BF16) cmp_bf16_exact(what, got, ref, n, 1);
                else CHECK(memcmp(got, ref, (size_t)n * 4) == 0, "%s: not the same bits", what);
                free(got);
            }
            free_all(b, 2);
        }
        free(ref);
    }
    free(in);
}

/* ---- targets check ---- */

static int32_t first_bad(const int32_t *t, int64_t n, int64_t V, int32_t ignore) {
    for (int64_t i = 0; i < n; i++)
        if (t[i] != ignore && (t[i] < 0 || t[i] >= V)) return (int32_t)i;
    return -1;
}

/* Valid targets (0 and V - 1 among them, every 5th the ignore index), then
 * vals[k] put at index at[k] for k < nbad. */
static void targets_case(int64_t M, int64_t V, int32_t ignore, const int32_t *vals, const int64_t *at, int nbad) {
    h_rng r = rng_new(seed_of(4, M, V, nbad * 7 + (ignore & 15)));
    int32_t *t = h_alloc((size_t)M * 4);
    for (int64_t i = 0; i < M; i++) {
        t[i] = (int32_t)((rng_uniform(&r) + 1.0f) * 0.5f * (float)V);
        if (t[i] >= V) t[i] = (int32_t)(V - 1);
        if (i % 5 == 4) t[i] = ignore;
    }
    t[0] = 0;
    if (M > 1) t[M - 1] = (int32_t)(V - 1);
    for (int k = 0; k < nbad; k++) t[at[k]] = vals[k];
    int32_t want = first_bad(t, M, V, ignore);
    for (int L = 0; L < 4; L++) {
        if (M > 1000000 && L % 2) continue; /* padded (M, 1) rows of 2^25 targets: gigabytes */
        char what[200];
        snprintf(what, sizeof what, "targets M %lld V %lld ignore %d, %d bad (first %d at %lld), layout %d",
                 (long long)M, (long long)V, ignore, nbad, nbad ? vals[0] : 0, nbad ? (long long)at[0] : -1LL, L);
        g_buf_t b[2];
        mk_in(&b[0], "targets", CODA_I32, L % 2 ? 2 : 1, M, 1, L, 0, t, &r);
        mk_out(&b[1], "bad", CODA_I32, 1, 1, 0, L, 1, &r);
        coda_status_t s = coda__cuda_check_targets(ctx, &b[0].t, V, ignore, &b[1].t, NULL);
        CHECK(s == CODA_OK, "%s: %s: %s", what, coda_status_name(s), coda_last_error());
        if (s == CODA_OK) {
            check_all(b, 2, what);
            int32_t *got = g_view(&b[1], 1);
            CHECK(*got == want, "%s: flag %d, expected %d", what, *got, want);
            free(got);
        }
        free_all(b, 2);
    }
    free(t);
}

/* Every kind of bad target alone (V itself, negatives, the extremes, the
 * other ignore index, far past V), then several (the smallest index wins),
 * then none. */
static void targets_cases(int64_t M, int64_t V, int32_t ignore) {
    const int32_t kinds[] = {(int32_t)V, -1, INT_MIN, INT_MAX, ignore == -100 ? -7 : -100,
                             (int32_t)(V + 1000)};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int64_t at = M / 2;
        targets_case(M, V, ignore, &kinds[k], &at, 1);
    }
    const int64_t at3[3] = {M - 1, M / 2, (M * 3) / 4};
    const int32_t v3[3] = {kinds[0], kinds[3], kinds[1]};
    targets_case(M, V, ignore, v3, at3, 3);
    const int64_t at2[2] = {M - 1, 0};
    targets_case(M, V, ignore, v3, at2, 2);
    targets_case(M, V, ignore, NULL, NULL, 0);
}

/* ---- bad input on the GPU: refused, nothing written ---- */

static void bad_input(void) {
    enum { M = 5, D = 130 };
    h_rng r = rng_new(99);
    uint16_t x[M * D], g[D];
    float dy[M * D], pos[M], freq[D / 2], in[D];
    int32_t tg[M];
    for (int i = 0; i < M * D; i++) x[i] = h_f2bf(nz(&r, 1.0f)), dy[i] = nz(&r, 1.0f);
    for (int j = 0; j < D; j++) g[j] = h_f2bf(nz(&r, 1.0f)), in[j] = nz(&r, 1.0f);
    for (int i = 0; i < M; i++) pos[i] = (float)i, tg[i] = i;
    for (int p = 0; p < D / 2; p++) freq[p] = 0.5f;
    /* host memory a descriptor calls CUDA: the driver tells */
    unsigned char *host = h_alloc(M * D * 4), *before = h_alloc(M * D * 4);
    for (int i = 0; i < M * D * 4; i++) host[i] = (unsigned char)(i * 37 + 1);
    memcpy(before, host, M * D * 4);
    coda_tensor_t ht;

    g_buf_t b[6];
    mk_in(&b[0], "x", CODA_BF16, 2, M, D, 0, 0, x, &r);
    mk_in(&b[1], "g", CODA_BF16, 1, D, 0, 0, 1, g, &r);
    mk_out(&b[2], "xg", CODA_BF16, 2, M, D, 0, 2, &r);
    mk_out(&b[3], "ss", CODA_F32, 1, M, 0, 0, 3, &r);
    coda_tensor_t t;
    const char *what = "norm prologue, bad input";
    ht = coda_tensor_2d(host, CODA_BF16, M, D), ht.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &ht, &b[3].t, NULL), CODA_ERR_DEVICE);
    CHECK_STATUS(coda__cuda_norm_prologue(ctx, &ht, &b[1].t, &b[2].t, &b[3].t, NULL), CODA_ERR_DEVICE);
    ht = coda_tensor_1d(host, CODA_F32, M), ht.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &b[2].t, &ht, NULL), CODA_ERR_DEVICE);
    t = b[2].t, t.shape[1] = D - 2;
    CHECK_STATUS(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &t, &b[3].t, NULL), CODA_ERR_SHAPE);
    t = b[2].t, t.device = CODA_DEVICE_CPU;
    CHECK_STATUS(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &t, &b[3].t, NULL), CODA_ERR_DEVICE);
    t = b[0].t, t.data = b[2].t.data; /* x = xg */
    CHECK_STATUS(coda__cuda_norm_prologue(ctx, &t, &b[1].t, &b[2].t, &b[3].t, NULL), CODA_ERR_OVERLAP);
    t = b[3].t, t.device_index = 1;
    CHECK_STATUS(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &b[2].t, &t, NULL), CODA_ERR_DEVICE);
    same_all(b, 4, what);
    CHECK(memcmp(host, before, M * D * 4) == 0, "%s: host memory written", what);
    free_all(b, 4);

    what = "RoPE backward, bad input";
    mk_in(&b[0], "dy", CODA_F32, 2, M, D, 1, 0, dy, &r);
    mk_in(&b[1], "y", CODA_BF16, 2, M, D, 1, 1, x, &r);
    mk_in(&b[2], "pos", CODA_F32, 1, M, 0, 1, 2, pos, &r);
    mk_in(&b[3], "freq", CODA_F32, 1, D / 2, 0, 1, 3, freq, &r);
    mk_out(&b[4], "dz", CODA_BF16, 2, M, D, 1, 4, &r);
    mk_out(&b[5], "s", CODA_F32, 1, M, 0, 1, 5, &r);
    ht = coda_tensor_2d(host, CODA_BF16, M, D), ht.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &b[2].t, &b[3].t, &ht, &b[5].t, NULL),
                 CODA_ERR_DEVICE);
    ht = coda_tensor_1d(host, CODA_F32, M), ht.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &b[2].t, &b[3].t, &b[4].t, &ht, NULL),
                 CODA_ERR_DEVICE);
    CHECK_STATUS(coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &ht, &b[3].t, &b[4].t, &b[5].t, NULL),
                 CODA_ERR_DEVICE);
    t = b[3].t, t.shape[0] = D;
    CHECK_STATUS(coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &b[2].t, &t, &b[4].t, &b[5].t, NULL),
                 CODA_ERR_SHAPE);
    t = b[4].t, t.data = b[1].t.data, t.stride[0] = b[1].t.stride[0]; /* dz = y */
    CHECK_STATUS(coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &b[2].t, &b[3].t, &t, &b[5].t, NULL),
                 CODA_ERR_OVERLAP);
    t = b[5].t, t.device = CODA_DEVICE_CPU;
    CHECK_STATUS(coda__cuda_rope_backward(ctx, &b[0].t, 1, &b[1].t, &b[2].t, &b[3].t, &b[4].t, &t, NULL),
                 CODA_ERR_DEVICE);
    t = b[0].t, t.dtype = CODA_I32; /* dy is f32 or bf16 */
    CHECK_STATUS(coda__cuda_rope_backward(ctx, &t, 1, &b[1].t, &b[2].t, &b[3].t, &b[4].t, &b[5].t, NULL),
                 CODA_ERR_DTYPE);
    same_all(b, 6, what);
    CHECK(memcmp(host, before, M * D * 4) == 0, "%s: host memory written", what);
    free_all(b, 6);

    what = "convert, bad input";
    mk_in(&b[0], "in", CODA_F32, 1, D, 0, 2, 0, in, &r);
    mk_out(&b[1], "out", CODA_BF16, 1, D, 0, 2, 1, &r);
    ht = coda_tensor_1d(host, CODA_BF16, D), ht.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda__cuda_convert_vec(ctx, &b[0].t, &ht, NULL), CODA_ERR_DEVICE);
    t = b[1].t, t.shape[0] = D + 1;
    CHECK_STATUS(coda__cuda_convert_vec(ctx, &b[0].t, &t, NULL), CODA_ERR_SHAPE);
    t = b[1].t, t.dtype = CODA_I32, t.stride[0] = 4;
    CHECK_STATUS(coda__cuda_convert_vec(ctx, &b[0].t, &t, NULL), CODA_ERR_DTYPE);
    t = b[1].t, t.data = b[0].t.data;
    CHECK_STATUS(coda__cuda_convert_vec(ctx, &b[0].t, &t, NULL), CODA_ERR_OVERLAP);
    same_all(b, 2, what);
    CHECK(memcmp(host, before, M * D * 4) == 0, "%s: host memory written", what);
    free_all(b, 2);

    what = "targets check, bad input";
    mk_in(&b[0], "targets", CODA_I32, 1, M, 0, 3, 0, tg, &r);
    mk_out(&b[1], "bad", CODA_I32, 1, 1, 0, 3, 1, &r);
    ht = coda_tensor_1d(host, CODA_I32, 1), ht.device = CODA_DEVICE_CUDA;
    CHECK_STATUS(coda__cuda_check_targets(ctx, &b[0].t, 100, -100, &ht, NULL), CODA_ERR_DEVICE);
    CHECK_STATUS(coda__cuda_check_targets(ctx, &b[0].t, 0, -100, &b[1].t, NULL), CODA_ERR_INVALID_ARG);
    t = b[1].t, t.data = b[0].t.data;
    CHECK_STATUS(coda__cuda_check_targets(ctx, &b[0].t, 100, -100, &t, NULL), CODA_ERR_OVERLAP);
    t = b[1].t, t.shape[0] = 2;
    CHECK_STATUS(coda__cuda_check_targets(ctx, &b[0].t, 100, -100, &t, NULL), CODA_ERR_SHAPE);
    same_all(b, 2, what);
    CHECK(memcmp(host, before, M * D * 4) == 0, "%s: host memory written", what);
    free_all(b, 2);
    free(host), free(before);
}

/* ---- a non-blocking stream: the same bits as the default stream ---- */

static void side_stream(void) {
    enum { M = 127, D = 4098 };
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    h_rng r = rng_new(5);
    size_t nb = (size_t)M * D * 2, nf = (size_t)M * D * 4;
    uint16_t *x = h_alloc(nb), *g = h_alloc(D * 2);
    float *dy = h_alloc(nf), *pos = rope_pos(M), *freq = rope_freq(D / 2);
    for (int64_t i = 0; i < (int64_t)M * D; i++) x[i] = h_f2bf(nz(&r, 1.0f)), dy[i] = nz(&r, 1.0f);
    for (int j = 0; j < D; j++) g[j] = h_f2bf(nz(&r, 1.0f));
    g_buf_t b[10];
    mk_in(&b[0], "x", CODA_BF16, 2, M, D, 0, 0, x, &r);
    mk_in(&b[1], "g", CODA_BF16, 1, D, 0, 0, 1, g, &r);
    mk_in(&b[2], "dy", CODA_F32, 2, M, D, 0, 0, dy, &r);
    mk_in(&b[3], "pos", CODA_F32, 1, M, 0, 0, 0, pos, &r);
    mk_in(&b[4], "freq", CODA_F32, 1, D / 2, 0, 0, 0, freq, &r);
    mk_out(&b[5], "xg", CODA_BF16, 2, M, D, 0, 0, &r);
    mk_out(&b[6], "ss", CODA_F32, 1, M, 0, 0, 0, &r);
    mk_out(&b[7], "dz", CODA_BF16, 2, M, D, 0, 0, &r);
    mk_out(&b[8], "s", CODA_F32, 1, M, 0, 0, 0, &r);
    CHECK_OK(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &b[5].t, &b[6].t, st));
    CHECK_OK(coda__cuda_rope_backward(ctx, &b[2].t, 1, &b[0].t, &b[3].t, &b[4].t, &b[7].t, &b[8].t, st));
    CUDA_OK(cudaStreamSynchronize(st));
    void *got[4] = {g_view(&b[5], 1), g_view(&b[6], 1), g_view(&b[7], 1), g_view(&b[8], 1)};
    CHECK_OK(coda__cuda_norm_prologue(ctx, &b[0].t, &b[1].t, &b[5].t, &b[6].t, NULL));
    CHECK_OK(coda__cuda_rope_backward(ctx, &b[2].t, 1, &b[0].t, &b[3].t, &b[4].t, &b[7].t, &b[8].t, NULL));
    size_t sizes[4] = {nb, M * 4, nb, M * 4};
    for (int k = 0; k < 4; k++) {
        void *now = g_view(&b[5 + k], 1);
        CHECK(memcmp(now, got[k], sizes[k]) == 0, "non-blocking stream: %s differs from the default stream's",
              b[5 + k].name);
        free(now);
        free(got[k]);
    }
    check_all(b, 9, "non-blocking stream");
    free_all(b, 9);
    CUDA_OK(cudaStreamDestroy(st));
    free(x), free(g), free(dy), free(pos), free(freq);
}

/* The periodic form (the layer's: coda__cuda_rope_backward_periodic with
 * period head_dim / 2 over the q and k heads, freq as coda__llama_rope_freq
 * makes it) gives the bits of the general form, dz and s, with dy in f32 and
 * in bf16; positions up to 8191 and one past cosf's fast path; NaN in one
 * row's position. Then its refusals. */
static void rope_periodic_case(int64_t M, int64_t hd, int64_t nh, int64_t nkv, int dy_bf16) {
    const int64_t half = hd / 2, rot = (nh + nkv) * half, N = (nh + 2 * nkv) * hd;
    h_rng r = rng_new(seed_of(7, M, N, dy_bf16));
    float *freq = h_alloc((size_t)(N / 2) * 4), *pos = rope_pos(M), *dy = h_alloc((size_t)(M * N) * 4);
    for (int64_t p = 0; p < N / 2; p++)
        freq[p] = p < rot ? (float)pow(500000.0, -2.0 * (double)(p % half) / (double)hd) : 0.0f;
    if (M > 3) pos[1] = NAN;
    uint16_t *y = h_alloc((size_t)(M * N) * 2), *dy16 = h_alloc((size_t)(M * N) * 2);
    for (int64_t i = 0; i < M * N; i++) dy[i] = nz(&r, 1.0f), dy16[i] = h_f2bf(dy[i]), y[i] = h_f2bf(nz(&r, 2.0f));
    void *d_dy, *d_y, *d_pos, *d_freq, *d_dz[2], *d_s[2];
    const size_t dyb = (size_t)(M * N) * (dy_bf16 ? 2 : 4), zb = (size_t)(M * N) * 2;
    d_dy = dev_alloc(dyb), d_y = dev_alloc(zb), d_pos = dev_alloc((size_t)M * 4), d_freq = dev_alloc((size_t)N * 2);
    CUDA_OK(cudaMemcpy(d_dy, dy_bf16 ? (void *)dy16 : (void *)dy, dyb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_y, y, zb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_pos, pos, (size_t)M * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_freq, freq, (size_t)N * 2, cudaMemcpyHostToDevice));
    coda_tensor_t tdy = coda_tensor_2d(d_dy, dy_bf16 ? CODA_BF16 : CODA_F32, M, N);
    coda_tensor_t ty = coda_tensor_2d(d_y, CODA_BF16, M, N), tpos = coda_tensor_1d(d_pos, CODA_F32, M);
    coda_tensor_t tfreq = coda_tensor_1d(d_freq, CODA_F32, N / 2), tdz[2], ts[2];
    tdy.device = ty.device = tpos.device = tfreq.device = CODA_DEVICE_CUDA;
    uint16_t *hz[2];
    float *hs[2];
    for (int k = 0; k < 2; k++) {
        d_dz[k] = dev_alloc(zb), d_s[k] = dev_alloc((size_t)M * 4);
        CUDA_OK(cudaMemset(d_dz[k], 0x5a + k, zb));
        CUDA_OK(cudaMemset(d_s[k], 0x5a + k, (size_t)M * 4));
        tdz[k] = coda_tensor_2d(d_dz[k], CODA_BF16, M, N), ts[k] = coda_tensor_1d(d_s[k], CODA_F32, M);
        tdz[k].device = ts[k].device = CODA_DEVICE_CUDA;
        CHECK_OK(k == 0 ? coda__cuda_rope_backward(ctx, &tdy, 1, &ty, &tpos, &tfreq, &tdz[0], &ts[0], NULL)
                        : coda__cuda_rope_backward_periodic(ctx, &tdy, 1, &ty, &tpos, &tfreq, (int)half, rot,
                                                            &tdz[1], &ts[1], NULL));
        hz[k] = h_alloc(zb), hs[k] = h_alloc((size_t)M * 4);
        CUDA_OK(cudaMemcpy(hz[k], d_dz[k], zb, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(hs[k], d_s[k], (size_t)M * 4, cudaMemcpyDeviceToHost));
    }
    CHECK(memcmp(hz[0], hz[1], zb) == 0 && memcmp(hs[0], hs[1], (size_t)M * 4) == 0,
          "RoPE backward M %lld hd %lld heads %lld/%lld dy %s: the periodic form's dz or s differs from the "
          "general form's", (long long)M, (long long)hd, (long long)nh, (long long)nkv, dy_bf16 ? "bf16" : "f32");
    if (M > 3) CHECK(bf_nan(hz[1][1 * N]) && bf_nan(hz[1][1 * N + rot * 2 - 1]), "NaN position: row 1 of dz");
    /* refusals: a period the table cannot hold or that cuts a chunk, pairs
     * past N/2, a period of 0 with rot_pairs; nothing written */
    static const struct { int period; int64_t rot; } bad[] = {{6, 8}, {132, 132}, {-4, 8}, {0, 4}, {4, 6}};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        int64_t rp = bad[b].rot;
        CHECK_STATUS(coda__cuda_rope_backward_periodic(ctx, &tdy, 1, &ty, &tpos, &tfreq, bad[b].period, rp, &tdz[1],
                                                       &ts[1], NULL),
                     CODA_ERR_INVALID_ARG);
    }
    CHECK_STATUS(coda__cuda_rope_backward_periodic(ctx, &tdy, 1, &ty, &tpos, &tfreq, 4, N / 2 + 4, &tdz[1], &ts[1],
                                                   NULL),
                 CODA_ERR_INVALID_ARG);
    CUDA_OK(cudaDeviceSynchronize());
    uint16_t *after = h_alloc(zb);
    CUDA_OK(cudaMemcpy(after, d_dz[1], zb, cudaMemcpyDeviceToHost));
    CHECK(memcmp(after, hz[1], zb) == 0, "a refused periodic RoPE backward wrote dz");
    printf("RoPE backward, periodic form: M %lld hd %lld heads %lld/%lld dy %s: the general form's bits\n",
           (long long)M, (long long)hd, (long long)nh, (long long)nkv, dy_bf16 ? "bf16" : "f32");
    for (int k = 0; k < 2; k++) dev_free(d_dz[k]), dev_free(d_s[k]), free(hz[k]), free(hs[k]);
    dev_free(d_dy), dev_free(d_y), dev_free(d_pos), dev_free(d_freq);
    free(freq), free(pos), free(dy), free(y), free(dy16), free(after);
}

/* ---- time at LLaMA-3-8B sizes (M = 16384 tokens, d = 4096, qkv 6144) ---- */

static double time_ms(int which, coda_tensor_t *t) {
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    enum { REPS = 20 };
    float ms = 0;
    for (int rep = -1; rep < REPS; rep++) { /* rep -1: warm-up (compile, load) */
        if (rep == 0) CUDA_OK(cudaEventRecord(e0, NULL));
        coda_status_t s = which == 0 ? coda__cuda_norm_prologue(ctx, &t[0], &t[1], &t[2], &t[3], NULL)
                          : which == 1 ? coda__cuda_rope_backward(ctx, &t[0], 1, &t[1], &t[2], &t[3], &t[4], &t[5], NULL)
                          : which == 4 ? coda__cuda_rope_backward_periodic(ctx, &t[0], 1, &t[1], &t[2], &t[3],
                                                                           (int)t[6].shape[0], t[7].shape[0], &t[4],
                                                                           &t[5], NULL)
                          : which == 2 ? coda__cuda_convert_vec(ctx, &t[0], &t[1], NULL)
                                       : coda__cuda_check_targets(ctx, &t[0], 128256, -100, &t[1], NULL);
        CHECK(s == CODA_OK, "timing %d: %s", which, coda_last_error());
        if (s != CODA_OK) return NAN;
    }
    CUDA_OK(cudaEventRecord(e1, NULL));
    CUDA_OK(cudaEventSynchronize(e1));
    CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    return ms / REPS;
}

static coda_tensor_t dev_tensor(coda_dtype_t dt, int64_t r, int64_t c, void **keep) {
    size_t bytes = (size_t)(r * (c > 0 ? c : 1)) * coda_dtype_size(dt);
    void *p = dev_alloc(bytes);
    /* bf16 and f32: 0x3c3c.. = 0.0115, finite, not 0; i32 (targets): 0, valid */
    CUDA_OK(cudaMemset(p, dt == CODA_I32 ? 0 : 0x3c, bytes));
    *keep = p;
    coda_tensor_t t = c > 0 ? coda_tensor_2d(p, dt, r, c) : coda_tensor_1d(p, dt, r);
    t.device = CODA_DEVICE_CUDA;
    return t;
}

static void timing(void) {
    enum { M = 16384, D = 4096, NQKV = 6144 };
    void *keep[6];
    coda_tensor_t t[6];
    t[0] = dev_tensor(CODA_BF16, M, D, &keep[0]);
    t[1] = dev_tensor(CODA_BF16, D, 0, &keep[1]);
    t[2] = dev_tensor(CODA_BF16, M, D, &keep[2]);
    t[3] = dev_tensor(CODA_F32, M, 0, &keep[3]);
    double ms = time_ms(0, t);
    double gb = ((double)M * D * 4 + M * 4) / 1e9;
    printf("time: norm prologue (%d, %d): %.1f us, %.0f GB/s\n", M, D, 1e3 * ms, gb / (ms * 1e-3));
    for (int k = 0; k < 4; k++) dev_free(keep[k]);

    t[0] = dev_tensor(CODA_F32, M, NQKV, &keep[0]);
    t[1] = dev_tensor(CODA_BF16, M, NQKV, &keep[1]);
    t[2] = dev_tensor(CODA_F32, M, 0, &keep[2]);
    t[3] = dev_tensor(CODA_F32, NQKV / 2, 0, &keep[3]);
    t[4] = dev_tensor(CODA_BF16, M, NQKV, &keep[4]);
    t[5] = dev_tensor(CODA_F32, M, 0, &keep[5]);
    ms = time_ms(1, t);
    gb = ((double)M * NQKV * 8 + M * 8) / 1e9;
    printf("time: RoPE backward (%d, %d): %.1f us, %.0f GB/s\n", M, NQKV, 1e3 * ms, gb / (ms * 1e-3));
    for (int k = 0; k < 6; k++) dev_free(keep[k]);

    /* the block's form at LLaMA-3-1B and 8B: dy in bf16 (SDPA's), general
     * and periodic (period head_dim / 2 over the q and k heads) */
    static const struct { const char *name; int64_t n, hd, rot; } lay[] = {{"1B", 3072, 64, 40 * 32},
                                                                           {"8B", 6144, 128, 40 * 64}};
    for (int l = 0; l < 2; l++) {
        coda_tensor_t u[8];
        u[0] = dev_tensor(CODA_BF16, M, lay[l].n, &keep[0]);
        u[1] = dev_tensor(CODA_BF16, M, lay[l].n, &keep[1]);
        u[2] = dev_tensor(CODA_F32, M, 0, &keep[2]);
        u[3] = dev_tensor(CODA_F32, lay[l].n / 2, 0, &keep[3]);
        u[4] = dev_tensor(CODA_BF16, M, lay[l].n, &keep[4]);
        u[5] = dev_tensor(CODA_F32, M, 0, &keep[5]);
        u[6] = coda_tensor_1d(NULL, CODA_F32, lay[l].hd / 2); /* carries the period */
        u[7] = coda_tensor_1d(NULL, CODA_F32, lay[l].rot);   /* and rot_pairs */
        double g = ((double)M * lay[l].n * 6 + M * 8) / 1e9, m0 = time_ms(1, u), m1 = time_ms(4, u);
        printf("time: RoPE backward %s (%d, %lld), dy bf16: general %.1f us (%.0f GB/s), periodic %.1f us "
               "(%.0f GB/s)\n", lay[l].name, M, (long long)lay[l].n, 1e3 * m0, g / (m0 * 1e-3), 1e3 * m1,
               g / (m1 * 1e-3));
        for (int k = 0; k < 6; k++) dev_free(keep[k]);
    }

    t[0] = dev_tensor(CODA_F32, D, 0, &keep[0]);
    t[1] = dev_tensor(CODA_BF16, D, 0, &keep[1]);
    printf("time: convert (%d) f32 -> bf16: %.1f us\n", D, 1e3 * time_ms(2, t));
    for (int k = 0; k < 2; k++) dev_free(keep[k]);

    t[0] = dev_tensor(CODA_I32, M, 0, &keep[0]);
    t[1] = dev_tensor(CODA_I32, 1, 0, &keep[1]);
    printf("time: targets check (%d): %.1f us (with its preset)\n", M, 1e3 * time_ms(3, t));
    for (int k = 0; k < 2; k++) dev_free(keep[k]);
}

int main(int argc, char **argv) {
    small = argc > 1 && strcmp(argv[1], "small") == 0;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "FAIL: no CUDA device: %s\n", coda_last_error());
        return 1;
    }
    const int64_t rows[] = {1, 3, 127, 1000};
    const int64_t dims[] = {1, 2, 6, 8, 130, 1032, 4098};  /* norm: any d >= 1 */
    const int64_t cols[] = {2, 6, 8, 130, 1032, 4098};     /* RoPE: even N     */
    int nrows = small ? 3 : 4;
    for (int a = 0; a < nrows; a++)
        for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) norm_case(rows[a], dims[k], 0, 0xff);
    for (int a = 0; a < nrows; a++)
        for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++) rope_case(rows[a], cols[k], 0, 0xff);
    for (int a = 0; a < nrows; a++) /* dy in bf16 */
        for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++) rope_case(rows[a], cols[k], 4, 0xff);
    if (!small) {
        /* more rows than the grid has blocks (2^16; 8 rows a block in the
         * warp form, 1 in the block form): blocks take further rows in turn */
        norm_case(524288 + 9 * 8 + 3, 8, 0, 0x21);
        norm_case(65536 + 37, 1032, 0, 0x21);
        rope_case(524288 + 9 * 8 + 3, 8, 0, 0x21);
        rope_case(65536 + 37, 1032, 0, 0x21);
    }
    printf("RoPE backward: %lld of %lld dz elements differ from the CPU within f32 cos/sin error\n",
           (long long)rope_ulps, (long long)rope_elems);
    /* the periodic form: 8 rows a block (N <= 1024) and a row a block, rows
     * not a multiple of 8, LLaMA-3-1B's and 8B's heads */
    rope_periodic_case(13, 64, 4, 2, 0);
    rope_periodic_case(1000, 64, 32, 8, 1);
    if (!small) rope_periodic_case(999, 128, 32, 8, 0), rope_periodic_case(37, 256, 4, 1, 1);
    /* NaN in, NaN out: warp and block forms, with and without a tail */
    const int64_t nan_d[] = {6, 130, 1032, 4098};
    for (size_t k = 0; k < sizeof nan_d / sizeof nan_d[0]; k++) {
        for (int mode = 1; mode <= 2; mode++) norm_case(3, nan_d[k], mode, 0xff);
        for (int mode = 1; mode <= 3; mode++) rope_case(3, nan_d[k], mode, 0xff);
    }
    printf("NaN in, NaN out: norm prologue and RoPE backward done\n");
    const int64_t ns[] = {1, 3, 127, 1000, 4098};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) convert_case(ns[k]);
    printf("convert: done\n");
    const int64_t vs[] = {1, 7, 50000};
    for (int a = 0; a < nrows; a++)
        for (int v = 0; v < 3; v++) {
            targets_cases(rows[a], vs[v], -100);
            targets_cases(rows[a], vs[v], 3);
        }
    if (!small) { /* more targets than one grid's threads (2^24): the grid-stride loop */
        int64_t big = (int64_t)1 << 25;
        int64_t at[2] = {big - 5, (big * 3) / 4};
        int32_t v[2] = {128256, -1};
        targets_case(big, 128256, -100, NULL, NULL, 0);
        targets_case(big, 128256, -100, v, at, 2);
    }
    printf("targets check: done\n");
    bad_input();
    printf("bad input: done\n");
    side_stream();
    printf("non-blocking stream: done\n");
    if (!small) timing();
    coda_context_free(ctx);
    TEST_MAIN_END();
}
#else
int main(void) {
    printf("test_steps_gpu: skipped (built without the CUDA toolkit)\n");
    return 0;
}
#endif
