/* nvrtc.c - run-time compilation of kernel source to sm_90a cubins, cached.
 *
 * Lookup order: the device's in-memory list, then <cache_dir>/<key>.cubin,
 * then NVRTC (and the result is written to the disk cache, atomically, by
 * rename). The key hashes the source, the options and the NVRTC version, so
 * a new toolkit or a changed kernel never picks up a stale cubin. */
#include "cuda/backend.h"

#include <errno.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

extern const struct { const char *name; const char *text; } coda_embedded_sources[];

const char *coda__cuda_source(const char *name) {
    for (int i = 0; coda_embedded_sources[i].name; i++)
        if (strcmp(coda_embedded_sources[i].name, name) == 0) return coda_embedded_sources[i].text;
    return NULL;
}

coda_status_t coda__cuda_join_sources(const char *const *files, size_t n, const char *fill, const char *what,
                                      char **out) {
    const char *parts[16];
    size_t len = 1;
    *out = NULL;
    if (n > sizeof parts / sizeof parts[0])
        return coda__fail(CODA_ERR_INTERNAL, "%s: %zu kernel sources, at most 16", what, n);
    for (size_t i = 0; i < n; i++) {
        parts[i] = files[i] ? coda__cuda_source(files[i]) : fill;
        if (!parts[i])
            return coda__fail(CODA_ERR_INTERNAL, "%s: kernel source %s is not embedded", what,
                              files[i] ? files[i] : "(epilogue)");
        len += strlen(parts[i]) + 1;
    }
    char *src = malloc(len);
    if (!src) return coda__fail(CODA_ERR_NO_MEMORY, "%s: out of memory", what);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(parts[i]);
        memcpy(src + off, parts[i], k);
        off += k;
        src[off++] = '\n';
    }
    src[off] = 0;
    *out = src;
    return CODA_OK;
}

void coda__nvrtc_key(const char *src, const char *const *opts, int n_opts, uint64_t key[2]) {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    uint64_t seeds[2] = {CODA_HASH_SEED0, CODA_HASH_SEED1};
    for (int s = 0; s < 2; s++) {
        uint64_t h = seeds[s];
        h = coda__hash(h, src, strlen(src) + 1);
        for (int i = 0; i < n_opts; i++) h = coda__hash(h, opts[i], strlen(opts[i]) + 1);
        h = coda__hash(h, &major, sizeof major);
        h = coda__hash(h, &minor, sizeof minor);
        key[s] = h;
    }
}

/* The program's log, malloc'ed (NULL where there is none or no memory). */
static char *program_log(nvrtcProgram prog) {
    size_t n = 0;
    if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n <= 1) return NULL;
    char *log = malloc(n);
    if (log && nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
        free(log);
        log = NULL;
    }
    return log;
}

coda_status_t coda__nvrtc_compile(const char *src, const char *const *opts, int n_opts,
                                  char **cubin, size_t *size) {
    return coda__nvrtc_compile_log(src, opts, n_opts, cubin, size, NULL);
}

coda_status_t coda__nvrtc_compile_log(const char *src, const char *const *opts, int n_opts, char **cubin,
                                      size_t *size, char **log_out) {
    *cubin = NULL;
    *size = 0;
    if (log_out) *log_out = NULL;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, "coda_kernel.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return coda__fail(CODA_ERR_COMPILE, "nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    r = nvrtcCompileProgram(prog, n_opts, opts);
    if (r != NVRTC_SUCCESS) {
        char log[1536] = "", *full = program_log(prog);
        if (full) snprintf(log, sizeof log, "%s", full);
        free(full);
        nvrtcDestroyProgram(&prog);
        return coda__fail(CODA_ERR_COMPILE, "NVRTC failed (%s): %s", nvrtcGetErrorString(r), log);
    }
    if (log_out) *log_out = program_log(prog);
    size_t n = 0;
    r = nvrtcGetCUBINSize(prog, &n);
    char *out = r == NVRTC_SUCCESS ? malloc(n) : NULL;
    if (out) r = nvrtcGetCUBIN(prog, out);
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS || !out) {
        free(out);
        if (log_out) {
            free(*log_out);
            *log_out = NULL;
        }
        return r != NVRTC_SUCCESS
                   ? coda__fail(CODA_ERR_COMPILE, "nvrtcGetCUBIN: %s", nvrtcGetErrorString(r))
                   : coda__fail(CODA_ERR_NO_MEMORY, "NVRTC: out of memory for the cubin");
    }
    *cubin = out;
    *size = n;
    return CODA_OK;
}

/* mkdir -p; failure is not an error (the cache is an optimisation). */
static void make_dirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(tmp, 0755);
        *p = '/';
    }
    mkdir(tmp, 0755);
}

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) *size = (size_t)n;
    return buf;
}

/* Write to a fresh temporary file (mkstemp: unique across threads and
 * processes) and rename it into place, so readers see all or nothing. */
static void write_file_atomic(const char *path, const char *data, size_t size) {
    char tmp[1100];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) return;
    int fd = mkstemp(tmp);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        return;
    }
    int ok = fwrite(data, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

CUfunction coda__cuda_kernel_find(coda_cuda_device_t *d, const uint64_t quick[2]) {
    for (coda_cuda_kernel_t *k = d->kernels; k; k = k->next)
        if (k->quick[0] == quick[0] && k->quick[1] == quick[1]) return k->fn;
    return NULL;
}

coda_status_t coda__cuda_kernel(coda_context_t *ctx, coda_cuda_device_t *d, const char *src,
                                const char *const *opts, int n_opts, const char *entry,
                                const uint64_t quick[2], CUfunction *fn) {
    struct coda_cuda *c = ctx->cuda;
    uint64_t key[2];
    coda__nvrtc_key(src, opts, n_opts, key);
    /* One module may hold several entry points: the in-memory key names the entry too. */
    uint64_t mkey1 = coda__hash(key[1], entry, strlen(entry));
    for (coda_cuda_kernel_t *k = d->kernels; k; k = k->next) {
        if (k->key[0] == key[0] && k->key[1] == mkey1) {
            *fn = k->fn;
            return CODA_OK;
        }
    }
    char path[1100] = "";
    if (ctx->cache_dir[0])
        snprintf(path, sizeof path, "%s/%016llx%016llx.cubin", ctx->cache_dir,
                 (unsigned long long)key[0], (unsigned long long)key[1]);
    size_t size = 0;
    char *cubin = path[0] ? read_file(path, &size) : NULL;
    CUmodule mod = NULL;
    if (cubin && c->cu.ModuleLoadData(&mod, cubin) != CUDA_SUCCESS) {
        /* a damaged or foreign cache file: recompile */
        mod = NULL;
        free(cubin);
        cubin = NULL;
    }
    if (!mod) {
        CODA_TRY(coda__nvrtc_compile(src, opts, n_opts, &cubin, &size));
        CUresult r = c->cu.ModuleLoadData(&mod, cubin);
        if (r != CUDA_SUCCESS) {
            free(cubin);
            return coda__cu_fail(c, r, "cuModuleLoadData");
        }
        if (path[0]) {
            make_dirs(ctx->cache_dir);
            write_file_atomic(path, cubin, size);
        }
    }
    free(cubin);
    CUfunction f;
    CUresult r = c->cu.ModuleGetFunction(&f, mod, entry);
    /* dynamic shared memory up to what the kernel's static shared memory
     * leaves of the device's limit (asking for more is an error) */
    int static_smem = 0;
    if (r == CUDA_SUCCESS) r = c->cu.FuncGetAttribute(&static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f);
    if (r == CUDA_SUCCESS)
        r = c->cu.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                   d->smem_optin - static_smem);
    coda_cuda_kernel_t *k = r == CUDA_SUCCESS ? calloc(1, sizeof *k) : NULL;
    if (!k) {
        c->cu.ModuleUnload(mod);
        return r != CUDA_SUCCESS ? coda__cu_fail(c, r, "cuModuleGetFunction / cuFuncGetAttribute / cuFuncSetAttribute")
                                 : coda__fail(CODA_ERR_NO_MEMORY, "CUDA backend: out of memory");
    }
    k->key[0] = key[0];
    k->key[1] = mkey1;
    if (quick) {
        k->quick[0] = quick[0];
        k->quick[1] = quick[1];
    }
    k->module = mod;
    k->fn = f;
    k->next = d->kernels;
    d->kernels = k;
    *fn = f;
    return CODA_OK;
}
