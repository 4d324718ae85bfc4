/* epilogue_cuda.c - generate CUDA C for an epilogue program (see codegen.h).
 *
 * Every value of the program becomes 1, 2 or 4 float registers per
 * accumulator pair (its space: half, full, double); values that do not vary
 * along columns (scalars, row values) are one register, broadcast. The
 * generated code is straight-line: the kernel unrolls its fragment loops, so
 * the slot indices are constants and the reduction state stays in registers.
 *
 * The pieces: src/codegen/cg.h. */
#include "codegen/cg.h"

#include <stdlib.h>
#include <string.h>

/* The device helpers every generated epilogue starts with (cg_* loads,
 * stores, conversions, branch-free math, the log-sum-exp steps): a real CUDA
 * file, src/codegen/epi_prelude.cuh, embedded by the build (tools/embed). */
extern const struct { const char *name; const char *text; } coda_codegen_sources[];

static const char *prelude(void) {
    for (int i = 0; coda_codegen_sources[i].name; i++)
        if (strcmp(coda_codegen_sources[i].name, "epi_prelude.cuh") == 0) return coda_codegen_sources[i].text;
    return NULL;
}

coda_status_t coda__codegen_cuda(const coda_program_t *p, char **out) {
    return coda__codegen_cuda_ex(p, CODA_CG_ANY, out);
}

_Static_assert(sizeof(((coda_program_t *)0)->cuda_src) / sizeof(((coda_program_t *)0)->cuda_src[0]) == CODA_CG_NFORMS,
               "one cached text per form");

coda_cg_form_t coda__codegen_form(int64_t n) {
    return n % 16 == 0 ? CODA_CG_N16 : n % 2 == 0 ? CODA_CG_EVEN : CODA_CG_ANY;
}

coda_status_t coda__codegen_cuda_ex(const coda_program_t *p, coda_cg_form_t form, char **out) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: out is NULL");
    *out = NULL;
    if (!p || !p->verified) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: program is NULL or not verified");
    if ((unsigned)form >= CODA_CG_NFORMS) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: form %d", (int)form);
    const int even_n = form != CODA_CG_ANY;
    if (p->n_args > CODA_EPI_MAX_ARGS)
        return coda__fail(CODA_ERR_UNSUPPORTED, "codegen: %d arguments; the GPU epilogue takes at most %d",
                          p->n_args, CODA_EPI_MAX_ARGS);
    sb_t b = {0};
    const char *pre = prelude();
    if (!pre) return coda__fail(CODA_ERR_INTERNAL, "codegen: epi_prelude.cuh is not embedded");
    sb_printf(&b, "%s\n/* ---- generated from epilogue program '%s'%s ---- */\n", pre, p->name,
              form == CODA_CG_RING ? " (N a multiple of 16, tile inputs through the stage ring)"
              : form == CODA_CG_N16 ? " (N a multiple of 16)" : even_n ? " (N even)" : "");
    coda_ring_plan_t rp;
    coda__codegen_ring_plan(form == CODA_CG_RING ? p : NULL, &rp);
    if (form == CODA_CG_RING)
        /* the cooperative mainloop (staging slabs, no ping-pong) fills the
         * ring; elsewhere the ring inputs are read from global memory */
        sb_printf(&b, "#define CODA_EPI_RING_BOXES %d\n"
                      "#if CODA_EPI_STAGE && !CODA_PINGPONG\n#define CODA_EPI_RING 1\n#else\n#define CODA_EPI_RING 0\n#endif\n",
                  rp.nbox);
    stage_plan_t sp;
    plan_staging(p, form == CODA_CG_N16 || form == CODA_CG_RING, &rp, &sp);
    gen_slab_wait(&b, &sp);
    gen_state(&b, p, &sp);
    gen_fetch(&b, p, even_n, &rp, &sp);
    gen_stage_in(&b, p, &sp);
    CODA_TRY(gen_pair(&b, p, even_n, &sp));
    gen_flush(&b, p, &sp);
    gen_end(&b, p, &sp);
    if (b.oom) {
        free(b.buf);
        return coda__fail(CODA_ERR_NO_MEMORY, "codegen: out of memory");
    }
    *out = b.buf;
    return CODA_OK;
}

coda_status_t coda__codegen_cuda_cached(const coda_program_t *p, coda_cg_form_t form, const char **out,
                                        const uint64_t **key) {
    if (!out) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: out is NULL");
    if (!p) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: program is NULL");
    if ((unsigned)form >= CODA_CG_NFORMS) return coda__fail(CODA_ERR_INVALID_ARG, "codegen: form %d", (int)form);
    _Atomic(struct coda_cg_text *) *slot = &((coda_program_t *)p)->cuda_src[form];
    struct coda_cg_text *cur = atomic_load(slot);
    if (!cur) {
        char *text = NULL;
        CODA_TRY(coda__codegen_cuda_ex(p, form, &text));
        size_t len = strlen(text);
        struct coda_cg_text *made = malloc(sizeof *made + len + 1);
        if (!made) {
            free(text);
            return coda__fail(CODA_ERR_NO_MEMORY, "codegen: out of memory");
        }
        memcpy(made->text, text, len + 1);
        free(text);
        made->key[0] = coda__hash(CODA_HASH_SEED0, made->text, len);
        made->key[1] = coda__hash(CODA_HASH_SEED1, made->text, len);
        /* another thread may have been first: keep its text, drop ours */
        if (atomic_compare_exchange_strong(slot, &cur, made)) cur = made;
        else free(made);
    }
    *out = cur->text;
    if (key) *key = cur->key;
    return CODA_OK;
}
