/* test_nvrtc.c - every GEMM mainloop variant coda can launch compiles with
 * NVRTC for sm_90a (every configuration and layout; C stored by the
 * mainloop as bf16 or f32, or left to the epilogue as fused GEMMs do; the
 * generated epilogues themselves are compiled by the codegen tests); the
 * attention source compiles at both head dimensions, and the fused
 * attention backward neither spills nor has its wgmma serialised in any
 * of its dq forms; the stream-K rule and the attention backward's layout
 * rule pick what they should. Needs the CUDA toolkit, not a GPU: CI runs
 * it, so an NVRTC regression (or crash) shows there and not in a user's
 * process. */
#include "harness.h"

#ifdef CODA_WITH_CUDA
#include "cuda/backend.h"

#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The stream-K rule (no GPU needed; src/cuda/gemm.c): a tail only from 8
 * whole waves, with at least 1% of the last wave idle, and K <= 8192 but
 * on an H200's memory (4917 GB/s; an H100's 3352, unknown 0). */
static void check_streamk_rule(void) {
    static const struct { int64_t units, clusters, kiters; int gbps, tail; } cases[] = {
        {896, 66, 256, 3352, 0},  /* LLaMA-3-8B down wgrad, 4096 x 14336 x 16384, H100: K too long */
        {896, 66, 256, 0, 0},     /* the same, bandwidth unknown */
        {896, 66, 256, 4917, 1},  /* the same on an H200 */
        {896, 66, 64, 3352, 1},   /* the same tiles with K = 4096 */
        {1024, 66, 128, 3352, 1}, /* 16384 x 4096 x 8192: 15.5 waves */
        {256, 66, 64, 4917, 0},   /* 4096^3: 3.9 waves */
        {1056, 66, 64, 4917, 0},  /* 16 whole waves */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int dp = coda__cuda_streamk_dp_units(cases[i].units, cases[i].clusters, cases[i].kiters, 0,
                                             CODA_STREAMK_AUTO, cases[i].gbps);
        CHECK((dp < cases[i].units) == cases[i].tail, "stream-K for %lld units on %lld clusters, %lld k-blocks, "
              "%d GB/s: %d whole", (long long)cases[i].units, (long long)cases[i].clusters,
              (long long)cases[i].kiters, cases[i].gbps, dp);
        CHECK(coda__cuda_streamk_dp_units(cases[i].units, cases[i].clusters, cases[i].kiters, 0, CODA_STREAMK_OFF,
                                          cases[i].gbps) == cases[i].units, "CODA_STREAMK=0: no tail");
    }
}

/* The epilogue overlap's rule before the kernel's say (src/cuda/gemm.c,
 * coda__cuda_overlap_candidate): fused, cooperative, no ring inputs, K > 0,
 * two tile pairs a cluster, a program that rounds acc first, no forced
 * stream-K; tuning's 1 drops the acc condition, 0 refuses all. */
static void check_overlap_rule(void) {
    static const struct {
        int store_c, pingpong, nbox, acc_bf16;
        int64_t kiters, units, clusters;
        int mode, streamk, want;
    } cases[] = {
        {0, 0, 0, 1, 32, 4096, 66, -1, CODA_STREAMK_AUTO, 1}, /* the 1B gate/up */
        {0, 0, 0, 1, 32, 131, 66, -1, CODA_STREAMK_AUTO, 0},  /* under 2 pairs a cluster */
        {0, 0, 0, 1, 32, 132, 66, -1, CODA_STREAMK_AUTO, 1},
        {0, 0, 0, 1, 0, 4096, 66, -1, CODA_STREAMK_AUTO, 0},  /* K = 0 */
        {0, 0, 0, 0, 32, 4096, 66, -1, CODA_STREAMK_AUTO, 0}, /* acc read as it is */
        {0, 0, 0, 0, 32, 4096, 66, 1, CODA_STREAMK_AUTO, 1},  /* ... unless forced */
        {0, 0, 2, 1, 32, 4096, 66, 1, CODA_STREAMK_AUTO, 0},  /* ring inputs */
        {0, 0, -1, 1, 32, 4096, 66, 1, CODA_STREAMK_AUTO, 0}, /* the plain GEMM */
        {1, 0, 0, 1, 32, 4096, 66, 1, CODA_STREAMK_AUTO, 0},  /* C stored by the mainloop */
        {0, 1, 0, 1, 32, 4096, 66, 1, CODA_STREAMK_AUTO, 0},  /* ping-pong */
        {0, 0, 0, 1, 32, 4096, 66, 0, CODA_STREAMK_AUTO, 0},  /* never */
        {0, 0, 0, 1, 32, 4096, 66, -1, CODA_STREAMK_OFF, 1},
        {0, 0, 0, 1, 32, 4096, 66, 1, CODA_STREAMK_ON, 0},  /* a forced stream-K wins */
        {0, 0, 0, 1, 32, 4096, 66, -1, CODA_STREAMK_SPLIT, 0},
        {0, 0, 0, 1, 32, 4096, 66, -1, CODA_STREAMK_ALL, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(coda__cuda_overlap_candidate(cases[i].store_c, cases[i].pingpong, cases[i].nbox, cases[i].acc_bf16,
                                           cases[i].kiters, cases[i].units, cases[i].clusters, cases[i].mode,
                                           cases[i].streamk) == cases[i].want,
              "overlap rule case %zu: want %d", i, cases[i].want);
}

/* The split tail's rule (src/cuda/gemm.c, coda__cuda_streamk_split): below
 * 8 whole waves the partial wave's p units cut into S = clusters / p
 * parts, at most 4, each at least 16 k-blocks; CODA_STREAMK=s forces it at
 * any wave count, every other mode never; the classic tail's rule gives no
 * tail in that mode. */
static void check_streamk_split(void) {
    static const struct { int64_t units, clusters, kiters; int mode, pingpong, parts; } cases[] = {
        {96, 66, 256, CODA_STREAMK_AUTO, 0, 2},   /* LLaMA-3-1B QKV wgrad, 3072 x 2048 x 16384 */
        {96, 66, 256, CODA_STREAMK_AUTO, 1, 0},   /* ping-pong: no stream-K kernel */
        {96, 66, 16, CODA_STREAMK_AUTO, 0, 0},    /* K = 1024: 8 k-blocks a part */
        {96, 66, 256, CODA_STREAMK_OFF, 0, 0},
        {96, 66, 256, CODA_STREAMK_ON, 0, 0},
        {96, 66, 256, CODA_STREAMK_ALL, 0, 0},
        {132, 66, 256, CODA_STREAMK_AUTO, 0, 0},  /* whole waves */
        {100, 66, 256, CODA_STREAMK_AUTO, 0, 0},  /* p = 34 > 66 / 2 */
        {67, 66, 256, CODA_STREAMK_AUTO, 0, 4},   /* p = 1: 66 parts wanted, 4 made */
        {67, 66, 48, CODA_STREAMK_AUTO, 0, 3},    /* 48 k-blocks: parts of 16 */
        {384, 66, 256, CODA_STREAMK_AUTO, 0, 0},  /* 8B QKV wgrad: p = 54 */
        {600, 66, 64, CODA_STREAMK_AUTO, 0, 0},   /* 9 whole waves: the classic tail's */
        {600, 66, 64, CODA_STREAMK_SPLIT, 0, 4},  /* forced: p = 6 */
        {8, 6, 49, CODA_STREAMK_SPLIT, 0, 3},     /* test_gemm_gpu's split cases */
        {9, 8, 64, CODA_STREAMK_SPLIT, 0, 4},
        {12, 8, 33, CODA_STREAMK_SPLIT, 0, 2},
        {20, 6, 33, CODA_STREAMK_SPLIT, 0, 2},    /* test_epilogue_gpu's */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int s = coda__cuda_streamk_split(cases[i].units, cases[i].clusters, cases[i].kiters, cases[i].pingpong,
                                         cases[i].mode);
        CHECK(s == cases[i].parts, "split tail of %lld units on %lld clusters, %lld k-blocks, mode %d%s: %d parts, "
              "want %d", (long long)cases[i].units, (long long)cases[i].clusters, (long long)cases[i].kiters,
              cases[i].mode, cases[i].pingpong ? " (ping-pong)" : "", s, cases[i].parts);
    }
    CHECK(coda__cuda_streamk_dp_units(600, 66, 64, 0, CODA_STREAMK_SPLIT, 4917) == 600,
          "CODA_STREAMK=s: no classic tail");
}

/* The attention backward's layout rule (src/cuda/attention.c): the old
 * layout while a kv group's q, do and f32 dq fit the L2; past it key
 * blocks fastest, the group in the fewest parts whose share fits; the
 * tuning's overrides, and counts that do not divide the group. */
static void check_attn_layout(void) {
    const int64_t mib = 1 << 20;
    static const struct { int group; int64_t seq, hd, l2_mib; int tp, to, parts, chunk; } cases[] = {
        {4, 8192, 64, 50, 0, -1, 1, 0},   /* LLaMA-3 1B: 16 MiB a group */
        {4, 8192, 128, 50, 0, -1, 2, 8},  /* 8B: 32 MiB; head_dim 128: two heads a block, chunks of 8 pairs */
        {2, 8192, 128, 50, 0, -1, 1, 0},  /* a group of 2 is left whole */
        {6, 2048, 128, 50, 0, -1, 3, 8},  /* 12 MiB: two heads a block */
        {8, 8192, 128, 50, 0, -1, 2, 1},  /* 70B on an H100: 64 MiB, 2 parts of 32 */
        {8, 8192, 128, 60, 0, -1, 2, 1},  /* 70B on an H200 */
        {8, 8192, 128, 0, 0, -1, 2, 1},   /* L2 unknown: 50 MiB */
        {8, 65536, 128, 50, 0, -1, 8, 1}, /* no part fits: one head a block */
        {1, 262144, 128, 50, 0, -1, 1, 1},/* one head a group: no parts, key blocks fastest */
        {6, 8192, 128, 40, 0, -1, 2, 1},  /* 48 MiB: 2 parts of 24 (the divisors of 6) */
        {5, 8192, 128, 30, 0, -1, 5, 1},  /* 40 MiB: 5 is prime */
        {4, 8192, 128, 50, -1, 1, 4, 1},  /* tuning: one head a block, key blocks fastest */
        {8, 8192, 128, 50, 1, 0, 1, 0},   /* tuning: the old layout at 70B */
        {6, 8192, 128, 50, 4, -1, 1, 0},  /* tuning's 4 does not divide 6: 1; its parts take the L2 rule's order */
        {4, 8192, 128, 50, 1, -1, 1, 0},  /* tuning's 1 part at 8B: the layout before stop 50 */
        {4, 8192, 128, 50, 0, 0, 2, 0},   /* tuning's order alone */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int parts = -7, chunk = -7;
        coda__cuda_attn_bwd_layout(cases[i].group, cases[i].seq, cases[i].hd, cases[i].l2_mib * mib, cases[i].tp,
                                   cases[i].to, &parts, &chunk);
        CHECK(parts == cases[i].parts && chunk == cases[i].chunk,
              "attention backward layout, group %d seq %lld hd %lld L2 %lld MiB (tuning %d, %d): %d parts, "
              "launch chunk %d; want %d, %d", cases[i].group, (long long)cases[i].seq, (long long)cases[i].hd,
              (long long)cases[i].l2_mib, cases[i].tp, cases[i].to, parts, chunk, cases[i].parts, cases[i].chunk);
    }
    /* the backward's ring: (tuning's stages, split, head_dim) -> stages; the
     * fused kernel's are cut to what fits its shared memory */
    static const int stages[][4] = {{0, 0, 64, 3}, {0, 0, 128, 2}, {4, 0, 64, 4}, {4, 0, 128, 2}, {2, 0, 64, 2},
                                    {3, 0, 128, 2}, {4, 1, 64, 4}, {4, 1, 128, 4}, {0, 1, 128, 3}};
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        const int n = coda__cuda_attn_bwd_stages(stages[i][0], stages[i][1], stages[i][2], 0);
        CHECK(n == stages[i][3], "attention backward stages (tuning %d, split %d, head_dim %d): %d, want %d",
              stages[i][0], stages[i][1], stages[i][2], n, stages[i][3]);
    }
}

/* The attention source (src/cuda/attention.c) compiles at both head
 * dimensions with the backward's defaults and each ring of the forward
 * (2 or 3 stages of k and v, freed together or apart), at head_dim 64 with
 * two consumer warpgroups (128-row items) and three (192 rows, the
 * default); the options a launch would pass. */
static void check_attention(void) {
    char *src = NULL;
    coda_status_t s = coda__cuda_join_sources(coda__cuda_attention_files, CODA_CUDA_ATTN_NFILES, NULL,
                                              "CUDA attention", &src);
    CHECK(s == CODA_OK, "attention source assembles: %s", coda_last_error());
    if (s != CODA_OK) return;
    /* (head_dim, forward stages, k and v freed apart, consumer warpgroups) */
    static const int builds[][4] = {{64, 2, 0, 2}, {64, 2, 1, 2}, {64, 3, 0, 2}, {64, 3, 1, 2}, {128, 2, 0, 2},
                                    {128, 2, 1, 2}, {64, 2, 0, 3}, {64, 3, 0, 3}, {64, 2, 1, 3}, {64, 3, 1, 3}};
    for (size_t v = 0; v < sizeof builds / sizeof builds[0]; v++) {
        const int hd = builds[v][0], fwd_stages = builds[v][1], apart = builds[v][2], consumers = builds[v][3];
        const char *opts[CODA_CUDA_ATTN_NOPTS];
        char buf[CODA_CUDA_ATTN_NOPTS][32];
        int n = coda__cuda_attention_options(hd, hd == 128 ? 2 : 3, 1, 1, fwd_stages, apart, consumers, opts, buf);
        char *cubin = NULL;
        size_t size = 0;
        double t0 = now();
        s = coda__nvrtc_compile(src, opts, n, &cubin, &size);
        CHECK(s == CODA_OK && size > 1000, "attention hd %d, forward %d stages %s, %d consumers: %s", hd, fwd_stages,
              apart ? "apart" : "together", consumers, s == CODA_OK ? "tiny cubin" : coda_last_error());
        printf("attention hd %d, forward ring %d stages, k and v freed %s, %d consumers: %s, %zu bytes, %.1f s\n", hd,
               fwd_stages, apart ? "apart" : "together", consumers, s == CODA_OK ? "ok" : "FAILED", size,
               now() - t0);
        free(cubin);
    }
    free(src);
}

/* The fused attention backward keeps its registers (the one-warpgroup dq
 * form and P^T as a register operand live beside dq, dk and dv, with
 * little room: a spill or a serialised wgmma would cost more than either
 * saves): ptxas's log (--ptxas-options=-v) for coda_attn_bwd_wgmma_kernel
 * says 0 bytes of spill stores and loads, and no kernel's wgmma is
 * serialised, at both head dimensions, in each dq form the tests and
 * `test_attention_gpu dqab` run; in the default build the other wgmma
 * kernels (the forward, the split backward's two) do not spill either.
 * Not held to it: the mma.sync kernels of CODA_DEBUG_ATTN_MMA (that
 * forward spills 48 bytes at hd 128) and the split dk/dv kernel at hd 64
 * (56 bytes: its 128-query tiles' P^T and dS^T as register operands
 * beside dk and dv; it runs only under CODA_DEBUG_ATTN_SPLIT_BWD or where
 * dqkv is not 16-byte aligned for TMA, docs/attention.md). */
/* 1 where ptxas's -v log says `kernel` has 0 bytes of spill stores and
 * loads: the line after "Function properties for KERNEL". */
static int ptxas_no_spill(const char *log, const char *kernel) {
    char key[160];
    snprintf(key, sizeof key, "Function properties for %s\n", kernel);
    const char *at = log ? strstr(log, key) : NULL;
    if (!at) return 0;
    const char *line = at + strlen(key), *end = strchr(line, '\n');
    const char *hit = strstr(line, " frame, 0 bytes spill stores, 0 bytes spill loads");
    return hit && (!end || hit < end);
}

/* Compiles src with opts[0..n) and --ptxas-options=-v (opts has room for
 * one more) and checks that each kernel of the NULL-terminated kernels[]
 * spills nothing and that no wgmma is serialised; `what` names the build. */
static void check_ptxas_clean(const char *src, const char **opts, int n, const char *const *kernels,
                              const char *what) {
    char *cubin = NULL, *log = NULL;
    size_t size = 0;
    opts[n++] = "--ptxas-options=-v";
    coda_status_t s = coda__nvrtc_compile_log(src, opts, n, &cubin, &size, &log);
    int no_spill = 1;
    for (const char *const *k = kernels; *k; k++) no_spill = no_spill && ptxas_no_spill(log, *k);
    CHECK(s == CODA_OK && no_spill && !strstr(log, "serialized"), "%s: compiled %s, no spill %d, serialised wgmma %s",
          what, s == CODA_OK ? "ok" : coda_last_error(), no_spill, log && strstr(log, "serialized") ? "yes" : "no");
    if (getenv("CODA_TEST_PTXAS_LOG") && log) fputs(log, stdout);
    free(cubin);
    free(log);
}

static void check_attention_registers(void) {
    /* the parser itself, on logs of the form ptxas writes */
    static const char ok_log[] = "ptxas info    : Function properties for k\n"
                                 "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n",
                      spill_log[] = "ptxas info    : Function properties for k\n"
                                    "ptxas         .     0 bytes stack frame, 40 bytes spill stores, 0 bytes spill loads\n"
                                    "ptxas info    : Function properties for j\n"
                                    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
    CHECK(ptxas_no_spill(ok_log, "k") && !ptxas_no_spill(spill_log, "k") && ptxas_no_spill(spill_log, "j") &&
              !ptxas_no_spill(ok_log, "j") && !ptxas_no_spill(NULL, "k"),
          "ptxas log parser");
    static const char *const forms[] = {NULL, "-DCODA_AB_DQ_ONE=0", "-DCODA_AB_PT_REG=0", "-DCODA_AB_DQ_LAG=0",
                                        "-DCODA_AB_DQ_LAG=2", "-DCODA_AB_DST_REG=1"};
    char *src = NULL;
    if (coda__cuda_join_sources(coda__cuda_attention_files, CODA_CUDA_ATTN_NFILES, NULL, "CUDA attention", &src) !=
        CODA_OK)
        return;
    for (int v = 0; v < 2 * (int)(sizeof forms / sizeof forms[0]); v++) {
        const int hd = v & 1 ? 128 : 64;
        const char *form = forms[v >> 1], *opts[CODA_CUDA_ATTN_NOPTS + 2];
        char buf[CODA_CUDA_ATTN_NOPTS][32], what[96];
        int n = coda__cuda_attention_default_options(hd, opts, buf);
        if (form) opts[n++] = form;
        /* the default build: the other wgmma kernels too (the forward, the split backward) */
        const char *kernels[5] = {"coda_attn_bwd_wgmma_kernel"}, **k = kernels + 1;
        if (!form) {
            *k++ = "coda_attn_fwd_wgmma_kernel";
            if (hd == 128) *k++ = "coda_attn_bwd_dkdv_wgmma_kernel";
            *k++ = "coda_attn_bwd_dq_wgmma_kernel";
        }
        snprintf(what, sizeof what, "attention backward hd %d %s", hd, form ? form : "(default)");
        check_ptxas_clean(src, opts, n, kernels, what);
    }
    { /* the forward with two consumer warpgroups at head_dim 64 (tuning's
       * attn_fwd_consumers = 2; the default build above has three, 160
       * registers a consumer thread) */
        const char *opts[CODA_CUDA_ATTN_NOPTS + 1], *kernels[] = {"coda_attn_fwd_wgmma_kernel", NULL};
        char buf[CODA_CUDA_ATTN_NOPTS][32];
        int n = coda__cuda_attention_options(64, 3, 1, 1, 2, 1, 2, opts, buf);
        check_ptxas_clean(src, opts, n, kernels, "attention forward hd 64, 2 consumers");
    }
    { /* the fused backward with 4 stages at head_dim 64 (tuning's attn_stages
       * = 4, which its ring of 64-row tiles has room for since stop 56: the
       * stage cut's table in check_attn_layout) */
        const char *opts[CODA_CUDA_ATTN_NOPTS + 1], *kernels[] = {"coda_attn_bwd_wgmma_kernel", NULL};
        char buf[CODA_CUDA_ATTN_NOPTS][32];
        int n = coda__cuda_attention_options(64, 4, 1, 1, 2, 1, 3, opts, buf);
        check_ptxas_clean(src, opts, n, kernels, "attention backward hd 64, 4 stages");
    }
    free(src);
}

int main(void) {
    check_streamk_rule();
    check_streamk_split();
    check_overlap_rule();
    check_attn_layout();
    check_attention();
    check_attention_registers();
    const char *epi = coda__cuda_source("epi_plain.cuh");
    CHECK(epi != NULL, "epi_plain.cuh is embedded");
    if (!epi) TEST_MAIN_END();
    char *src = coda__cuda_gemm_source(epi);
    CHECK(src != NULL, "kernel source assembles: %s", coda_last_error());
    if (!src) TEST_MAIN_END();
    const char *lname[3] = {"NT", "NN", "TN"};
    for (int cfg = 0; cfg < CODA_CUDA_GEMM_NCFG; cfg++) {
        /* C stored by the mainloop (bf16, f32), and not (fused epilogues) */
        /* v 9..14: the stream-K variants of the plain GEMM (cooperative
         * only): bf16 C with beta = 0 (CODA_PLAIN_SIMPLE), f32 C general.
         * v 0..2 compile the beta = 0 kernel too. */
        for (int v = 0; v < (coda__cuda_gemm_cfgs[cfg].pingpong ? 9 : 15); v++) {
            int layout = v % 3, c_f32 = v / 3 == 1 || v / 3 == 4, store_c = v / 3 != 2, streamk = v >= 9;
            const char *opts[CODA_CUDA_GEMM_MAX_OPTS];
            char optbuf[512];
            int n = coda__cuda_gemm_options((coda_layout_t)layout, &coda__cuda_gemm_cfgs[cfg],
                                            store_c, c_f32, streamk, opts, optbuf, sizeof optbuf);
            if ((v < 3 || v / 3 == 3) && n < CODA_CUDA_GEMM_MAX_OPTS) opts[n++] = "-DCODA_PLAIN_SIMPLE=1";
            char *cubin = NULL;
            size_t size = 0;
            double t0 = now();
            coda_status_t s = coda__nvrtc_compile(src, opts, n, &cubin, &size);
            CHECK(s == CODA_OK, "cfg %d layout %s: %s", cfg, lname[layout], coda_last_error());
            CHECK(s != CODA_OK || size > 1000, "cfg %d layout %s: cubin of %zu bytes", cfg,
                  lname[layout], size);
            printf("cfg %d (%dx%d, %d stages, cluster %d) %s C %s%s: %s, %zu bytes, %.1f s\n", cfg,
                   coda__cuda_gemm_cfgs[cfg].bm, coda__cuda_gemm_cfgs[cfg].bn,
                   coda__cuda_gemm_cfgs[cfg].stages, coda__cuda_gemm_cfgs[cfg].cluster_m,
                   lname[layout], !store_c ? "by epilogue" : c_f32 ? "f32" : "bf16",
                   streamk ? (v / 3 == 3 ? ", stream-K, beta 0" : ", stream-K") : v < 3 ? ", beta 0" : "",
                   s == CODA_OK ? "ok" : "FAILED", size,
                   now() - t0);
            free(cubin);
        }
        /* the C-tail kernels (N not a whole number of 16-byte units of C):
         * bf16 C with beta = 0, f32 C general */
        for (int c_f32 = 0; c_f32 < 2; c_f32++) {
            const char *opts[CODA_CUDA_GEMM_MAX_OPTS];
            char optbuf[512];
            coda_layout_t layout = c_f32 ? CODA_LAYOUT_TN : CODA_LAYOUT_NT;
            int n = coda__cuda_gemm_options(layout, &coda__cuda_gemm_cfgs[cfg], 1, c_f32, 0, opts, optbuf,
                                            sizeof optbuf);
            if (!c_f32) opts[n++] = "-DCODA_PLAIN_SIMPLE=1";
            opts[n++] = "-DCODA_C_TAIL=1";
            char *cubin = NULL;
            size_t size = 0;
            coda_status_t s = coda__nvrtc_compile(src, opts, n, &cubin, &size);
            CHECK(s == CODA_OK && size > 1000, "cfg %d %s C tail: %s", cfg, c_f32 ? "f32" : "bf16",
                  s == CODA_OK ? "tiny cubin" : coda_last_error());
            printf("cfg %d %s C %s, C tail: %s\n", cfg, lname[layout], c_f32 ? "f32" : "bf16",
                   s == CODA_OK ? "ok" : "FAILED");
            free(cubin);
        }
    }
    /* A broken source reports CODA_ERR_COMPILE with the log, not a crash. */
    const char *bad_opts[1] = {"--gpu-architecture=sm_90a"};
    char *cubin = NULL;
    size_t size = 0;
    coda_status_t s = coda__nvrtc_compile("extern \"C\" __global__ void k() { undefined_x = 1; }",
                                          bad_opts, 1, &cubin, &size);
    CHECK(s == CODA_ERR_COMPILE, "bad source -> %s", coda_status_name(s));
    CHECK(strstr(coda_last_error(), "undefined_x") != NULL, "log names the error: %s",
          coda_last_error());
    free(cubin);
    /* The cache key changes with the source and the options. */
    uint64_t k1[2], k2[2], k3[2];
    const char *o1[1] = {"-DX=1"}, *o2[1] = {"-DX=2"};
    coda__nvrtc_key("abc", o1, 1, k1);
    coda__nvrtc_key("abd", o1, 1, k2);
    coda__nvrtc_key("abc", o2, 1, k3);
    CHECK(k1[0] != k2[0] && k1[0] != k3[0] && k2[1] != k3[1], "keys differ");
    free(src);
    TEST_MAIN_END();
}
#else
int main(void) {
    printf("test_nvrtc: skipped (built without the CUDA toolkit)\n");
    return 0;
}
#endif
