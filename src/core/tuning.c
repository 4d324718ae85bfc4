/* tuning.c - the kernel and launch choices a context makes (context.h),
 * read from the environment once, at coda_context_create. */
#include "core/context.h"

#include <stdio.h>
#include <stdlib.h>

/* A variable holding exactly one character, or 0. */
static int one_char(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && !v[1] ? v[0] : 0;
}

void coda__tuning_from_env(coda__tuning_t *t) {
    memset(t, 0, sizeof *t);
    t->gemm_cfg = -1;
    t->streamk = CODA_STREAMK_AUTO;
    t->l2_promotion = 3;
    int c = one_char("CODA_GEMM_CFG");
    if (c >= '0' && c <= '9') t->gemm_cfg = c - '0';
    c = one_char("CODA_STREAMK");
    t->streamk = c == '0'   ? CODA_STREAMK_OFF
                 : c == '1' ? CODA_STREAMK_ON
                 : c == 'a' ? CODA_STREAMK_ALL
                 : c == 's' ? CODA_STREAMK_SPLIT
                            : CODA_STREAMK_AUTO;
    const char *v = getenv("CODA_DEBUG_CLUSTERS");
    if (v && atoi(v) > 0) t->clusters = atoi(v);
    c = one_char("CODA_DEBUG_L2");
    if (c >= '0' && c <= '3') t->l2_promotion = c - '0';
    t->no_ring = getenv("CODA_DEBUG_NO_RING") != NULL;
    t->log_launch = getenv("CODA_DEBUG_LAUNCH") != NULL;
    c = one_char("CODA_DEBUG_OVERLAP");
    t->epi_overlap = c == '0' || c == '1' ? c - '0' : -1;
    t->attn_mma = getenv("CODA_DEBUG_ATTN_MMA") != NULL;
    t->attn_split_bwd = getenv("CODA_DEBUG_ATTN_SPLIT_BWD") != NULL;
    c = one_char("CODA_DEBUG_ATTN_STAGES");
    if (c >= '2' && c <= '4') t->attn_stages = c - '0';
    c = one_char("CODA_DEBUG_ATTN_PIPE");
    t->attn_pipe = c == '0' || c == '1' ? c - '0' : -1;
    c = one_char("CODA_DEBUG_ATTN_FWD_STAGES");
    if (c >= '2' && c <= '3') t->attn_fwd_stages = c - '0';
    c = one_char("CODA_DEBUG_ATTN_FWD_APART");
    t->attn_fwd_apart = c == '0' || c == '1' ? c - '0' : -1;
    c = one_char("CODA_DEBUG_ATTN_FWD_PERSIST");
    t->attn_fwd_persist = c == '0' || c == '1' ? c - '0' : -1;
    c = one_char("CODA_DEBUG_ATTN_FWD_CONSUMERS");
    if (c == '2' || c == '3') t->attn_fwd_consumers = c - '0';
    c = one_char("CODA_DEBUG_ATTN_BWD_PARTS");
    t->attn_bwd_parts = c == 'h' ? -1 : c >= '1' && c <= '8' ? c - '0' : 0;
    c = one_char("CODA_DEBUG_ATTN_BWD_ORDER");
    t->attn_bwd_order = c >= '0' && c <= '9' ? c - '0' : -1;
    v = getenv("CODA_DEBUG_OPTS");
    if (v && strlen(v) < sizeof t->extra_opts) snprintf(t->extra_opts, sizeof t->extra_opts, "%s", v);
}

coda_status_t coda__set_tuning(coda_context_t *ctx, const coda__tuning_t *t) {
    if (!ctx || !t) return coda__fail(CODA_ERR_INVALID_ARG, "coda__set_tuning: NULL argument");
    if (t->gemm_cfg < -1 || t->gemm_cfg > 9)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: gemm_cfg %d is not -1..9", t->gemm_cfg);
    if (t->streamk < CODA_STREAMK_OFF || t->streamk > CODA_STREAMK_SPLIT)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: streamk %d is not 0..4", t->streamk);
    if (t->clusters < 0 || t->l2_promotion < 0 || t->l2_promotion > 3)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: clusters %d < 0 or l2_promotion %d not 0..3",
                          t->clusters, t->l2_promotion);
    if (t->attn_stages != 0 && (t->attn_stages < 2 || t->attn_stages > 4))
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_stages %d is not 0 (default) or 2..4", t->attn_stages);
    if (t->epi_overlap < -1 || t->epi_overlap > 1)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: epi_overlap %d is not -1 (default), 0 or 1", t->epi_overlap);
    if (t->attn_pipe < -1 || t->attn_pipe > 1)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_pipe %d is not -1 (default), 0 or 1", t->attn_pipe);
    if (t->attn_fwd_stages != 0 && (t->attn_fwd_stages < 2 || t->attn_fwd_stages > 3))
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_fwd_stages %d is not 0 (default), 2 or 3",
                          t->attn_fwd_stages);
    if (t->attn_fwd_apart < -1 || t->attn_fwd_apart > 1)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_fwd_apart %d is not -1 (default), 0 or 1",
                          t->attn_fwd_apart);
    if (t->attn_fwd_persist < -1 || t->attn_fwd_persist > 1)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_fwd_persist %d is not -1 (default), 0 or 1",
                          t->attn_fwd_persist);
    if (t->attn_fwd_consumers != 0 && t->attn_fwd_consumers != 2 && t->attn_fwd_consumers != 3)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_fwd_consumers %d is not 0 (default), 2 or 3",
                          t->attn_fwd_consumers);
    if (t->attn_bwd_parts < -1 || t->attn_bwd_parts > 8)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_bwd_parts %d is not -1 (a head a block), 0 (default) or 1..8",
                          t->attn_bwd_parts);
    if (t->attn_bwd_order < -1 || t->attn_bwd_order > 9)
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: attn_bwd_order %d is not -1 (default) or 0..9",
                          t->attn_bwd_order);
    if (!memchr(t->extra_opts, 0, sizeof t->extra_opts))
        return coda__fail(CODA_ERR_INVALID_ARG, "tuning: extra_opts is not terminated");
    ctx->tuning = *t;
    size_t n = strlen(t->extra_opts);
    ctx->tuning.code_key = n ? coda__hash(CODA_HASH_SEED0, t->extra_opts, n) : 0;
    return CODA_OK;
}

coda__tuning_t coda__get_tuning(const coda_context_t *ctx) { return ctx->tuning; }
