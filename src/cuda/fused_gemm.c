/* fused_gemm.c - a GEMM whose epilogue is a program, on the GPU.
 *
 * The program is turned into CUDA C (src/codegen) and spliced into the
 * Hopper mainloop (kernels/gemm_mainloop.cuh) at its epilogue hook; NVRTC
 * compiles it once per (program text, layout, tile configuration), and the
 * compiled module is cached in memory and on disk (nvrtc.c), so a second run
 * of the same program starts fast and a new program needs no rebuild.
 *
 * Tiling on the GPU: tile_n is the mainloop's block width, 256 or 128 as
 * the plain GEMM would pick (cooperative schedule; a caller asking for 128
 * on a big problem gets the ping-pong schedule); tile_m is 128, the
 * mainloop's block height: column partials are combined over the tile's
 * warps through shared memory (codegen.h). Row partials do not depend on
 * tile_m. */
#include "codegen/codegen.h"
#include "cuda/backend.h"

#include <stdlib.h>

#define GPU_TILE_M 128 /* CODA_BM */
#define PINGPONG_TILE_N 128 /* the ping-pong schedule's tile width */

/* Configuration index for a tiling: tile_n 128 runs the ping-pong schedule
 * (gemm_mainloop.cuh), which hides each tile's epilogue behind the other
 * consumer's mainloop, 256 the cooperative one (the plain GEMM's pick);
 * 2-CTA clusters where there are enough tiles to fill the chip twice.
 * Tuning's gemm_cfg (benchmarking) overrides when its tile width matches.
 * Returns -1 if no configuration has tl.tile_n. */
static int cfg_for_tiling(const coda_context_t *ctx, coda_tiling_t tl, int64_t m, int64_t n, int sm_count) {
    int forced = coda__cuda_gemm_cfg_override(ctx);
    if (forced >= 0 && coda__cuda_gemm_cfgs[forced].bn == tl.tile_n) return forced;
    int pp = tl.tile_n == PINGPONG_TILE_N, best = -1;
    int pick = coda__cuda_gemm_pick(m, n, 0, sm_count); /* the plain GEMM's, if it fits */
    if (!pp && coda__cuda_gemm_cfgs[pick].bn == tl.tile_n) return pick;
    for (int i = 0; i < CODA_CUDA_GEMM_NCFG; i++) {
        const coda_cuda_gemm_cfg_t *c = &coda__cuda_gemm_cfgs[i];
        if (c->bn != tl.tile_n || c->pingpong != pp) continue;
        int64_t tiles = coda__cdiv(m, c->bm) * coda__cdiv(n, c->bn);
        int want_cluster = tiles >= 2 * (int64_t)sm_count;
        if (best < 0 || (c->cluster_m > 1) == want_cluster) best = i;
    }
    return best;
}

coda_status_t coda__cuda_choose_tiling(coda_context_t *ctx, int index, int64_t m, int64_t n,
                                       int64_t k, const coda_program_t *p, coda_tiling_t *tiling) {
    /* Without a device (sizing buffers on a machine with no GPU), assume an
     * H100/H200 SXM's 132 multiprocessors. */
    /* Every program gets the plain GEMM's tile width: 256, the cooperative
     * schedule, on big problems. Since the generated epilogues are
     * branch-free and staged, that is as fast as or faster than
     * ping-pong for every built-in program at M = N = K = 4096 and 8192 on
     * an H200 (bench/HISTORY.md). On small problems the plain pick may be
     * 128, which cfg_for_tiling maps to the ping-pong configurations (not
     * measured against the cooperative 128 there). p is kept for a
     * per-program choice. */
    (void)p;
    coda_cuda_device_t *d;
    coda__error_kept_t kept; /* no device is not a failure here: the caller's last error stays */
    coda__error_keep(&kept);
    int sm_count = coda__cuda_device(ctx, index, &d) == CODA_OK ? d->sm_count : 132;
    coda__error_restore(&kept);
    tiling->tile_m = GPU_TILE_M;
    tiling->tile_n = coda__cuda_gemm_cfgs[coda__cuda_gemm_pick(m, n, k, sm_count)].bn;
    int forced = coda__cuda_gemm_cfg_override(ctx); /* as in cfg_for_tiling */
    if (forced >= 0) tiling->tile_n = coda__cuda_gemm_cfgs[forced].bn;
    return CODA_OK;
}

coda_cg_form_t coda__cuda_fused_form(const coda_program_t *p, const coda_tensor_t *const *bound, int64_t n,
                                     int pingpong, coda_ring_plan_t *plan) {
    coda_ring_plan_t own;
    coda_ring_plan_t *rp = plan ? plan : &own;
    coda__codegen_ring_plan(NULL, rp); /* empty unless the form is RING */
    coda_cg_form_t form = coda__codegen_form(n);
    if (form != CODA_CG_N16) return form;
    /* the N16 form moves tiles as 16-byte vectors and copies column vectors
     * 16 bytes at a time: every tile argument's base and row stride, and
     * the base of every column vector it may copy, must be 16-byte
     * aligned, or the even-N form runs */
    for (int k = 0; k < p->n_args; k++) {
        const coda_tensor_t *t = bound[k];
        coda_arg_kind_t kind = p->args[k].kind;
        int col = coda__codegen_col_staged(p, k);
        if (!t || (kind != CODA_IN_TILE && kind != CODA_OUT_TILE && !col)) continue;
        if ((uintptr_t)t->data % 16 != 0 || (!col && t->ndim == 2 && t->stride[0] % 16 != 0)) return CODA_CG_EVEN;
        /* staged outputs may go out by TMA (the store plan), which takes
         * row strides below 2^40 bytes and no shorter than a row (a
         * one-row tensor may have any stride) */
        if (kind == CODA_OUT_TILE && t->ndim == 2 &&
            (t->stride[0] >= ((int64_t)1 << 40) || t->stride[0] < t->shape[1] * (int64_t)coda_dtype_size(t->dtype)))
            return CODA_CG_EVEN;
    }
    /* tile inputs through the stage ring (TMA), on the cooperative schedule
     * only (ping-pong would read them pair by pair from global memory):
     * 2-D, rows at least a row's bytes and less than 2^40 bytes apart.
     * (Tuning's no_ring, an experiment, is passed in as pingpong.) */
    if (pingpong) return form;
    coda_ring_plan_t ring;
    coda__codegen_ring_plan(p, &ring);
    if (ring.nbox == 0) return form;
    for (int b = 0; b < ring.nbox; b++) {
        const coda_tensor_t *t = bound[ring.arg[b]];
        if (!t || t->ndim != 2 || t->stride[0] >= ((int64_t)1 << 40) ||
            t->stride[0] < t->shape[1] * (int64_t)coda_dtype_size(t->dtype))
            return form;
    }
    *rp = ring;
    return CODA_CG_RING;
}

/* The parameter block: one pointer, two element strides, one scalar and
 * one dim-1 extent per program argument (codegen.h). */
static void fill_params(const coda_program_t *p, const coda_tensor_t *const *bound,
                        const float *scalars, int64_t m, int64_t n, coda_epi_params_t *P) {
    memset(P, 0, sizeof *P);
    for (int k = 0; k < p->n_args; k++) {
        const coda_tensor_t *t = bound[k];
        P->scalar[k] = scalars[k];
        if (!t) continue;
        int64_t es = (int64_t)coda_dtype_size(t->dtype);
        P->ptr[k] = (uint64_t)(uintptr_t)t->data;
        P->s0[k] = t->stride[0] / es;
        P->s1[k] = t->ndim > 1 ? t->stride[1] / es : 1;
        P->e1[k] = t->ndim > 1 ? (int32_t)t->shape[1] : 1;
    }
    P->m = (int32_t)m;
    P->n = (int32_t)n;
}

coda_status_t coda__cuda_gemm_epilogue(coda_context_t *ctx, coda_layout_t layout,
                                       const coda_tensor_t *a, const coda_tensor_t *b,
                                       const coda_program_t *p, const coda_tensor_t *const *bound,
                                       const float *scalars, coda_tiling_t tiling, void *stream) {
    int64_t m = 0, n = 0, k = 0;
    coda__gemm_extents(layout, a, b, &m, &n, &k);
    if (m > INT32_MAX / 4 || n > INT32_MAX / 4)
        return coda__fail(CODA_ERR_SHAPE, "fused GEMM on CUDA: extents %lld x %lld are too large",
                          (long long)m, (long long)n);
    /* Column partials are per 128-row tile; row partials do not depend on
     * tile_m, so only programs with column reductions are held to it. */
    int has_colred = 0;
    for (int i = 0; i < p->n_args; i++) has_colred |= p->args[i].kind == CODA_OUT_COLRED;
    if (has_colred && tiling.tile_m != GPU_TILE_M)
        return coda__fail(CODA_ERR_UNSUPPORTED,
                          "fused GEMM on CUDA: tiling.tile_m %d; a program with column reductions "
                          "needs %d on the GPU (coda_choose_tiling)", tiling.tile_m, GPU_TILE_M);
    coda_cuda_device_t *d;
    CODA_TRY(coda__cuda_device(ctx, a->device_index, &d));
    int cfg = cfg_for_tiling(ctx, tiling, m, n, d->sm_count);
    if (cfg < 0)
        return coda__fail(CODA_ERR_UNSUPPORTED,
                          "fused GEMM on CUDA: tiling.tile_n %d; the GPU mainloop has 128 or 256",
                          tiling.tile_n);
    for (int i = 0; i < p->n_args; i++) {
        const coda_tensor_t *t = bound[i];
        const coda_arg_t *arg = &p->args[i];
        if (!t) continue;
        if (t->device_index != a->device_index)
            return coda__fail(CODA_ERR_DEVICE, "argument %s is on cuda:%d, a on cuda:%d", arg->name,
                              t->device_index, a->device_index);
        /* The generated code moves a pair's elements (1, 2 or 4 of them:
         * half, full, double space) as one access: that many elements'
         * alignment for the base and the row stride. */
        if (arg->kind == CODA_IN_TILE || arg->kind == CODA_OUT_TILE || arg->kind == CODA_IN_COL) {
            int64_t vec = (int64_t)coda_dtype_size(t->dtype) *
                          (arg->space == CODA_SPACE_HALF ? 1 : arg->space == CODA_SPACE_FULL ? 2 : 4);
            if ((uintptr_t)t->data % (uintptr_t)vec != 0 || (t->ndim == 2 && t->stride[0] % vec != 0))
                return coda__fail(CODA_ERR_STRIDE,
                                  "argument %s: base %p and row stride %lld bytes must be multiples of %lld "
                                  "on the GPU (one access per accumulator pair)",
                                  arg->name, t->data, (long long)t->stride[0], (long long)vec);
        }
    }

    const char *src = NULL; /* generated and hashed once per program and form */
    const uint64_t *key = NULL;
    coda_ring_plan_t rp;
    coda_cg_form_t form = coda__cuda_fused_form(p, bound, n, coda__cuda_gemm_cfgs[cfg].pingpong || ctx->tuning.no_ring, &rp);
    CODA_TRY(coda__codegen_cuda_cached(p, form, &src, &key));
    coda_epi_params_t params;
    fill_params(p, bound, scalars, m, n, &params);
    coda_cuda_epi_io_t io;
    memset(&io, 0, sizeof io);
    io.nbox = rp.nbox; /* 0 unless the form is RING */
    for (int b = 0; b < rp.nbox; b++) {
        io.tensor[b] = bound[rp.arg[b]];
        io.xmul[b] = rp.xmul[b];
        io.xadd[b] = rp.xadd[b];
    }
    coda_store_plan_t sp; /* empty unless the form is N16 or RING */
    coda__codegen_store_plan(p, form, &sp);
    io.nstore = sp.nmap;
    for (int s = 0; s < sp.nmap; s++) {
        io.store[s] = bound[sp.arg[s]];
        io.store_cols[s] = sp.cols[s];
    }
    io.acc_bf16 = coda__program_acc_bf16(p);
    io.nbound = p->n_args;
    for (int i = 0; i < p->n_args; i++) {
        io.bound[i] = bound[i];
        io.bound_name[i] = p->args[i].name;
    }
    return coda__cuda_gemm_run(ctx, layout, a, b, NULL, src, key, &params, sizeof params, 0, cfg, &io, stream);
}
