/* test_tuning.c - the context's tuning (src/core/context.h): read from the
 * environment once, when the context is made; changed afterwards only
 * through coda__set_tuning, which refuses bad values and changes nothing
 * then; code_key follows the options that change compiled code. */
#include "harness.h"
#include "tuning.h"

static void with_env(const char *const *kv, int n) {
    for (int i = 0; i < n; i += 2) setenv(kv[i], kv[i + 1], 1);
}

int main(void) {
    static const char *const names[] = {"CODA_GEMM_CFG", "CODA_STREAMK", "CODA_DEBUG_CLUSTERS", "CODA_DEBUG_L2",
                                        "CODA_DEBUG_NO_RING", "CODA_DEBUG_LAUNCH", "CODA_DEBUG_OPTS",
                                        "CODA_DEBUG_ATTN_STAGES", "CODA_DEBUG_ATTN_PIPE",
                                        "CODA_DEBUG_ATTN_FWD_STAGES", "CODA_DEBUG_ATTN_FWD_APART",
                                        "CODA_DEBUG_ATTN_FWD_PERSIST", "CODA_DEBUG_ATTN_BWD_PARTS", "CODA_DEBUG_ATTN_BWD_ORDER",
                                        "CODA_DEBUG_ATTN_FWD_CONSUMERS", "CODA_DEBUG_OVERLAP"};
    const int n_names = (int)(sizeof names / sizeof names[0]);
    for (int i = 0; i < n_names; i++) unsetenv(names[i]);

    coda_context_t *ctx;
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    coda__tuning_t t = coda__get_tuning(ctx);
    CHECK(t.gemm_cfg == -1 && t.streamk == CODA_STREAMK_AUTO && t.clusters == 0 && t.l2_promotion == 3 &&
              !t.no_ring && !t.log_launch && !t.extra_opts[0] && t.code_key == 0 && t.attn_stages == 0 &&
              t.attn_pipe == -1 && t.attn_fwd_stages == 0 && t.attn_fwd_apart == -1 && t.attn_bwd_parts == 0 &&
              t.attn_bwd_order == -1 && t.attn_fwd_persist == -1 && t.attn_fwd_consumers == 0 &&
              t.epi_overlap == -1,
          "defaults: cfg %d streamk %d clusters %d l2 %d attn stages %d pipe %d", t.gemm_cfg, t.streamk, t.clusters,
          t.l2_promotion, t.attn_stages, t.attn_pipe);

    /* set after the context exists: no effect on it */
    setenv("CODA_GEMM_CFG", "3", 1);
    CHECK(coda__get_tuning(ctx).gemm_cfg == -1, "environment read again after creation");
    coda_context_free(ctx);

    static const char *const env[] = {"CODA_GEMM_CFG", "4", "CODA_STREAMK", "a", "CODA_DEBUG_CLUSTERS", "64",
                                      "CODA_DEBUG_L2", "1", "CODA_DEBUG_NO_RING", "1", "CODA_DEBUG_LAUNCH", "1",
                                      "CODA_DEBUG_OPTS", "-DX=1 -DY=2", "CODA_DEBUG_ATTN_STAGES", "4",
                                      "CODA_DEBUG_ATTN_PIPE", "0", "CODA_DEBUG_ATTN_FWD_STAGES", "3",
                                      "CODA_DEBUG_ATTN_FWD_APART", "1", "CODA_DEBUG_ATTN_BWD_PARTS", "h",
                                      "CODA_DEBUG_ATTN_BWD_ORDER", "4", "CODA_DEBUG_ATTN_FWD_PERSIST", "1",
                                      "CODA_DEBUG_ATTN_FWD_CONSUMERS", "3", "CODA_DEBUG_OVERLAP", "0"};
    with_env(env, 32);
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    t = coda__get_tuning(ctx);
    CHECK(t.gemm_cfg == 4 && t.streamk == CODA_STREAMK_ALL && t.clusters == 64 && t.l2_promotion == 1 &&
              t.no_ring && t.log_launch && strcmp(t.extra_opts, "-DX=1 -DY=2") == 0 && t.code_key != 0 &&
              t.attn_stages == 4 && t.attn_pipe == 0 && t.attn_fwd_stages == 3 && t.attn_fwd_apart == 1 &&
              t.attn_bwd_parts == -1 && t.attn_bwd_order == 4 && t.attn_fwd_persist == 1 &&
              t.attn_fwd_consumers == 3 && t.epi_overlap == 0,
          "from the environment: cfg %d streamk %d clusters %d l2 %d opts '%s'", t.gemm_cfg, t.streamk,
          t.clusters, t.l2_promotion, t.extra_opts);
    uint64_t key = t.code_key;
    coda_context_free(ctx);
    /* the split tail's spelling */
    setenv("CODA_STREAMK", "s", 1);
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    CHECK(coda__get_tuning(ctx).streamk == CODA_STREAMK_SPLIT, "CODA_STREAMK=s: streamk %d",
          coda__get_tuning(ctx).streamk);
    coda_context_free(ctx);

    /* values the variables do not spell are the defaults */
    static const char *const odd[] = {"CODA_GEMM_CFG", "12", "CODA_STREAMK", "yes", "CODA_DEBUG_L2", "7",
                                      "CODA_DEBUG_CLUSTERS", "-3", "CODA_DEBUG_ATTN_STAGES", "5",
                                      "CODA_DEBUG_ATTN_PIPE", "2", "CODA_DEBUG_ATTN_FWD_STAGES", "4",
                                      "CODA_DEBUG_ATTN_FWD_APART", "x", "CODA_DEBUG_ATTN_BWD_PARTS", "9",
                                      "CODA_DEBUG_ATTN_BWD_ORDER", "12", "CODA_DEBUG_ATTN_FWD_PERSIST", "2",
                                      "CODA_DEBUG_ATTN_FWD_CONSUMERS", "4", "CODA_DEBUG_OVERLAP", "2"};
    for (int i = 0; i < n_names; i++) unsetenv(names[i]);
    with_env(odd, 26);
    REQUIRE_OK(coda_context_create(NULL, &ctx));
    t = coda__get_tuning(ctx);
    CHECK(t.gemm_cfg == -1 && t.streamk == CODA_STREAMK_AUTO && t.l2_promotion == 3 && t.clusters == 0 &&
              t.attn_stages == 0 && t.attn_pipe == -1 && t.attn_fwd_stages == 0 && t.attn_fwd_apart == -1 &&
              t.attn_bwd_parts == 0 && t.attn_bwd_order == -1 && t.attn_fwd_persist == -1 &&
              t.attn_fwd_consumers == 0 && t.epi_overlap == -1,
          "unspelled values: cfg %d streamk %d l2 %d clusters %d attn stages %d pipe %d", t.gemm_cfg, t.streamk,
          t.l2_promotion, t.clusters, t.attn_stages, t.attn_pipe);
    for (int i = 0; i < n_names; i++) unsetenv(names[i]);

    /* coda__set_tuning: refused values change nothing */
    coda__tuning_t before = coda__get_tuning(ctx), bad = before;
    /* each value of vals[] in field: refused */
#define REFUSE_EACH(field, ...)                                                   \
    do {                                                                          \
        static const int vals_[] = {__VA_ARGS__};                                 \
        for (size_t i_ = 0; i_ < sizeof vals_ / sizeof vals_[0]; i_++) {          \
            bad = before;                                                         \
            bad.field = vals_[i_];                                                \
            CHECK_STATUS(coda__set_tuning(ctx, &bad), CODA_ERR_INVALID_ARG);      \
        }                                                                         \
    } while (0)
    REFUSE_EACH(gemm_cfg, 10);
    REFUSE_EACH(streamk, 5, -1);
    REFUSE_EACH(l2_promotion, -1);
    REFUSE_EACH(clusters, -1);
    REFUSE_EACH(attn_stages, 1, 5, -1);
    REFUSE_EACH(attn_pipe, 2, -2);
    REFUSE_EACH(attn_fwd_stages, 1, 4, -1);
    REFUSE_EACH(attn_fwd_apart, 2, -2);
    REFUSE_EACH(attn_fwd_persist, 2, -2);
    REFUSE_EACH(attn_fwd_consumers, 1, 4, -1);
    REFUSE_EACH(attn_bwd_parts, 9, -2);
    REFUSE_EACH(attn_bwd_order, 10, -2);
    REFUSE_EACH(epi_overlap, 2, -2);
#undef REFUSE_EACH
    bad = before;
    memset(bad.extra_opts, 'x', sizeof bad.extra_opts);
    CHECK_STATUS(coda__set_tuning(ctx, &bad), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__set_tuning(NULL, &before), CODA_ERR_INVALID_ARG);
    CHECK_STATUS(coda__set_tuning(ctx, NULL), CODA_ERR_INVALID_ARG);
    coda__tuning_t now = coda__get_tuning(ctx);
    CHECK(memcmp(&now, &before, sizeof now) == 0, "a refused tuning changed the context's");

    /* the helpers the GPU tests use, and code_key */
    tune_cfg(ctx, 2);
    tune_streamk(ctx, CODA_STREAMK_ON);
    tune_clusters(ctx, 8);
    CHECK(coda__get_tuning(ctx).gemm_cfg == 2 && coda__get_tuning(ctx).streamk == CODA_STREAMK_ON &&
              coda__get_tuning(ctx).clusters == 8 && coda__get_tuning(ctx).code_key == 0,
          "helpers set one field each; no code change, no code key");
    tune_opts(ctx, "-DX=1 -DY=2");
    CHECK(coda__get_tuning(ctx).code_key == key, "the same options give the same code key");
    tune_opts(ctx, "-DX=1 -DY=3");
    CHECK(coda__get_tuning(ctx).code_key != key && coda__get_tuning(ctx).code_key != 0,
          "other options, another code key");
    tune_opts(ctx, NULL);
    CHECK(coda__get_tuning(ctx).code_key == 0, "no options: code key 0");
    tune_cfg_str(ctx, "5");
    CHECK(coda__get_tuning(ctx).gemm_cfg == 5, "tune_cfg_str");
    tune_cfg_str(ctx, NULL);
    CHECK(coda__get_tuning(ctx).gemm_cfg == -1, "tune_cfg_str(NULL): per shape");
    coda_context_free(ctx);
    TEST_MAIN_END();
}
