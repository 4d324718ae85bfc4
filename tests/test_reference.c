/* test_reference.c - the plain reference layer (tests/oracle/reference.c) is
 * itself trustworthy: its hand-written float64 backward agrees with central
 * finite differences of its own float64 forward, on random coordinates of
 * every weight and of the input, with and without the LM head, the loss term
 * and the dy term; its bf16-unfused mode differs from float64 by a
 * bf16-sized amount; bad arguments are refused; inputs are never modified. */
/* This test works in float64. */
#include "harness.h"
#include "oracle/reference.h"

static double urand(h_rng *r) { return (double)rng_uniform(r); }

/* Random bf16-representable values (what the layer is fed in practice). */
static void fill(h_rng *r, double *p, int64_t n, double scale, double offset) {
    for (int64_t i = 0; i < n; i++) p[i] = h_bf2f(h_f2bf((float)(offset + scale * urand(r))));
}

static void setup(coda__ref_layer_t *L, uint64_t seed, int n_ignored) {
    h_rng r = rng_new(seed);
    int64_t d = L->cfg.d, ffn = L->cfg.ffn;
    coda__ref_param_t p[CODA__REF_N_WEIGHTS];
    coda__ref_params(L, &L->w, p);
    for (int i = 0; i < CODA__REF_N_WEIGHTS; i++) {
        if (!p[i].data) continue;
        if (p[i].cols == 1) fill(&r, p[i].data, p[i].rows, 0.3, 1.0); /* norm weights near 1 */
        else fill(&r, p[i].data, p[i].rows * p[i].cols, 1.7 / sqrt((double)p[i].cols), 0.0);
    }
    (void)ffn;
    fill(&r, L->x, L->m * d, 1.0, 0.0);
    fill(&r, L->dy, L->m * d, 1.0, 0.0);
    if (L->targets) {
        for (int64_t i = 0; i < L->m; i++) {
            int32_t t = (int32_t)((urand(&r) * 0.5 + 0.5) * (double)L->cfg.vocab);
            L->targets[i] = t >= L->cfg.vocab ? (int32_t)L->cfg.vocab - 1 : t;
        }
        for (int k = 0; k < n_ignored; k++) L->targets[(k * 7 + 3) % L->m] = -100;
    }
    L->loss_scale = 0.7;
}

static double objective(coda__ref_layer_t *L) {
    REQUIRE_OK(coda__ref_forward(L, CODA__REF_F64));
    double f = 0;
    if (L->use_loss && L->cfg.vocab > 0)
        for (int64_t i = 0; i < L->m; i++) f += L->loss_scale * L->loss[i];
    if (L->use_dy)
        for (int64_t i = 0; i < L->m * L->cfg.d; i++) f += L->dy[i] * L->y[i];
    return f;
}

/* One finite-difference probe of coordinate idx of array p (gradient g[idx]). */
static int probe(coda__ref_layer_t *L, double *p, int64_t idx, double g, double *worst) {
    double keep = p[idx], h = 1e-5 * (1.0 + fabs(keep));
    p[idx] = keep + h;
    double fp = objective(L);
    p[idx] = keep - h;
    double fm = objective(L);
    p[idx] = keep;
    double fd = (fp - fm) / (2 * h);
    double err = fabs(fd - g) / (1e-3 + fabs(fd));
    if (err > *worst) *worst = err;
    return fabs(fd - g) <= 1e-6 + 1e-5 * fabs(fd);
}

static void fd_case(const char *label, coda_llama_config_t cfg, int64_t batch, int64_t seq,
                    int use_loss, int use_dy, uint64_t seed) {
    coda__ref_layer_t *L;
    REQUIRE_OK(coda__ref_create(&cfg, batch, seq, &L));
    setup(L, seed, 2);
    L->use_loss = use_loss;
    L->use_dy = use_dy;
    CHECK_OK(coda__ref_forward(L, CODA__REF_F64));
    CHECK_OK(coda__ref_backward(L));
    int64_t d = cfg.d;
    /* Save the gradients: objective() reruns the forward pass only. */
    coda__ref_param_t pw[CODA__REF_N_WEIGHTS], pg[CODA__REF_N_WEIGHTS];
    coda__ref_params(L, &L->w, pw);
    coda__ref_params(L, &L->grad, pg);
    h_rng r = rng_new(seed + 100);
    int probes = 0, bad = 0;
    double worst = 0;
    for (int i = 0; i <= CODA__REF_N_WEIGHTS; i++) {
        double *p, *g;
        int64_t n;
        const char *name;
        if (i < CODA__REF_N_WEIGHTS) {
            if (!pw[i].data) continue;
            p = pw[i].data;
            g = pg[i].data;
            n = pw[i].rows * pw[i].cols;
            name = pw[i].name;
        } else {
            p = L->x;
            g = L->dx;
            n = L->m * d;
            name = "x";
        }
        double *gcopy = h_alloc(sizeof(double) * (size_t)n);
        memcpy(gcopy, g, sizeof(double) * (size_t)n);
        double gnorm = 0;
        for (int64_t j = 0; j < n; j++) gnorm += gcopy[j] * gcopy[j];
        int bad_here = 0;
        for (int t = 0; t < 5; t++) {
            int64_t idx = (int64_t)((urand(&r) * 0.5 + 0.5) * (double)n);
            if (idx >= n) idx = n - 1;
            probes++;
            if (!probe(L, p, idx, gcopy[idx], &worst)) bad_here++;
        }
        bad += bad_here;
        int loss_only = !strcmp(name, "gf") || !strcmp(name, "wlm");
        CHECK(bad_here == 0, "%s: %s: %d of 5 finite-difference probes disagree", label, name, bad_here);
        /* A gradient that is identically zero would pass the probes only if the
         * objective does not depend on it: that is only the case for the LM
         * head's weights when the loss is off. */
        int qk = !strcmp(name, "wq") || !strcmp(name, "wk"); /* seq 1: softmax of one key */
        if ((loss_only && !use_loss) || (qk && seq == 1))
            CHECK(gnorm == 0, "%s: %s gradient should be 0", label, name);
        else CHECK(gnorm > 0, "%s: %s gradient is all zero", label, name);
        free(gcopy);
    }
    printf("  %-28s %d probes, %d bad, worst relative error %.2e\n", label, probes, bad, worst);
    coda__ref_free(L);
}

typedef struct { const char *name; const double *a, *b; int64_t n; } cmp_item_t;

/* bf16-unfused mode: error vs float64 of bf16 size, and nonzero (it rounds). */
static void bf16_mode(void) {
    coda_llama_config_t cfg = {.d = 40, .n_heads = 4, .n_kv_heads = 2, .head_dim = 10, .ffn = 56,
                               .vocab = 37, .eps = 1e-5f, .rope_theta = 10000.0f};
    coda__ref_layer_t *A, *B;
    REQUIRE_OK(coda__ref_create(&cfg, 3, 7, &A));
    REQUIRE_OK(coda__ref_create(&cfg, 3, 7, &B));
    setup(A, 7, 3);
    CHECK_OK(coda__ref_copy_inputs(B, A));
    double *x_before = h_alloc(sizeof(double) * (size_t)(A->m * cfg.d));
    memcpy(x_before, B->x, sizeof(double) * (size_t)(A->m * cfg.d));
    CHECK_OK(coda__ref_forward(A, CODA__REF_F64));
    CHECK_OK(coda__ref_backward(A));
    CHECK_OK(coda__ref_forward(B, CODA__REF_BF16));
    CHECK_OK(coda__ref_backward(B));
    CHECK(memcmp(x_before, B->x, sizeof(double) * (size_t)(A->m * cfg.d)) == 0, "x was modified");
    coda__ref_param_t pa[CODA__REF_N_WEIGHTS], pb[CODA__REF_N_WEIGHTS];
    coda__ref_params(A, &A->grad, pa);
    coda__ref_params(B, &B->grad, pb);
    cmp_item_t items[CODA__REF_N_WEIGHTS + 3];
    int n_items = 0;
    items[n_items++] = (cmp_item_t){"y", A->y, B->y, A->m * cfg.d};
    items[n_items++] = (cmp_item_t){"loss", A->loss, B->loss, A->m};
    items[n_items++] = (cmp_item_t){"dx", A->dx, B->dx, A->m * cfg.d};
    for (int i = 0; i < CODA__REF_N_WEIGHTS; i++)
        items[n_items++] = (cmp_item_t){pa[i].name, pa[i].data, pb[i].data, pa[i].rows * pa[i].cols};
    printf("  bf16-unfused vs float64 (relative Frobenius):");
    for (int i = 0; i < n_items; i++) {
        double num = 0, den = 0;
        for (int64_t j = 0; j < items[i].n; j++) {
            double e = items[i].b[j] - items[i].a[j];
            num += e * e;
            den += items[i].a[j] * items[i].a[j];
        }
        double err = sqrt(num / den);
        printf(" %s %.1e", items[i].name, err);
        CHECK(err > 1e-5 && err < 5e-2, "bf16 mode %s error %.3e not of bf16 size", items[i].name, err);
    }
    printf("\n");
    /* The mode is a property of the last forward: float64 again gives float64 results. */
    CHECK_OK(coda__ref_forward(B, CODA__REF_F64));
    CHECK(memcmp(A->y, B->y, sizeof(double) * (size_t)(A->m * cfg.d)) == 0, "float64 rerun differs");
    free(x_before);
    coda__ref_free(A);
    coda__ref_free(B);
}

static void bad_args(void) {
    coda_llama_config_t cfg = {.d = 8, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .ffn = 8,
                               .vocab = 5, .eps = 1e-5f, .rope_theta = 10000.0f};
    coda__ref_layer_t *L = NULL;
    CHECK_STATUS(coda__ref_create(NULL, 1, 1, &L), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__ref_create(&cfg, 1, 1, NULL), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__ref_create(&cfg, 0, 1, &L), CODA_ERR_SHAPE);
    coda_llama_config_t c = cfg;
    c.head_dim = 3;
    CHECK_STATUS(coda__ref_create(&c, 1, 1, &L), CODA_ERR_SHAPE);
    c = cfg;
    c.n_kv_heads = 3;
    CHECK_STATUS(coda__ref_create(&c, 1, 1, &L), CODA_ERR_SHAPE);
    c = cfg;
    c.eps = 0;
    CHECK_STATUS(coda__ref_create(&c, 1, 1, &L), CODA_ERR_INVALID_ARG);
    CHECK(L == NULL, "out written on failure");
    REQUIRE_OK(coda__ref_create(&cfg, 2, 3, &L));
    CHECK_STATUS(coda__ref_backward(L), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__ref_forward(L, (coda__ref_mode_t)7), CODA_ERR_INVALID_ARG);
    setup(L, 3, 0);
    L->targets[1] = 5;
    CHECK_STATUS(coda__ref_forward(L, CODA__REF_F64), CODA_ERR_INVALID_ARG);
    L->targets[1] = -100;
    CHECK_OK(coda__ref_forward(L, CODA__REF_F64));
    coda__ref_layer_t *O;
    c = cfg;
    c.vocab = 6;
    REQUIRE_OK(coda__ref_create(&c, 2, 3, &O));
    CHECK_STATUS(coda__ref_copy_inputs(O, L), CODA_ERR_SHAPE);
    /* from_tensor: bf16 and f32, strided rows */
    uint16_t raw[2 * 5];
    for (int i = 0; i < 10; i++) raw[i] = h_f2bf(0.25f * (float)(i + 1));
    coda_tensor_t t = coda_tensor_2d(raw, CODA_BF16, 2, 3);
    t.stride[0] = 10;
    double got[6];
    CHECK_OK(coda__ref_from_tensor(got, &t, 6));
    CHECK(got[0] == 0.25 && got[2] == 0.75 && got[3] == 1.5 && got[5] == 2.0, "from_tensor values");
    CHECK_STATUS(coda__ref_from_tensor(got, &t, 5), CODA_ERR_SHAPE);
    t.dtype = CODA_I32;
    t.stride[0] = 20;
    t.stride[1] = 4;
    CHECK_STATUS(coda__ref_from_tensor(got, &t, 6), CODA_ERR_DTYPE);
    coda__ref_free(O);
    coda__ref_free(L);
    coda__ref_free(NULL);
}

int main(void) {
    coda_llama_config_t cfg = {.d = 12, .n_heads = 3, .n_kv_heads = 1, .head_dim = 6, .ffn = 20,
                               .vocab = 9, .eps = 1e-5f, .rope_theta = 100.0f};
    fd_case("GQA 3/1, loss + dy", cfg, 2, 5, 1, 1, 11);
    fd_case("GQA 3/1, loss only", cfg, 2, 5, 1, 0, 12);
    fd_case("GQA 3/1, dy only", cfg, 1, 7, 0, 1, 13);
    coda_llama_config_t c2 = {.d = 16, .n_heads = 4, .n_kv_heads = 2, .head_dim = 4, .ffn = 12,
                              .vocab = 0, .eps = 1e-6f, .rope_theta = 10000.0f};
    fd_case("GQA 4/2, no LM head", c2, 3, 3, 1, 1, 14);
    coda_llama_config_t c3 = {.d = 10, .n_heads = 2, .n_kv_heads = 2, .head_dim = 8, .ffn = 6,
                              .vocab = 13, .eps = 1e-5f, .rope_theta = 500000.0f};
    fd_case("MHA 2/2, seq 1", c3, 4, 1, 1, 1, 15);
    bf16_mode();
    bad_args();
    TEST_MAIN_END();
}
