/* test_arg_shape.c - coda_program_arg_shape: the tensor each argument kind
 * must be bound to, and its bad arguments. */
#include "harness.h"

int main(void) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse("in x tile bf16\nin r row i32\nin g col f32 half\nin s scalar\nin pp rowpart\n"
                                  "out y tile f32 double\nout y2 tile bf16\nout rs rowsum\nout cs colmax half\nout st lse\n"
                                  "a = acc\nxx = load x\nb = add a xx\nd = interleave b b\nstore y d\n"
                                  "reduce rs b\ne = even b\nreduce cs e\nrr = load r\nlse st b rr\nqq = load pp\nbq = add b qq\nstore y2 bq\n",
                                  &p));
    const coda_tiling_t tl = {16, 256};
    struct {
        const char *name;
        int ndim;
        int64_t shape[3];
        coda_dtype_t dtype;
    } want[] = {
        {"x", 2, {1000, 520}, CODA_BF16},    {"r", 1, {1000}, CODA_I32},
        {"g", 1, {260}, CODA_F32},           {"s", 0, {0}, CODA_F32},
        {"y", 2, {1000, 1040}, CODA_F32},    {"rs", 2, {1000, 3}, CODA_F32},
        {"cs", 2, {260, 63}, CODA_F32},      {"st", 3, {1000, 3, 3}, CODA_F32},
        {"pp", 2, {1000, 0}, CODA_F32},      {"y2", 2, {1000, 520}, CODA_BF16},
    };
    for (int k = 0; k < (int)(sizeof want / sizeof want[0]); k++) {
        int i = coda_program_find_arg(p, want[k].name), ndim = -1;
        int64_t shape[3] = {-1, -1, -1};
        coda_dtype_t dt = (coda_dtype_t)-1;
        CHECK_OK(coda_program_arg_shape(p, i, 1000, 520, &tl, &ndim, shape, &dt));
        CHECK(ndim == want[k].ndim, "%s: ndim %d, want %d", want[k].name, ndim, want[k].ndim);
        for (int d = 0; d < want[k].ndim; d++)
            CHECK(shape[d] == want[k].shape[d], "%s: dim %d is %lld, want %lld", want[k].name, d,
                  (long long)shape[d], (long long)want[k].shape[d]);
        CHECK(dt == want[k].dtype, "%s: dtype %d, want %d", want[k].name, (int)dt, (int)want[k].dtype);
    }
    /* NULL tiling: the CPU default (128 x 128) */
    int ndim;
    int64_t shape[3];
    coda_dtype_t dt;
    CHECK_OK(coda_program_arg_shape(p, coda_program_find_arg(p, "cs"), 1000, 520, NULL, &ndim, shape, &dt));
    CHECK(shape[0] == 260 && shape[1] == 8, "default tiling: (%lld, %lld)", (long long)shape[0], (long long)shape[1]);
    /* bad arguments */
    CHECK_STATUS(coda_program_arg_shape(NULL, 0, 1, 1, NULL, &ndim, shape, &dt), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_program_arg_shape(p, coda_program_num_args(p), 1, 1, NULL, &ndim, shape, &dt), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_program_arg_shape(p, -1, 1, 1, NULL, &ndim, shape, &dt), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda_program_arg_shape(p, 0, -1, 1, NULL, &ndim, shape, &dt), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_program_arg_shape(p, 0, 1, 1, NULL, NULL, shape, &dt), CODA_ERR_INVALID_ARG);
    /* extents past a tensor's 2^40 (a review: 2n and the tile counts wrapped
     * to negative extents with CODA_OK), and tilings coda_gemm_epilogue refuses */
    CHECK_STATUS(coda_program_arg_shape(p, 0, 4, (int64_t)1 << 62, NULL, &ndim, shape, &dt), CODA_ERR_SHAPE);
    CHECK_STATUS(coda_program_arg_shape(p, 0, ((int64_t)1 << 40) + 1, 4, NULL, &ndim, shape, &dt), CODA_ERR_SHAPE);
    CHECK_OK(coda_program_arg_shape(p, 0, (int64_t)1 << 40, (int64_t)1 << 40, NULL, &ndim, shape, &dt));
    {
        const coda_tiling_t odd[] = {{-1, 128}, {128, 3}, {128, -2}, {2000, 128}, {128, 2048}};
        for (size_t t = 0; t < sizeof odd / sizeof odd[0]; t++)
            CHECK_STATUS(coda_program_arg_shape(p, 0, 4, 4, &odd[t], &ndim, shape, &dt), CODA_ERR_INVALID_ARG);
    }
    coda_program_free(p);
    TEST_MAIN_END();
}
