/* test_epilogue_nan.c - a NaN element reaches the partials of its row and
 * column (max reductions too: fmaxf alone would drop it), and no other. */
#include "harness.h"

int main(void) {
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    coda_program_t *p;
    REQUIRE_OK(coda_program_parse("in x tile f32\nout rm rowmax\nout cm colmax\nout rs rowsum\n"
                                  "a = acc\nxv = load x\ns = add a xv\nreduce rm s\nreduce cm s\n"
                                  "reduce rs s\n", &p));
    enum { M = 20, N = 24, K = 8 };
    h_rng r = rng_new(3);
    uint16_t a[M * K], b[N * K];
    float x[M * N], rm[M * 2], cm[N * 2], rs[M * 2];
    rng_fill_bf16(&r, a, M * K, 1.0f);
    rng_fill_bf16(&r, b, N * K, 1.0f);
    rng_fill_f32(&r, x, M * N, 1.0f);
    x[5 * N + 17] = NAN; /* row 5, column 17 */
    poison_f32(rm, M * 2);
    poison_f32(cm, N * 2);
    poison_f32(rs, M * 2);
    coda_tensor_t A = coda_tensor_2d(a, CODA_BF16, M, K), B = coda_tensor_2d(b, CODA_BF16, N, K);
    coda_tiling_t tl = {16, 16}; /* 2 x 2 tiles: row 5 in tile row 0, column 17 in tile column 1 */
    coda_binding_t bd[] = {{"x", coda_tensor_2d(x, CODA_F32, M, N), 0}, {"rm", coda_tensor_2d(rm, CODA_F32, M, 2), 0},
                           {"cm", coda_tensor_2d(cm, CODA_F32, N, 2), 0}, {"rs", coda_tensor_2d(rs, CODA_F32, M, 2), 0}};
    CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &A, &B, p, bd, 4, &tl, NULL));
    for (int i = 0; i < M; i++)
        for (int t = 0; t < 2; t++) {
            int hit = i == 5 && t == 1;
            CHECK(isnan(rm[i * 2 + t]) == hit, "rowmax[%d][%d] = %g", i, t, rm[i * 2 + t]);
            CHECK(isnan(rs[i * 2 + t]) == hit, "rowsum[%d][%d] = %g", i, t, rs[i * 2 + t]);
        }
    for (int j = 0; j < N; j++)
        for (int t = 0; t < 2; t++)
            CHECK(isnan(cm[j * 2 + t]) == (j == 17 && t == 0), "colmax[%d][%d] = %g", j, t, cm[j * 2 + t]);
    coda_program_free(p);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
