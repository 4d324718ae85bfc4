/* test_epilogue_gpu.c - fused GEMMs on the GPU against the CPU backend.
 *
 *   test_epilogue_gpu          every built-in program and one program per
 *                              primitive class, odd shapes, three layouts
 *   test_epilogue_gpu small    a few small cases (for compute-sanitizer)
 *
 * Each case binds every argument of the program to fresh random data (row
 * targets are column indices, some -100), runs the program on the CPU and on
 * the GPU with the same tiling (tile_m 128, tile_n the GPU's), with every
 * output poisoned with NaN first, and compares every output element by
 * element, partials included: relative Frobenius error <= 4e-3 (bf16 outputs
 * may differ by one rounding step where the f32 values differ in the last
 * bits: the GEMMs sum in different orders) and no NaN the CPU did not
 * produce. A second GPU run must give identical bits. The epilogue
 * overlap's cases (kernels/gemm_overlap.cuh) also compare every output bit
 * for bit with the ordinary kernel on rounded accumulators, and check that
 * each launch took the overlap. Needs an sm_90a GPU. */
#include "harness.h"

#include "gpu/cuda_check.h"
#include "tuning.h"
#include "program/ir.h" /* coda__program_acc_bf16 */


static coda_context_t *ctx;
static uint64_t seed = 7;

/* Programs beyond the built-ins: one per primitive class (as test_codegen.c). */
static const char *const extra_programs[] = {
    "program maps\nin s scalar\nout y tile f32\na = acc\nc = const 0.5\nb = mul a c\nss = load s\n"
    "d = add b ss\ne = exp d\nj = sin a\nk = cos a\nl = tanh a\nm = sigmoid a\nn = silu a\no = dsilu a\n"
    "q = round_bf16 a\nr = neg a\nt = abs r\nu = sub t q\nv = div u e\nw = max v o\nx = min w n\n"
    "z2 = lt a c\nz4 = fma x m l\nz5 = select z2 z4 k\nri = rowidx\nci = colidx\nc7 = const 7\n"
    "z6 = mod ri c7\nz8 = mul ci c\nz9 = add z6 z8\nz7 = add z5 z9\nstore y z7\n",
    "program pairs\nout h tile bf16 half\nout d tile f32 double\nout s tile bf16\na = acc\ne = even a\n"
    "o = odd a\nm = mul e o\nstore h m\nw = swap a\nx = interleave a w\nstore d x\nstore s w\n",
    "program loads\nin r row bf16\nin g col f32\nin gh col bf16 half\nin x tile bf16\n"
    "in z tile f32 double\nout y tile bf16\nout yh tile f32 half\na = acc\nb = load r\nc = load g\n"
    "d = load x\nf = fma a b c\ng2 = add f d\nstore y g2\nzz = load z\nze = even zz\nzo = odd zz\n"
    "q = mul ze zo\nqe = even q\nk = load gh\nl = mul qe k\nstore yh l\n",
    /* ring and slab together: x and w through the stage ring, u through the warp's slab */
    "program ringslab\nin x tile bf16\nin w tile bf16\nin u tile bf16\nout y tile bf16\na = acc\nv = load x\n"
    "q = load w\nz = load u\ns = add a v\nt = mul s q\nr = add t z\nstore y r\n",
    /* an f32 input in the double space: the whole slab (no room in the ring) */
    "program zslab\nin z tile f32 double\nout y tile f32\na = acc\nzz = load z\nze = even zz\nzo = odd zz\n"
    "q = mul ze zo\nb = add a q\nstore y b\n",
    "program reductions\nout rs rowsum\nout rm rowmax\nout rq rowsumsq\nout cs colsum\nout cm colmax half\n"
    "out cq colsumsq double\na = acc\nreduce rs a\nreduce rm a\nreduce rq a\nreduce cs a\ne = even a\n"
    "reduce cm e\nx = interleave a a\nreduce cq x\n",
    "program lse\nin t row i32\nin r row f32\nout st lse\na = acc\nrr = load r\nz = mul a rr\n"
    "tt = load t\nlse st z tt\n",
    /* three staged outputs, the f32 one's region off its 1 KiB swizzle
     * period: two leave by TMA, the middle one by vector stores (store plan) */
    "program mixedstore\nout a tile bf16 half\nout b tile f32\nout c tile bf16 half\nx = acc\ne = even x\n"
    "o = odd x\nstore a e\nstore b x\nstore c o\n",
    /* row partials read by the next GEMM: an RMSNorm finished in the epilogue */
    "program rowpart\nin ss rowpart\nin inv scalar\nin eps scalar\nout y tile f32\nout sv tile f32\n"
    "a = acc\ns = load ss\ni = load inv\nm = mul s i\nv = abs m\ne = load eps\nw = add v e\nr = rsqrt w\n"
    "y1 = mul a r\nstore y y1\nstore sv s\n",
};

typedef struct buf {
    coda_tensor_t host, dev;
    size_t bytes;
    void *host_block, *dev_block; /* what to free when the data do not start there (skew_buf) */
} buf_t;

/* Host + device tensors of a shape; host filled with random data of `dt`. */
/* Rows of 2-D tiles padded to 16 bytes (needed when N is odd); the padding
 * starts poisoned on both sides and must stay so. */
static int pad_rows;
/* 1: every 2-D tensor's rows 32 bytes longer still (N16 and ring forms with
 * row strides that are not the row's bytes: the TMA-stored outputs must
 * keep off the poisoned padding) */
static int pad_extra;

static void make_buf(buf_t *b, coda_dtype_t dt, int ndim, const int64_t *shape, h_rng *r, int is_out,
                     int64_t target_w) {
    size_t es = coda_dtype_size(dt);
    int64_t ld = ndim == 2 && (pad_rows || pad_extra)
                     ? ((shape[1] * (int64_t)es + 15) / 16 * 16 + (pad_extra ? 32 : 0)) / (int64_t)es
                     : 0;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (ld) n = shape[0] * ld;
    b->bytes = (size_t)(n ? n : 1) * es;
    b->host_block = b->dev_block = NULL;
    void *h = h_alloc(b->bytes);
    if (is_out) {
        if (dt == CODA_BF16) poison_bf16(h, n);
        else poison_f32(h, n);
    } else if (dt == CODA_BF16) {
        rng_fill_bf16(r, h, n, 1.0f);
    } else if (dt == CODA_I32) {
        for (int64_t i = 0; i < n; i++) {
            float u = rng_uniform(r);
            ((int32_t *)h)[i] = u < -0.8f ? -100 : (int32_t)((u + 1.0f) * 0.5f * (float)(target_w - 1));
        }
    } else {
        rng_fill_f32(r, h, n, 1.0f);
    }
    b->host = ndim == 1 ? coda_tensor_1d(h, dt, shape[0])
            : ndim == 2 ? coda_tensor_2d(h, dt, shape[0], shape[1])
                        : coda_tensor_3d(h, dt, shape[0], shape[1], shape[2]);
    void *d;
    CUDA_OK(cudaMalloc(&d, b->bytes));
    CUDA_OK(cudaMemcpy(d, h, b->bytes, cudaMemcpyHostToDevice));
    if (ld) b->host.stride[0] = ld * (int64_t)es;
    b->dev = b->host;
    b->dev.data = d;
    b->dev.device = CODA_DEVICE_CUDA;
}

/* Move b's data `es` bytes on (host and device): one accumulator pair's
 * elements, so that its base is still aligned for a pair's access but no
 * longer 16-byte aligned. */
static void skew_buf(buf_t *b, size_t es) {
    unsigned char *h = h_alloc(b->bytes + es), *d;
    memcpy(h + es, b->host.data, b->bytes);
    CUDA_OK(cudaMalloc((void **)&d, b->bytes + es));
    CUDA_OK(cudaMemcpy(d + es, b->dev.data, b->bytes, cudaMemcpyDeviceToDevice));
    free(b->host.data);
    CUDA_OK(cudaFree(b->dev.data));
    b->host_block = h;
    b->dev_block = d;
    b->host.data = h + es;
    b->dev.data = d + es;
}

/* Compare GPU output (copied back into `got`) with the CPU's: normalised
 * error at most 4e-3, or else a few rounding flips. The second case: an
 * output whose norm one element dominates (lmhead_bwd's exp of random
 * logits reaches 1e9 and more) fails the first test when that element's
 * bf16 rounding goes the other way on the GPU (a 1e-7 difference in its
 * exp crossing a rounding boundary: measured, |d| = 2^22 at
 * 2^30, one bf16 unit), and so do the f32 sums taken over it. So: every
 * element of a bf16 output within one unit in the last place of the
 * CPU's, every element of an f32 output within 2^-7 relative (a sum over
 * such a flip), and at most 1 in 10^4 (or 2) elements further off than
 * 1e-3 relative. A wrong value, a misplaced tile or a systematic error is
 * still far outside. */
static int compare(const char *what, const coda_tensor_t *cpu, const void *got, size_t bytes) {
    int64_t n = (int64_t)(bytes / coda_dtype_size(cpu->dtype)); /* padding included */
    double num = 0, den = 0, worst_rel = 0;
    int64_t bad_nan = 0, worst = -1, n_far = 0, over_ulp = 0;
    double worst_d = 0;
    for (int64_t i = 0; i < n; i++) {
        float c, g;
        if (cpu->dtype == CODA_BF16) {
            c = h_bf2f(((const uint16_t *)cpu->data)[i]);
            g = h_bf2f(((const uint16_t *)got)[i]);
        } else {
            c = ((const float *)cpu->data)[i];
            g = ((const float *)got)[i];
        }
        if (isnan(c) != isnan(g) || isinf(c) != isinf(g)) {
            bad_nan++;
            continue;
        }
        if (isnan(c) || isinf(c)) continue;
        double d = (double)g - c;
        num += d * d;
        den += (double)c * c;
        if (fabs(d) > worst_d) worst_d = fabs(d), worst = i;
        if (d != 0) {
            double er = fabs(d) / (fabs((double)c) > 1e-30 ? fabs((double)c) : 1e-30);
            if (er > worst_rel) worst_rel = er;
            n_far += er > 1e-3;
            /* one bf16 unit at c: 2^(exponent of c - 7) */
            if (cpu->dtype == CODA_BF16 && fabs(d) > ldexp(1.0, ilogb(c) - 7)) over_ulp++;
        }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    int flips = rel > 4e-3 && n_far <= (n / 10000 > 2 ? n / 10000 : 2) &&
                (cpu->dtype == CODA_BF16 ? over_ulp == 0 : worst_rel <= 1.0 / 128);
    int ok = bad_nan == 0 && (rel <= 4e-3 || flips);
    CHECK(ok, "%s: rel err %.3g, %lld NaN/inf mismatches, worst |d| %.3g at %lld, worst element rel %.3g, "
              "%lld elements off by > 1e-3", what, rel, (long long)bad_nan, worst_d, (long long)worst, worst_rel,
          (long long)n_far);
    printf("    %-14s rel %.2e%s\n", what, rel, !ok ? "  FAIL" : flips ? " (rounding flips: bf16 within 1 unit, f32 within 2^-7)" : "");
    return ok;
}

/* What a test needs of argument i of p for an (m, n) GEMM cut by tl: its
 * name, kind and space, and the tensor it is bound to (a scalar gets an
 * unused one-element one). */
typedef struct arg_desc {
    const char *name;
    coda_arg_kind_t kind;
    coda_space_t sp;
    coda_dtype_t dt;
    int nd;
    int64_t sh[3];
    int out; /* an output (tile, partials, lse) */
} arg_desc_t;

static arg_desc_t describe_arg(const coda_program_t *p, int i, int64_t m, int64_t n, const coda_tiling_t *tl) {
    arg_desc_t d;
    coda_reduce_t red;
    REQUIRE_OK(coda_program_arg_info(p, i, &d.name, &d.kind, &d.dt, &d.sp, &red));
    REQUIRE_OK(coda_program_arg_shape(p, i, m, n, tl, &d.nd, d.sh, &d.dt));
    if (d.nd == 0) d.nd = 1, d.sh[0] = 1;
    d.out = d.kind >= CODA_OUT_TILE && d.kind <= CODA_OUT_LSE;
    return d;
}

/* 1: run fused GEMMs on the cooperative schedule (CODA_GEMM_CFG 0 or 1,
 * by tile width) instead of the default: ping-pong for tile_n 128,
 * cooperative for 256 */
static int cooperative;

/* >= 0: run fused GEMMs on this configuration (the split stream-K tail's
 * cases, which need 2-CTA clusters on a small problem) */
static int force_cfg = -1;

/* 1: A[0][0] is NaN, so accumulator row 0 is NaN in every column: the
 * reductions must carry it into the row-0 partials and the column
 * partials of the first row tile, on the GPU as on the CPU. */
static int nan_a;

/* 1: column vectors one pair's elements off 16-byte alignment (still
 * aligned for a pair's access; the generated code then reads them from
 * global memory instead of copying them into shared memory: the even-N
 * form). An f32 double-space vector (16 bytes a pair) stays aligned. */
static int skew_cols;

/* 1: every case's outputs also compared bit for bit with the ordinary
 * kernel's on accumulators rounded to bf16 (CODA_EPI_ROUND_ACC), which is
 * what the epilogue overlap (kernels/gemm_overlap.cuh) must give: the
 * overlap cases below set the tuning so that their launches take it. The
 * CPU comparison then holds only for programs that round the accumulator
 * themselves (coda__program_acc_bf16): the others see it rounded here and
 * not on the CPU (lmhead_bwd's exp(z - lse) by 2-9%). */
static int overlap_bits;

/* How many of the ne elements (esz bytes each) of x and y differ in any
 * bit; *first: the first that does (ne if none). */
static size_t elements_differ(const void *x, const void *y, size_t ne, size_t esz, size_t *first) {
    size_t n = 0;
    *first = ne;
    for (size_t e = 0; e < ne; e++)
        if (memcmp((const char *)x + e * esz, (const char *)y + e * esz, esz) != 0) {
            if (*first == ne) *first = e;
            n++;
        }
    return n;
}

/* The outputs of p's run (in bufs) against the overlap's reference. */
static void overlap_reference(const coda_program_t *p, int na, buf_t *bufs, const coda_binding_t *bg,
                              coda_layout_t layout, const buf_t *A, const buf_t *B, const coda_tiling_t *tl,
                              int64_t m, int64_t n) {
    void *ran[32] = {0};
    for (int i = 0; i < na; i++)
        if (describe_arg(p, i, m, n, tl).out) {
            ran[i] = h_alloc(bufs[i].bytes);
            CUDA_OK(cudaMemcpy(ran[i], bufs[i].dev.data, bufs[i].bytes, cudaMemcpyDeviceToHost));
        }
    coda__tuning_t saved = coda__get_tuning(ctx), t = saved;
    t.epi_overlap = 0;
    snprintf(t.extra_opts, sizeof t.extra_opts, "-DCODA_EPI_ROUND_ACC=1");
    tune_set(ctx, &t);
    CHECK_OK(coda_gemm_epilogue(ctx, layout, &A->dev, &B->dev, p, bg, na, tl, NULL));
    CUDA_OK(cudaDeviceSynchronize());
    tune_set(ctx, &saved);
    for (int i = 0; i < na; i++) {
        if (!ran[i]) continue;
        void *ref = h_alloc(bufs[i].bytes);
        CUDA_OK(cudaMemcpy(ref, bufs[i].dev.data, bufs[i].bytes, cudaMemcpyDeviceToHost));
        size_t esz = coda_dtype_size(bufs[i].host.dtype), ne = bufs[i].bytes / esz, first;
        size_t ndiff = elements_differ(ran[i], ref, ne, esz, &first);
        CHECK(ndiff == 0, "%s: the overlap differs from the ordinary kernel on rounded accumulators in %zu of %zu "
                          "elements, first at element %zu", bg[i].name, ndiff, ne, first);
        printf("    %-14s bit for bit with the rounded ordinary kernel%s\n", bg[i].name, ndiff ? "  FAIL" : "");
        free(ref);
        free(ran[i]);
    }
}

/* tile_n 0: the backend's choice; else force that tile width */
static void run_case(const char *text, coda_layout_t layout, int64_t m, int64_t n, int64_t k, int tile_n) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse(text, &p));
    h_rng r = rng_new(seed++);
    pad_rows = n % 2 != 0;
    coda_tiling_t tl;
    tune_cfg(ctx, -1);
    REQUIRE_OK(coda_choose_tiling(ctx, CODA_DEVICE_CUDA, layout, m, n, k, &tl));
    if (tile_n) tl.tile_n = tile_n;
    if (cooperative) tune_cfg_str(ctx, tl.tile_n == 256 ? "0" : "1");
    if (force_cfg >= 0) tune_cfg(ctx, force_cfg);
    /* debugging: CODA_TEST_ONLY=program runs that program alone;
     * CODA_TEST_CFG=digit forces a configuration of the tile width */
    const char *only = getenv("CODA_TEST_ONLY");
    if (only && (strncmp(text, "program ", 8) != 0 || strncmp(text + 8, only, strlen(only)) != 0 ||
                 text[8 + strlen(only)] != '\n')) {
        coda_program_free(p);
        return;
    }
    const char *force = getenv("CODA_TEST_CFG");
    if (force) tune_cfg_str(ctx, force);

    /* operands */
    int64_t ash[2] = {layout == CODA_LAYOUT_TN ? k : m, layout == CODA_LAYOUT_TN ? m : k};
    int64_t bsh[2] = {layout == CODA_LAYOUT_NT ? n : k, layout == CODA_LAYOUT_NT ? k : n};
    buf_t A, B;
    make_buf(&A, CODA_BF16, 2, ash, &r, 0, 0);
    make_buf(&B, CODA_BF16, 2, bsh, &r, 0, 0);
    if (nan_a) {
        ((uint16_t *)A.host.data)[0] = 0x7fc0; /* bf16 NaN; element [0][0] in every layout */
        CUDA_OK(cudaMemcpy(A.dev.data, A.host.data, 2, cudaMemcpyHostToDevice));
    }

    int na = coda_program_num_args(p);
    buf_t bufs[32];
    coda_binding_t bc[32], bg[32];
    for (int i = 0; i < na; i++) {
        arg_desc_t d = describe_arg(p, i, m, n, &tl);
        if (d.kind == CODA_IN_ROWPART) { /* any T: around the registers' 16 (CG_ROWPART_REGS), 1 and 40 */
            static const int64_t ts[] = {7, 1, 16, 17, 40, 33};
            static int next;
            d.sh[1] = ts[next++ % 6];
        }
        make_buf(&bufs[i], d.dt, d.nd, d.sh, &r, d.out, n);
        if (skew_cols && d.kind == CODA_IN_COL)
            skew_buf(&bufs[i], coda_dtype_size(d.dt) * (d.sp == CODA_SPACE_HALF ? 1 : d.sp == CODA_SPACE_FULL ? 2 : 4));
        bc[i].name = bg[i].name = d.name;
        bc[i].tensor = bufs[i].host;
        bg[i].tensor = bufs[i].dev;
        bc[i].scalar = bg[i].scalar = d.kind == CODA_IN_SCALAR ? 0.25f + rng_uniform(&r) * 0.1f : 0.0f;
    }
    CHECK_OK(coda_gemm_epilogue(ctx, layout, &A.host, &B.host, p, bc, na, &tl, NULL));
    char title[40];
    snprintf(title, sizeof title, "%.*s", (int)strcspn(text, "\n"), text);
    printf("  %-28s %s m %lld n %lld k %lld tile %dx%d\n", title, layout == 0 ? "NT" : layout == 1 ? "NN" : "TN",
           (long long)m, (long long)n, (long long)k, tl.tile_m, tl.tile_n);
    fflush(stdout); /* FAIL lines (stderr) of the GPU run and its checks land under their case */
    const uint64_t overlaps = atomic_load(&ctx->overlap_launches);
    coda_status_t s = coda_gemm_epilogue(ctx, layout, &A.dev, &B.dev, p, bg, na, &tl, NULL);
    CHECK(s == CODA_OK, "GPU run: %s", coda_last_error());
    if (overlap_bits) { /* else the bitwise check below may compare a kernel with itself */
        int took = atomic_load(&ctx->overlap_launches) == overlaps + 1;
        CHECK(took, "the launch did not take the epilogue overlap");
        if (!took && s == CODA_OK) { /* once more with the launch log, which says why (gemm.c, overlap_kernel) */
            const coda__tuning_t saved = coda__get_tuning(ctx);
            coda__tuning_t t = saved;
            t.log_launch = 1;
            tune_set(ctx, &t);
            CHECK_OK(coda_gemm_epilogue(ctx, layout, &A.dev, &B.dev, p, bg, na, &tl, NULL));
            tune_set(ctx, &saved);
        }
    }
    CUDA_OK(cudaDeviceSynchronize());
    if (s == CODA_OK) {
        for (int i = 0; i < na; i++) {
            const char *name = bg[i].name;
            if (!describe_arg(p, i, m, n, &tl).out) continue;
            void *got = h_alloc(bufs[i].bytes), *again = h_alloc(bufs[i].bytes);
            CUDA_OK(cudaMemcpy(got, bufs[i].dev.data, bufs[i].bytes, cudaMemcpyDeviceToHost));
            if (!overlap_bits || coda__program_acc_bf16(p)) compare(name, &bufs[i].host, got, bufs[i].bytes);
            if (strncmp(text, "program rowpart\n", 16) == 0 && strcmp(name, "sv") == 0) /* the sums: same bits */
                CHECK(memcmp(got, bufs[i].host.data, bufs[i].bytes) == 0, "rowpart: GPU sums differ from the CPU's bits");
            /* further runs give the same bits (no atomics, fixed orders);
             * CODA_TEST_REPEAT sets how many (default 1) */
            int reps = getenv("CODA_TEST_REPEAT") ? atoi(getenv("CODA_TEST_REPEAT")) : 1;
            for (int rep = 0; rep < (reps > 0 ? reps : 1); rep++) {
                CHECK_OK(coda_gemm_epilogue(ctx, layout, &A.dev, &B.dev, p, bg, na, &tl, NULL));
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cudaMemcpy(again, bufs[i].dev.data, bufs[i].bytes, cudaMemcpyDeviceToHost));
                size_t esz = coda_dtype_size(bufs[i].host.dtype), ne = bufs[i].bytes / esz, first;
                size_t ndiff = elements_differ(got, again, ne, esz, &first);
                int64_t ld = bufs[i].host.ndim == 2 ? bufs[i].host.stride[0] / (int64_t)esz : 1;
                CHECK(ndiff == 0, "%s: GPU run %d differs from the first in %zu elements, first at row %lld col %lld",
                      name, rep + 2, ndiff, (long long)(first / (size_t)ld), (long long)(first % (size_t)ld));
                if (ndiff) break;
            }
            free(got);
            free(again);
        }
        if (overlap_bits) overlap_reference(p, na, bufs, bg, layout, &A, &B, &tl, m, n);
    }
    for (int i = 0; i < na; i++) {
        free(bufs[i].host_block ? bufs[i].host_block : bufs[i].host.data);
        CUDA_OK(cudaFree(bufs[i].dev_block ? bufs[i].dev_block : bufs[i].dev.data));
    }
    free(A.host.data);
    free(B.host.data);
    CUDA_OK(cudaFree(A.dev.data));
    CUDA_OK(cudaFree(B.dev.data));
    coda_program_free(p);
}

/* A bound tensor whose pointer is host memory (descriptor says CUDA): the
 * launch is refused with CODA_ERR_DEVICE and no output changes. */
static void host_pointer_case(const char *name) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_parse(coda_builtin_program(name), &p));
    h_rng r = rng_new(seed++);
    const int64_t m = 256, n = 512, k = 128;
    pad_rows = 0;
    coda_tiling_t tl;
    REQUIRE_OK(coda_choose_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, m, n, k, &tl));
    int64_t ash[2] = {m, k}, bsh[2] = {n, k};
    buf_t A, B, bufs[16];
    make_buf(&A, CODA_BF16, 2, ash, &r, 0, 0);
    make_buf(&B, CODA_BF16, 2, bsh, &r, 0, 0);
    int na = coda_program_num_args(p);
    coda_binding_t bg[16];
    for (int bad = 0; bad < na; bad++) {
        coda_arg_kind_t bk = CODA_IN_SCALAR;
        for (int i = 0; i < na; i++) {
            arg_desc_t d = describe_arg(p, i, m, n, &tl);
            make_buf(&bufs[i], d.dt, d.nd, d.sh, &r, d.out, n);
            bg[i].name = d.name;
            bg[i].tensor = bufs[i].dev;
            bg[i].scalar = 0.5f;
            if (i == bad) bk = d.kind;
        }
        const char *bn = bg[bad].name;
        if (bk != CODA_IN_SCALAR) {
            bg[bad].tensor.data = bufs[bad].host.data; /* host memory, said to be on cuda:0 */
            coda_status_t s = coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &A.dev, &B.dev, p, bg, na, &tl, NULL);
            CHECK(s == CODA_ERR_DEVICE, "%s: host pointer for '%s' gives %s (%s)", name, bn, coda_status_name(s),
                  coda_last_error());
            CUDA_OK(cudaDeviceSynchronize());
            for (int i = 0; i < na; i++) { /* outputs still poisoned: as they were made */
                if (i == bad) continue;
                void *got = h_alloc(bufs[i].bytes);
                CUDA_OK(cudaMemcpy(got, bufs[i].dev.data, bufs[i].bytes, cudaMemcpyDeviceToHost));
                CHECK(memcmp(got, bufs[i].host.data, bufs[i].bytes) == 0, "%s: refused run changed '%s'", name,
                      bg[i].name);
                free(got);
            }
        }
        for (int i = 0; i < na; i++) {
            free(bufs[i].host.data);
            CUDA_OK(cudaFree(bufs[i].dev.data));
        }
    }
    printf("  %-28s host pointers refused, one argument at a time\n", name);
    free(A.host.data);
    free(B.host.data);
    CUDA_OK(cudaFree(A.dev.data));
    CUDA_OK(cudaFree(B.dev.data));
    coda_program_free(p);
}

/* coda_finish_reduce through views: partials (rows, T) with a row stride
 * of T + 5 elements (rows neither 16-byte aligned nor adjacent), and out a
 * slice of a buffer with GUARDS guard elements before and after it. Every
 * op's GPU bits equal the CPU's, and the guards keep their bits on both.
 * The kernel stages 64 x 64 blocks of partials, so rows and T here
 * straddle them; every third row is all negative, so that a max which took
 * in the zeros the kernel stages past T (or past the last row) would show. */
#define GUARDS 37
static void finish_views_case(int64_t rows, int64_t t) {
    h_rng r = rng_new(seed++);
    const int64_t ld = t + 5, on = rows + 2 * GUARDS;
    const size_t pbytes = (size_t)(rows * ld) * 4, obytes = (size_t)on * 4;
    float *ph = h_alloc(pbytes), *oh = h_alloc(obytes), *got = h_alloc(obytes);
    rng_fill_f32(&r, ph, rows * ld, 1.0f);
    for (int64_t i = 0; i < rows; i += 3)
        for (int64_t j = 0; j < t; j++) ph[i * ld + j] = -fabsf(ph[i * ld + j]) - 1.0f;
    void *pd, *od;
    CUDA_OK(cudaMalloc(&pd, pbytes));
    CUDA_OK(cudaMalloc(&od, obytes));
    CUDA_OK(cudaMemcpy(pd, ph, pbytes, cudaMemcpyHostToDevice));
    coda_tensor_t P[2], O[2];
    for (int b = 0; b < 2; b++) {
        P[b] = coda_tensor_2d(b ? pd : ph, CODA_F32, rows, t);
        P[b].stride[0] = 4 * ld;
        O[b] = coda_tensor_1d((float *)(b ? od : (void *)oh) + GUARDS, CODA_F32, rows);
    }
    P[1].device = O[1].device = CODA_DEVICE_CUDA;
    for (int op = 0; op < 3; op++) {
        for (int64_t i = 0; i < on; i++) oh[i] = (float)(i + 1);
        CUDA_OK(cudaMemcpy(od, oh, obytes, cudaMemcpyHostToDevice));
        CHECK_OK(coda_finish_reduce(ctx, (coda_reduce_t)op, &P[0], &O[0], NULL));
        CHECK_OK(coda_finish_reduce(ctx, (coda_reduce_t)op, &P[1], &O[1], NULL));
        CUDA_OK(cudaMemcpy(got, od, obytes, cudaMemcpyDeviceToHost));
        CHECK(memcmp(got, oh, obytes) == 0, "finish_reduce op %d, %lld x %lld, row stride %lld: GPU bits differ "
              "from CPU's, or a guard was written", op, (long long)rows, (long long)t, (long long)ld);
        int guards = 1;
        for (int64_t i = 0; i < GUARDS; i++)
            guards &= got[i] == (float)(i + 1) && got[on - 1 - i] == (float)(on - i);
        CHECK(guards, "finish_reduce op %d: a guard around out was written", op);
    }
    printf("  finish_reduce, %lld x %lld partials, row stride %lld, out between guards: checked\n",
           (long long)rows, (long long)t, (long long)ld);
    free(ph), free(oh), free(got);
    CUDA_OK(cudaFree(pd));
    CUDA_OK(cudaFree(od));
}
#undef GUARDS

/* Finishing steps on the GPU equal the CPU's bit for bit (same order, no FMA). */
static void finish_case(int64_t rows, int64_t t, int pad) {
    h_rng r = rng_new(seed++);
    pad_rows = pad; /* pad: the partials' rows 16-byte aligned, so T < row stride where 4 T is not */
    int64_t sh2[2] = {rows, t}, sh1[1] = {rows}, sh3[3] = {rows, t, 3};
    buf_t part, out, l3, tg, lse, loss;
    make_buf(&part, CODA_F32, 2, sh2, &r, 0, 0);
    make_buf(&out, CODA_F32, 1, sh1, &r, 1, 0);
    make_buf(&l3, CODA_F32, 3, sh3, &r, 0, 0);
    make_buf(&tg, CODA_I32, 1, sh1, &r, 0, 50);
    make_buf(&lse, CODA_F32, 1, sh1, &r, 1, 0);
    make_buf(&loss, CODA_F32, 1, sh1, &r, 1, 0);
    for (int64_t i = 0; i < rows * t * 3; i += 3) ((float *)l3.host.data)[i + 1] = fabsf(((float *)l3.host.data)[i + 1]) + 0.5f;
    CUDA_OK(cudaMemcpy(l3.dev.data, l3.host.data, l3.bytes, cudaMemcpyHostToDevice));
    float *got = h_alloc(out.bytes), *got2 = h_alloc(out.bytes);
    for (int op = 0; op < 3; op++) {
        CHECK_OK(coda_finish_reduce(ctx, (coda_reduce_t)op, &part.host, &out.host, NULL));
        CHECK_OK(coda_finish_reduce(ctx, (coda_reduce_t)op, &part.dev, &out.dev, NULL));
        CUDA_OK(cudaMemcpy(got, out.dev.data, out.bytes, cudaMemcpyDeviceToHost));
        CHECK(memcmp(got, out.host.data, out.bytes) == 0, "finish_reduce op %d: GPU bits differ from CPU", op);
    }
    CHECK_OK(coda_finish_rstd(ctx, &part.host, 4096, 1e-5f, &out.host, NULL));
    poison_f32(out.host.data, rows);
    CHECK_OK(coda_finish_rstd(ctx, &part.host, 4096, 1e-5f, &out.host, NULL));
    CHECK_OK(coda_finish_rstd(ctx, &part.dev, 4096, 1e-5f, &out.dev, NULL));
    CUDA_OK(cudaMemcpy(got, out.dev.data, out.bytes, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int64_t i = 0; i < rows; i++) {
        float c = ((float *)out.host.data)[i];
        num += (got[i] - c) * (double)(got[i] - c);
        den += (double)c * c;
    }
    CHECK(!(sqrt(num / den) > 1e-6), "finish_rstd: GPU vs CPU rel %.3g", sqrt(num / den));
    CHECK_OK(coda_finish_lse(ctx, &l3.host, &tg.host, -100, &lse.host, &loss.host, NULL));
    CHECK_OK(coda_finish_lse(ctx, &l3.dev, &tg.dev, -100, &lse.dev, &loss.dev, NULL));
    CUDA_OK(cudaMemcpy(got, lse.dev.data, lse.bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got2, loss.dev.data, loss.bytes, cudaMemcpyDeviceToHost));
    num = den = 0;
    for (int64_t i = 0; i < rows; i++) {
        float c = ((float *)lse.host.data)[i], c2 = ((float *)loss.host.data)[i];
        num += (got[i] - c) * (double)(got[i] - c) + (got2[i] - c2) * (double)(got2[i] - c2);
        den += (double)c * c + (double)c2 * c2;
    }
    CHECK(!(sqrt(num / den) > 1e-6), "finish_lse: GPU vs CPU rel %.3g", sqrt(num / den));
    printf("  finishing steps, %lld rows x %lld tiles: checked\n", (long long)rows, (long long)t);
    buf_t *all[] = {&part, &out, &l3, &tg, &lse, &loss};
    for (int i = 0; i < 6; i++) {
        free(all[i]->host.data);
        CUDA_OK(cudaFree(all[i]->dev.data));
    }
    free(got);
    free(got2);
}

int main(int argc, char **argv) {
    int small = argc > 1 && strcmp(argv[1], "small") == 0;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "test_epilogue_gpu: no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    const char *texts[32];
    int nt = 0;
    for (int i = 0; i < (int)(sizeof extra_programs / sizeof extra_programs[0]); i++) texts[nt++] = extra_programs[i];
    for (const char *const *name = coda_builtin_program_names(); *name && nt < 32; name++)
        texts[nt++] = coda_builtin_program(*name);

    /* shapes: M odd and tile-crossing, N a multiple of 8 but not of the
     * tile; N % 16 == 8 runs the generated code's even-N form, N % 16 == 0
     * its N16 form (tile outputs staged through shared memory) */
    static const int64_t shapes[][3] = {{1, 264, 200}, {127, 144, 72}, {1000, 520, 264}, {4096, 272, 136}};
    int nshape = small ? 2 : 4;
    for (int i = 0; i < nt; i++)
        for (int s = 0; s < nshape; s++)
            run_case(texts[i], CODA_LAYOUT_NT, shapes[s][0], shapes[s][1], shapes[s][2], 0);
    /* the 256-wide tile (big problems), every program */
    for (int i = 0; i < nt; i++) {
        run_case(texts[i], CODA_LAYOUT_NT, small ? 127 : 1000, 784, 264, 256);
        if (!small) run_case(texts[i], CODA_LAYOUT_NT, 1000, 520, 264, 256);
    }
    /* ping-pong with several tiles per consumer warpgroup, in 2-CTA clusters */
    for (int i = 0; i < (small ? 1 : nt); i++) run_case(texts[i], CODA_LAYOUT_NT, 4096, 1040, 520, 0);
    /* odd N (the general, branching form of the generated code), for the
     * programs that need no column pairs */
    run_case(extra_programs[0], CODA_LAYOUT_NT, 127, 131, 72, 0);
    run_case(extra_programs[4], CODA_LAYOUT_NT, 1000, 131, 72, 0);
    run_case(coda_builtin_program("resid_norm"), CODA_LAYOUT_NT, 1000, 131, 264, 0);
    run_case(coda_builtin_program("lmhead_lse"), CODA_LAYOUT_NT, 127, 1003, 72, 256);
    /* the other layouts, with a program of every primitive class */
    for (int i = 0; i < (small ? 2 : 5); i++) {
        run_case(texts[i], CODA_LAYOUT_NN, 127, 272, 136, 0);
        run_case(texts[i], CODA_LAYOUT_TN, 264, 136, 1000, 0);
    }
    /* the cooperative schedule (128-row tiles, both warpgroups on each) */
    cooperative = 1;
    for (int i = 0; i < nt; i++) {
        run_case(texts[i], CODA_LAYOUT_NT, small ? 127 : 1000, 528, 264, 0);
        if (!small) run_case(texts[i], CODA_LAYOUT_NT, 4096, 1032, 520, 0);
    }
    run_case(texts[0], CODA_LAYOUT_TN, 264, 136, 1000, 0);
    cooperative = 0;
    /* stream-K forced on (80 tile pairs on 66 clusters: 59 of them cut in
     * two, so most epilogues run on sums handed over between CTAs); then
     * whole units before the tail (144 pairs: 66 whole), with a ring program */
    tune_streamk(ctx, CODA_STREAMK_ON);
    for (int i = 0; i < (small ? 2 : nt); i++) run_case(texts[i], CODA_LAYOUT_NT, 4096, 1032, 520, 256);
    if (!small) {
        run_case(texts[0], CODA_LAYOUT_TN, 4096, 1032, 520, 256);
        run_case(coda_builtin_program("rmsnorm_bwd"), CODA_LAYOUT_NT, 4096, 2304, 264, 256);
    }
    /* the split tail (few waves): 1000 x 1032 on configuration 3 is 20
     * tile pairs; on 6 clusters the last 2 (66 k-blocks) go to 4 ranges of
     * 17, 17, 17 and 15 (S = 2: 33 k-blocks a unit), so range 1 ends in the
     * last unit, whose owner then waits on two contributors */
    force_cfg = 3;
    tune_streamk(ctx, CODA_STREAMK_SPLIT);
    tune_clusters(ctx, 6);
    run_case(coda_builtin_program("rmsnorm_bwd"), CODA_LAYOUT_NT, 1000, 1032, 2104, 256);
    run_case(texts[0], CODA_LAYOUT_TN, 1000, 1032, 2104, 256);
    tune_clusters(ctx, 0);
    force_cfg = -1;
    tune_streamk(ctx, CODA_STREAMK_AUTO);
    tune_cfg(ctx, -1);
    /* the epilogue overlap (kernels/gemm_overlap.cuh), bit for bit against
     * its reference: forced (tuning 1) with tile inputs read from global
     * memory (no_ring: the overlap takes no ring inputs), so that every
     * program takes it (run_case checks that each launch did). Configuration
     * 3 on 2 clusters: several tile pairs a cluster, with 9 k-blocks
     * (batches after k-blocks 0, 1, 2, 3, 5, 6, 7 and 8 of the next tile),
     * 3 (fewer than the 8 batches: all after the last k-block) and 33, the
     * last on 5 tile rows (the last pair's second tile wholly below M);
     * N % 16 == 0 (the N16 form: staged tiles, column vectors in the
     * slab, TMA stores) and 8 (the even form); then the 256 and 128 wide
     * tiles without clusters, more tiles than CTAs; odd N; and the measured
     * rule's own pick (tuning -1), which must take it for gate/up and
     * QKV + RoPE (no ring inputs, no spills) */
    {
        coda__tuning_t t = coda__get_tuning(ctx);
        t.no_ring = 1;
        t.epi_overlap = 1;
        t.streamk = CODA_STREAMK_OFF;
        tune_set(ctx, &t);
        overlap_bits = 1;
        force_cfg = 3;
        tune_clusters(ctx, 2);
        for (int i = 0; i < nt; i++) {
            run_case(texts[i], CODA_LAYOUT_NT, 1000, 1024, 520, 256);
            if (!small) {
                run_case(texts[i], CODA_LAYOUT_NT, 1000, 1032, 520, 256);
                run_case(texts[i], CODA_LAYOUT_NT, 1000, 1024, 136, 256);
                run_case(texts[i], CODA_LAYOUT_NT, 520, 1040, 2104, 256);
            }
        }
        run_case(extra_programs[0], CODA_LAYOUT_NT, 1000, 131, 520, 256);
        run_case(coda_builtin_program("lmhead_lse"), CODA_LAYOUT_NT, 1000, 1003, 520, 256);
        run_case(texts[0], CODA_LAYOUT_TN, 1000, 1032, 520, 256);
        tune_clusters(ctx, 0);
        static const char *const some[] = {"gateup_swiglu_train", "qkv_rope", "rmsnorm_bwd", "lmhead_lse"};
        for (int i = 0; i < (small ? 1 : 4); i++) {
            force_cfg = 0;
            run_case(coda_builtin_program(some[i]), CODA_LAYOUT_NT, 4096, 2320, 520, 256);
            if (!small) run_case(coda_builtin_program(some[i]), CODA_LAYOUT_NT, 4096, 2320, 264, 256);
            force_cfg = 1;
            run_case(coda_builtin_program(some[i]), CODA_LAYOUT_NT, 4096, 1040, 520, 128);
        }
        force_cfg = 3;
        tune_clusters(ctx, 2);
        t = coda__get_tuning(ctx);
        t.no_ring = 0;
        t.epi_overlap = -1;
        tune_set(ctx, &t);
        run_case(coda_builtin_program("gateup_swiglu_train"), CODA_LAYOUT_NT, 1000, 2048, 520, 256);
        run_case(coda_builtin_program("qkv_rope"), CODA_LAYOUT_NT, 1000, 1536, 2104, 256);
        overlap_bits = 0;
        tune_clusters(ctx, 0);
        force_cfg = -1;
        tune_streamk(ctx, CODA_STREAMK_AUTO);
    }
    /* an odd number of row tiles in 2-CTA clusters (33 x 5 and 33 x 9
     * tiles): the last pair's second CTA runs a tile wholly below M, which
     * must store no column partials (a review found it wrote one past
     * the partials' row-tile range) */
    for (int i = 0; i < nt; i++)
        if (strncmp(texts[i], "program reductions\n", 19) == 0 || strncmp(texts[i], "program rmsnorm_bwd\n", 20) == 0) {
            run_case(texts[i], CODA_LAYOUT_NT, 4200, 1032, 136, 256);
            if (!small) run_case(texts[i], CODA_LAYOUT_NT, 4200, 1032, 136, 128);
        }
    /* column vectors off 16-byte alignment: read from global memory (the
     * even-N form) where aligned ones are copied into the slabs */
    skew_cols = 1;
    for (int i = 0; i < nt; i++)
        if (strstr(texts[i], " col ")) {
            run_case(texts[i], CODA_LAYOUT_NT, 127, 784, 72, 256);
            if (!small) run_case(texts[i], CODA_LAYOUT_NT, 1000, 528, 136, 128);
        }
    skew_cols = 0;
    /* NaN in the accumulator: every reduction kind (the column max's
     * shuffles must run in every lane, NaN or not), both tile widths */
    nan_a = 1;
    for (int i = 0; i < nt; i++)
        if (strncmp(texts[i], "program reductions\n", 19) == 0) {
            run_case(texts[i], CODA_LAYOUT_NT, 127, 272, 72, 256);
            run_case(texts[i], CODA_LAYOUT_NT, 127, 272, 72, 128);
        }
    nan_a = 0;
    /* rows longer than their bytes: the TMA-stored outputs of the N16 and
     * ring forms stop at the row's end (the padding stays poisoned) */
    pad_extra = 1;
    for (int i = 0; i < nt; i++) {
        run_case(texts[i], CODA_LAYOUT_NT, small ? 127 : 1000, 784, 264, 256);
        if (!small) {
            cooperative = 1;
            run_case(texts[i], CODA_LAYOUT_NT, 1000, 528, 264, 0);
            cooperative = 0;
        }
    }
    pad_extra = 0;
    if (!small) { /* not under compute-sanitizer (the small set): it reports the refused pointer queries */
        host_pointer_case("rmsnorm_bwd");
        host_pointer_case("swiglu_bwd");
    }
    finish_case(small ? 100 : 5000, 17, 0);
    finish_case(small ? 65 : 2049, 130, 1); /* the 1B block's column partials: 2048 x 128 */
    finish_case(64, 64, 0);
    finish_case(1, 1, 0);
    finish_views_case(small ? 63 : 16385, 33);
    finish_views_case(130, 129);
    coda_context_free(ctx);
    TEST_MAIN_END();
}
