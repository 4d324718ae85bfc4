/* test_memory_gpu.c - the backend's 2-D copies and zero fills
 * (src/cuda/memory.c), which the layer and the LM head use for staging:
 *
 *   rectangles     host -> device, device -> device, device -> host and
 *                  zero fills of rows x width bytes between buffers of
 *                  different pitches; every byte of every buffer compared
 *                  with a host model, so the bytes between and after the
 *                  rows must stay as they were. Once whole, once in one-row
 *                  pieces (a small max_pitch stands in for the driver's
 *                  2 GiB limit). The host destination is pinned memory for
 *                  half the limits (there the driver's copy is
 *                  asynchronous, so the host's compare right after the call
 *                  tests the call's wait), pageable for the others.
 *   past 2 GiB     one row of 2^31 + 12291 bytes (the driver refuses such a
 *                  pitch): copied device to device and zeroed with the
 *                  default limit; windows at its start, across 2^31 and at
 *                  its end compared, the bytes after it untouched.
 *
 *   describe       coda_context_describe lists every device without
 *                  retaining its primary context (first, before anything
 *                  in the process touches a GPU): each device's context is
 *                  inactive after it, and device 0's is active once a coda
 *                  call opens it, so the check can see a retained one.
 *
 * Random bytes, never all zeros. Needs a CUDA GPU with 5 GiB free; the
 * output ends with "N checks, 0 failures". */
#include "harness.h"

#ifdef CODA_WITH_CUDA
#include "gpu/cuda_check.h"
#include "core/context.h"
#include "cuda/backend.h"

#include <dlfcn.h>

static coda_context_t *ctx;
static h_rng rng;

static void random_bytes(unsigned char *p, size_t n) { rng_fill_bytes(&rng, p, n); }

/* rows x width bytes from src (pitch sp) into dst (pitch dp), on the host. */
static void model_copy(unsigned char *dst, size_t dp, const unsigned char *src, size_t sp, size_t width,
                       size_t rows) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * dp, src + r * sp, width);
}

static void model_zero(unsigned char *dst, size_t dp, size_t width, size_t rows) {
    for (size_t r = 0; r < rows; r++) memset(dst + r * dp, 0, width);
}

/* The device buffer equals the host model, byte for byte. */
static void check_device(const void *dev, const unsigned char *want, size_t n, const char *what, size_t rows,
                         size_t width, size_t max_pitch) {
    unsigned char *got = malloc(n);
    if (!got) exit(1);
    CUDA_OK(cudaMemcpy(got, dev, n, cudaMemcpyDeviceToHost));
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != want[i]) bad = i;
    CHECK(bad == n, "%s, %zu rows x %zu bytes, max_pitch %zu: byte %zu of %zu differs", what, rows, width, max_pitch,
          bad, n);
    free(got);
}

#define GUARD 64 /* bytes after the last row */

static void rectangles(size_t rows, size_t width, size_t pad, size_t max_pitch, int pinned) {
    size_t sp = width + pad, d1p = width + 2 * pad + 8, d2p = width + (pad ? pad + 3 : 0), hp = width + pad + 1;
    size_t sn = rows * sp + GUARD, n1 = rows * d1p + GUARD, n2 = rows * d2p + GUARD, nh = rows * hp + GUARD;
    unsigned char *src = malloc(sn), *m1 = malloc(n1), *m2 = malloc(n2), *host = NULL, *mh = malloc(nh);
    if (pinned) CUDA_OK(cudaMallocHost((void **)&host, nh));
    else host = malloc(nh);
    if (!src || !m1 || !m2 || !host || !mh) exit(1);
    random_bytes(src, sn);
    random_bytes(m1, n1);
    random_bytes(m2, n2);
    random_bytes(host, nh);
    memcpy(mh, host, nh);
    void *d1, *d2;
    CUDA_OK(cudaMalloc(&d1, n1));
    CUDA_OK(cudaMalloc(&d2, n2));
    CUDA_OK(cudaMemcpy(d1, m1, n1, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d2, m2, n2, cudaMemcpyHostToDevice));

    CHECK_OK(coda__cuda_copy_2d_pieces(ctx, 0, d1, d1p, 0, src, sp, 1, width, rows, NULL, max_pitch, "h2d"));
    model_copy(m1, d1p, src, sp, width, rows);
    check_device(d1, m1, n1, "host -> device", rows, width, max_pitch);

    CHECK_OK(coda__cuda_copy_2d_pieces(ctx, 0, d2, d2p, 0, d1, d1p, 0, width, rows, NULL, max_pitch, "d2d"));
    model_copy(m2, d2p, m1, d1p, width, rows);
    check_device(d2, m2, n2, "device -> device", rows, width, max_pitch);

    CHECK_OK(coda__cuda_copy_2d_pieces(ctx, 0, host, hp, 1, d2, d2p, 0, width, rows, NULL, max_pitch, "d2h"));
    model_copy(mh, hp, m2, d2p, width, rows);
    CHECK(memcmp(host, mh, nh) == 0, "device -> host (%s), %zu rows x %zu bytes, max_pitch %zu: differs",
          pinned ? "pinned" : "pageable", rows, width, max_pitch);

    CHECK_OK(coda__cuda_zero_2d_pieces(ctx, 0, d1, d1p, width, rows, NULL, max_pitch, "zero"));
    model_zero(m1, d1p, width, rows);
    check_device(d1, m1, n1, "zero fill", rows, width, max_pitch);

    CUDA_OK(cudaFree(d1));
    CUDA_OK(cudaFree(d2));
    if (pinned) CUDA_OK(cudaFreeHost(host));
    else free(host);
    free(src), free(m1), free(m2), free(mh);
}

/* The GUARD device bytes at dev all still `fill`? */
static int guard_kept(const unsigned char *dev, unsigned char fill) {
    unsigned char tail[GUARD];
    CUDA_OK(cudaMemcpy(tail, dev, GUARD, cudaMemcpyDeviceToHost));
    for (int i = 0; i < GUARD; i++)
        if (tail[i] != fill) return 0;
    return 1;
}

/* One row longer than the driver's largest pitch, with the default limit. */
static void past_2gib(void) {
    /* windows at the start, across 2^31 and at the end, apart from each other */
    const size_t W = 4096, width = ((size_t)1 << 31) + 3 * W + 3;
    const size_t at[3] = {0, ((size_t)1 << 31) - W / 2, width - W};
    unsigned char *d1, *d2;
    CHECK(at[0] + W <= at[1] && at[1] + W <= at[2], "past 2 GiB: the test's windows overlap");
    if (cudaMalloc((void **)&d1, width + GUARD) != cudaSuccess) d1 = NULL;
    if (!d1 || cudaMalloc((void **)&d2, width + GUARD) != cudaSuccess) {
        printf("past 2 GiB: skipped (no 4.1 GiB free on the GPU)\n");
        (void)cudaGetLastError();
        if (d1) CUDA_OK(cudaFree(d1));
        return;
    }
    unsigned char win[3][4096], got[4096];
    CUDA_OK(cudaMemset(d1, 0x5a, width + GUARD));
    CUDA_OK(cudaMemset(d2, 0xc3, width + GUARD));
    for (int w = 0; w < 3; w++) {
        random_bytes(win[w], W);
        /* no byte equal to a fill (0, 0x5a, 0xc3): a byte the copy or the
         * zero fill missed always shows */
        for (size_t i = 0; i < W; i++)
            if (win[w][i] == 0 || win[w][i] == 0x5a || win[w][i] == 0xc3) win[w][i] = 0x96;
        CUDA_OK(cudaMemcpy(d1 + at[w], win[w], W, cudaMemcpyHostToDevice));
    }
    CHECK_OK(coda__cuda_copy_2d(ctx, 0, d2, width, 0, d1, width, 0, width, 1, NULL, "d2d 2 GiB"));
    CUDA_OK(cudaDeviceSynchronize());
    for (int w = 0; w < 3; w++) {
        CUDA_OK(cudaMemcpy(got, d2 + at[w], W, cudaMemcpyDeviceToHost));
        CHECK(memcmp(got, win[w], W) == 0, "past 2 GiB: copy, window at %zu differs", at[w]);
    }
    CHECK(guard_kept(d2 + width, 0xc3), "past 2 GiB: copy wrote past the row");

    CHECK_OK(coda__cuda_zero_2d(ctx, 0, d2, width, width, 1, NULL, "zero 2 GiB"));
    CUDA_OK(cudaDeviceSynchronize());
    for (int w = 0; w < 3; w++) {
        CUDA_OK(cudaMemcpy(got, d2 + at[w], W, cudaMemcpyDeviceToHost));
        int zero = 1;
        for (size_t i = 0; i < W; i++) zero &= got[i] == 0;
        CHECK(zero, "past 2 GiB: zero fill, window at %zu not zero", at[w]);
    }
    CHECK(guard_kept(d2 + width, 0xc3), "past 2 GiB: zero fill wrote past the row");
    printf("past 2 GiB: one row of %zu bytes copied and zeroed\n", width);
    CUDA_OK(cudaFree(d1));
    CUDA_OK(cudaFree(d2));
}

/* Whether device i's primary context is active, asked of the driver itself
 * (cuDevicePrimaryCtxGetState does not create one); -1 if it cannot say. */
static int primary_active(int i) {
    static CUresult (*get_state)(CUdevice, unsigned int *, int *);
    static CUresult (*get_device)(CUdevice *, int);
    if (!get_state || !get_device) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return -1;
        get_state = (CUresult(*)(CUdevice, unsigned int *, int *))dlsym(lib, "cuDevicePrimaryCtxGetState");
        get_device = (CUresult(*)(CUdevice *, int))dlsym(lib, "cuDeviceGet");
        if (!get_state || !get_device) return -1;
    }
    CUdevice dev;
    unsigned int flags;
    int active = -1;
    if (get_device(&dev, i) != CUDA_SUCCESS || get_state(dev, &flags, &active) != CUDA_SUCCESS) return -1;
    return active;
}

static void describe_opens_nothing(void) {
    char text[4096];
    CHECK_OK(coda_context_describe(ctx, text, sizeof text));
    int n = ctx->cuda->device_count;
    for (int i = 0; i < n; i++)
        CHECK(primary_active(i) == 0, "after describe, device %d's primary context is %d (want 0: inactive)", i,
              primary_active(i));
    CHECK(strstr(text, "cuda:0 ") != NULL, "describe lists device 0:\n%s", text);
    coda_cuda_device_t *d;
    CHECK_OK(coda__cuda_device(ctx, 0, &d));
    CHECK(primary_active(0) == 1, "once opened, device 0's primary context is %d (want 1)", primary_active(0));
    printf("describe: %d device(s) listed, no primary context retained by it\n", n);
}

int main(void) {
    rng = rng_new(58);
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    describe_opens_nothing();
    static const size_t rows[] = {1, 3, 17}, widths[] = {1, 63, 64, 200, 1000}, pads[] = {0, 5, 300};
    static const size_t limits[] = {64, 100, 4096, CODA__CUDA_MAX_PITCH};
    for (size_t r = 0; r < 3; r++)
        for (size_t w = 0; w < 5; w++)
            for (size_t p = 0; p < 3; p++)
                for (size_t l = 0; l < 4; l++) rectangles(rows[r], widths[w], pads[p], limits[l], (int)(l & 1));
    printf("rectangles: 3 row counts x 5 widths x 3 pitches x 4 limits (host pinned for 2 of them), each byte as "
           "modelled\n");
    past_2gib();
    coda_context_free(ctx);
    TEST_MAIN_END();
}
#else
int main(void) {
    printf("test_memory_gpu: built without CUDA\n");
    return 0;
}
#endif
