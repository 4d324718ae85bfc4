/* kernel_stats.c - what ptxas makes of each fused kernel: registers, spills,
 * stack, for every built-in layer program on a given tile configuration.
 *
 *   kernel_stats [cfg [DIR]]   (default: configuration 3, the cooperative
 *                               128 x 256 that big fused GEMMs run; DIR: also
 *                               write each kernel's cubin there, NAME.cubin,
 *                               for bench/sass_stats.sh, and the
 *                               generated epilogue, NAME.epi.cu)
 *   CODA_BENCH_FILES="a.coda,b.coda" kernel_stats ...   also these program
 *                               files (named by file)
 *
 * Needs NVRTC, not a GPU. The generated code is the form the LLaMA shapes
 * get: RING where the program has tile inputs for the stage ring, else N16
 * (N a multiple of 16). A fused epilogue that spills to local
 * memory runs many times slower than its arithmetic suggests, so this is
 * the first thing to look at when bench_epilogue shows a program far above
 * the plain GEMM; ptxas also reports here if it had to serialize wgmma. */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "harness.h"

#ifdef CODA_WITH_CUDA
#include "codegen/codegen.h"
#include "cuda/backend.h"

#include <nvrtc.h>

static const char *cubin_dir;

/* DIR/NAME.cubin from the compiled program (errors are reported, not fatal). */
static void write_cubin(nvrtcProgram prog, const char *name) {
    size_t size = 0;
    if (nvrtcGetCUBINSize(prog, &size) != NVRTC_SUCCESS || !size) return;
    char *bin = malloc(size), path[1024];
    snprintf(path, sizeof path, "%s/%s.cubin", cubin_dir, name[0] == '(' ? "plain" : name);
    FILE *f = bin && nvrtcGetCUBIN(prog, bin) == NVRTC_SUCCESS ? fopen(path, "wb") : NULL;
    if (!f || fwrite(bin, 1, size, f) != size) fprintf(stderr, "kernel_stats: cannot write %s\n", path);
    if (f) fclose(f);
    free(bin);
}

static void stats(const char *name, const char *epi, int cfg) {
    char *src = coda__cuda_gemm_source(epi);
    if (!src) {
        printf("%s: %s\n", name, coda_last_error());
        return;
    }
    const char *opts[CODA_CUDA_GEMM_MAX_OPTS + 2]; /* the options, -v, CODA_STATS_OPTS */
    char optbuf[768];
    const char *sk = getenv("CODA_STATS_STREAMK"); /* 1: the stream-K variants */
    int n = coda__cuda_gemm_options(CODA_LAYOUT_NT, &coda__cuda_gemm_cfgs[cfg], 0, 0, sk && *sk == '1', opts,
                                    optbuf, sizeof optbuf);
    opts[n++] = "--ptxas-options=-v";
    const char *xo = getenv("CODA_STATS_OPTS"); /* one more option, e.g. -DCODA_X_NO_LDSM */
    if (xo && *xo) opts[n++] = xo;
    nvrtcProgram prog;
    if (nvrtcCreateProgram(&prog, src, "k.cu", 0, NULL, NULL) != NVRTC_SUCCESS) {
        printf("%s: nvrtcCreateProgram failed\n", name);
        free(src);
        return;
    }
    nvrtcResult r = nvrtcCompileProgram(prog, n, opts);
    size_t len = 0;
    nvrtcGetProgramLogSize(prog, &len);
    char *log = malloc(len + 1);
    if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) {
        log[len] = 0;
        /* keep the ptxas lines about the kernel */
        for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"))
            if (r != NVRTC_SUCCESS || strstr(line, "registers") || strstr(line, "spill") ||
                strstr(line, "stack") || strstr(line, "serialized"))
                printf("%-20s %s\n", name, line);
    }
    free(log);
    if (r == NVRTC_SUCCESS && cubin_dir) write_cubin(prog, name);
    if (cubin_dir) { /* the generated epilogue too, NAME.epi.cu, to read beside the SASS */
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.epi.cu", cubin_dir, name[0] == '(' ? "plain" : name);
        FILE *f = fopen(path, "w");
        if (!f || fputs(epi, f) < 0) fprintf(stderr, "kernel_stats: cannot write %s\n", path);
        if (f) fclose(f);
    }
    nvrtcDestroyProgram(&prog);
    free(src);
}

int main(int argc, char **argv) {
    int cfg = argc > 1 ? atoi(argv[1]) : 3;
    cubin_dir = argc > 2 ? argv[2] : NULL;
    if (cfg < 0 || cfg >= CODA_CUDA_GEMM_NCFG) {
        fprintf(stderr, "kernel_stats: configuration %d out of range 0..%d\n", cfg,
                CODA_CUDA_GEMM_NCFG - 1);
        return 2;
    }
    const coda_cuda_gemm_cfg_t *c = &coda__cuda_gemm_cfgs[cfg];
    printf("configuration %d: %dx%d, %d stages, cluster %d, %s\n", cfg, c->bm, c->bn, c->stages,
           c->cluster_m, c->pingpong ? "ping-pong" : "cooperative");
    stats("(plain)", coda__cuda_source("epi_plain.cuh"), cfg);
    const char *names[64], *texts[64];
    int n = 0;
    for (const char *const *name = coda_builtin_program_names(); *name && n < 64; name++)
        names[n] = *name, texts[n++] = coda_builtin_program(*name);
    if (h_program_files(getenv("CODA_BENCH_FILES"), names, texts, &n, 64)) return 2;
    for (int i = 0; i < n; i++) {
        const char *const *name = &names[i];
        coda_program_t *p = NULL;
        REQUIRE_OK(coda_program_parse(texts[i], &p));
        char *epi = NULL;
        coda_ring_plan_t rp;
        coda__codegen_ring_plan(p, &rp);
        REQUIRE_OK(coda__codegen_cuda_ex(p, rp.nbox ? CODA_CG_RING : CODA_CG_N16, &epi)); /* as LLaMA shapes run */
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
