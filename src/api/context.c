/* context.c - create, describe and free a context. */
#include "core/context.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The cache directory from the environment; 0 if the path does not fit. */
static int default_cache_dir(char *out, size_t cap) {
    const char *env = getenv("CODA_CACHE_DIR");
    int n;
    if (env && *env) {
        n = snprintf(out, cap, "%s", env);
    } else if ((env = getenv("XDG_CACHE_HOME")) && *env) {
        n = snprintf(out, cap, "%s/coda", env);
    } else {
        env = getenv("HOME");
        n = snprintf(out, cap, "%s/.cache/coda", env && *env ? env : "/tmp");
    }
    return n >= 0 && (size_t)n < cap;
}

coda_status_t coda_context_create(const coda_context_options_t *opts, coda_context_t **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_create: out is NULL");
    *out = NULL;
    if (opts && opts->cpu_threads < 0)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_create: cpu_threads %d < 0",
                          opts->cpu_threads);
    if (opts && opts->cache_dir && strlen(opts->cache_dir) >= sizeof(((coda_context_t *)0)->cache_dir))
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_create: cache_dir is too long");
    coda_context_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return coda__fail(CODA_ERR_NO_MEMORY, "coda_context_create: out of memory");
    ctx->cpu_threads = opts && opts->cpu_threads > 0 ? opts->cpu_threads : 0;
    if (ctx->cpu_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        ctx->cpu_threads = n > 0 ? (int)(n > 64 ? 64 : n) : 1;
    }
    if (opts && opts->cache_dir && *opts->cache_dir)
        snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", opts->cache_dir);
    else if (!default_cache_dir(ctx->cache_dir, sizeof ctx->cache_dir)) {
        free(ctx);
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_create: the cache directory from "
                          "CODA_CACHE_DIR / XDG_CACHE_HOME / HOME is longer than %zu bytes",
                          sizeof ctx->cache_dir - 1);
    }
    coda__tuning_t t;
    coda__tuning_from_env(&t);
    coda_status_t st = coda__set_tuning(ctx, &t);
    if (st != CODA_OK) {
        free(ctx);
        return st;
    }
    *out = ctx;
    return CODA_OK;
}

void coda_context_free(coda_context_t *ctx) {
    if (!ctx) return;
#ifdef CODA_WITH_CUDA
    coda__cuda_free(ctx->cuda);
#endif
    for (int i = 0; i < 2; i++) coda_program_free(atomic_load(&ctx->lm_programs[i]));
    free(ctx);
}

int coda_context_has_cuda(const coda_context_t *ctx) {
#ifdef CODA_WITH_CUDA
    /* Opening the driver is lazy (it may set the error message): this query
     * is not a failing call, so the caller's last error is kept. */
    coda__error_kept_t kept;
    coda__error_keep(&kept);
    struct coda_cuda *cuda;
    int ok = ctx && coda__cuda_get((coda_context_t *)ctx, &cuda) == CODA_OK;
    coda__error_restore(&kept);
    return ok;
#else
    (void)ctx;
    return 0;
#endif
}

static coda_status_t describe(coda_context_t *ctx, char *buf, size_t cap);

coda_status_t coda_context_describe(coda_context_t *ctx, char *buf, size_t cap) {
    if (!ctx || !buf || cap == 0)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_describe: NULL context or buffer");
    /* built in a local buffer and copied only if it fits: a failing call
     * leaves buf as it was */
    char text[4096];
    /* a device that cannot be opened is described, not a failure: the
     * caller's last error stays */
    coda__error_kept_t kept;
    coda__error_keep(&kept);
    coda_status_t s = describe(ctx, text, sizeof text);
    if (s != CODA_OK) return s;
    coda__error_restore(&kept);
    size_t n = strlen(text);
    if (n >= cap)
        return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_describe: needs %zu bytes, cap is %zu", n + 1, cap);
    memcpy(buf, text, n + 1);
    return CODA_OK;
}

static coda_status_t describe(coda_context_t *ctx, char *buf, size_t cap) {
    int n = snprintf(buf, cap,
                     "coda %s\n"
                     "build: CUDA backend %s\n"
                     "cpu: reference backend, %d threads\n"
                     "cache: %s\n",
                     CODA_VERSION_STRING,
#ifdef CODA_WITH_CUDA
                     "compiled in (NVRTC, sm_90a)",
#else
                     "not built (no CUDA toolkit at build time)",
#endif
                     ctx->cpu_threads, ctx->cache_dir);
    if (n < 0 || (size_t)n >= cap) return coda__fail(CODA_ERR_INVALID_ARG, "coda_context_describe: buffer too small");
#ifdef CODA_WITH_CUDA
    return coda__cuda_describe(ctx, buf + n, cap - (size_t)n);
#else
    return CODA_OK;
#endif
}
