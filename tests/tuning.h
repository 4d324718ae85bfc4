/* tuning.h - tests and benchmarks steer the library's kernel and launch
 * choices through the context's tuning (src/core/context.h), never through
 * setenv: the library reads the environment once, when a context is made.
 * Each helper changes one field; a refused value stops the program (the
 * library itself never exits). */
#ifndef CODA_TESTS_TUNING_H
#define CODA_TESTS_TUNING_H

#include "core/context.h"

#include <stdio.h>
#include <stdlib.h>

static inline void tune_set(coda_context_t *ctx, const coda__tuning_t *t) {
    if (coda__set_tuning(ctx, t) != CODA_OK) {
        fprintf(stderr, "tuning refused: %s\n", coda_last_error());
        exit(2);
    }
}
/* Tile configuration forced (-1: chosen per shape, as by default). */
static inline void tune_cfg(coda_context_t *ctx, int cfg) {
    coda__tuning_t t = coda__get_tuning(ctx);
    t.gemm_cfg = cfg;
    tune_set(ctx, &t);
}
/* The same from one digit, as CODA_GEMM_CFG spells it (NULL: per shape). */
static inline void tune_cfg_str(coda_context_t *ctx, const char *digit) {
    tune_cfg(ctx, digit && digit[0] >= '0' && digit[0] <= '9' && !digit[1] ? digit[0] - '0' : -1);
}
/* CODA_STREAMK_OFF / _ON / _AUTO / _ALL. */
static inline void tune_streamk(coda_context_t *ctx, int mode) {
    coda__tuning_t t = coda__get_tuning(ctx);
    t.streamk = mode;
    tune_set(ctx, &t);
}
/* At most n clusters per launch (0: as many as fit). */
static inline void tune_clusters(coda_context_t *ctx, int n) {
    coda__tuning_t t = coda__get_tuning(ctx);
    t.clusters = n;
    tune_set(ctx, &t);
}
/* A fused GEMM's epilogue beside the next tile's k-loop: never (0),
 * wherever the kernel can (1), by the measured rule (-1). */
static inline void tune_overlap(coda_context_t *ctx, int mode) {
    coda__tuning_t t = coda__get_tuning(ctx);
    t.epi_overlap = mode;
    tune_set(ctx, &t);
}
/* Extra NVRTC options for every GEMM kernel (NULL or "": none). */
static inline void tune_opts(coda_context_t *ctx, const char *opts) {
    coda__tuning_t t = coda__get_tuning(ctx);
    if (opts && strlen(opts) >= sizeof t.extra_opts) {
        fprintf(stderr, "tuning: %zu bytes of options (max %zu)\n", strlen(opts), sizeof t.extra_opts - 1);
        exit(2);
    }
    snprintf(t.extra_opts, sizeof t.extra_opts, "%s", opts ? opts : "");
    tune_set(ctx, &t);
}

#endif
