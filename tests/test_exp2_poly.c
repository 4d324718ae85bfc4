/* test_exp2_poly.c - src/cuda/kernels/exp2_poly.cuh's 2^x on the host: the
 * relative error against libm's exp2 (double) below 3e-6 over [-126, 1/2],
 * at every float of a dense sweep and at the ends of each binade; the
 * special values as ex2.approx.ftz gives them (x < -127 and -inf: 0; NaN:
 * NaN). The same source is what NVRTC compiles for the attention forward's
 * CODA_AW_EMU_EVERY experiment. */
#include <math.h>

#include "harness.h"
#define CODA_EXP2_POLY_HOST 1
#include "../src/cuda/kernels/exp2_poly.cuh"

static double rel_err(float x) {
    const double want = exp2((double)x);
    return fabs((double)coda_exp2_poly(x) / want - 1.0);
}

int main(void) {
    double worst = 0.0;
    float worst_x = 0.0f;
    /* a dense sweep: 2^20 points over [-126, 0.5], and each integer +- 0.5
     * (where round() changes n, f jumps from +1/2 to -1/2) */
    for (int i = 0; i <= (1 << 20); i++) {
        const float x = -126.0f + 126.5f * (float)i / (float)(1 << 20);
        const double e = rel_err(x);
        if (e > worst) worst = e, worst_x = x;
    }
    for (int n = -125; n <= 0; n++) /* seams from -125.5 on (below -126 the result is subnormal) */
        for (int s = -1; s <= 1; s += 2) {
            const float x = nextafterf((float)n + 0.5f * (float)s, (float)n);
            const float y = nextafterf((float)n + 0.5f * (float)s, (float)n + (float)s);
            const double e = fmax(rel_err(x), rel_err(y));
            if (e > worst) worst = e, worst_x = x;
        }
    CHECK(worst < 3e-6, "2^x relative error %.3g at x = %.9g (bound 3e-6)", worst, (double)worst_x);
    printf("exp2_poly: worst relative error %.3g at x = %.9g\n", worst, (double)worst_x);

    CHECK(coda_exp2_poly(0.0f) > 0.999996f && coda_exp2_poly(0.0f) < 1.000004f, "2^0 = %.9g", coda_exp2_poly(0.0f));
    CHECK(coda_exp2_poly(-INFINITY) == 0.0f, "2^-inf = %g", coda_exp2_poly(-INFINITY));
    CHECK(coda_exp2_poly(-127.0f) == 0.0f && coda_exp2_poly(-200.0f) == 0.0f && coda_exp2_poly(-3e38f) == 0.0f,
          "x <= -127 gives 0: %g %g %g", coda_exp2_poly(-127.0f), coda_exp2_poly(-200.0f),
          coda_exp2_poly(-3e38f));
    CHECK(isnan(coda_exp2_poly(NAN)) && isnan(coda_exp2_poly(-NAN)), "NaN stays NaN: %g %g", coda_exp2_poly(NAN),
          coda_exp2_poly(-NAN));
    /* monotone across the seams (a softmax's order of scores is kept) */
    int mono = 1;
    for (int n = -125; n <= 0 && mono; n++) {
        float x = (float)n - 0.5f;
        for (int k = -8; k < 8; k++) {
            float a = x, b = x;
            for (int j = 0; j < k + 8; j++) a = nextafterf(a, 1.0f);
            b = nextafterf(a, 1.0f);
            if (coda_exp2_poly(b) < coda_exp2_poly(a)) mono = 0;
        }
    }
    CHECK(mono, "2^x does not decrease across x = n - 1/2");
    TEST_MAIN_END();
}
