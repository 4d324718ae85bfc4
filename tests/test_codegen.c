/* test_codegen.c - every epilogue program coda ships, and one program per
 * primitive class, turns into CUDA C that NVRTC compiles for sm_90a (no GPU
 * needed: CI runs this), both in a stand-in mainloop (fast) and spliced into
 * the real Hopper mainloop. Programs the GPU cannot run are refused with a
 * clear error. */
#include "harness.h"
#include "codegen_harness.h"

#include "codegen/codegen.h"

#include <pthread.h>
#include <time.h>

#include "class_programs.h"

static coda_program_t *parse_or_fail(const char *name, const char *text) {
    coda_program_t *p = NULL;
    coda_status_t s = coda_program_parse(text, &p);
    CHECK(s == CODA_OK, "%s parses: %s", name, coda_last_error());
    return s == CODA_OK ? p : NULL;
}

#ifdef CODA_WITH_CUDA
#include "cuda/backend.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* probes.cuh + gemm_prelude.cuh + tile width + generated epilogue + the
 * stand-in kernel, as the kernel source starts; stage: with the warps'
 * slabs (CODA_EPI_STAGE, as the mainloop builds the fused kernels: the
 * slab, ring, ldmatrix and stmatrix code; compiled only, the stand-in does
 * not stage inputs) */
static void compile_in_harness(const char *name, const char *epi, int stage) {
    const char *probes = coda__cuda_source("probes.cuh");
    const char *prelude = coda__cuda_source("gemm_prelude.cuh");
    CHECK(probes != NULL && prelude != NULL, "probes.cuh and gemm_prelude.cuh are embedded");
    if (!probes || !prelude) return;
    size_t len = strlen(probes) + strlen(prelude) + strlen(epi) + sizeof coda_test_harness_kernel + 64;
    char *src = malloc(len);
    snprintf(src, len, "%s\n%s\n#define CODA_BN 128\n#define CODA_EPI_STAGE %d\n%s\n%s", probes, prelude, stage,
             epi, coda_test_harness_kernel);
    const char *opts[] = {"--gpu-architecture=sm_90a", "--std=c++17", "-default-device"};
    char *cubin = NULL;
    size_t size = 0;
    double t0 = now();
    coda_status_t s = coda__nvrtc_compile(src, opts, 3, &cubin, &size);
    CHECK(s == CODA_OK, "%s compiles in the stand-in mainloop: %s", name, coda_last_error());
    printf("  %-28s stand-in mainloop%s: %s (%zu bytes, %.1f s)\n", name, stage ? ", slabs" : "",
           s == CODA_OK ? "ok" : "FAILED", size, now() - t0);
    free(cubin);
    free(src);
}

/* The real thing: generated epilogue spliced into the Hopper mainloop. */
static void compile_in_mainloop(const char *name, const char *epi, coda_layout_t layout, int cfg, int sched) {
    char *src = coda__cuda_gemm_source(epi);
    CHECK(src != NULL, "%s: kernel source assembles: %s", name, coda_last_error());
    if (!src) return;
    const char *opts[CODA_CUDA_GEMM_MAX_OPTS];
    char optbuf[512];
    int n = coda__cuda_gemm_options(layout, &coda__cuda_gemm_cfgs[cfg], 0, 0, sched, opts, optbuf, sizeof optbuf);
    char *cubin = NULL;
    size_t size = 0;
    double t0 = now();
    coda_status_t s = coda__nvrtc_compile(src, opts, n, &cubin, &size);
    CHECK(s == CODA_OK, "%s compiles in the mainloop (layout %d, cfg %d): %s", name, (int)layout, cfg,
          coda_last_error());
    printf("  %-28s mainloop layout %d cfg %d%s: %s (%zu bytes, %.1f s)\n", name, (int)layout, cfg,
           sched == CODA_SCHED_STREAMK ? " stream-K" : sched == CODA_SCHED_OVERLAP ? " epilogue overlap" : "",
           s == CODA_OK ? "ok" : "FAILED", size, now() - t0);
    free(cubin);
    free(src);
}

/* The form a fused GEMM runs: N16 only with every tile argument 16-byte
 * aligned (the staged form moves tiles as 16-byte vectors). The tensors are
 * descriptors only: nothing is read. */
static void check_fused_form(void) {
    coda_program_t *p = parse_or_fail("form", coda_builtin_program("resid_norm")); /* res, g, h, hg, ss */
    if (!p) return;
    static _Alignas(16) unsigned short buf[64 * 72];
    coda_tensor_t res = coda_tensor_2d(buf, CODA_BF16, 32, 64), g = coda_tensor_1d(buf, CODA_BF16, 64);
    coda_tensor_t h = res, hg = res, ss = coda_tensor_2d(buf, CODA_F32, 32, 1);
    const coda_tensor_t *bound[5] = {&res, &g, &h, &hg, &ss};
    CHECK(coda__cuda_fused_form(p, bound, 64, 0, NULL) == CODA_CG_RING, "aligned tiles, N 64: ring form (res through the ring)");
    CHECK(coda__cuda_fused_form(p, bound, 72, 0, NULL) == CODA_CG_EVEN, "N 72: even form");
    CHECK(coda__cuda_fused_form(p, bound, 65, 0, NULL) == CODA_CG_ANY, "N 65: general form");
    hg.data = buf + 2; /* 4-byte aligned: enough for a pair, not for a vector */
    CHECK(coda__cuda_fused_form(p, bound, 64, 0, NULL) == CODA_CG_EVEN, "a tile 4-byte aligned: even form");
    hg = res;
    res.stride[0] = 72 * 2 + 4; /* a row stride that is no multiple of 16 */
    CHECK(coda__cuda_fused_form(p, bound, 64, 0, NULL) == CODA_CG_EVEN, "a row stride of 148 bytes: even form");
    res = coda_tensor_2d(buf, CODA_BF16, 32, 64);
    g.data = buf + 2; /* column vectors are copied into shared memory 16 bytes at a time */
    CHECK(coda__cuda_fused_form(p, bound, 64, 0, NULL) == CODA_CG_EVEN, "a column vector 4-byte aligned: even form");
    g = coda_tensor_1d(buf, CODA_BF16, 64);
    CHECK(coda__cuda_fused_form(p, bound, 64, 1, NULL) == CODA_CG_N16, "ping-pong: N16 (the ring is the cooperative schedule's)");
    res.shape[0] = 1;
    res.stride[0] = 32; /* one row: a stride shorter than the row is legal, TMA's maps refuse it */
    CHECK(coda__cuda_fused_form(p, bound, 64, 0, NULL) == CODA_CG_N16, "a ring input's stride below its row: N16");
    res = coda_tensor_2d(buf, CODA_BF16, 32, 64);
    coda_program_free(p);
    /* no tile input for the ring: N16 */
    p = parse_or_fail("form-n16", "out y tile bf16\na = acc\nstore y a\n");
    if (!p) return;
    const coda_tensor_t *one[1] = {&h};
    CHECK(coda__cuda_fused_form(p, one, 64, 0, NULL) == CODA_CG_N16, "no tile input: N16 form");
    coda_program_free(p);
}

static void compile_finish(void) {
    const char *src = coda__cuda_source("finish.cuh");
    CHECK(src != NULL, "finish.cuh is embedded");
    if (!src) return;
    const char *opts[] = {"--gpu-architecture=sm_90a", "--fmad=false", "-default-device"};
    char *cubin = NULL;
    size_t size = 0;
    coda_status_t s = coda__nvrtc_compile(src, opts, 3, &cubin, &size);
    CHECK(s == CODA_OK, "finish.cuh compiles: %s", coda_last_error());
    free(cubin);
}
#endif

static void check_program(const char *name, const char *text, int in_mainloop) {
    coda_program_t *p = parse_or_fail(name, text);
    if (!p) return;
    char *src = NULL;
    coda_status_t s = coda__codegen_cuda(p, &src);
    CHECK(s == CODA_OK && src, "%s generates CUDA C: %s", name, coda_last_error());
    if (s == CODA_OK) {
        CHECK(strstr(src, "coda_epi_pair") && strstr(src, "coda_epi_end"), "%s: hooks defined", name);
        /* deterministic: the same program gives the same text (the cache key) */
        char *again = NULL;
        CHECK(coda__codegen_cuda(p, &again) == CODA_OK && strcmp(src, again) == 0, "%s: same text twice", name);
        free(again);
#ifdef CODA_WITH_CUDA
        compile_in_harness(name, src, 0);
        if (in_mainloop) compile_in_mainloop(name, src, (coda_layout_t)(in_mainloop - 1), 1, 0);
        /* the branch-free form for even N */
        char *even = NULL;
        CHECK(coda__codegen_cuda_ex(p, CODA_CG_EVEN, &even) == CODA_OK && even && strcmp(even, src) != 0,
              "%s: even-N form generated: %s", name, coda_last_error());
        if (even) compile_in_harness(name, even, 0);
        if (even && in_mainloop) compile_in_mainloop(name, even, CODA_LAYOUT_NT, 0, 0);
        /* N a multiple of 16, which the GPU runs most: tile outputs staged
         * through shared memory (both schedules) */
        char *n16 = NULL;
        CHECK(coda__codegen_cuda_ex(p, CODA_CG_N16, &n16) == CODA_OK && n16, "%s: N16 form generated: %s", name,
              coda_last_error());
        int tile_outs = 0;
        for (int k = 0; k < p->n_args; k++) tile_outs += p->args[k].kind == CODA_OUT_TILE;
        if (n16) CHECK((strstr(n16, "staged, coda_epi_flush") != NULL) == (tile_outs > 0), "%s: the N16 form stages its tile outputs", name);
        int cols = 0;
        for (int k = 0; k < p->n_args; k++) cols += p->args[k].kind == CODA_IN_COL;
        if (n16) CHECK((strstr(n16, "the tile's slice, in the slab") != NULL) == (cols > 0),
                       "%s: the N16 form reads its column vectors from the slab", name);
        if (n16) compile_in_harness(name, n16, 0);
        if (n16) compile_in_harness(name, n16, 1);
        if (n16 && in_mainloop) {
            compile_in_mainloop(name, n16, CODA_LAYOUT_NT, 3, 0);
            compile_in_mainloop(name, n16, CODA_LAYOUT_NT, 5, 0);
            /* the epilogue overlap (gemm_overlap.cuh: no ring inputs, so the
             * N16 form), on both tile widths of the cooperative schedule */
            compile_in_mainloop(name, n16, CODA_LAYOUT_NT, 3, CODA_SCHED_OVERLAP);
            if (strcmp(name, "gateup_swiglu_train") == 0)
                compile_in_mainloop(name, n16, CODA_LAYOUT_TN, 1, CODA_SCHED_OVERLAP);
        }
        /* tile inputs through the stage ring: active on the cooperative
         * schedule (cfg 3), read from global memory on ping-pong (cfg 5) */
        coda_ring_plan_t rp;
        coda__codegen_ring_plan(p, &rp);
        if (rp.nbox > 0) {
            char *ring = NULL;
            CHECK(coda__codegen_cuda_ex(p, CODA_CG_RING, &ring) == CODA_OK && ring, "%s: ring form generated: %s",
                  name, coda_last_error());
            if (ring) {
                CHECK(strstr(ring, "copied into the stage ring by TMA") != NULL, "%s: the ring form reads the ring", name);
                compile_in_harness(name, ring, 0);
                compile_in_harness(name, ring, 1);
                /* 4-byte pairs (rmsnorm_bwd: x, dres, g in; dx, b out) by ldmatrix / stmatrix */
                if (strcmp(name, "rmsnorm_bwd") == 0)
                    CHECK(strstr(ring, "cg_ldsm4(base_") && strstr(ring, "cg_ldsm4(a_") && strstr(ring, "cg_stsm4(t.stage"),
                          "%s: ring, column-slab and staged-output pairs by ldmatrix / stmatrix", name);
                if (in_mainloop || strcmp(name, "swiglu_bwd") == 0) {
                    /* the ring is on in the cooperative build, off in ping-pong's */
                    size_t len = strlen(ring) + 128;
                    char *on = malloc(len), *off = malloc(len);
                    snprintf(on, len, "%s\n#if !CODA_EPI_RING\n#error \"ring off\"\n#endif\n", ring);
                    snprintf(off, len, "%s\n#if CODA_EPI_RING\n#error \"ring on\"\n#endif\n", ring);
                    compile_in_mainloop(name, on, CODA_LAYOUT_NT, 3, 0);
                    /* the stream-K variant (its own kernel, cooperative only) */
                    if (strcmp(name, "swiglu_bwd") == 0) compile_in_mainloop(name, on, CODA_LAYOUT_TN, 3, CODA_SCHED_STREAMK);
                    if (in_mainloop) compile_in_mainloop(name, off, CODA_LAYOUT_NN, 5, 0);
                    free(on);
                    free(off);
                }
            }
            free(ring);
        }
        free(n16);
        free(even);
#else
        (void)in_mainloop;
#endif
    }
    free(src);
    coda_program_free(p);
}

/* The per-program cache: one text per form, the same pointer every time,
 * equal to a fresh generation; threads racing on a fresh program all get
 * the one text that won (the losers' copies are freed: ASan checks). */
typedef struct { const coda_program_t *p; const char *got; } race_t;
static void *race(void *arg) {
    race_t *r = arg;
    if (coda__codegen_cuda_cached(r->p, CODA_CG_EVEN, &r->got, NULL) != CODA_OK) r->got = NULL;
    return NULL;
}

/* Which tile inputs go through the stage ring, as how many 16 KiB boxes. */
static void check_ring_plan(void) {
    static const struct {
        const char *text;
        int nbox, arg0, xmul0, xadd1;
    } cases[] = {
        /* resid_norm: res (bf16, full) is one box */
        {NULL, 1, 0, 1, -1},
        /* one bf16 input in the double space: two boxes, columns 2 col0 and 2 col0 + 64 */
        {"in z tile bf16 double\nout y tile bf16\na = acc\nzz = load z\ng = even zz\ns = add a g\nstore y s\n",
         2, 0, 2, 64},
        /* an f32 input: two boxes of 32 columns */
        {"in x tile f32\nout y tile f32\na = acc\nv = load x\ns = add a v\nstore y s\n", 2, 0, 1, 32},
        /* three bf16 inputs: the first two fill the plan */
        {"in x tile bf16\nin w tile bf16\nin u tile bf16\nout y tile bf16\na = acc\nv = load x\n"
         "q = load w\nz = load u\ns = add a v\nt = add s q\nr = add t z\nstore y r\n", 2, 0, 1, 0},
        /* a half-space input stays out */
        {"in x tile bf16 half\nout y tile bf16 half\na = acc\ne = even a\nv = load x\ns = add e v\nstore y s\n",
         0, -1, 0, 0},
    };
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        coda_program_t *p = parse_or_fail("ring", cases[c].text ? cases[c].text : coda_builtin_program("resid_norm"));
        if (!p) continue;
        coda_ring_plan_t rp;
        coda__codegen_ring_plan(p, &rp);
        CHECK(rp.nbox == cases[c].nbox, "ring case %d: %d boxes, want %d", c, rp.nbox, cases[c].nbox);
        if (rp.nbox > 0 && rp.nbox == cases[c].nbox) {
            CHECK(rp.arg[0] == cases[c].arg0 && rp.first_box[cases[c].arg0] == 0 && rp.xmul[0] == cases[c].xmul0 &&
                      rp.xadd[0] == 0,
                  "ring case %d: box 0 is argument %d at %d col0", c, rp.arg[0], rp.xmul[0]);
            if (rp.nbox > 1) CHECK(rp.xadd[1] == cases[c].xadd1, "ring case %d: box 1 at +%d", c, rp.xadd[1]);
        }
        if (c == 3) {
            CHECK(rp.arg[1] == 1 && rp.first_box[1] == 1 && rp.first_box[2] == -1,
                  "ring case 3: x and w in the ring, u not");
            char *ring = NULL;
            CHECK_OK(coda__codegen_cuda_ex(p, CODA_CG_RING, &ring));
            CHECK(ring && strstr(ring, "u: staged by coda_epi_vput") != NULL,
                  "ring case 3: u goes through the warp's slab instead");
            free(ring);
        }
        coda_program_free(p);
    }
    coda_ring_plan_t none;
    coda__codegen_ring_plan(NULL, &none);
    CHECK(none.nbox == 0 && none.first_box[0] == -1, "no program: an empty plan");
}

/* The store plan (codegen.h): which staged outputs go out by TMA, with
 * what boxes, and that the generated flush issues exactly those copies. */
static void check_store_plan(void) {
    static const struct {
        const char *name, *text;
        coda_cg_form_t form;
        int nmap, arg0, cols0, arg1, cols1;
    } cases[] = {
        /* h, hg: bf16 full, rows of 32 elements (64 bytes) */
        {"resid_norm", NULL, CODA_CG_RING, 2, 2, 32, 3, 32},
        {"resid_norm", NULL, CODA_CG_N16, 2, 2, 32, 3, 32},
        {"resid_norm", NULL, CODA_CG_EVEN, 0, -1, 0, -1, 0},
        /* dz: bf16 double (128 bytes), c: bf16 full */
        {"swiglu_bwd", NULL, CODA_CG_RING, 2, 1, 64, 2, 32},
        /* one staged output: vector stores (cg_layout.c) */
        {"gateup_swiglu", NULL, CODA_CG_N16, 0, -1, 0, -1, 0},
        /* z: bf16 full, c: bf16 half (32 bytes, 16 elements) */
        {"gateup_swiglu_train", NULL, CODA_CG_N16, 2, 1, 32, 2, 16},
        /* an f32 double-space output (256-byte rows, a region of the whole
         * slab): w finds no room and is stored straight; no TMA */
        {"f32double", "out y tile f32 double\nout w tile f32\na = acc\nx = interleave a a\nstore y x\nstore w a\n",
         CODA_CG_N16, 0, -1, 0, -1, 0},
        /* three outputs, b's region (at 512) off its 1 KiB period: a and c
         * by TMA, b by vector stores in the same flush */
        {"mixed", "out a tile bf16 half\nout b tile f32\nout c tile bf16 half\nx = acc\ne = even x\no = odd x\n"
                  "store a e\nstore b x\nstore c o\n", CODA_CG_N16, 2, 0, 16, 2, 16},
        /* f32 full (128 bytes) and f32 half (64 bytes) */
        {"f32pair", "out y tile f32\nout w tile f32 half\na = acc\ne = even a\nstore y a\nstore w e\n", CODA_CG_N16,
         2, 0, 32, 1, 16},
    };
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        coda_program_t *p = parse_or_fail(cases[c].name, cases[c].text ? cases[c].text : coda_builtin_program(cases[c].name));
        if (!p) continue;
        coda_store_plan_t sp;
        coda__codegen_store_plan(p, cases[c].form, &sp);
        CHECK(sp.nmap == cases[c].nmap, "store plan %s form %d: %d maps, want %d", cases[c].name, (int)cases[c].form,
              sp.nmap, cases[c].nmap);
        if (sp.nmap == 2 && cases[c].nmap == 2)
            CHECK(sp.arg[0] == cases[c].arg0 && sp.cols[0] == cases[c].cols0 && sp.arg[1] == cases[c].arg1 &&
                      sp.cols[1] == cases[c].cols1 && sp.map_of[cases[c].arg0] == 0 && sp.map_of[cases[c].arg1] == 1,
                  "store plan %s: maps (%d, %d cols) (%d, %d cols)", cases[c].name, sp.arg[0], sp.cols[0], sp.arg[1],
                  sp.cols[1]);
        char *src = NULL;
        CHECK_OK(coda__codegen_cuda_ex(p, cases[c].form, &src));
        if (src) {
            int copies = 0;
            for (const char *q = src; (q = strstr(q, "coda_tma_store(&O.map[")) != NULL; q++) copies++;
            CHECK(copies == sp.nmap, "store plan %s: the flush issues %d copies, want %d", cases[c].name, copies, sp.nmap);
            CHECK((strstr(src, "#define CODA_EPI_TMA_STORES 1") != NULL) == (sp.nmap > 0),
                  "store plan %s: CODA_EPI_TMA_STORES follows the plan", cases[c].name);
        }
        if (src && strcmp(cases[c].name, "mixed") == 0) /* mixed: b's flush is the vector one, outside the TMA-only #if */
            CHECK(strstr(src, "{ /* b */\n") != NULL && strstr(src, "#if !CODA_EPI_TMA_STORES\n    { /* b */") == NULL,
                  "store plan mixed: b keeps its vector stores");
        free(src);
        coda_program_free(p);
    }
#ifdef CODA_WITH_CUDA
    /* the kernel's copies of the limits (gemm_prelude.cuh) are the host's */
    const char *pre = coda__cuda_source("gemm_prelude.cuh");
    char want[2][64];
    snprintf(want[0], sizeof want[0], "#define CODA_STORE_MAX_MAP %d\n", CODA_STORE_MAX_MAP);
    snprintf(want[1], sizeof want[1], "#define CODA_RING_MAX_BOX %d\n", CODA_RING_MAX_BOX);
    CHECK(pre && strstr(pre, want[0]) && strstr(pre, want[1]), "gemm_prelude.cuh: %s and %s", want[0], want[1]);
#endif
    coda_store_plan_t none;
    coda__codegen_store_plan(NULL, CODA_CG_N16, &none);
    CHECK(none.nmap == 0 && none.map_of[0] == -1, "no program: an empty store plan");
}

static void check_cache(void) {
    coda_program_t *p = parse_or_fail("cache", coda_builtin_program("resid_norm"));
    if (!p) return;
    const char *a = NULL, *b = NULL, *e = NULL, *v = NULL;
    char *fresh = NULL;
    const uint64_t *ka = NULL, *kb = NULL, *ke = NULL;
    CHECK_OK(coda__codegen_cuda_cached(p, CODA_CG_ANY, &a, &ka));
    CHECK_OK(coda__codegen_cuda_cached(p, CODA_CG_ANY, &b, &kb));
    CHECK_OK(coda__codegen_cuda_cached(p, CODA_CG_EVEN, &e, &ke));
    CHECK_OK(coda__codegen_cuda_cached(p, CODA_CG_N16, &v, NULL));
    CHECK(ka && ka == kb && ka[0] == coda__hash(CODA_HASH_SEED0, a, strlen(a)) &&
              ka[1] == coda__hash(CODA_HASH_SEED1, a, strlen(a)),
          "the cached key is the text's hash");
    CHECK(ka && ke && (ka[0] != ke[0] || ka[1] != ke[1]), "each form has its own key");
    CHECK_OK(coda__codegen_cuda_ex(p, CODA_CG_ANY, &fresh));
    CHECK(a && a == b, "cached text is kept");
    CHECK(a && fresh && strcmp(a, fresh) == 0, "cached text equals a fresh generation");
    CHECK(e && a && e != a && strcmp(e, a) != 0, "the even-N form is cached apart");
    CHECK(v && e && v != e && strcmp(v, e) != 0, "the N16 form is cached apart");
    const char *rg = NULL;
    CHECK_OK(coda__codegen_cuda_cached(p, CODA_CG_RING, &rg, NULL));
    CHECK(rg && v && rg != v && strcmp(rg, v) != 0, "the ring form is cached apart");
    CHECK(coda__codegen_cuda_cached(p, CODA_CG_NFORMS, &v, NULL) == CODA_ERR_INVALID_ARG, "a bad form is refused");
    CHECK(coda__codegen_form(4096) == CODA_CG_N16 && coda__codegen_form(4098) == CODA_CG_EVEN &&
              coda__codegen_form(4097) == CODA_CG_ANY,
          "the form follows N");
    free(fresh);
    coda_program_free(p);

    p = parse_or_fail("cache-race", coda_builtin_program("qkv_rope"));
    if (!p) return;
    pthread_t th[4];
    race_t r[4];
    for (int i = 0; i < 4; i++) {
        r[i].p = p;
        r[i].got = NULL;
        pthread_create(&th[i], NULL, race, &r[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 1; i < 4; i++) CHECK(r[i].got && r[i].got == r[0].got, "thread %d got the same text", i);
    coda_program_free(p);
}

/* A program changed with builder calls after it was used: the next
 * finish's program, not the cached code of the old one (a review found
 * the generated CUDA source kept per program outliving the edit). */
static void edited_after_use(void) {
    coda_program_t *p = NULL;
    REQUIRE_OK(coda_program_new("edited", &p));
    int o = coda_program_arg(p, "o", CODA_OUT_TILE, CODA_F32, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    int a = coda_program_value(p, "a", CODA_OP_ACC, -1, -1, -1);
    coda_program_store(p, o, a);
    REQUIRE_OK(coda_program_finish(p));
    const char *t1 = NULL;
    REQUIRE_OK(coda__codegen_cuda_cached(p, CODA_CG_ANY, &t1, NULL)); /* what a CUDA launch does */
    int o2 = coda_program_arg(p, "o2", CODA_OUT_TILE, CODA_F32, CODA_SPACE_FULL, CODA_REDUCE_SUM);
    coda_program_store(p, o2, coda_program_value(p, "e", CODA_OP_EXP, a, -1, -1));
    REQUIRE_OK(coda_program_finish(p));
    const char *t2 = NULL;
    char *fresh = NULL;
    REQUIRE_OK(coda__codegen_cuda_cached(p, CODA_CG_ANY, &t2, NULL));
    REQUIRE_OK(coda__codegen_cuda_ex(p, CODA_CG_ANY, &fresh));
    CHECK(strcmp(t2, fresh) == 0, "a program edited after use: the cached CUDA source is the old program's");
    free(fresh);
    coda_program_free(p);
}

int main(void) {
    edited_after_use();
    for (int i = 0; i < N_PRIMITIVE; i++)
        check_program("primitive", primitive_programs[i], i == 3 || i == 5 ? 2 : 0); /* reductions, rowpart */
    int n = 0;
    for (const char *const *name = coda_builtin_program_names(); *name; name++, n++)
        /* in the mainloop: the first, and gate/up (the epilogue overlap's program) */
        check_program(*name, coda_builtin_program(*name), n == 0 || strcmp(*name, "gateup_swiglu_train") == 0 ? 1 : 0);
    CHECK(n >= 6, "at least 6 built-in programs, got %d", n);

    /* Refusals: a pair swap in the half space would pair columns of two
     * threads (the verifier refuses it); more arguments than the parameter
     * block holds (the code generator refuses them). */
    coda_program_t *p = NULL;
    coda_status_t s0 = coda_program_parse("out y tile f32 half\na = acc\ne = even a\nw = swap e\nstore y w\n", &p);
    CHECK(s0 == CODA_ERR_VERIFY && p == NULL, "swap in the half space refused: %s", coda_status_name(s0));
    CHECK(strstr(coda_last_error(), "swap") != NULL, "message names swap: %s", coda_last_error());
    char big[8192] = "";
    for (int i = 0; i < CODA_EPI_MAX_ARGS + 1; i++) {
        char line[64];
        snprintf(line, sizeof line, "in s%d scalar\n", i);
        strcat(big, line);
    }
    strcat(big, "out y tile f32\na = acc\nstore y a\n");
    p = parse_or_fail("many-args", big);
    if (p) {
        char *src = NULL;
        coda_status_t s = coda__codegen_cuda(p, &src);
        CHECK(s == CODA_ERR_UNSUPPORTED, "17+ arguments refused: %s", coda_status_name(s));
        CHECK(strstr(coda_last_error(), "at most") != NULL, "message: %s", coda_last_error());
        coda_program_free(p);
    }
    check_cache();
    check_ring_plan();
    check_store_plan();
#ifdef CODA_WITH_CUDA
    check_fused_form();
    compile_finish();
#endif
    TEST_MAIN_END();
}
