/* test_nvrtc_steps.c - the layer's non-GEMM GPU steps (src/cuda/layer_steps.c)
 * without a GPU: their kernels (kernels/layer_steps.cuh) compile with NVRTC
 * for sm_90a with the library's own options, every entry point is in the
 * cubin, and each call refuses bad input (NULL, wrong dtypes and extents,
 * bad strides, CPU tensors, tensors of two devices, outputs overlapping)
 * with the right status and a message naming the argument, having touched
 * nothing. The descriptors say CUDA but hold host memory, so a call that
 * gets past its own checks meets the driver's: CODA_ERR_DEVICE, with or
 * without a GPU (no driver, or "not CUDA device memory"); the host bytes
 * must be unchanged either way. Empty calls (no rows) succeed without a
 * device. tests/gpu/test_steps_gpu.c runs the kernels. */
#include "harness.h"

#ifdef CODA_WITH_CUDA
#include "cuda/backend.h"
#include "cuda/layer_steps.h"

/* ---- host memory dressed as CUDA tensors, filled with a pattern ---- */

enum { POOL = 1 << 16 };
static unsigned char pool[POOL] __attribute__((aligned(256)));
static unsigned char pool_init[POOL];
static size_t pool_used;

static void pool_reset(void) {
    for (size_t i = 0; i < POOL; i++) pool[i] = (unsigned char)(i * 131u + 7u);
    memcpy(pool_init, pool, POOL);
    pool_used = 0;
}
static void *pool_get(size_t bytes) {
    size_t off = (pool_used + 255) / 256 * 256;
    if (off + bytes > POOL) {
        fprintf(stderr, "FATAL: test pool too small\n");
        exit(1);
    }
    pool_used = off + bytes;
    return pool + off;
}
static int pool_same(void) { return memcmp(pool, pool_init, POOL) == 0; }

static coda_tensor_t cuda2(coda_dtype_t dt, int64_t r, int64_t c) {
    coda_tensor_t t = coda_tensor_2d(pool_get((size_t)(r * c) * coda_dtype_size(dt) + 16), dt, r, c);
    t.device = CODA_DEVICE_CUDA;
    return t;
}
static coda_tensor_t cuda1(coda_dtype_t dt, int64_t n) {
    coda_tensor_t t = coda_tensor_1d(pool_get((size_t)n * coda_dtype_size(dt) + 16), dt, n);
    t.device = CODA_DEVICE_CUDA;
    return t;
}

/* The call returns `want`, its message names `word`, and the pool (every
 * tensor's bytes) is as it was. */
#define REFUSED(call, want, word)                                                                  \
    do {                                                                                           \
        CHECK_STATUS(call, want);                                                                  \
        CHECK(strstr(coda_last_error(), word) != NULL, "%s: message does not name '%s': %s", #call, \
              word, coda_last_error());                                                            \
        CHECK(pool_same(), "%s: refused but changed memory", #call);                              \
    } while (0)

/* lm_steps.cuh (coda_lm_loss's steps) compiles too, with every entry point. */
static void compile_lm_kernels(void) {
    const char *src = coda__cuda_source("lm_steps.cuh");
    CHECK(src != NULL, "lm_steps.cuh is embedded");
    if (!src) return;
    char *cubin = NULL;
    size_t size = 0;
    coda_status_t s = coda__nvrtc_compile(src, coda__cuda_lm_steps_opts, CODA_CUDA_LM_STEPS_NOPTS, &cubin, &size);
    CHECK(s == CODA_OK, "lm_steps.cuh compiles for sm_90a: %s", coda_last_error());
    int found = 0;
    for (int i = 0; s == CODA_OK && coda__cuda_lm_steps_entries[i]; i++) {
        const char *e = coda__cuda_lm_steps_entries[i];
        int in = memmem(cubin, size, e, strlen(e)) != NULL;
        CHECK(in, "entry point %s is in the cubin", e);
        found += in;
    }
    CHECK(found == 4, "4 entry points (count, rows, total, scale), %d found", found);
    printf("lm_steps.cuh: %s, %zu bytes, %d entry points\n", s == CODA_OK ? "ok" : "FAILED", size, found);
    free(cubin);
}

static void compile_kernels(void) {
    const char *src = coda__cuda_source("layer_steps.cuh");
    CHECK(src != NULL, "layer_steps.cuh is embedded");
    if (!src) return;
    char *cubin = NULL;
    size_t size = 0;
    coda_status_t s = coda__nvrtc_compile(src, coda__cuda_steps_opts, CODA_CUDA_STEPS_NOPTS, &cubin, &size);
    CHECK(s == CODA_OK, "layer_steps.cuh compiles for sm_90a: %s", coda_last_error());
    CHECK(s != CODA_OK || size > 1000, "cubin of %zu bytes", size);
    int found = 0;
    for (int i = 0; s == CODA_OK && coda__cuda_steps_entries[i]; i++) {
        const char *e = coda__cuda_steps_entries[i];
        int in = memmem(cubin, size, e, strlen(e)) != NULL;
        CHECK(in, "entry point %s is in the cubin", e);
        found += in;
    }
    CHECK(found == 4, "4 entry points, %d found", found);
    printf("layer_steps.cuh: %s, %zu bytes, %d entry points\n", s == CODA_OK ? "ok" : "FAILED", size, found);
    /* the options the library compiles with: sm_90a, no FMA contraction */
    int fmad = 0, arch = 0;
    for (int i = 0; i < CODA_CUDA_STEPS_NOPTS; i++) {
        fmad |= strcmp(coda__cuda_steps_opts[i], "--fmad=false") == 0;
        arch |= strcmp(coda__cuda_steps_opts[i], "--gpu-architecture=sm_90a") == 0;
    }
    CHECK(fmad && arch, "options hold --fmad=false and sm_90a");
    free(cubin);
}

static void norm_prologue(coda_context_t *ctx) {
    enum { M = 3, D = 6 };
    pool_reset();
    coda_tensor_t x = cuda2(CODA_BF16, M, D), g = cuda1(CODA_BF16, D), xg = cuda2(CODA_BF16, M, D);
    coda_tensor_t ss = cuda1(CODA_F32, M), ss2 = cuda2(CODA_F32, M, 1);
    memcpy(pool_init, pool, POOL);
    coda_tensor_t t;

    REFUSED(coda__cuda_norm_prologue(NULL, &x, &g, &xg, &ss, NULL), CODA_ERR_INVALID_ARG, "ctx");
    REFUSED(coda__cuda_norm_prologue(ctx, NULL, &g, &xg, &ss, NULL), CODA_ERR_INVALID_ARG, "x is NULL");
    REFUSED(coda__cuda_norm_prologue(ctx, &x, NULL, &xg, &ss, NULL), CODA_ERR_INVALID_ARG, "g is NULL");
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, NULL, &ss, NULL), CODA_ERR_INVALID_ARG, "xg is NULL");
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, NULL, NULL), CODA_ERR_INVALID_ARG, "ss is NULL");
    /* dtypes */
    t = x, t.dtype = CODA_F32, t.stride[0] = 4 * D, t.stride[1] = 4;
    REFUSED(coda__cuda_norm_prologue(ctx, &t, &g, &xg, &ss, NULL), CODA_ERR_DTYPE, "x");
    t = g, t.dtype = CODA_F16;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &t, &xg, &ss, NULL), CODA_ERR_DTYPE, "g");
    t = xg, t.dtype = CODA_F32;
    t.stride[0] = 4 * D, t.stride[1] = 4;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &t, &ss, NULL), CODA_ERR_DTYPE, "xg");
    t = ss, t.dtype = CODA_BF16, t.stride[0] = 2;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_DTYPE, "ss");
    t = x, t.dtype = (coda_dtype_t)99;
    REFUSED(coda__cuda_norm_prologue(ctx, &t, &g, &xg, &ss, NULL), CODA_ERR_DTYPE, "x");
    /* extents */
    t = coda_tensor_1d(x.data, CODA_BF16, D), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_norm_prologue(ctx, &t, &g, &xg, &ss, NULL), CODA_ERR_SHAPE, "x");
    t = g, t.shape[0] = D + 1;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &t, &xg, &ss, NULL), CODA_ERR_SHAPE, "g");
    t = g, t.shape[0] = D - 1;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &t, &xg, &ss, NULL), CODA_ERR_SHAPE, "g");
    t = xg, t.shape[1] = D - 2;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &t, &ss, NULL), CODA_ERR_SHAPE, "xg");
    t = xg, t.shape[0] = M - 1;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &t, &ss, NULL), CODA_ERR_SHAPE, "xg");
    t = ss, t.shape[0] = M + 1;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_SHAPE, "ss");
    t = coda_tensor_2d(ss.data, CODA_F32, M, 2), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_SHAPE, "ss");
    t = coda_tensor_2d(g.data, CODA_BF16, 1, D), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &t, &xg, &ss, NULL), CODA_ERR_SHAPE, "g");
    /* strides and pointers */
    t = x, t.stride[1] = 4;
    REFUSED(coda__cuda_norm_prologue(ctx, &t, &g, &xg, &ss, NULL), CODA_ERR_STRIDE, "x");
    t = xg, t.stride[0] = 2 * (D - 1);
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &t, &ss, NULL), CODA_ERR_STRIDE, "xg");
    t = ss, t.data = (char *)ss.data + 2;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_STRIDE, "ss");
    t = x, t.data = NULL;
    REFUSED(coda__cuda_norm_prologue(ctx, &t, &g, &xg, &ss, NULL), CODA_ERR_INVALID_ARG, "x");
    /* devices */
    t = x, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_norm_prologue(ctx, &t, &g, &xg, &ss, NULL), CODA_ERR_DEVICE, "x is a CPU tensor");
    t = g, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &t, &xg, &ss, NULL), CODA_ERR_DEVICE, "g is a CPU tensor");
    t = xg, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &t, &ss, NULL), CODA_ERR_DEVICE, "xg is a CPU tensor");
    t = ss, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_DEVICE, "ss is a CPU tensor");
    t = ss, t.device = (coda_device_t)7;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_DEVICE, "ss");
    t = xg, t.device_index = 1;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &t, &ss, NULL), CODA_ERR_DEVICE, "xg is on cuda:1");
    /* overlap: outputs apart from the inputs and from each other */
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &x, &ss, NULL), CODA_ERR_OVERLAP, "xg overlaps x");
    t = coda_tensor_1d(xg.data, CODA_F32, M), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_OVERLAP, "ss overlaps xg");
    t = coda_tensor_1d(g.data, CODA_F32, M), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &t, NULL), CODA_ERR_OVERLAP, "ss overlaps g");
    /* well-formed: only the driver can refuse host memory (or the absence of a GPU) */
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &ss, NULL), CODA_ERR_DEVICE, "");
    REFUSED(coda__cuda_norm_prologue(ctx, &x, &g, &xg, &ss2, NULL), CODA_ERR_DEVICE, "");
    /* no rows: nothing to do, no device needed */
    coda_tensor_t x0 = x, xg0 = xg, ss0 = ss;
    x0.shape[0] = xg0.shape[0] = ss0.shape[0] = 0;
    CHECK_OK(coda__cuda_norm_prologue(ctx, &x0, &g, &xg0, &ss0, NULL));
    CHECK(pool_same(), "empty norm prologue changed memory");
}

static void rope_backward(coda_context_t *ctx) {
    enum { M = 3, N = 6 };
    pool_reset();
    coda_tensor_t dy = cuda2(CODA_F32, M, N), y = cuda2(CODA_BF16, M, N), pos = cuda1(CODA_F32, M);
    coda_tensor_t freq = cuda1(CODA_F32, N / 2), dz = cuda2(CODA_BF16, M, N), s = cuda1(CODA_F32, M);
    memcpy(pool_init, pool, POOL);
    coda_tensor_t t;

    REFUSED(coda__cuda_rope_backward(NULL, &dy, 1, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_INVALID_ARG, "ctx");
    REFUSED(coda__cuda_rope_backward(ctx, NULL, 1, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_INVALID_ARG, "dy is NULL");
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, NULL, &pos, &freq, &dz, &s, NULL), CODA_ERR_INVALID_ARG, "y is NULL");
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, NULL, &freq, &dz, &s, NULL), CODA_ERR_INVALID_ARG, "pos is NULL");
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, NULL, &dz, &s, NULL), CODA_ERR_INVALID_ARG, "freq is NULL");
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, NULL, &s, NULL), CODA_ERR_INVALID_ARG, "dz is NULL");
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &dz, NULL, NULL), CODA_ERR_INVALID_ARG, "s is NULL");
    /* dtypes */
    t = dy, t.dtype = CODA_I32; /* dy is f32 or bf16 */
    REFUSED(coda__cuda_rope_backward(ctx, &t, 1, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_DTYPE, "dy");
    t = y, t.dtype = CODA_F32, t.stride[0] = 4 * N, t.stride[1] = 4;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &t, &pos, &freq, &dz, &s, NULL), CODA_ERR_DTYPE, "y");
    t = pos, t.dtype = CODA_I32;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &t, &freq, &dz, &s, NULL), CODA_ERR_DTYPE, "pos");
    t = freq, t.dtype = CODA_BF16, t.stride[0] = 2;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &t, &dz, &s, NULL), CODA_ERR_DTYPE, "freq");
    t = dz, t.dtype = CODA_F32, t.stride[0] = 4 * N, t.stride[1] = 4;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &t, &s, NULL), CODA_ERR_DTYPE, "dz");
    t = s, t.dtype = CODA_BF16, t.stride[0] = 2;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &dz, &t, NULL), CODA_ERR_DTYPE, "s");
    /* extents */
    t = dy, t.shape[1] = N - 1;
    REFUSED(coda__cuda_rope_backward(ctx, &t, 1, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "even");
    t = y, t.shape[1] = N - 2;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &t, &pos, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "y");
    t = y, t.shape[0] = M - 1;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &t, &pos, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "y");
    t = pos, t.shape[0] = M + 1;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &t, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "pos");
    t = freq, t.shape[0] = N;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &t, &dz, &s, NULL), CODA_ERR_SHAPE, "freq");
    t = freq, t.shape[0] = N / 2 - 1;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &t, &dz, &s, NULL), CODA_ERR_SHAPE, "freq");
    t = dz, t.shape[0] = M + 1;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &t, &s, NULL), CODA_ERR_SHAPE, "dz");
    t = s, t.shape[0] = M - 1;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &dz, &t, NULL), CODA_ERR_SHAPE, "s");
    t = coda_tensor_2d(pos.data, CODA_F32, M, 1), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &t, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "pos");
    /* strides */
    t = dy, t.stride[0] = 4 * (N - 2);
    REFUSED(coda__cuda_rope_backward(ctx, &t, 1, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_STRIDE, "dy");
    t = dz, t.stride[0] = 3;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &t, &s, NULL), CODA_ERR_STRIDE, "dz");
    /* devices */
    t = dy, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_rope_backward(ctx, &t, 1, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_DEVICE, "dy is a CPU tensor");
    t = pos, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &t, &freq, &dz, &s, NULL), CODA_ERR_DEVICE, "pos is a CPU tensor");
    t = dz, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &t, &s, NULL), CODA_ERR_DEVICE, "dz is a CPU tensor");
    t = s, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &dz, &t, NULL), CODA_ERR_DEVICE, "s is a CPU tensor");
    t = freq, t.device_index = 2;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &t, &dz, &s, NULL), CODA_ERR_DEVICE, "freq is on cuda:2");
    /* overlap */
    t = coda_tensor_2d(dy.data, CODA_BF16, M, N), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &t, &s, NULL), CODA_ERR_OVERLAP, "dz overlaps dy");
    t = coda_tensor_1d(freq.data, CODA_F32, M), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &dz, &t, NULL), CODA_ERR_OVERLAP, "s overlaps freq");
    t = coda_tensor_1d((char *)dz.data + 4, CODA_F32, M), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &dz, &t, NULL), CODA_ERR_OVERLAP, "s overlaps dz");
    /* dy in parts (dq, dk, dv): each checked as dy is, one dtype, one row count */
    coda_tensor_t parts[4];
    for (int q = 0; q < 4; q++) parts[q] = dy, parts[q].shape[1] = 2; /* three (M, 2) views side by side */
    parts[1].data = (char *)dy.data + 8, parts[2].data = (char *)dy.data + 16;
    REFUSED(coda__cuda_rope_backward(ctx, parts, 0, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_INVALID_ARG, "1 to 3");
    REFUSED(coda__cuda_rope_backward(ctx, parts, 4, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_INVALID_ARG, "1 to 3");
    t = parts[1], parts[1].dtype = CODA_BF16, parts[1].stride[1] = 2;
    REFUSED(coda__cuda_rope_backward(ctx, parts, 3, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_DTYPE, "dy[1]");
    parts[1] = t, parts[2].shape[0] = M - 1;
    REFUSED(coda__cuda_rope_backward(ctx, parts, 3, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "dy[2]");
    parts[2].shape[0] = M, parts[1].shape[1] = 1;
    REFUSED(coda__cuda_rope_backward(ctx, parts, 3, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "even");
    parts[1].shape[1] = 2;
    REFUSED(coda__cuda_rope_backward(ctx, parts, 2, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_SHAPE, "y");
    parts[2].device_index = 1;
    REFUSED(coda__cuda_rope_backward(ctx, parts, 3, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_DEVICE, "dy[2] is on cuda:1");
    parts[2].device_index = 0;
    t = coda_tensor_2d(dy.data, CODA_BF16, M, N), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_rope_backward(ctx, parts, 3, &y, &pos, &freq, &t, &s, NULL), CODA_ERR_OVERLAP, "dz overlaps dy[0]");
    REFUSED(coda__cuda_rope_backward(ctx, parts, 3, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_DEVICE, "");
    CHECK(pool_same(), "refused RoPE backward in parts changed memory");
    /* well-formed */
    REFUSED(coda__cuda_rope_backward(ctx, &dy, 1, &y, &pos, &freq, &dz, &s, NULL), CODA_ERR_DEVICE, "");
    /* no rows */
    coda_tensor_t dy0 = dy, y0 = y, pos0 = pos, dz0 = dz, s0 = s;
    dy0.shape[0] = y0.shape[0] = pos0.shape[0] = dz0.shape[0] = s0.shape[0] = 0;
    CHECK_OK(coda__cuda_rope_backward(ctx, &dy0, 1, &y0, &pos0, &freq, &dz0, &s0, NULL));
    CHECK(pool_same(), "empty RoPE backward changed memory");
}

static void convert_vec(coda_context_t *ctx) {
    enum { N = 7 };
    pool_reset();
    coda_tensor_t in = cuda1(CODA_F32, N), ob = cuda1(CODA_BF16, N), of = cuda1(CODA_F32, N);
    coda_tensor_t col = coda_tensor_2d(pool_get(N * 12), CODA_F32, N, 1);
    col.device = CODA_DEVICE_CUDA;
    col.stride[0] = 12; /* every third float: an element stride */
    memcpy(pool_init, pool, POOL);
    coda_tensor_t t;

    REFUSED(coda__cuda_convert_vec(NULL, &in, &ob, NULL), CODA_ERR_INVALID_ARG, "ctx");
    REFUSED(coda__cuda_convert_vec(ctx, NULL, &ob, NULL), CODA_ERR_INVALID_ARG, "in is NULL");
    REFUSED(coda__cuda_convert_vec(ctx, &in, NULL, NULL), CODA_ERR_INVALID_ARG, "out is NULL");
    t = ob;
    REFUSED(coda__cuda_convert_vec(ctx, &t, &of, NULL), CODA_ERR_DTYPE, "in");
    t = of, t.dtype = CODA_I32;
    REFUSED(coda__cuda_convert_vec(ctx, &in, &t, NULL), CODA_ERR_DTYPE, "out");
    t = ob, t.dtype = CODA_F16;
    REFUSED(coda__cuda_convert_vec(ctx, &in, &t, NULL), CODA_ERR_DTYPE, "out");
    t = ob, t.shape[0] = N - 1;
    REFUSED(coda__cuda_convert_vec(ctx, &in, &t, NULL), CODA_ERR_SHAPE, "out");
    t = coda_tensor_2d(in.data, CODA_F32, 3, 2), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_convert_vec(ctx, &t, &of, NULL), CODA_ERR_SHAPE, "in");
    t = in, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_convert_vec(ctx, &t, &ob, NULL), CODA_ERR_DEVICE, "in is a CPU tensor");
    t = ob, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_convert_vec(ctx, &in, &t, NULL), CODA_ERR_DEVICE, "out is a CPU tensor");
    t = ob, t.device_index = 1;
    REFUSED(coda__cuda_convert_vec(ctx, &in, &t, NULL), CODA_ERR_DEVICE, "out is on cuda:1");
    t = coda_tensor_1d((char *)in.data + 8, CODA_BF16, N), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_convert_vec(ctx, &in, &t, NULL), CODA_ERR_OVERLAP, "out overlaps in");
    REFUSED(coda__cuda_convert_vec(ctx, &in, &in, NULL), CODA_ERR_OVERLAP, "out overlaps in");
    REFUSED(coda__cuda_convert_vec(ctx, &in, &ob, NULL), CODA_ERR_DEVICE, "");
    REFUSED(coda__cuda_convert_vec(ctx, &in, &of, NULL), CODA_ERR_DEVICE, "");
    REFUSED(coda__cuda_convert_vec(ctx, &col, &ob, NULL), CODA_ERR_DEVICE, "");
    REFUSED(coda__cuda_convert_vec(ctx, &in, &col, NULL), CODA_ERR_DEVICE, "");
    coda_tensor_t in0 = in, ob0 = ob;
    in0.shape[0] = ob0.shape[0] = 0;
    CHECK_OK(coda__cuda_convert_vec(ctx, &in0, &ob0, NULL));
    CHECK(pool_same(), "empty convert changed memory");
}

static void check_targets(coda_context_t *ctx) {
    enum { M = 9 };
    pool_reset();
    coda_tensor_t tg = cuda1(CODA_I32, M), bad = cuda1(CODA_I32, 1);
    memcpy(pool_init, pool, POOL);
    coda_tensor_t t;

    REFUSED(coda__cuda_check_targets(NULL, &tg, 100, -100, &bad, NULL), CODA_ERR_INVALID_ARG, "ctx");
    REFUSED(coda__cuda_check_targets(ctx, NULL, 100, -100, &bad, NULL), CODA_ERR_INVALID_ARG, "targets is NULL");
    REFUSED(coda__cuda_check_targets(ctx, &tg, 100, -100, NULL, NULL), CODA_ERR_INVALID_ARG, "bad is NULL");
    t = tg, t.dtype = CODA_F32;
    REFUSED(coda__cuda_check_targets(ctx, &t, 100, -100, &bad, NULL), CODA_ERR_DTYPE, "targets");
    t = bad, t.dtype = CODA_F32;
    REFUSED(coda__cuda_check_targets(ctx, &tg, 100, -100, &t, NULL), CODA_ERR_DTYPE, "bad");
    t = bad, t.shape[0] = 2;
    REFUSED(coda__cuda_check_targets(ctx, &tg, 100, -100, &t, NULL), CODA_ERR_SHAPE, "bad");
    t = coda_tensor_2d(tg.data, CODA_I32, 3, 3), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_check_targets(ctx, &t, 100, -100, &bad, NULL), CODA_ERR_SHAPE, "targets");
    /* more targets than an i32 index can name (the data is never read) */
    t = tg, t.shape[0] = ((int64_t)1 << 31) + 1;
    REFUSED(coda__cuda_check_targets(ctx, &t, 100, -100, &bad, NULL), CODA_ERR_SHAPE, "2^31");
    REFUSED(coda__cuda_check_targets(ctx, &tg, 0, -100, &bad, NULL), CODA_ERR_INVALID_ARG, "vocab");
    REFUSED(coda__cuda_check_targets(ctx, &tg, -5, -100, &bad, NULL), CODA_ERR_INVALID_ARG, "vocab");
    t = tg, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_check_targets(ctx, &t, 100, -100, &bad, NULL), CODA_ERR_DEVICE, "targets is a CPU tensor");
    t = bad, t.device = CODA_DEVICE_CPU;
    REFUSED(coda__cuda_check_targets(ctx, &tg, 100, -100, &t, NULL), CODA_ERR_DEVICE, "bad is a CPU tensor");
    t = bad, t.device_index = 3;
    REFUSED(coda__cuda_check_targets(ctx, &tg, 100, -100, &t, NULL), CODA_ERR_DEVICE, "bad is on cuda:3");
    t = coda_tensor_1d((char *)tg.data + 8, CODA_I32, 1), t.device = CODA_DEVICE_CUDA;
    REFUSED(coda__cuda_check_targets(ctx, &tg, 100, -100, &t, NULL), CODA_ERR_OVERLAP, "bad overlaps targets");
    REFUSED(coda__cuda_check_targets(ctx, &tg, 100, -100, &bad, NULL), CODA_ERR_DEVICE, "");
    /* no targets: the flag is still written (-1), so the device is needed */
    t = tg, t.shape[0] = 0;
    REFUSED(coda__cuda_check_targets(ctx, &t, 100, -100, &bad, NULL), CODA_ERR_DEVICE, "");
}

int main(void) {
    compile_kernels();
    compile_lm_kernels();
    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    norm_prologue(ctx);
    rope_backward(ctx);
    convert_vec(ctx);
    check_targets(ctx);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
#else
int main(void) {
    printf("test_nvrtc_steps: skipped (built without the CUDA toolkit)\n");
    return 0;
}
#endif
