/* kernel_stats.c - what ptxas makes of each fused kernel: registers, spills,
 * stack, for every built-in layer program on a given tile configuration.
 *
 *   kernel_stats [cfg [DIR]]   (default: configuration 3, the cooperative
 *                               128 x 256 that big fused GEMMs run; DIR: also
 *                               write each kernel's cubin there, NAME.cubin,
 *                               for bench/sass_stats.sh, and the
 *                               generated epilogue, NAME.epi.cu)
 *   kernel_stats attn HD [OPTION] [DIR]   the attention source
 *                               (src/cuda/attention.c) at head_dim HD with
 *                               the options a launch passes (backward: seq
 *                               a multiple of 8), and OPTION (e.g.
 *                               -DCODA_AB_DQ_ONE=0): ptxas's registers,
 *                               spills and serialisation notes for every
 *                               attention kernel; with DIR (an argument not
 *                               starting with '-') also its cubin there,
 *                               attn.hdHD.cubin: two dumps' md5sums show
 *                               whether a source change left the kernels
 *                               as they were
 *   CODA_BENCH_FILES="a.coda,b.coda" kernel_stats ...   also these program
 *                               files (named by file)
 *   kernel_stats cfg DIR all   every kernel the library compiles for cfg,
 *                               with the library's own options and compile
 *                               call (no -v): the plain GEMM in each layout,
 *                               C type, beta = 0 / C-tail variant and
 *                               stream-K; each program in each layout, form
 *                               (ANY, EVEN, N16, RING) and stream-K; the
 *                               finishing kernels. One cubin each, named by
 *                               variant, and each program's text per form.
 *                               Two dumps' md5sums show whether a source
 *                               change left the compiled kernels as they were.
 *
 * Needs NVRTC, not a GPU. The generated code is the form the LLaMA shapes
 * get: RING where the program has tile inputs for the stage ring, else N16
 * (N a multiple of 16). A fused epilogue that spills to local
 * memory runs many times slower than its arithmetic suggests, so this is
 * the first thing to look at when bench_epilogue shows a program far above
 * the plain GEMM; ptxas also reports here if it had to serialize wgmma. */
#include "harness.h"

#ifdef CODA_WITH_CUDA
#include "codegen/codegen.h"
#include "cuda/backend.h"


static const char *cubin_dir;

/* DIR/FILE: the n bytes of data. */
static void write_file(const char *file, const char *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", cubin_dir, file);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) fprintf(stderr, "kernel_stats: cannot write %s\n", path);
    if (f) fclose(f);
}

/* Compiles src with opts (n of them, room for one more: -v) and prints
 * ptxas's lines about each kernel, prefixed by name; with cubin_dir, the
 * cubin into it as NAME.cubin. */
static void ptxas_report(const char *name, const char *src, const char **opts, int n) {
    opts[n++] = "--ptxas-options=-v";
    char *cubin = NULL, *log = NULL;
    size_t size = 0;
    if (coda__nvrtc_compile_log(src, opts, n, &cubin, &size, &log) != CODA_OK) {
        printf("%-20s %s\n", name, coda_last_error());
        return;
    }
    /* keep the ptxas lines about the kernels */
    for (char *line = log ? strtok(log, "\n") : NULL; line; line = strtok(NULL, "\n"))
        if (strstr(line, "registers") || strstr(line, "spill") || strstr(line, "stack") ||
            strstr(line, "serialized") || strstr(line, "entry") || strstr(line, "properties"))
            printf("%-20s %s\n", name, line);
    if (cubin_dir) {
        char file[512];
        snprintf(file, sizeof file, "%s.cubin", name[0] == '(' ? "plain" : name);
        write_file(file, cubin, size);
    }
    free(log);
    free(cubin);
}

static void stats(const char *name, const char *epi, int cfg) {
    char *src = coda__cuda_gemm_source(epi);
    if (!src) {
        printf("%s: %s\n", name, coda_last_error());
        return;
    }
    const char *opts[CODA_CUDA_GEMM_MAX_OPTS + 2]; /* the options, CODA_STATS_OPTS, -v */
    char optbuf[768];
    const char *sk = getenv("CODA_STATS_STREAMK"); /* 1: the stream-K variants */
    const char *ov = getenv("CODA_STATS_OVERLAP"); /* 1: the epilogue-overlap variants (programs only) */
    const int sched = sk && *sk == '1' ? CODA_SCHED_STREAMK : ov && *ov == '1' ? CODA_SCHED_OVERLAP : CODA_SCHED_TILES;
    if (sched == CODA_SCHED_OVERLAP && name[0] == '(') return; /* the plain GEMM stores C: never overlapped */
    int n = coda__cuda_gemm_options(CODA_LAYOUT_NT, &coda__cuda_gemm_cfgs[cfg], 0, 0, sched, opts, optbuf,
                                    sizeof optbuf);
    const char *xo = getenv("CODA_STATS_OPTS"); /* one more option, e.g. -DCODA_PROBE_NO_COL_LOAD */
    if (xo && *xo) opts[n++] = xo;
    ptxas_report(name, src, opts, n);
    if (cubin_dir) { /* the generated epilogue too, NAME.epi.cu, to read beside the SASS */
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.epi.cu", cubin_dir, name[0] == '(' ? "plain" : name);
        FILE *f = fopen(path, "w");
        if (!f || fputs(epi, f) < 0) fprintf(stderr, "kernel_stats: cannot write %s\n", path);
        if (f) fclose(f);
    }
    free(src);
}

/* ---- kernel_stats attn HD [OPTION] ---- */
static int attn_stats(int hd, int argc, char **argv) {
    const char *extra = NULL;
    for (int i = 0; i < argc; i++) {
        if (argv[i][0] == '-') extra = argv[i];
        else cubin_dir = argv[i];
    }
    if (hd != 64 && hd != 128) return fprintf(stderr, "kernel_stats attn: HD is 64 or 128\n"), 2;
    char *src = NULL;
    REQUIRE_OK(coda__cuda_join_sources(coda__cuda_attention_files, CODA_CUDA_ATTN_NFILES, NULL, "CUDA attention",
                                       &src));
    const char *opts[CODA_CUDA_ATTN_NOPTS + 2];
    char buf[CODA_CUDA_ATTN_NOPTS][32];
    int n = coda__cuda_attention_default_options(hd, opts, buf);
    if (extra && *extra) opts[n++] = extra;
    char name[32];
    snprintf(name, sizeof name, "attn.hd%d", hd);
    ptxas_report(name, src, opts, n);
    free(src);
    return 0;
}

/* ---- kernel_stats cfg DIR all ---- */


/* One kernel as the library compiles it (coda__nvrtc_compile, the options
 * of get_kernel in src/cuda/gemm.c), into DIR/FILE.cubin. */
static int dump(const char *file, const char *src, const char *const *opts, int n) {
    char *cubin = NULL;
    size_t size = 0;
    if (coda__nvrtc_compile(src, opts, n, &cubin, &size) != CODA_OK) {
        printf("%s: FAILED %s\n", file, coda_last_error());
        return 1;
    }
    char name[512];
    snprintf(name, sizeof name, "%s.cubin", file);
    write_file(name, cubin, size);
    printf("%s.cubin %zu bytes\n", file, size);
    free(cubin);
    return 0;
}

static const char *const layout_name[3] = {"nt", "nn", "tn"};

/* A GEMM kernel: src (coda__cuda_gemm_source) with the options for this
 * layout, configuration and variant, then the plain epilogue's variant
 * options in get_kernel's order. */
static int dump_gemm(const char *file, const char *src, int layout, int cfg, int store_c, int c_f32, int sched,
                     int simple, int c_tail) {
    const char *opts[CODA_CUDA_GEMM_MAX_OPTS];
    char optbuf[768];
    int n = coda__cuda_gemm_options((coda_layout_t)layout, &coda__cuda_gemm_cfgs[cfg], store_c, c_f32, sched,
                                    opts, optbuf, sizeof optbuf);
    if (simple && n < CODA_CUDA_GEMM_MAX_OPTS) opts[n++] = "-DCODA_PLAIN_SIMPLE=1";
    if (c_tail && n < CODA_CUDA_GEMM_MAX_OPTS) opts[n++] = "-DCODA_C_TAIL=1";
    return dump(file, src, opts, n);
}

static int dump_all(int cfg, const char *const *names, const char *const *texts, int n_progs) {
    const int pingpong = coda__cuda_gemm_cfgs[cfg].pingpong;
    int fails = 0;
    char file[512];
    /* the plain GEMM (coda__cuda_gemm): C stored by the mainloop, bf16 or
     * f32; beta = 0 and C-tail variant bits; stream-K on the cooperative
     * schedule */
    char *src = coda__cuda_gemm_source(coda__cuda_source("epi_plain.cuh"));
    if (!src) return printf("plain: %s\n", coda_last_error()), 1;
    for (int layout = 0; layout < 3; layout++)
        for (int c_f32 = 0; c_f32 < 2; c_f32++)
            for (int sk = 0; sk < (pingpong ? 1 : 2); sk++)
                for (int v = 0; v < 4; v++) {
                    snprintf(file, sizeof file, "plain.%s.%s%s%s%s", layout_name[layout], c_f32 ? "f32" : "bf16",
                             v & 1 ? ".simple" : "", v & 2 ? ".tail" : "", sk ? ".sk" : "");
                    fails += dump_gemm(file, src, layout, cfg, 1, c_f32, sk, v & 1, v & 2);
                }
    free(src);
    /* fused programs (coda__cuda_fused_gemm): no C store, each form the
     * host may pick (RING only on the cooperative schedule, for programs
     * with a ring plan); on the cooperative schedule also stream-K (.sk)
     * and, but for RING, the epilogue overlap (.ov) */
    static const char *const form_name[CODA_CG_NFORMS] = {"any", "even", "n16", "ring"};
    for (int i = 0; i < n_progs; i++) {
        coda_program_t *p = NULL;
        if (coda_program_parse(texts[i], &p) != CODA_OK) {
            printf("%s: %s\n", names[i], coda_last_error());
            fails++;
            continue;
        }
        coda_ring_plan_t rp;
        coda__codegen_ring_plan(p, &rp);
        for (int form = 0; form < CODA_CG_NFORMS; form++) {
            if (form == CODA_CG_RING && (pingpong || rp.nbox == 0)) continue;
            char *epi = NULL;
            if (coda__codegen_cuda_ex(p, (coda_cg_form_t)form, &epi) != CODA_OK) {
                printf("%s %s: %s\n", names[i], form_name[form], coda_last_error());
                fails++;
                continue;
            }
            snprintf(file, sizeof file, "%s.%s.epi.cu", names[i], form_name[form]);
            write_file(file, epi, strlen(epi));
            src = coda__cuda_gemm_source(epi);
            for (int layout = 0; src && layout < 3; layout++)
                for (int sched = 0; sched < (pingpong ? 1 : 3); sched++) {
                    if (sched == CODA_SCHED_OVERLAP && form == CODA_CG_RING) continue;
                    snprintf(file, sizeof file, "%s.%s.%s%s", names[i], layout_name[layout], form_name[form],
                             sched == CODA_SCHED_STREAMK ? ".sk" : sched == CODA_SCHED_OVERLAP ? ".ov" : "");
                    fails += dump_gemm(file, src, layout, cfg, 0, 0, sched, 0, 0);
                }
            free(src);
            free(epi);
        }
        coda_program_free(p);
    }
    /* the finishing kernels (src/cuda/finish_gpu.c's options) */
    static const char *const finish_opts[] = {"--gpu-architecture=sm_90a", "--fmad=false", "-default-device"};
    const char *fin = coda__cuda_source("finish.cuh");
    fails += fin ? dump("finish", fin, finish_opts, 3) : 1;
    printf("configuration %d: %d failures\n", cfg, fails);
    return fails != 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "attn") == 0) return attn_stats(atoi(argv[2]), argc - 3, argv + 3);
    int cfg = argc > 1 ? atoi(argv[1]) : 3;
    cubin_dir = argc > 2 ? argv[2] : NULL;
    const int all = argc > 3 && strcmp(argv[3], "all") == 0;
    if (cfg < 0 || cfg >= CODA_CUDA_GEMM_NCFG) {
        fprintf(stderr, "kernel_stats: configuration %d out of range 0..%d\n", cfg,
                CODA_CUDA_GEMM_NCFG - 1);
        return 2;
    }
    const coda_cuda_gemm_cfg_t *c = &coda__cuda_gemm_cfgs[cfg];
    printf("configuration %d: %dx%d, %d stages, cluster %d, %s\n", cfg, c->bm, c->bn, c->stages,
           c->cluster_m, c->pingpong ? "ping-pong" : "cooperative");
    const char *names[64], *texts[64];
    int n = 0;
    for (const char *const *name = coda_builtin_program_names(); *name && n < 64; name++)
        names[n] = *name, texts[n++] = coda_builtin_program(*name);
    if (h_program_files(getenv("CODA_BENCH_FILES"), names, texts, &n, 64)) return 2;
    if (all) return cubin_dir ? dump_all(cfg, names, texts, n) : 2;
    stats("(plain)", coda__cuda_source("epi_plain.cuh"), cfg);
    for (int i = 0; i < n; i++) {
        const char *const *name = &names[i];
        coda_program_t *p = NULL;
        REQUIRE_OK(coda_program_parse(texts[i], &p));
        char *epi = NULL;
        coda_ring_plan_t rp;
        coda__codegen_ring_plan(p, &rp);
        /* as LLaMA shapes run; the overlap takes no ring inputs, so with
         * CODA_STATS_OVERLAP=1 the N16 form (what it runs with the ring off) */
        const char *ov = getenv("CODA_STATS_OVERLAP");
        const int ring = rp.nbox && !(ov && *ov == '1');
        REQUIRE_OK(coda__codegen_cuda_ex(p, ring ? CODA_CG_RING : CODA_CG_N16, &epi));
        stats(*name, epi, cfg);
        free(epi);
        coda_program_free(p);
    }
    return 0;
}
#else
int main(void) {
    printf("kernel_stats: built without the CUDA toolkit\n");
    return 0;
}
#endif
