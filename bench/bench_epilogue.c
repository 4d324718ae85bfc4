/* bench_epilogue.c - what a fused epilogue costs over the GEMM alone.
 *
 *   bench_epilogue [sizes...]      default: 2048 4096 8192 (M = N = K); a size
 *                                  MxNxK is that GEMM (the LLaMA-3-1B block's
 *                                  down dgrad: 16384x8192x2048)
 *   CODA_BENCH_AB="-DCODA_PROBE_..." bench_epilogue ...   A/B of a kernel
 *                                  option (a measurement probe,
 *                                  src/cuda/kernels/probes.cuh, or any -D
 *                                  option): each program's fused GEMM as
 *                                  built and with the option, run by run
 *                                  with the plain GEMM (extra column "B ms",
 *                                  and B / A); the option reaches NVRTC
 *                                  through CODA_DEBUG_OPTS, set per run
 *   CODA_BENCH_AB="cfg=4" bench_epilogue ...   A/B of a tile configuration:
 *                                  B runs the fused GEMM with CODA_GEMM_CFG=4
 *                                  (its own tiling, so its own partials)
 *   CODA_BENCH_AB="overlap=0" bench_epilogue ...   A/B of the epilogue
 *                                  overlap (src/cuda/gemm.c): B never (0)
 *                                  or wherever the kernel can (1); A as
 *                                  CODA_DEBUG_OVERLAP says (default: the
 *                                  measured rule)
 *   CODA_BENCH_AB_CHECK=1 (with an option A/B)   also runs A twice and B
 *                                  twice from the same arguments and
 *                                  compares every argument bit for bit
 *                                  ("check ok", or the first differing
 *                                  bytes; exit 1): for options that must
 *                                  not change results. CODA_GEMM_CFG and
 *                                  CODA_STREAMK then steer both sides. The
 *                                  overlap's check: CODA_DEBUG_OVERLAP=0
 *                                  CODA_DEBUG_OPTS=-DCODA_EPI_ROUND_ACC=1
 *                                  CODA_BENCH_AB=overlap=1 (its reference
 *                                  rounds the accumulators as it does)
 *   CODA_BENCH_PROGRAMS="rmsnorm_bwd,resid_norm"   only these programs
 *   CODA_BENCH_FILES="a.coda,b.coda"   also these program files (named by
 *                                  file in the table), bound like the rest
 *   CODA_BENCH_TIMELINE=1 bench_epilogue ...   also one plain and one fused
 *                                  launch built with CODA_PROBE_TIMELINE: per
 *                                  tile of consumer warp 0, the mean wait
 *                                  for the first k-block, k-loop, epilogue
 *                                  and the gap to the next tile (us at the
 *                                  device's nominal clock, which the H200
 *                                  does not hold under load: compare rows,
 *                                  not absolute values). Thread 128 records:
 *                                  in ping-pong that is every other tile;
 *                                  with stream-K each piece counts as a tile
 *
 * For each built-in layer program and each size, in one process: cuBLAS's
 * bf16 GEMM (bf16 out), coda's plain GEMM (coda_gemm, bf16 out), and coda's
 * fused GEMM running the program (coda_gemm_epilogue, every argument bound to
 * random data). Reports milliseconds and fused / plain. CUDA events, 10
 * warm-up runs, median of 50 timed runs; cuBLAS and the plain GEMM are
 * timed run by run in turn, and so are the plain GEMM and each fused one
 * (the plain column of a program row is from that pairing); at 2048 the
 * operands rotate over 4 sets so that timings do not come from L2. Needs an
 * sm_90a GPU. */
#include "harness.h"

#include <cublas_v2.h>
#include "cuda/backend.h" /* CODA_CUDA_GEMM_NCFG */
#include "gpu/cuda_check.h"
#include "tuning.h"


#define WARMUP 10
#define TIMED 50

static coda_context_t *ctx;
static cublasHandle_t blas;

static void *dev_random_bytes(size_t bytes, coda_dtype_t dt, h_rng *r, int64_t target_w) {
    void *h = h_alloc(bytes), *d;
    size_t n = bytes / coda_dtype_size(dt);
    if (dt == CODA_BF16) rng_fill_bf16(r, h, (int64_t)n, 1.0f);
    else if (dt == CODA_I32)
        for (size_t i = 0; i < n; i++) ((int32_t *)h)[i] = (int32_t)((rng_uniform(r) + 1.0f) * 0.5f * (float)(target_w - 1));
    else rng_fill_f32(r, h, (int64_t)n, 1.0f);
    CUDA_OK(cudaMalloc(&d, bytes));
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef enum { RUN_CUBLAS, RUN_PLAIN, RUN_FUSED } run_kind_t;

typedef struct job {
    run_kind_t kind;
    int64_t m, n, k;
    int nsets;
    coda_tensor_t a[4], b[4], c;
    const coda_program_t *p;
    coda_binding_t *bind;
    int nbind;
    coda_tiling_t tl;
    const char *opts; /* CODA_DEBUG_OPTS for this job's runs ("": none) */
    const char *cfg;  /* CODA_GEMM_CFG for this job's runs (NULL: none) */
    int overlap;      /* tuning's epi_overlap for this job's runs (-2: the process's) */
} job_t;

static void run_once(job_t *j, int it);

/* CODA_BENCH_TIMELINE: the kernel's stamps (probes.cuh,
 * CODA_PROBE_TIMELINE): per CTA 8 tiles x 4 clock64 values, then the count. */
#define TL_CTAS 1024
#define TL_PER_CTA 36
static long long *tl_dev;
static double tl_khz;

static void timeline(job_t *j, const char *what) {
    static long long h[TL_CTAS * TL_PER_CTA];
    CUDA_OK(cudaMemset(tl_dev, 0, sizeof h));
    run_once(j, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(h, tl_dev, sizeof h, cudaMemcpyDeviceToHost));
    double sum[4] = {0}, span = 0;
    long tiles = 0, gaps = 0, ctas = 0;
    for (int c = 0; c < TL_CTAS; c++) {
        const long long *t = h + TL_PER_CTA * c;
        /* a CTA with more than 8 tiles: slot 7 holds its last one, so no gap
         * from slot 6 to 7, and the span covers all of them */
        const int all = (int)t[32], n = all < 8 ? all : 8;
        if (n <= 0) continue;
        ctas++;
        for (int i = 0; i < n; i++) {
            sum[0] += t[4 * i + 1] - t[4 * i];
            sum[1] += t[4 * i + 2] - t[4 * i + 1];
            sum[2] += t[4 * i + 3] - t[4 * i + 2];
            if (i + 1 < n && (all <= 8 || i + 1 < 7)) sum[3] += t[4 * i + 4] - t[4 * i + 3], gaps++;
            tiles++;
        }
        span += t[4 * (n - 1) + 3] - t[0];
    }
    if (!tiles) {
        printf("  timeline %-6s: no stamps\n", what);
        return;
    }
    const double us = 1e3 / tl_khz;
    printf("  timeline %-6s: %ld tiles (of each CTA's first 7 and last) on %ld CTAs; per tile: first data %.2f us, k-loop %.2f, epilogue %.2f, "
           "gap %.2f; CTA span %.2f us\n", what, tiles, ctas, sum[0] / tiles * us, sum[1] / tiles * us,
           sum[2] / tiles * us, gaps ? sum[3] / gaps * us : 0.0, span / ctas * us);
}

/* name is one of the comma-separated names of list */
static int listed(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static char run_opts[512]; /* CODA_DEBUG_OPTS as the process started: every job's but B's */

static int env_overlap; /* tuning's epi_overlap as the process started (CODA_DEBUG_OVERLAP) */
/* The job's extra NVRTC options, configuration and overlap, set through the
 * context's tuning (tests/tuning.h) when they change; time_jobs calls this
 * before each run's first event, so nothing of it sits inside a timed run. */
static void use_opts(const job_t *j) {
    static const char *cur, *cur_cfg;
    static int set, cur_ov;
    const char *want = j->opts ? j->opts : run_opts;
    const int ov = j->overlap == -2 ? env_overlap : j->overlap;
    if (!set || want != cur) tune_opts(ctx, want);
    if (!set || j->cfg != cur_cfg) tune_cfg_str(ctx, j->cfg);
    if (!set || ov != cur_ov) tune_overlap(ctx, ov);
    cur = want;
    cur_cfg = j->cfg;
    cur_ov = ov;
    set = 1;
}

/* Random device tensors for every argument of j's program, shaped for
 * j's tiling (ptrs[i]: what to free, or NULL). */
static void bind_args(job_t *j, h_rng *r, coda_binding_t *bind, void **ptrs) {
    const coda_program_t *p = j->p;
    int na = coda_program_num_args(p);
    for (int i = 0; i < na; i++) {
        const char *an;
        coda_arg_kind_t kind;
        coda_dtype_t dt;
        coda_space_t sp;
        coda_reduce_t red;
        REQUIRE_OK(coda_program_arg_info(p, i, &an, &kind, &dt, &sp, &red));
        int nd;
        int64_t sh[3];
        REQUIRE_OK(coda_program_arg_shape(p, i, j->m, j->n, &j->tl, &nd, sh, &dt));
        if (kind == CODA_IN_ROWPART) sh[1] = (j->n + 255) / 256; /* the partials of a GEMM like this one */
        int64_t numel = nd == 0 ? 0 : nd == 1 ? sh[0] : nd == 2 ? sh[0] * sh[1] : sh[0] * sh[1] * sh[2];
        ptrs[i] = numel ? dev_random_bytes((size_t)numel * coda_dtype_size(dt), dt, r, j->n) : NULL;
        if (kind == CODA_IN_ROWPART) { /* sums of squares: positive */
            float *h = h_alloc((size_t)numel * 4);
            for (int64_t e = 0; e < numel; e++) h[e] = 1.0f + 0.5f * rng_uniform(r);
            CUDA_OK(cudaMemcpy(ptrs[i], h, (size_t)numel * 4, cudaMemcpyHostToDevice));
            free(h);
        }
        coda_tensor_t t = nd == 0 ? coda_tensor_1d(NULL, CODA_F32, 0)
                        : nd == 1 ? coda_tensor_1d(ptrs[i], dt, sh[0])
                        : nd == 2 ? coda_tensor_2d(ptrs[i], dt, sh[0], sh[1])
                                  : coda_tensor_3d(ptrs[i], dt, sh[0], sh[1], sh[2]);
        t.device = CODA_DEVICE_CUDA;
        bind[i].name = an;
        bind[i].tensor = t;
        bind[i].scalar = 0.5f;
    }
    j->bind = bind;
    j->nbind = na;
}

/* The bytes of every bound argument, device to host (into h[i]) or back. */
static size_t arg_bytes(const coda_binding_t *b) {
    const coda_tensor_t *t = &b->tensor;
    if (!t->data) return 0;
    size_t n = coda_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d]; /* contiguous: bind_args makes them so */
    return n;
}
static void args_copy(const job_t *j, unsigned char **h, int to_host) {
    for (int i = 0; i < j->nbind; i++) {
        size_t n = arg_bytes(&j->bind[i]);
        if (!n) continue;
        if (!h[i]) h[i] = h_alloc(n);
        if (to_host) CUDA_OK(cudaMemcpy(h[i], j->bind[i].tensor.data, n, cudaMemcpyDeviceToHost));
        else CUDA_OK(cudaMemcpy(j->bind[i].tensor.data, h[i], n, cudaMemcpyHostToDevice));
    }
}
/* Argument by argument, the first byte where x and y differ; prints it
 * under label and returns 1, or 0 when all agree. */
static int args_differ(const job_t *j, unsigned char **x, unsigned char **y, const char *label) {
    for (int i = 0; i < j->nbind; i++) {
        size_t n = arg_bytes(&j->bind[i]);
        for (size_t e = 0; e < n; e++)
            if (x[i][e] != y[i][e]) {
                size_t es = coda_dtype_size(j->bind[i].tensor.dtype), at = e / es, w = (size_t)j->bind[i].tensor.shape[j->bind[i].tensor.ndim - 1];
                size_t diff = 0;
                for (size_t f = e; f < n; f++) diff += x[i][f] != y[i][f];
                char vals[96] = "";
                if (j->bind[i].tensor.dtype == CODA_F32) {
                    float u, v;
                    memcpy(&u, x[i] + at * 4, 4);
                    memcpy(&v, y[i] + at * 4, 4);
                    snprintf(vals, sizeof vals, ": %.9g against %.9g", u, v);
                }
                printf("  check %s: argument %s differs first at element %zu (row %zu, column %zu%s); %zu bytes differ\n",
                       label, j->bind[i].name, at, at / w, at % w, vals, diff);
                return 1;
            }
    }
    return 0;
}

/* CODA_BENCH_AB_CHECK: A twice and B twice from the same arguments; 1 when
 * B differs from A (or either from itself: then the check says nothing). */
static int check_ab(job_t *a, job_t *b) {
    unsigned char *h0[32] = {0}, *ha[32] = {0}, *ha2[32] = {0}, *hb[32] = {0}, *hb2[32] = {0};
    args_copy(a, h0, 1);
    job_t *const order[4] = {a, a, b, b};
    unsigned char **into[4] = {ha, ha2, hb, hb2};
    for (int r = 0; r < 4; r++) {
        args_copy(a, h0, 0);
        run_once(order[r], 0);
        CUDA_OK(cudaDeviceSynchronize());
        args_copy(a, into[r], 1);
    }
    args_copy(a, h0, 0);
    int bad = args_differ(a, ha, ha2, "A vs A (not deterministic)") ||
              args_differ(a, hb, hb2, "B vs B (not deterministic)") || args_differ(a, ha, hb, "A vs B");
    for (int i = 0; i < 32; i++) free(h0[i]), free(ha[i]), free(ha2[i]), free(hb[i]), free(hb2[i]);
    return bad;
}

static void run_once(job_t *j, int it) {
    int s = it % j->nsets;
    use_opts(j);
    if (j->kind == RUN_CUBLAS) {
        /* row-major C (M,N) = A (M,K) B(N,K)^T  ==  col-major C^T = B A^T */
        const float alpha = 1.0f, beta = 0.0f;
        cublasStatus_t st = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)j->n, (int)j->m, (int)j->k, &alpha,
                                         j->b[s].data, CUDA_R_16BF, (int)j->k, j->a[s].data, CUDA_R_16BF, (int)j->k,
                                         &beta, j->c.data, CUDA_R_16BF, (int)j->n, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "cublasGemmEx failed: %d\n", (int)st);
            exit(1);
        }
    } else if (j->kind == RUN_PLAIN) {
        REQUIRE_OK(coda_gemm(ctx, CODA_LAYOUT_NT, &j->a[s], &j->b[s], &j->c, 1.0f, 0.0f, NULL));
    } else {
        REQUIRE_OK(coda_gemm_epilogue(ctx, CODA_LAYOUT_NT, &j->a[s], &j->b[s], j->p, j->bind, j->nbind, &j->tl, NULL));
    }
}

/* Median ms of each of n jobs, timed run by run in turn (job 0, 1, .., 0,
 * 1, ..): the H200's clock drifts under sustained load, and jobs timed in
 * separate blocks would see different clocks. */
static void time_jobs(job_t *const *jobs, int n, float *median) {
    if (n < 1 || n > 4) {
        fprintf(stderr, "time_jobs: %d jobs (1..4)\n", n);
        exit(2);
    }
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    for (int j = 0; j < n; j++)
        for (int i = 0; i < WARMUP; i++) run_once(jobs[j], i);
    CUDA_OK(cudaDeviceSynchronize());
    float ms[4][TIMED];
    for (int i = 0; i < TIMED; i++)
        for (int j = 0; j < n; j++) {
            use_opts(jobs[j]);
            CUDA_OK(cudaEventRecord(e0, NULL));
            run_once(jobs[j], i);
            CUDA_OK(cudaEventRecord(e1, NULL));
            CUDA_OK(cudaEventSynchronize(e1));
            CUDA_OK(cudaEventElapsedTime(&ms[j][i], e0, e1));
        }
    CUDA_OK(cudaEventDestroy(e0));
    CUDA_OK(cudaEventDestroy(e1));
    for (int j = 0; j < n; j++) {
        qsort(ms[j], TIMED, sizeof ms[j][0], cmp_float);
        median[j] = ms[j][TIMED / 2];
    }
}

int main(int argc, char **argv) {
    int64_t sizes[8][3] = {{2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 8192, 8192}};
    int nsizes = 3;
    const char *opts0 = getenv("CODA_DEBUG_OPTS");
    if (opts0) snprintf(run_opts, sizeof run_opts, "%s", opts0);
    /* CODA_BENCH_AB: B is another configuration (cfg=N), or the process's
     * options and the A/B ones */
    const char *ab = getenv("CODA_BENCH_AB");
    if (ab && !*ab) ab = NULL;
    const char *ab_cfg = ab && strncmp(ab, "cfg=", 4) == 0 ? ab + 4 : NULL;
    const char *ab_ov = ab && strncmp(ab, "overlap=", 8) == 0 ? ab + 8 : NULL;
    if (ab_ov && ((ab_ov[0] != '0' && ab_ov[0] != '1') || ab_ov[1])) {
        fprintf(stderr, "CODA_BENCH_AB=overlap=N: N is 0 or 1\n");
        return 2;
    }
    char ab_opts[600] = "";
    if (ab_cfg) {
        /* a configuration gemm.c takes (else B would be A again), and no
         * CODA_GEMM_CFG of the caller's (A's runs unset it) */
        if (ab_cfg[0] < '0' || ab_cfg[0] >= '0' + CODA_CUDA_GEMM_NCFG || ab_cfg[1]) {
            fprintf(stderr, "CODA_BENCH_AB=cfg=N: N is one digit below %d\n", CODA_CUDA_GEMM_NCFG);
            return 2;
        }
        if (getenv("CODA_GEMM_CFG")) {
            fprintf(stderr, "CODA_BENCH_AB=cfg=N: unset CODA_GEMM_CFG (A runs the default configuration)\n");
            return 2;
        }
    } else if (ab && !ab_ov) {
        /* gemm.c takes up to 4 options, each at most 60 characters, and
         * ignores the rest: refuse those rather than time two equal kernels */
        snprintf(ab_opts, sizeof ab_opts, "%s%s%s", run_opts, *run_opts ? " " : "", ab);
        int words = 0;
        for (const char *q = ab_opts; *q;) {
            while (*q == ' ') q++;
            size_t len = strcspn(q, " ");
            if (!len) break;
            if (len > 60 || ++words > 4) {
                fprintf(stderr, "CODA_BENCH_AB: with CODA_DEBUG_OPTS, at most 4 options of 60 characters\n");
                return 2;
            }
            q += len;
        }
    }
    /* CODA_BENCH_AB_CHECK: for an option A/B only (cfg=N has its own
     * tiling and partials); A and B then both run CODA_GEMM_CFG */
    const int ab_check = getenv("CODA_BENCH_AB_CHECK") != NULL;
    if (ab_check && (!ab || ab_cfg)) {
        fprintf(stderr, "CODA_BENCH_AB_CHECK needs CODA_BENCH_AB=\"-D...\" or overlap=N (not cfg=N)\n");
        return 2;
    }
    const char *base_cfg = ab_check ? getenv("CODA_GEMM_CFG") : NULL;
    int checks_failed = 0;
    char tl_opts[600] = "";
    if (getenv("CODA_BENCH_TIMELINE")) {
        CUDA_OK(cudaMalloc((void **)&tl_dev, TL_CTAS * TL_PER_CTA * sizeof(long long)));
        int khz = 0;
        CUDA_OK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        tl_khz = khz;
        snprintf(tl_opts, sizeof tl_opts, "%s%s-DCODA_PROBE_TIMELINE=0x%llx", run_opts, *run_opts ? " " : "",
                 (unsigned long long)(uintptr_t)tl_dev);
    }
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc && nsizes < 8; i++) {
            int64_t *z = sizes[nsizes++];
            long long m, n, k;
            if (sscanf(argv[i], "%lldx%lldx%lld", &m, &n, &k) == 3) z[0] = m, z[1] = n, z[2] = k;
            else z[0] = z[1] = z[2] = atoll(argv[i]);
            if (z[0] < 1 || z[1] < 1 || z[2] < 1) {
                fprintf(stderr, "bench_epilogue: size %s is not N or MxNxK\n", argv[i]);
                return 2;
            }
        }
    }
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    if (!coda_context_has_cuda(ctx)) {
        fprintf(stderr, "bench_epilogue: no usable CUDA device: %s\n", coda_last_error());
        return 1;
    }
    env_overlap = coda__get_tuning(ctx).epi_overlap;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    /* the built-in programs, then CODA_BENCH_FILES="a.coda,b.coda" (a
     * user's programs, named by their file) */
    const char *prog_names[64], *prog_texts[64];
    int n_progs = 0;
    for (const char *const *name = coda_builtin_program_names(); *name && n_progs < 64; name++)
        prog_names[n_progs] = *name, prog_texts[n_progs++] = coda_builtin_program(*name);
    if (h_program_files(getenv("CODA_BENCH_FILES"), prog_names, prog_texts, &n_progs, 64)) return 2;
    h_rng r = rng_new(2026);
    printf("%-20s %6s %10s %10s %10s %8s %8s\n", "program", "size", "cuBLAS ms", "plain ms", "fused ms",
           "fused/pl", "fused/cb");
    for (int si = 0; si < nsizes; si++) {
        const int64_t m = sizes[si][0], n = sizes[si][1], k = sizes[si][2];
        char sz[48]; /* the size column: N, or MxNxK */
        if (m == n && n == k) snprintf(sz, sizeof sz, "%lld", (long long)m);
        else snprintf(sz, sizeof sz, "%lldx%lldx%lld", (long long)m, (long long)n, (long long)k);
        job_t base;
        memset(&base, 0, sizeof base);
        base.m = m, base.n = n, base.k = k;
        base.cfg = base_cfg;
        base.overlap = -2;
        /* operands rotate over 4 sets where one set would sit in L2 */
        base.nsets = (m + n) * k * 2 <= ((int64_t)32 << 20) ? 4 : 1;
        for (int s = 0; s < base.nsets; s++) {
            base.a[s] = coda_tensor_2d(dev_random_bytes((size_t)(m * k * 2), CODA_BF16, &r, 0), CODA_BF16, m, k);
            base.b[s] = coda_tensor_2d(dev_random_bytes((size_t)(n * k * 2), CODA_BF16, &r, 0), CODA_BF16, n, k);
            base.a[s].device = base.b[s].device = CODA_DEVICE_CUDA;
        }
        base.c = coda_tensor_2d(dev_random_bytes((size_t)(m * n * 2), CODA_BF16, &r, 0), CODA_BF16, m, n);
        base.c.device = CODA_DEVICE_CUDA;
        job_t jc = base, jp = base;
        jc.kind = RUN_CUBLAS;
        jp.kind = RUN_PLAIN;
        /* CODA_BENCH_ONLY=program: one plain and one fused launch, for a profiler */
        const char *only = getenv("CODA_BENCH_ONLY");
        const char *progs = getenv("CODA_BENCH_PROGRAMS");
        if (only) {
            run_once(&jp, 0);
            CUDA_OK(cudaDeviceSynchronize());
        }
        float t_cb = 0, t_pl = 0;
        if (!only) {
            job_t *const both[2] = {&jc, &jp};
            float t[2];
            time_jobs(both, 2, t);
            t_cb = t[0];
            t_pl = t[1];
        }
        const double flop = 2.0 * (double)m * (double)n * (double)k;
        printf("%-20s %6s %10.3f %10.3f %10s %8s %8s   (%.0f / %.0f TFLOP/s)\n", "(GEMM alone)", sz, t_cb, t_pl, "",
               "", "", flop / t_cb / 1e9, flop / t_pl / 1e9);
        for (int pi = 0; pi < n_progs; pi++) {
            const char *const *name = &prog_names[pi];
            if (only && strcmp(only, *name) != 0) continue;
            if (progs && !listed(progs, *name)) continue;
            coda_program_t *p = NULL;
            REQUIRE_OK(coda_program_parse(prog_texts[pi], &p));
            job_t jf = base;
            jf.kind = RUN_FUSED;
            jf.p = p;
            use_opts(&jf); /* the tiling follows CODA_GEMM_CFG, which B's runs set */
            REQUIRE_OK(coda_choose_program_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, m, n, k, p, &jf.tl));
            int na = coda_program_num_args(p);
            coda_binding_t bind[32], bind_b[32];
            void *ptrs[32], *ptrs_b[32] = {0};
            bind_args(&jf, &r, bind, ptrs);
            /* B: the same kernel with an option, or another configuration
             * with its own tiling and arguments */
            job_t jb = jf;
            jb.opts = ab_cfg || ab_ov ? NULL : ab_opts;
            if (ab_ov) jb.overlap = ab_ov[0] - '0';
            if (ab_cfg) {
                jb.cfg = ab_cfg;
                use_opts(&jb); /* the tiling follows CODA_GEMM_CFG */
                REQUIRE_OK(coda_choose_program_tiling(ctx, CODA_DEVICE_CUDA, CODA_LAYOUT_NT, m, n, k, p, &jb.tl));
                use_opts(&jf);
                bind_args(&jb, &r, bind_b, ptrs_b);
            }
            float t_f = 0;
            if (only) {
                run_once(&jf, 0);
                CUDA_OK(cudaDeviceSynchronize());
                printf("%s: one plain and one fused launch done\n", *name);
            } else {
                /* the plain GEMM again, run by run with the fused one: the
                 * ratio is what this row is for */
                job_t *const jobs[3] = {&jp, &jf, &jb};
                float t[3];
                time_jobs(jobs, ab ? 3 : 2, t);
                t_pl = t[0];
                t_f = t[1];
                if (ab) printf("%-20s %6s   A/B %s: plain %.3f  A %.3f  B %.3f  B/A %.3f  (A/plain %.3f, B/plain %.3f)\n",
                               *name, sz, ab, t_pl, t_f, t[2], t[2] / t_f, t_f / t_pl, t[2] / t_pl);
            }
            if (ab_check) {
                int bad = check_ab(&jf, &jb);
                printf("%-20s %6s   check %s\n", *name, sz, bad ? "FAILED" : "ok");
                checks_failed += bad;
            }
            if (tl_dev) {
                job_t tp = jp, tf = jf;
                tp.opts = tf.opts = tl_opts;
                timeline(&tp, "plain");
                timeline(&tf, "fused");
            }
            if (!only && !ab) printf("%-20s %6s %10.3f %10.3f %10.3f %8.3f %8.3f  %s\n", *name, sz, t_cb, t_pl, t_f,
                   t_f / t_pl, t_f / t_cb, jf.tl.tile_n == 128 ? "ping-pong 128" : "cooperative 256");
            fflush(stdout);
            for (int i = 0; i < na; i++) {
                if (ptrs[i]) CUDA_OK(cudaFree(ptrs[i]));
                if (ptrs_b[i]) CUDA_OK(cudaFree(ptrs_b[i]));
            }
            coda_program_free(p);
        }
        for (int s = 0; s < base.nsets; s++) {
            CUDA_OK(cudaFree(base.a[s].data));
            CUDA_OK(cudaFree(base.b[s].data));
        }
        CUDA_OK(cudaFree(base.c.data));
    }
    cublasDestroy(blas);
    coda_context_free(ctx);
    if (checks_failed) printf("bench_epilogue: %d checks FAILED\n", checks_failed);
    return checks_failed ? 1 : 0;
}
