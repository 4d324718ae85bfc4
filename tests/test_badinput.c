/* test_badinput.c - bad arguments to coda_gemm, coda_gemm_epilogue,
 * coda_choose_tiling and the finishing steps: each returns the right status
 * with a message naming the problem, and leaves every buffer the caller owns
 * byte-identical (all buffers are snapshotted before and compared after). */
#include "harness.h"

/* ---- buffers under watch ---- */
#define MAX_BUF 32
static struct { void *p; size_t n; unsigned char *copy; } g_buf[MAX_BUF];
static int g_nbuf;

static void *watched(size_t bytes, h_rng *r) {
    unsigned char *p = h_alloc(bytes + 64);
    for (size_t i = 0; i < bytes + 64; i++) p[i] = (unsigned char)(rng_uniform(r) * 127 + 128);
    g_buf[g_nbuf].p = p;
    g_buf[g_nbuf].n = bytes + 64;
    g_buf[g_nbuf].copy = h_alloc(bytes + 64);
    g_nbuf++;
    return p;
}
static void snap(void) { for (int i = 0; i < g_nbuf; i++) memcpy(g_buf[i].copy, g_buf[i].p, g_buf[i].n); }
static int unchanged(void) {
    for (int i = 0; i < g_nbuf; i++)
        if (memcmp(g_buf[i].copy, g_buf[i].p, g_buf[i].n) != 0) return 0;
    return 1;
}

/* The call fails with `st`, its message mentions `word`, nothing changed. */
#define BAD(call, st, word)                                                              \
    do {                                                                                 \
        snap();                                                                          \
        CHECK_STATUS(call, st);                                                          \
        CHECK(strstr(coda_last_error(), word) != NULL, "%s: message '%s' lacks '%s'", #call, \
              coda_last_error(), word);                                                  \
        CHECK(unchanged(), "%s: a caller's buffer changed", #call);                      \
    } while (0)

static coda_context_t *ctx;

/* Host memory labelled CUDA: fine for checks that stop before any device
 * work, and for backends that refuse CUDA tensors; never run it where a GPU
 * backend would really use the pointers. The refusal may be UNSUPPORTED (not
 * implemented) or DEVICE (no device), depending on the build. */
#define FAKE_CUDA(call)                                                              \
    do {                                                                             \
        if (coda_context_has_cuda(ctx)) break;                                       \
        snap();                                                                      \
        coda_status_t fc_s = (call);                                                 \
        CHECK(fc_s == CODA_ERR_UNSUPPORTED || fc_s == CODA_ERR_DEVICE, "%s -> %s: %s", #call, \
              coda_status_name(fc_s), coda_last_error());                            \
        CHECK(strstr(coda_last_error(), "CUDA") != NULL, "%s: message '%s' lacks 'CUDA'", #call, \
              coda_last_error());                                                    \
        CHECK(unchanged(), "%s: a caller's buffer changed", #call);                  \
    } while (0)

enum { M = 37, N = 40, K = 24, TM = 16, TN = 16, MT = 3, NT = 3 };

static void bad_gemm(h_rng *r) {
    void *A = watched(M * K * 2, r), *B = watched(N * K * 2, r), *C = watched(M * N * 4, r);
    const coda_tensor_t a = coda_tensor_2d(A, CODA_BF16, M, K), b = coda_tensor_2d(B, CODA_BF16, N, K),
                        c = coda_tensor_2d(C, CODA_F32, M, N);
    coda_tensor_t x, y;
    /* the good call works (then restore C) */
    snap();
    x = c;
    CHECK_OK(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &x, 1, 0, NULL));
    memcpy(C, g_buf[2].copy, M * N * 4);

    x = c;
    BAD(coda_gemm(NULL, CODA_LAYOUT_NT, &a, &b, &x, 1, 0, NULL), CODA_ERR_INVALID_ARG, "ctx");
    BAD(coda_gemm(ctx, (coda_layout_t)3, &a, &b, &x, 1, 0, NULL), CODA_ERR_INVALID_ARG, "layout");
    BAD(coda_gemm(ctx, (coda_layout_t)-1, &a, &b, &x, 1, 0, NULL), CODA_ERR_INVALID_ARG, "layout");
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, NULL, &b, &x, 1, 0, NULL), CODA_ERR_INVALID_ARG, "a");
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, NULL, &x, 1, 0, NULL), CODA_ERR_INVALID_ARG, "b");
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, NULL, 1, 0, NULL), CODA_ERR_INVALID_ARG, "c");
    y = a; y.data = NULL;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_INVALID_ARG, "a");
    y = a; y.dtype = (coda_dtype_t)99;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_DTYPE, "a");
    y = b; y.dtype = CODA_F16;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &y, &x, 1, 0, NULL), CODA_ERR_DTYPE, "b");
    y = c; y.dtype = CODA_I32;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &y, 1, 0, NULL), CODA_ERR_DTYPE, "c");
    y = a; y.ndim = 3; y.shape[2] = 1; y.stride[2] = 2; y.stride[1] = 2; y.stride[0] = 2 * K;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_SHAPE, "2-D");
    y = a; y.ndim = 0;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_SHAPE, "a");
    y = a; y.shape[1] = K - 8; /* K disagrees */
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_SHAPE, "K");
    BAD(coda_gemm(ctx, CODA_LAYOUT_NN, &a, &b, &x, 1, 0, NULL), CODA_ERR_SHAPE, "K");
    y = c; y.shape[0] = M - 1;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &y, 1, 0, NULL), CODA_ERR_SHAPE, "c");
    y = c; y.shape[1] = N - 8; y.stride[0] = (N - 8) * 4;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &y, 1, 0, NULL), CODA_ERR_SHAPE, "c");
    y = a; y.shape[0] = -3;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_SHAPE, "a");
    y = a; y.data = (char *)A + 1; /* misaligned */
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_STRIDE, "align");
    y = c; y.data = (char *)C + 2;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &y, 1, 0, NULL), CODA_ERR_STRIDE, "c");
    y = a; y.stride[1] = 4;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_STRIDE, "a");
    y = a; y.stride[0] = 2 * K - 2; /* rows overlap */
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_STRIDE, "a");
    y = b; y.stride[0] = 3;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &y, &x, 1, 0, NULL), CODA_ERR_STRIDE, "b");
    y = c; y.stride[0] = -(int64_t)N * 4;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &y, 1, 0, NULL), CODA_ERR_STRIDE, "c");
    /* c aliasing a or b: an f32 (M', N) view over their bytes */
    {
        /* a real overlap: C's second half is B */
        void *big = watched((size_t)(M * N * 4 + N * K * 2), r);
        coda_tensor_t bb = coda_tensor_2d((char *)big + M * N * 4 - 64, CODA_BF16, N, K);
        coda_tensor_t cc = coda_tensor_2d(big, CODA_F32, M, N);
        BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &bb, &cc, 1, 0, NULL), CODA_ERR_OVERLAP, "overlap");
        coda_tensor_t aa = coda_tensor_2d((char *)big + 128, CODA_BF16, M, K);
        BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &aa, &b, &cc, 1, 0, NULL), CODA_ERR_OVERLAP, "overlap");
    }
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &x, NAN, 0, NULL), CODA_ERR_INVALID_ARG, "alpha");
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &x, 1, INFINITY, NULL), CODA_ERR_INVALID_ARG, "beta");
    y = b; y.device = CODA_DEVICE_CUDA;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &y, &x, 1, 0, NULL), CODA_ERR_DEVICE, "device");
    y = c; y.device = CODA_DEVICE_CUDA;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &y, 1, 0, NULL), CODA_ERR_DEVICE, "device");
    y = a; y.device = (coda_device_t)7;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_DEVICE, "device");
    /* a CPU tensor's device_index is 0: another would pass as "on another
     * device" the overlap checks skip (a review had a failed
     * coda_llama_backward write into weights passed as gradients so) */
    y = c; y.device_index = 1;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &a, &b, &y, 1, 0, NULL), CODA_ERR_DEVICE, "device_index");
    y = a; y.device_index = -1;
    BAD(coda_gemm(ctx, CODA_LAYOUT_NT, &y, &b, &x, 1, 0, NULL), CODA_ERR_DEVICE, "device_index");
}

/* A program with every kind of argument. */
static const char prog_text[] =
    "program all\n"
    "in  x  tile bf16\n"
    "in  r  row f32\n"
    "in  tg row i32\n"
    "in  g  col bf16 half\n"
    "in  sc scalar\n"
    "out h  tile bf16\n"
    "out ss rowsum\n"
    "out cs colsum\n"
    "out L  lse\n"
    "a  = acc\n"
    "xv = load x\n"
    "rv = load r\n"
    "s  = fma a rv xv\n"
    "store h s\n"
    "reduce ss s\n"
    "e  = even a\n"
    "gv = load g\n"
    "eg = mul e gv\n"
    "reduce cs a\n"
    "t  = load tg\n"
    "sv = load sc\n"
    "z  = mul eg sv\n"
    "lse L z t\n";

static void bad_epilogue(h_rng *rng) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse(prog_text, &p));
    void *A = watched(M * K * 2, rng), *B = watched(N * K * 2, rng);
    void *X = watched(M * N * 2, rng), *R = watched(M * 4, rng), *TG = watched(M * 4, rng),
         *G = watched(N / 2 * 2, rng), *H = watched(M * N * 2, rng), *SS = watched(M * NT * 4, rng),
         *CS = watched(N * MT * 4, rng), *L = watched(M * NT * 3 * 4, rng);
    for (int i = 0; i < M; i++) ((int32_t *)TG)[i] = i % N;
    const coda_tensor_t a = coda_tensor_2d(A, CODA_BF16, M, K), b = coda_tensor_2d(B, CODA_BF16, N, K);
    enum { BX, BR, BTG, BG, BSC, BH, BSS, BCS, BL, NB };
    coda_binding_t good[NB] = {
        {"x", coda_tensor_2d(X, CODA_BF16, M, N), 0},       {"r", coda_tensor_1d(R, CODA_F32, M), 0},
        {"tg", coda_tensor_1d(TG, CODA_I32, M), 0},         {"g", coda_tensor_1d(G, CODA_BF16, N / 2), 0},
        {"sc", {0}, 0.5f},                                  {"h", coda_tensor_2d(H, CODA_BF16, M, N), 0},
        {"ss", coda_tensor_2d(SS, CODA_F32, M, NT), 0},     {"cs", coda_tensor_2d(CS, CODA_F32, N, MT), 0},
        {"L", coda_tensor_3d(L, CODA_F32, M, NT, 3), 0},
    };
    const coda_tiling_t tl = {TM, TN};
    coda_binding_t bd[NB + 1];
#define RESET() memcpy(bd, good, sizeof good)
    RESET();
    snap();
    CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL));
    /* outputs were written; take the written state as the baseline from here on */

    BAD(coda_gemm_epilogue(NULL, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "ctx");
    BAD(coda_gemm_epilogue(ctx, (coda_layout_t)5, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "layout");
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, NULL, &b, p, bd, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "a");
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NN, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "K");
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, NULL, bd, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "program");
    {
        coda_program_t *q = NULL;
        REQUIRE_OK(coda_program_new("unfinished", &q));
        coda_program_arg(q, "h", CODA_OUT_TILE, CODA_BF16, CODA_SPACE_FULL, CODA_REDUCE_SUM);
        BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, q, bd, 1, &tl, NULL), CODA_ERR_VERIFY, "verified");
        coda_program_free(q);
    }
    {   /* a refused coda_program_new leaves NULL in *out (coda.h), so a
         * caller's coda_program_free afterwards is harmless (a review: the
         * pointer was left as it was) */
        coda_program_t *q = (coda_program_t *)&a;
        BAD(coda_program_new("1bad", &q), CODA_ERR_INVALID_ARG, "name");
        CHECK(q == NULL, "coda_program_new with a bad name left *out %p", (void *)q);
        q = (coda_program_t *)&a;
        BAD(coda_program_new("this_name_is_far_longer_than_thirty_one", &q), CODA_ERR_INVALID_ARG, "name");
        CHECK(q == NULL, "coda_program_new with a long name left *out %p", (void *)q);
        if (q == NULL) coda_program_free(q); /* harmless on NULL; never on the stack address it was */
    }
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, -1, &tl, NULL), CODA_ERR_INVALID_ARG, "n_bindings");
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, NULL, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "bindings");
    RESET(); bd[3].name = NULL;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "name");
    /* unbound, duplicate, unknown */
    RESET();
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB - 1, &tl, NULL), CODA_ERR_BINDING, "'L'");
    RESET(); bd[BSC] = bd[BR];
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_BINDING, "'r'");
    RESET(); bd[NB] = bd[BH];
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB + 1, &tl, NULL), CODA_ERR_BINDING, "twice");
    RESET(); bd[NB] = bd[BH]; bd[NB].name = "nosuch";
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB + 1, &tl, NULL), CODA_ERR_BINDING, "nosuch");
    /* shapes, one per argument kind */
    RESET(); bd[BX].tensor.shape[1] = N - 2;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'x'");
    RESET(); bd[BR].tensor.shape[0] = M + 1;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'r'");
    RESET(); bd[BG].tensor.shape[0] = N; /* g is in the half space: N/2 */
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'g'");
    RESET(); bd[BH].tensor = coda_tensor_1d(H, CODA_BF16, M * N);
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'h'");
    RESET(); bd[BSS].tensor.shape[1] = NT - 1;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'ss'");
    RESET(); bd[BCS].tensor = coda_tensor_2d(CS, CODA_F32, MT, N); /* transposed */
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'cs'");
    RESET(); bd[BL].tensor = coda_tensor_3d(L, CODA_F32, M, NT, 2);
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'L'");
    RESET(); bd[BL].tensor = coda_tensor_2d(L, CODA_F32, M, NT * 3);
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "'L'");
    /* partial shapes follow the tiling: the default (128 x 128) gives 1 tile, not 3 */
    RESET();
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, NULL, NULL), CODA_ERR_SHAPE, "'ss'");
    /* dtypes */
    RESET(); bd[BX].tensor = coda_tensor_2d(X, CODA_F32, M, N / 2); bd[BX].tensor.shape[1] = N;
    bd[BX].tensor.stride[0] = N * 4;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_DTYPE, "'x'");
    RESET(); bd[BR].tensor.dtype = CODA_I32;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_DTYPE, "'r'");
    RESET(); bd[BTG].tensor.dtype = CODA_F32;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_DTYPE, "'tg'");
    RESET(); bd[BSS].tensor = coda_tensor_2d(SS, CODA_BF16, M, NT);
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_DTYPE, "'ss'");
    RESET(); bd[BH].tensor.dtype = CODA_FP8_E4M3; bd[BH].tensor.stride[1] = 1; bd[BH].tensor.stride[0] = N;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_DTYPE, "'h'");
    /* strides and pointers */
    RESET(); bd[BX].tensor.data = (char *)X + 1;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_STRIDE, "'x'");
    RESET(); bd[BH].tensor.stride[0] = 2 * N - 2;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_STRIDE, "'h'");
    RESET(); bd[BSS].tensor.stride[1] = 8;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_STRIDE, "'ss'");
    RESET(); bd[BL].tensor.data = NULL;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "'L'");
    /* scalars */
    RESET(); bd[BSC].scalar = NAN;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_INVALID_ARG, "'sc'");
    /* devices */
    RESET(); bd[BG].tensor.device = CODA_DEVICE_CUDA;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_DEVICE, "'g'");
    {
        coda_tensor_t ca = a, cb = b;
        ca.device = cb.device = CODA_DEVICE_CUDA;
        RESET();
        for (int i = 0; i < NB; i++) bd[i].tensor.device = CODA_DEVICE_CUDA;
        FAKE_CUDA(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &ca, &cb, p, bd, NB, &tl, NULL));
    }
    /* tilings */
    const coda_tiling_t bad_tl[] = {{-1, 16}, {16, -2}, {16, 3}, {16, 1}, {2000, 16}, {16, 2048}};
    for (int i = 0; i < 6; i++) {
        RESET();
        BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &bad_tl[i], NULL), CODA_ERR_INVALID_ARG, "tiling");
    }
    /* odd N with a half-space program */
    {
        coda_tensor_t b2 = coda_tensor_2d(B, CODA_BF16, N - 1, K);
        RESET();
        bd[BX].tensor.shape[1] = N - 1;
        BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b2, p, bd, NB, &tl, NULL), CODA_ERR_SHAPE, "odd");
    }
    /* overlaps: output on an input, two outputs, output on A */
    RESET(); bd[BH].tensor.data = (char *)X + 2 * N; /* one row off x: not its view (checked, never touched) */
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_OVERLAP, "'x'");
    RESET(); bd[BH].tensor = bd[BX].tensor; bd[BH].tensor.stride[0] = 2 * N + 16; /* x's base, other rows */
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_OVERLAP, "'x'");
    RESET(); bd[BCS].tensor.data = (char *)SS + 8;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_OVERLAP, "overlaps");
    RESET(); bd[BSS].tensor.data = (char *)A + 4;
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_OVERLAP, "overlaps a");
    RESET(); bd[BTG].tensor.data = (char *)L + 12; /* an input inside an output */
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL), CODA_ERR_OVERLAP, "'tg'");
    /* an output bound to the very view of a tile input of its space: an
     * update in place, the same bits as out of place */
    {
        uint16_t *x0 = malloc(M * N * 2), *h_out = malloc(M * N * 2);
        memcpy(x0, X, M * N * 2);
        RESET();
        CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL));
        memcpy(h_out, H, M * N * 2);
        RESET(); bd[BH].tensor = bd[BX].tensor;
        CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, NB, &tl, NULL));
        CHECK(!memcmp(X, h_out, M * N * 2), "h written over x (in place) differs from h out of place");
        CHECK(memcmp(x0, h_out, M * N * 2) != 0, "the in-place test's h equals its x: it tests nothing");
        memcpy(X, x0, M * N * 2);
        free(x0), free(h_out);
    }
    /* ... but not when the program stores into the output before it loads
     * the input: the CPU runs a tile's statements in order, and the load
     * would read the stored values (a review's repro gave z = acc where z
     * should be x). Refused, nothing written; out of place it runs. */
    {
        coda_program_t *q = NULL;
        CHECK_OK(coda_program_parse("program store_first\n"
                                    "in  x tile f32\n"
                                    "out y tile f32\n"
                                    "out z tile f32\n"
                                    "a = acc\n"
                                    "store y a\n"
                                    "b = load x\n"
                                    "store z b\n",
                                    &q));
        enum { QM = 4, QN = 4, QK = 2 };
        float qa[QM * QK], qb[QN * QK], qx[QM * QN], qy[QM * QN], qz[QM * QN], qx0[QM * QN];
        for (int i = 0; i < QM * QK; i++) qa[i] = 1.0f;
        for (int i = 0; i < QN * QK; i++) qb[i] = 1.0f + (float)i;
        for (int i = 0; i < QM * QN; i++) qx[i] = qx0[i] = 100.0f + (float)i, qz[i] = -1.0f;
        coda_tensor_t ta = coda_tensor_2d(qa, CODA_F32, QM, QK), tb = coda_tensor_2d(qb, CODA_F32, QN, QK);
        coda_binding_t qbd[3] = {{"x", coda_tensor_2d(qx, CODA_F32, QM, QN), 0},
                                 {"y", coda_tensor_2d(qx, CODA_F32, QM, QN), 0},
                                 {"z", coda_tensor_2d(qz, CODA_F32, QM, QN), 0}};
        if (q) {
            BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &ta, &tb, q, qbd, 3, NULL, NULL), CODA_ERR_OVERLAP, "'x'");
            CHECK(!memcmp(qx, qx0, sizeof qx), "a refused in-place call wrote its output");
            qbd[1].tensor = coda_tensor_2d(qy, CODA_F32, QM, QN);
            CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &ta, &tb, q, qbd, 3, NULL, NULL));
            CHECK(!memcmp(qz, qx0, sizeof qz), "out of place, z is x");
        }
        coda_program_free(q);
    }
#undef RESET
    coda_program_free(p);
}

/* A block and a layer on CUDA where none can be made (no GPU: want
 * CODA_ERR_DEVICE; no CUDA backend in the build: CODA_ERR_UNSUPPORTED):
 * refused with a message naming the call (the driver's own does not), and
 * NULL left in *out. */
static void cuda_objects_refused(coda_status_t want) {
    coda_llama_config_t c = {.d = 16, .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .ffn = 24, .vocab = 40,
                             .eps = 1e-5f, .rope_theta = 10000.0f};
    int sentinel;
    coda_block_t *B = (coda_block_t *)&sentinel;
    BAD(coda_block_create(ctx, &c, CODA_DEVICE_CUDA, &B), want, "coda_block_create: ");
    CHECK(B == NULL, "coda_block_create: a failed call leaves NULL in *out");
    coda_llama_t *L = (coda_llama_t *)&sentinel;
    BAD(coda_llama_create(ctx, &c, 2, 8, CODA_DEVICE_CUDA, &L), want, "coda_llama_create: ");
    CHECK(L == NULL, "coda_llama_create: a failed call leaves NULL in *out");
}

static void bad_tiling(void) {
    coda_tiling_t t = {77, 99};
    BAD(coda_choose_tiling(NULL, CODA_DEVICE_CPU, CODA_LAYOUT_NT, 8, 8, 8, &t), CODA_ERR_INVALID_ARG, "ctx");
    BAD(coda_choose_tiling(ctx, CODA_DEVICE_CPU, CODA_LAYOUT_NT, 8, 8, 8, NULL), CODA_ERR_INVALID_ARG, "tiling");
    BAD(coda_choose_tiling(ctx, (coda_device_t)4, CODA_LAYOUT_NT, 8, 8, 8, &t), CODA_ERR_INVALID_ARG, "device");
    BAD(coda_choose_tiling(ctx, CODA_DEVICE_CPU, (coda_layout_t)9, 8, 8, 8, &t), CODA_ERR_INVALID_ARG, "layout");
    BAD(coda_choose_tiling(ctx, CODA_DEVICE_CPU, CODA_LAYOUT_NT, -1, 8, 8, &t), CODA_ERR_SHAPE, "negative");
    CHECK(t.tile_m == 77 && t.tile_n == 99, "coda_choose_tiling wrote its output on failure");
#ifdef CODA_WITH_CUDA
    /* a query that succeeds keeps the last failing call's message, whether
     * or not a device can be opened (with none it assumes 132 SMs) */
    BAD(coda_choose_tiling(ctx, CODA_DEVICE_CPU, CODA_LAYOUT_NT, -1, 8, 8, &t), CODA_ERR_SHAPE, "negative");
    char before[1024];
    snprintf(before, sizeof before, "%s", coda_last_error());
    CHECK_OK(coda_choose_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_TN, 1000, 264, 7, &t));
    CHECK(strcmp(coda_last_error(), before) == 0, "coda_choose_tiling (CUDA) succeeded but changed the last error: '%s'",
          coda_last_error());
    char desc[4096];
    CHECK_OK(coda_context_describe(ctx, desc, sizeof desc));
    CHECK(strcmp(coda_last_error(), before) == 0, "coda_context_describe succeeded but changed the last error: '%s'",
          coda_last_error());
    (void)coda_context_has_cuda(ctx);
    CHECK(strcmp(coda_last_error(), before) == 0, "coda_context_has_cuda changed the last error: '%s'",
          coda_last_error());
    if (!coda_context_has_cuda(ctx)) cuda_objects_refused(CODA_ERR_DEVICE);
    CHECK(t.tile_m >= 1 && t.tile_n >= 2 && t.tile_n % 2 == 0, "default tiling %dx%d", t.tile_m, t.tile_n);
#else /* a build without the CUDA backend says so, CODA_ERR_UNSUPPORTED in every call */
    BAD(coda_choose_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_TN, 1000, 264, 7, &t), CODA_ERR_UNSUPPORTED, "no CUDA");
    cuda_objects_refused(CODA_ERR_UNSUPPORTED);
#endif
    /* per program: a NULL program is coda_choose_tiling; an unverified one
     * is refused; on CUDA every program gets the plain GEMM's tile on a big
     * problem (the cooperative 256) */
    coda_tiling_t u = {77, 99};
    CHECK_OK(coda_choose_program_tiling(ctx, CODA_DEVICE_CPU, CODA_LAYOUT_NT, 64, 64, 64, NULL, &u));
    CHECK_OK(coda_choose_tiling(ctx, CODA_DEVICE_CPU, CODA_LAYOUT_NT, 64, 64, 64, &t));
    CHECK(u.tile_m == t.tile_m && u.tile_n == t.tile_n, "NULL program: %dx%d vs %dx%d", u.tile_m, u.tile_n,
          t.tile_m, t.tile_n);
    coda_program_t *unverified = NULL;
    if (coda_program_new("unverified", &unverified) == CODA_OK) {
        u.tile_m = 77;
        BAD(coda_choose_program_tiling(ctx, CODA_DEVICE_CPU, CODA_LAYOUT_NT, 8, 8, 8, unverified, &u),
            CODA_ERR_INVALID_ARG, "not verified");
        CHECK(u.tile_m == 77, "coda_choose_program_tiling wrote its output on failure");
        coda_program_free(unverified);
    }
#ifdef CODA_WITH_CUDA
    coda_program_t *heavy = NULL, *light = NULL;
    REQUIRE_OK(coda_program_parse(coda_builtin_program("swiglu_bwd"), &heavy));
    REQUIRE_OK(coda_program_parse(coda_builtin_program("resid_add"), &light));
    CHECK_OK(coda_choose_program_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, 8192, 8192, 8192, heavy, &u));
    CHECK(u.tile_n == 256, "swiglu_bwd on CUDA at 8192: tile_n %d, want 256 (cooperative)", u.tile_n);
    CHECK_OK(coda_choose_program_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, 8192, 8192, 8192, light, &u));
    CHECK(u.tile_n == 256, "resid_add on CUDA at 8192: tile_n %d, want 256 (cooperative)", u.tile_n);
    coda_program_free(heavy);
    coda_program_free(light);
#endif
}

static void bad_finish(h_rng *r) {
    void *P = watched(M * NT * 4, r), *O = watched(M * 4, r), *P3 = watched(M * NT * 3 * 4, r),
         *TG = watched(M * 4, r), *LS = watched(M * 4, r), *LO = watched(M * 4, r);
    const coda_tensor_t p = coda_tensor_2d(P, CODA_F32, M, NT), o = coda_tensor_1d(O, CODA_F32, M);
    const coda_tensor_t p3 = coda_tensor_3d(P3, CODA_F32, M, NT, 3), tg = coda_tensor_1d(TG, CODA_I32, M),
                        ls = coda_tensor_1d(LS, CODA_F32, M), lo = coda_tensor_1d(LO, CODA_F32, M);
    coda_tensor_t x = o, y, z = ls, w = lo;
    BAD(coda_finish_reduce(NULL, CODA_REDUCE_SUM, &p, &x, NULL), CODA_ERR_INVALID_ARG, "ctx");
    BAD(coda_finish_reduce(ctx, (coda_reduce_t)3, &p, &x, NULL), CODA_ERR_INVALID_ARG, "op");
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_SUM, NULL, &x, NULL), CODA_ERR_INVALID_ARG, "partials");
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &p, NULL, NULL), CODA_ERR_INVALID_ARG, "out");
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &p3, &x, NULL), CODA_ERR_SHAPE, "partials");
    y = p; y.dtype = CODA_BF16; y.stride[1] = 2; y.stride[0] = NT * 2;
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &y, &x, NULL), CODA_ERR_DTYPE, "f32");
    y = o; y.shape[0] = M - 1;
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_MAX, &p, &y, NULL), CODA_ERR_SHAPE, "out");
    y = o; y.dtype = CODA_I32;
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_MAX, &p, &y, NULL), CODA_ERR_DTYPE, "out");
    y = coda_tensor_1d((char *)P + 4, CODA_F32, M);
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_SUMSQ, &p, &y, NULL), CODA_ERR_OVERLAP, "overlaps");
    y = o; y.data = (char *)O + 2;
    BAD(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &p, &y, NULL), CODA_ERR_STRIDE, "out");
    {
        coda_tensor_t cp = p, co = o;
        cp.device = co.device = CODA_DEVICE_CUDA;
        FAKE_CUDA(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &cp, &co, NULL));
        BAD(coda_finish_reduce(ctx, CODA_REDUCE_SUM, &cp, &x, NULL), CODA_ERR_DEVICE, "device");
        FAKE_CUDA(coda_finish_rstd(ctx, &cp, 64, 1e-5f, &co, NULL));
    }

    BAD(coda_finish_rstd(NULL, &p, 64, 1e-5f, &x, NULL), CODA_ERR_INVALID_ARG, "ctx");
    BAD(coda_finish_rstd(ctx, &p, 0, 1e-5f, &x, NULL), CODA_ERR_INVALID_ARG, "d");
    BAD(coda_finish_rstd(ctx, &p, 64, NAN, &x, NULL), CODA_ERR_INVALID_ARG, "eps");
    BAD(coda_finish_rstd(ctx, &p, 64, -1.0f, &x, NULL), CODA_ERR_INVALID_ARG, "eps");
    BAD(coda_finish_rstd(ctx, &p, 64, 1e-5f, NULL, NULL), CODA_ERR_INVALID_ARG, "rstd");
    y = o; y.shape[0] = M + 1;
    BAD(coda_finish_rstd(ctx, &p, 64, 1e-5f, &y, NULL), CODA_ERR_SHAPE, "rstd");

    BAD(coda_finish_lse(NULL, &p3, &tg, -100, &z, &w, NULL), CODA_ERR_INVALID_ARG, "ctx");
    BAD(coda_finish_lse(ctx, &p, &tg, -100, &z, &w, NULL), CODA_ERR_SHAPE, "partials");
    y = coda_tensor_3d(P3, CODA_F32, M, NT * 3 / 2, 2);
    BAD(coda_finish_lse(ctx, &y, &tg, -100, &z, &w, NULL), CODA_ERR_SHAPE, "partials");
    BAD(coda_finish_lse(ctx, &p3, NULL, -100, &z, &w, NULL), CODA_ERR_INVALID_ARG, "targets");
    y = tg; y.dtype = CODA_F32;
    BAD(coda_finish_lse(ctx, &p3, &y, -100, &z, &w, NULL), CODA_ERR_DTYPE, "targets");
    BAD(coda_finish_lse(ctx, &p3, &tg, -100, NULL, &w, NULL), CODA_ERR_INVALID_ARG, "lse");
    BAD(coda_finish_lse(ctx, &p3, &tg, -100, &z, NULL, NULL), CODA_ERR_INVALID_ARG, "loss");
    y = lo; y.shape[0] = 1;
    BAD(coda_finish_lse(ctx, &p3, &tg, -100, &z, &y, NULL), CODA_ERR_SHAPE, "loss");
    BAD(coda_finish_lse(ctx, &p3, &tg, -100, &z, &z, NULL), CODA_ERR_OVERLAP, "overlap");
    y = coda_tensor_1d(TG, CODA_F32, M);
    BAD(coda_finish_lse(ctx, &p3, &tg, -100, &y, &w, NULL), CODA_ERR_OVERLAP, "overlaps");
    y = coda_tensor_1d((char *)P3 + 64, CODA_F32, M);
    BAD(coda_finish_lse(ctx, &p3, &tg, -100, &z, &y, NULL), CODA_ERR_OVERLAP, "overlaps");
    {
        coda_tensor_t c1 = p3, c2 = tg, c3 = ls, c4 = lo;
        c1.device = c2.device = c3.device = c4.device = CODA_DEVICE_CUDA;
        FAKE_CUDA(coda_finish_lse(ctx, &c1, &c2, -100, &c3, &c4, NULL));
        BAD(coda_finish_lse(ctx, &c1, &c2, -100, &c3, &w, NULL), CODA_ERR_DEVICE, "device");
    }
}

/* An lse picks its target by comparing f32 column numbers, exact below
 * 2^24 (CODA_LSE_MAX_COLS). At exactly 2^24 columns the pick of the last
 * columns is right; one column pair more is refused and nothing is written
 * (a review found 2^24 + 4 columns picking row 0's value for row 1's target
 * 2^25 on the CPU, and i32 targets above 2^24 rounded to a neighbour). */
static void wide_lse(h_rng *r) {
    static const char text[] = "in t row i32\nout part lse\na = acc\ntv = load t\nlse part a tv\n";
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse(text, &p));
    const int64_t n_ok = CODA_LSE_MAX_COLS, n_bad = CODA_LSE_MAX_COLS + 2, tn = 1024, tm = 2;
    uint16_t *A = h_alloc(2 * 2), *B = h_alloc((size_t)n_bad * 2);
    int32_t *T = watched(2 * 4, r);
    float *part = watched((size_t)2 * ((n_bad + tn - 1) / tn) * 3 * 4, r);
    A[0] = A[1] = 0x3f80; /* 1.0: acc[i][j] = B[j] */
    for (int64_t j = 0; j < n_bad; j++) B[j] = (uint16_t)(0x3f80 + (j * 7919) % 997); /* distinct neighbours */
    T[0] = (int32_t)(n_ok - 1), T[1] = (int32_t)(n_ok - 2);
    const coda_tiling_t tl = {tm, tn};
    const coda_tensor_t a = coda_tensor_2d(A, CODA_BF16, 2, 1);
    coda_tensor_t b = coda_tensor_2d(B, CODA_BF16, n_bad, 1);
    coda_binding_t bd[2] = {{"t", coda_tensor_1d(T, CODA_I32, 2), 0},
                            {"part", coda_tensor_3d(part, CODA_F32, 2, (n_bad + tn - 1) / tn, 3), 0}};
    BAD(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, 2, &tl, NULL), CODA_ERR_SHAPE, "CODA_LSE_MAX_COLS");
    b.shape[0] = n_ok;
    bd[1].tensor = coda_tensor_3d(part, CODA_F32, 2, n_ok / tn, 3);
    CHECK_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &a, &b, p, bd, 2, &tl, NULL));
    const int64_t last = n_ok / tn - 1; /* the tile with both targets */
    for (int i = 0; i < 2; i++) {
        float want = h_bf2f(B[T[i]]), got = part[(i * (n_ok / tn) + last) * 3 + 2];
        CHECK(got == want, "row %d: pick of column %d = %g, expected %g", i, T[i], got, want);
        CHECK(part[(i * (n_ok / tn) + last - 1) * 3 + 2] == 0.0f, "row %d: a pick outside the target's tile", i);
    }
    free(A), free(B);
    coda_program_free(p);
}

int main(void) {
    coda_context_options_t o = {2, NULL};
    REQUIRE_OK(coda_context_create(&o, &ctx));
    h_rng r = rng_new(2024);
    bad_gemm(&r);
    bad_epilogue(&r);
    wide_lse(&r);
    bad_tiling();
    bad_finish(&r);
    /* frees of NULL are harmless */
    coda_context_free(NULL);
    coda_program_free(NULL);
    coda_context_free(ctx);
    for (int i = 0; i < g_nbuf; i++) { free(g_buf[i].p); free(g_buf[i].copy); }
    TEST_MAIN_END();
}
