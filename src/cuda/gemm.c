/* gemm.c - the CUDA GEMM: operand checks, tile choice, tensor maps, launch.
 *
 * The kernel (src/cuda/kernels/gemm_*.cuh) is one source per epilogue,
 * specialised per layout and tile configuration with -D options, compiled by
 * NVRTC on first use and cached (nvrtc.c). coda__cuda_gemm runs it with the
 * plain alpha/beta epilogue (kernels/epi_plain.cuh); fused epilogues use
 * coda__cuda_gemm_run with their own source and parameter block. */
#include "cuda/backend.h"

#include <stdio.h>
#include <stdlib.h>

/* Measured on an H200 (bench/HISTORY.md): 128x256 tiles in 2-CTA clusters
 * (B multicast to a pair of tile rows, groups of 16 tile rows) win wherever
 * there are enough tiles to fill the chip, by 3-5% over the same tile
 * without clusters; one wave or less of big tiles runs best without
 * clusters, and below half a wave smaller tiles spread the work wider. */
const coda_cuda_gemm_cfg_t coda__cuda_gemm_cfgs[CODA_CUDA_GEMM_NCFG] = {
    /* bm, bn, bk, stages, cluster_m, group_m, pingpong */
    {128, 256, 64, 4, 1, 8, 0},
    {128, 128, 64, 6, 1, 8, 0},
    {128, 256, 64, 4, 2, 8, 0},
    {128, 256, 64, 4, 2, 16, 0},
    {128, 128, 64, 6, 1, 8, 1},
    {128, 128, 64, 6, 2, 16, 1},
};

int coda__cuda_gemm_pick(int64_t m, int64_t n, int64_t k, int sm_count) {
    (void)k;
    int64_t tiles256 = coda__cdiv(m, 128) * coda__cdiv(n, 256);
    if (tiles256 >= sm_count) return 3;
    if (2 * tiles256 < sm_count) return 1;
    return 0;
}

int coda__cuda_gemm_cfg_override(const coda_context_t *ctx) {
    int c = ctx->tuning.gemm_cfg;
    return c >= 0 && c < CODA_CUDA_GEMM_NCFG ? c : -1;
}

/* NULL: the epilogue's place (probes.cuh first: the epilogue uses it too) */
static const char *const kernel_files[] = {"probes.cuh",       "gemm_prelude.cuh", "gemm_wgmma.cuh",   NULL,
                                           "gemm_streamk.cuh", "gemm_overlap.cuh", "gemm_mainloop.cuh"};
#define N_KERNEL_FILES (sizeof kernel_files / sizeof kernel_files[0])

char *coda__cuda_gemm_source(const char *epilogue_src) {
    char *src;
    return coda__cuda_join_sources(kernel_files, N_KERNEL_FILES, epilogue_src, "CUDA GEMM", &src) == CODA_OK ? src
                                                                                                          : NULL;
}

size_t coda__cuda_gemm_smem(const coda_cuda_gemm_cfg_t *cfg) {
    size_t stage = (size_t)(cfg->bm + cfg->bn) * cfg->bk * 2;
    /* stages, C staging (2 consumers x 2 x 8 KiB), barriers, alignment slack */
    return cfg->stages * stage + 32768 + 16 * (size_t)cfg->stages + 1024;
}

int coda__cuda_gemm_options(coda_layout_t layout, const coda_cuda_gemm_cfg_t *cfg, int store_c,
                            int c_f32, int sched, const char **opts, char *optbuf, size_t optcap) {
    int n = 0;
    opts[n++] = "--gpu-architecture=sm_90a";
    opts[n++] = "--std=c++17";
    opts[n++] = "-default-device";
    int ta = layout == CODA_LAYOUT_TN, tb = layout != CODA_LAYOUT_NT;
    const struct { const char *name; int value; } defs[] = {
        {"CODA_BN", cfg->bn},           {"CODA_STAGES", cfg->stages},     {"CODA_TA", ta},
        {"CODA_TB", tb},                {"CODA_CLUSTER", cfg->cluster_m}, {"CODA_EPI_STORE_C", store_c},
        {"CODA_C_F32", c_f32},          {"CODA_GROUP_M", cfg->group_m},   {"CODA_PINGPONG", cfg->pingpong},
        {"CODA_EPI_STAGE", !store_c},   {"CODA_STREAMK", sched == CODA_SCHED_STREAMK && !cfg->pingpong},
        {"CODA_EPI_OVERLAP", sched == CODA_SCHED_OVERLAP && !cfg->pingpong && !store_c},
    };
    size_t used = 0;
    for (size_t i = 0; i < sizeof defs / sizeof defs[0] && n < CODA_CUDA_GEMM_MAX_OPTS; i++) {
        int w = snprintf(optbuf + used, optcap - used, "-D%s=%d", defs[i].name, defs[i].value);
        if (w < 0 || used + (size_t)w + 1 > optcap) break; /* optbuf too small: fewer options, a compile error */
        opts[n++] = optbuf + used;
        used += (size_t)w + 1;
    }
    return n;
}

/* Tuning's extra NVRTC options (experiments): up to 4 space-separated
 * options after the n in opts, copied into buf; returns the new count. */
int coda__cuda_extra_options(const char *x, const char **opts, int n, int max, char *buf, size_t cap) {
    size_t used = 0;
    for (int added = 0; x && *x && added < 4 && n < max && used + 64 < cap; added++) {
        while (*x == ' ') x++;
        size_t len = strcspn(x, " ");
        if (!len || len > 60) break;
        memcpy(buf + used, x, len);
        buf[used + len] = 0;
        opts[n++] = buf + used;
        used += len + 1;
        x += len;
    }
    return n;
}

coda_status_t coda__cuda_check_operands(coda_layout_t layout, const coda_tensor_t *a,
                                        const coda_tensor_t *b) {
    int64_t m = 0, n = 0, k = 0;
    coda__gemm_extents(layout, a, b, &m, &n, &k);
    if (a->dtype != CODA_BF16)
        return coda__fail(CODA_ERR_DTYPE, "a: CUDA GEMM operands must be bf16, got %s",
                          coda_dtype_name(a->dtype) ? coda_dtype_name(a->dtype) : "?");
    if (b->dtype != CODA_BF16)
        return coda__fail(CODA_ERR_DTYPE, "b: CUDA GEMM operands must be bf16, got %s",
                          coda_dtype_name(b->dtype) ? coda_dtype_name(b->dtype) : "?");
    if (k % 8 != 0)
        return coda__fail(CODA_ERR_SHAPE,
                          "K = %lld is not a multiple of 8 (the CUDA GEMM copies 16-byte rows)",
                          (long long)k);
    const coda_tensor_t *ops[2] = {a, b};
    const char *names[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        if ((uintptr_t)ops[i]->data % 16 != 0)
            return coda__fail(CODA_ERR_STRIDE, "%s: data pointer %p is not 16-byte aligned",
                              names[i], ops[i]->data);
        if (ops[i]->stride[0] % 16 != 0)
            return coda__fail(CODA_ERR_STRIDE,
                              "%s: row stride %lld bytes is not a multiple of 16 (the GPU copy "
                              "engine needs 16-byte rows: pad the rows to a multiple of 8 elements)",
                              names[i], (long long)ops[i]->stride[0]);
        if (ops[i]->stride[0] >= ((int64_t)1 << 40))
            return coda__fail(CODA_ERR_STRIDE, "%s: row stride %lld bytes is too large (max 2^40)",
                              names[i], (long long)ops[i]->stride[0]);
        if (ops[i]->shape[0] > INT32_MAX || ops[i]->shape[1] > INT32_MAX)
            return coda__fail(CODA_ERR_SHAPE, "%s: extents beyond 2^31-1 are not supported",
                              names[i]);
    }
    return CODA_OK;
}

/* L2 sector promotion for TMA loads: 256 bytes, unless tuning's
 * l2_promotion (an experiment switch for bench_gemm) says otherwise. */
static coda_status_t encode_swizzled(const coda_context_t *ctx, CUtensorMap *map, const coda_tensor_t *t,
                                     int64_t inner, int64_t outer, int box_inner, int box_outer,
                                     CUtensorMapSwizzle swizzle, const char *what) {
    CUtensorMapDataType dt = t->dtype == CODA_F32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                                  : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    cuuint64_t dims[2] = {(cuuint64_t)(inner > 0 ? inner : 1), (cuuint64_t)(outer > 0 ? outer : 1)};
    /* K = 0 (C = beta C): the map is never used, but must encode */
    cuuint64_t strides[1] = {(cuuint64_t)(t->stride[0] >= 16 ? t->stride[0] : 16)};
    cuuint32_t box[2] = {(cuuint32_t)box_inner, (cuuint32_t)box_outer};
    cuuint32_t estr[2] = {1, 1};
    struct coda_cuda *cu = ctx->cuda;
    CODA_CU(cu,
            cu->cu.TensorMapEncodeTiled(map, dt, 2, t->data, dims,
                                        strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        swizzle, (CUtensorMapL2promotion)ctx->tuning.l2_promotion,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            what);
    return CODA_OK;
}

static coda_status_t encode(const coda_context_t *ctx, CUtensorMap *map, const coda_tensor_t *t,
                            int64_t inner, int64_t outer, int box_inner, int box_outer,
                            const char *what) {
    return encode_swizzled(ctx, map, t, inner, outer, box_inner, box_outer, CU_TENSOR_MAP_SWIZZLE_128B, what);
}

/* Variant bits of the plain GEMM's kernel (`simple` below). */
#define PLAIN_SIMPLE 1 /* beta = 0: C is not read                                  */
#define PLAIN_C_TAIL 2 /* N not a whole number of 16-byte units: the tail columns
                          are stored by threads, not TMA (gemm_mainloop.cuh)     */

/* The kernel for an epilogue, layout and config: the plain epilogue's are
 * remembered per device; others are found by a hash of the epilogue text
 * (cheap next to hashing the whole source), else compiled or read from the
 * disk cache. */
static coda_status_t get_kernel(coda_context_t *ctx, coda_cuda_device_t *d, coda_layout_t layout,
                                int cfg_index, int store_c, int c_f32, int sched, int simple,
                                const char *epilogue_src, const uint64_t *epilogue_key, CUfunction *fn) {
    const char *plain = coda__cuda_source("epi_plain.cuh");
    const coda__tuning_t *tu = &ctx->tuning;
    int is_plain = epilogue_src == plain && store_c && !tu->code_key && sched != CODA_SCHED_OVERLAP;
    if (epilogue_src != plain) simple = 0; /* the plain epilogue's variant bits */
    if (is_plain && d->plain_fn[layout][cfg_index][c_f32][sched][simple]) {
        *fn = d->plain_fn[layout][cfg_index][c_f32][sched][simple];
        return CODA_OK;
    }
    uint64_t quick[2];
    uint32_t variant = (uint32_t)layout * 64u + (uint32_t)cfg_index * 4u + (uint32_t)store_c * 2u +
                       (uint32_t)c_f32 + (uint32_t)sched * 1024u + (uint32_t)simple * 4096u;
    uint64_t key[2];
    if (epilogue_key) {
        key[0] = epilogue_key[0];
        key[1] = epilogue_key[1];
    } else {
        key[0] = coda__hash(CODA_HASH_SEED0, epilogue_src, strlen(epilogue_src));
        key[1] = coda__hash(CODA_HASH_SEED1, epilogue_src, strlen(epilogue_src));
    }
    quick[0] = coda__hash(key[0], &variant, sizeof variant);
    quick[1] = coda__hash(key[1], &variant, sizeof variant);
    if (tu->code_key) { /* the tuning that changes code is part of the key */
        quick[0] = coda__hash(quick[0], &tu->code_key, sizeof tu->code_key);
        quick[1] = coda__hash(quick[1], &tu->code_key, sizeof tu->code_key);
    }
    CUfunction f = coda__cuda_kernel_find(d, quick);
    if (!f) {
        char *src = coda__cuda_gemm_source(epilogue_src);
        if (!src) return CODA_ERR_INTERNAL;
        const char *opts[CODA_CUDA_GEMM_MAX_OPTS];
        char optbuf[768];
        int n_opts = coda__cuda_gemm_options(layout, &coda__cuda_gemm_cfgs[cfg_index], store_c,
                                             c_f32, sched, opts, optbuf, sizeof optbuf);
        if ((simple & PLAIN_SIMPLE) && n_opts < CODA_CUDA_GEMM_MAX_OPTS) opts[n_opts++] = "-DCODA_PLAIN_SIMPLE=1";
        if ((simple & PLAIN_C_TAIL) && n_opts < CODA_CUDA_GEMM_MAX_OPTS) opts[n_opts++] = "-DCODA_C_TAIL=1";
        char xbuf[CODA_TUNING_OPTS_CAP + 64];
        n_opts = coda__cuda_extra_options(tu->extra_opts, opts, n_opts, CODA_CUDA_GEMM_MAX_OPTS, xbuf, sizeof xbuf);
        coda_status_t s = coda__cuda_kernel(ctx, d, src, opts, n_opts, "coda_gemm_kernel", quick, &f);
        free(src);
        CODA_TRY(s);
    }
    if (is_plain) d->plain_fn[layout][cfg_index][c_f32][sched][simple] = f;
    *fn = f;
    return CODA_OK;
}

/* The overlapped kernel (CODA_SCHED_OVERLAP) of a fused GEMM the rule
 * admits (coda__cuda_overlap_candidate), if it has its own say too: no
 * local memory (spills), unless tuning forces it. NULL: the ordinary
 * kernel runs, also where the overlapped one does not build (the error it
 * set is not the launch's). */
static CUfunction overlap_kernel(coda_context_t *ctx, coda_cuda_device_t *d, coda_layout_t layout, int cfg_index,
                                 const char *epilogue_src, const uint64_t *epilogue_key) {
    CUfunction f = NULL;
    coda__error_kept_t kept;
    coda__error_keep(&kept);
    if (get_kernel(ctx, d, layout, cfg_index, 0, 0, CODA_SCHED_OVERLAP, 0, epilogue_src, epilogue_key, &f) != CODA_OK) {
        if (ctx->tuning.log_launch)
            fprintf(stderr, "coda gemm: epilogue overlap declined: its kernel did not build (%s)\n",
                    coda_last_error());
        f = NULL;
    }
    coda__error_restore(&kept);
    if (f && ctx->tuning.epi_overlap != 1) { /* the rule's one say that depends on ptxas */
        int local = -1;
        CUresult r = ctx->cuda->cu.FuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f);
        if (r != CUDA_SUCCESS || local != 0) {
            if (ctx->tuning.log_launch && r != CUDA_SUCCESS)
                fprintf(stderr, "coda gemm: epilogue overlap declined: cuFuncGetAttribute(LOCAL_SIZE_BYTES) "
                                "failed (%d)\n", (int)r);
            else if (ctx->tuning.log_launch)
                fprintf(stderr, "coda gemm: epilogue overlap declined: its kernel uses %d bytes of local memory\n",
                        local);
            f = NULL;
        }
    }
    return f;
}

/* Host mirror of struct coda_ring_params (kernels/gemm_prelude.cuh). */
typedef struct ring_params {
    CUtensorMap map[CODA_RING_MAX_BOX];
    int nbox;
    int xmul[CODA_RING_MAX_BOX], xadd[CODA_RING_MAX_BOX];
} ring_params_t;
/* CUDA 13's CUtensorMap is 128-byte aligned, the kernel's coda_tmap 64: a
 * map placed after other fields would sit at different offsets on the two
 * sides (it showed as an illegal instruction), so maps go first. The launch
 * copies as many bytes as the kernel's struct has (320), which this one's
 * alignment pads further. The kernel asserts the same offsets. */
_Static_assert(sizeof(CUtensorMap) == 128 && offsetof(ring_params_t, nbox) == 256 &&
                   offsetof(ring_params_t, xmul) == 260 && offsetof(ring_params_t, xadd) == 268 &&
                   sizeof(ring_params_t) >= 320,
               "ring_params_t: the layout of struct coda_ring_params (kernels/gemm_prelude.cuh)");

/* A tensor the copy engine may move as a 2-D tile (ring inputs, TMA-stored
 * outputs): bf16 or f32, 16-byte aligned base and rows, rows < 2^40 bytes
 * apart. The planners (fused_gemm.c) only pick such tensors; this is the
 * launch's own check. */
static int tma_tile_ok(const coda_tensor_t *t) {
    return t && t->ndim == 2 && (t->dtype == CODA_BF16 || t->dtype == CODA_F32) && (uintptr_t)t->data % 16 == 0 &&
           t->stride[0] % 16 == 0 && t->stride[0] < ((int64_t)1 << 40);
}

/* The ring's tensor maps: boxes of 128 rows x 128 bytes, 128B-swizzled,
 * as the generated epilogue reads them. */
static coda_status_t ring_maps(const coda_context_t *ctx, const coda_cuda_epi_io_t *ring, ring_params_t *rp) {
    memset(rp, 0, sizeof *rp);
    if (!ring || ring->nbox <= 0) return CODA_OK;
    if (ring->nbox > CODA_RING_MAX_BOX)
        return coda__fail(CODA_ERR_INTERNAL, "CUDA GEMM: %d ring boxes (max %d)", ring->nbox, CODA_RING_MAX_BOX);
    for (int b = 0; b < ring->nbox; b++) {
        const coda_tensor_t *t = ring->tensor[b];
        if (!tma_tile_ok(t))
            return coda__fail(CODA_ERR_INTERNAL, "CUDA GEMM: ring box %d: not a 16-byte aligned 2-D bf16/f32 tile", b);
        int elems = 128 / (int)coda_dtype_size(t->dtype);
        CODA_TRY(encode(ctx, &rp->map[b], t, t->shape[1], t->shape[0], elems, 128, "cuTensorMapEncodeTiled(ring)"));
        rp->xmul[b] = ring->xmul[b];
        rp->xadd[b] = ring->xadd[b];
    }
    rp->nbox = ring->nbox;
    return CODA_OK;
}

/* Host mirror of struct coda_store_maps (kernels/gemm_prelude.cuh). */
typedef struct store_maps {
    CUtensorMap map[CODA_STORE_MAX_MAP];
} store_maps_t;
_Static_assert(sizeof(store_maps_t) == 128 * CODA_STORE_MAX_MAP,
               "store_maps_t: the layout of struct coda_store_maps (kernels/gemm_prelude.cuh)");

/* The store plan's tensor maps (codegen.h): boxes of 16 rows x cols
 * elements, swizzled by the row's bytes (32, 64 or 128), as the generated
 * coda_epi_flush lays out the warp's slab region. */
static coda_status_t store_maps(const coda_context_t *ctx, const coda_cuda_epi_io_t *io, store_maps_t *sm) {
    memset(sm, 0, sizeof *sm);
    if (!io || io->nstore <= 0) return CODA_OK;
    if (io->nstore > CODA_STORE_MAX_MAP)
        return coda__fail(CODA_ERR_INTERNAL, "CUDA GEMM: %d store maps (max %d)", io->nstore, CODA_STORE_MAX_MAP);
    for (int s = 0; s < io->nstore; s++) {
        const coda_tensor_t *t = io->store[s];
        int bytes = t ? io->store_cols[s] * (int)coda_dtype_size(t->dtype) : 0;
        CUtensorMapSwizzle sw = bytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                : bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
        if (!tma_tile_ok(t) || (bytes != 32 && bytes != 64 && bytes != 128))
            return coda__fail(CODA_ERR_INTERNAL, "CUDA GEMM: store map %d: not a 16-byte aligned 2-D bf16/f32 tile", s);
        CODA_TRY(encode_swizzled(ctx, &sm->map[s], t, t->shape[1], t->shape[0], io->store_cols[s], 16, sw,
                                 "cuTensorMapEncodeTiled(store)"));
    }
    return CODA_OK;
}

/* Host mirror of struct coda_sk_params (kernels/gemm_streamk.cuh, which
 * asserts the same layout). */
typedef struct sk_params {
    void *part;
    void *flag;
    int dp_units;
    int share, extra;
    int end;
} sk_params_t;
_Static_assert(offsetof(sk_params_t, flag) == 8 && offsetof(sk_params_t, dp_units) == 16 &&
                   offsetof(sk_params_t, share) == 20 && offsetof(sk_params_t, extra) == 24 &&
                   offsetof(sk_params_t, end) == 28 && sizeof(sk_params_t) == 32,
               "sk_params_t: the layout of struct coda_sk_params (kernels/gemm_streamk.cuh)");

/* Units (tile pairs) done whole before the stream-K tail; units: none.
 * The tail is the partial last wave plus one whole wave, so that each
 * cluster's share of its k-blocks spans at least one unit.
 *
 * When (measured on the H200, bench/HISTORY.md, `bench_gemm variants` with
 * CODA_VARIANTS="3- 3s"): a cluster's share of the tail runs through
 * k-blocks of its own, where the whole units of a wave run through the same
 * k-blocks side by side and share them in L2; so the tail is slower per
 * k-block, and stream-K pays only where it is a small part of the work:
 * +1-2% at 15.5 waves (8192^3, the 16384 x 4096 layer GEMMs), 27 waves
 * (gate/up wgrad), but -3% at 3.9 waves (4096^3) and -13% at 3.9 waves with
 * K = 16384 (o wgrad). Hence: at least 8 whole waves, and a partial wave
 * that leaves at least 1% of the machine idle. And K at most 8192 (128
 * k-blocks a unit) unless the memory is an H200's (4 TB/s or more): the
 * tail reads much of its operands from memory rather than L2, which the
 * H100's slower memory makes cost more than the idle part of a wave.
 * Measured with `bench_gemm variants`, ratio to cuBLAS with / without the
 * tail: on an H100 (2026-12-05) the LLaMA-3-8B down projection's weight
 * gradient, 4096 x 14336 x 16384 at 13.6 waves, 0.921 / 0.991, the 70B one,
 * 8192 x 28672 x 16384 at 54 waves, 0.995 / 1.002; on the H200
 * (bench/HISTORY.md, where stream-K came in) the 8B one 0.993 / 0.986 and
 * the 8B gate/up one (27 waves) 1.018 / 1.004. mode (tuning, context.h):
 * CODA_STREAMK=0: never; =1:
 * whenever there is a partial wave (tests); =s: the split form below
 * wherever it can cut (tests); =a (experiment): every unit
 * shared out by k-blocks, so that the CTAs' epilogues fall at staggered
 * times rather than all at the end of each wave. */
#define STREAMK_LONG_K_GBPS 4000 /* the memory bandwidth from which a tail pays with K > 8192 */

/* The epilogue overlap (kernels/gemm_overlap.cuh) for a fused GEMM:
 * cooperative, no ring inputs, two tiles or more a cluster, and a program
 * that rounds the accumulator to bf16 before anything else (the overlap
 * holds the finished tile as bf16: the same bits). Measured on an H100
 * (bench/RESULTS.md, stop 62) against the same kernel without it, both
 * without stream-K, at the 1B block's shapes: gate/up 0.945x, QKV + RoPE
 * 0.984x (neither spills with it); the ring programs, which all spill with
 * it, 1.02-1.37x (and a ring chunk would wait for its stage inside the
 * k-loop); the LM head's programs spill 708-1184 bytes with it
 * (kernel_stats 3). So the launch also asks the overlapped kernel: no
 * local memory. Where it takes the overlap it runs no stream-K tail (the
 * tail's pieces have no next tile to hide behind; with the rule's 2 tiles
 * a cluster and more, the overlap measured ahead: stop 62's A/B against
 * the default), and a stream-K mode forced by tuning (tests) wins over it.
 * mode (tuning's epi_overlap): 1 (tests) wherever the kernel can run it,
 * acc rounded or not; 0 never; -1 this rule. nbox < 0: not a fused GEMM. */
int coda__cuda_overlap_candidate(int store_c, int pingpong, int nbox, int acc_bf16, int64_t kiters, int64_t units,
                                 int64_t clusters, int mode, int streamk_mode) {
    if (mode == 0 || store_c || pingpong || nbox != 0 || kiters < 1 || units < 2 * clusters) return 0;
    if (streamk_mode != CODA_STREAMK_AUTO && streamk_mode != CODA_STREAMK_OFF) return 0;
    return mode == 1 || acc_bf16;
}

int coda__cuda_streamk_dp_units(int64_t units, int64_t clusters, int64_t kiters, int pingpong, int mode,
                                int mem_gbps) {
    if (mode == CODA_STREAMK_OFF || mode == CODA_STREAMK_SPLIT || pingpong || clusters < 2 || units <= clusters ||
        (units % clusters == 0 && mode != CODA_STREAMK_ALL) ||
        kiters < 4 || units * kiters >= INT32_MAX) /* the kernel numbers k-blocks in an int */
        return (int)units;
    if (mode == CODA_STREAMK_ALL) return 0;
    int64_t waves = coda__cdiv(units, clusters), idle = waves * clusters - units;
    if (mode == CODA_STREAMK_AUTO && (units / clusters < 8 || idle * 100 < waves * clusters ||
                                      (kiters > 128 && mem_gbps < STREAMK_LONG_K_GBPS)))
        return (int)units;
    return (int)((units / clusters - 1) * clusters);
}

/* The split form of the tail (kernels/gemm_streamk.cuh), for GEMMs of a
 * few waves: the partial wave's p = units % clusters units cut into S =
 * clusters / p aligned k-ranges, so that the last wave takes 1/S of a
 * unit's time (plus the owners' adds) instead of a whole unit's. S at most
 * 4 and ranges of at least 16 k-blocks, so that the partial sums (one f32
 * tile a contributor) stay small beside the k-loop. Where the classic tail
 * applies (8 whole waves and more: the rule above) it keeps it. The 1B
 * QKV weight gradient, 3072 x 2048 x 16384: 96 units on 66 clusters, 1.45
 * waves; S = 2 makes it 1.5 units' time instead of 2. Returns S >= 2, or
 * 0: no split. mode CODA_STREAMK_SPLIT forces it wherever S >= 2 (tests). */
int coda__cuda_streamk_split(int64_t units, int64_t clusters, int64_t kiters, int pingpong, int mode) {
    if ((mode != CODA_STREAMK_AUTO && mode != CODA_STREAMK_SPLIT) || pingpong || clusters < 2 ||
        units * kiters >= INT32_MAX)
        return 0;
    int64_t p = units % clusters;
    if (p == 0 || (mode == CODA_STREAMK_AUTO && units / clusters >= 8)) return 0;
    int64_t s = clusters / p;
    if (s > 4) s = 4;
    while (s >= 2 && kiters / s < 16) s--;
    return s >= 2 ? (int)s : 0;
}

/* The stream-K workspace of `stream`, made on first use (its flags zeroed
 * on the stream itself). When all slots are taken, a slot whose last GEMM
 * has finished (its event) and that no graph captured is handed to this
 * stream: its flags are zero again once its GEMMs are done, and nothing
 * can still be using it. NULL when none can be had without harm: a stream
 * being captured into a graph gets no new one (allocation would break the
 * capture), nor does a stream when every slot is busy; its GEMMs then run
 * without stream-K. */
static coda_cuda_sk_ws_t *sk_workspace(struct coda_cuda *cu, coda_cuda_device_t *d, CUstream stream) {
    coda_cuda_sk_ws_t *free_slot = NULL, *idle_slot = NULL;
    unsigned long long key = (unsigned long long)(uintptr_t)stream;
    if (cu->cu.StreamGetId ? cu->cu.StreamGetId(stream, &key) != CUDA_SUCCESS : stream == CU_STREAM_PER_THREAD)
        return NULL; /* not a stream it can tell apart (by id, or by a handle only one stream has): no stream-K */
    for (int i = 0; i < CODA_CUDA_SK_STREAMS; i++) {
        if (d->sk_ws[i].part && d->sk_ws[i].key == key) return &d->sk_ws[i];
        if (!d->sk_ws[i].part && !free_slot) free_slot = &d->sk_ws[i];
    }
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cu->cu.StreamIsCapturing(stream, &cap) != CUDA_SUCCESS || cap != CU_STREAM_CAPTURE_STATUS_NONE)
        return NULL;
    if (!free_slot) {
        for (int i = 0; i < CODA_CUDA_SK_STREAMS && !idle_slot; i++)
            if (!d->sk_ws[i].pinned && cu->cu.EventQuery(d->sk_ws[i].done) == CUDA_SUCCESS)
                idle_slot = &d->sk_ws[i];
        if (idle_slot) idle_slot->key = key;
        return idle_slot;
    }
    size_t slots = 2 * (size_t)d->sm_count;
    CUdeviceptr part = 0, flag = 0;
    CUevent done = NULL;
    /* another stream of the process may be capturing in global mode, where
     * an allocation from this thread would break its capture: relaxed mode
     * for the allocation (the driver call is optional; without it, none) */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!cu->cu.ThreadExchangeStreamCaptureMode || cu->cu.ThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
        return NULL;
    CUresult r = cu->cu.MemAlloc(&part, slots * 64 * 256 * sizeof(float));
    if (r == CUDA_SUCCESS) r = cu->cu.MemAlloc(&flag, 4 * slots * sizeof(uint32_t));
    if (r == CUDA_SUCCESS) r = cu->cu.EventCreate(&done, CU_EVENT_DISABLE_TIMING);
    cu->cu.ThreadExchangeStreamCaptureMode(&mode); /* back to what it was */
    if (r == CUDA_SUCCESS) r = cu->cu.MemsetD32Async(flag, 0, 4 * slots, stream);
    /* done covers the zeroing too: a slot whose first GEMM never launched (its
     * kernel failed to build) is not handed on before its flags are zero (an
     * event never recorded reads as done) */
    if (r == CUDA_SUCCESS) r = cu->cu.EventRecord(done, stream);
    if (r != CUDA_SUCCESS) {
        if (part) cu->cu.MemFree(part);
        if (flag) cu->cu.MemFree(flag);
        if (done) cu->cu.EventDestroy(done);
        return NULL;
    }
    free_slot->key = key;
    free_slot->part = part;
    free_slot->flag = flag;
    free_slot->done = done;
    free_slot->pinned = 0;
    return free_slot;
}

/* After a GEMM that used ws on stream: mark when it is done, or pin the
 * slot if the GEMM went into a graph (a replay may use it at any time). */
static void sk_workspace_used(struct coda_cuda *cu, coda_cuda_sk_ws_t *ws, CUstream stream) {
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cu->cu.StreamIsCapturing(stream, &cap) != CUDA_SUCCESS || cap != CU_STREAM_CAPTURE_STATUS_NONE ||
        cu->cu.EventRecord(ws->done, stream) != CUDA_SUCCESS)
        ws->pinned = 1;
}

/* Launch with d's primary context current (pushed by the caller). */
static coda_status_t launch(coda_context_t *ctx, coda_cuda_device_t *d, coda_layout_t layout,
                            const coda_tensor_t *a, const coda_tensor_t *b,
                            const coda_tensor_t *c_out, const char *epilogue_src,
                            const uint64_t *epilogue_key, const void *params, int cfg_index,
                            size_t scratch_bytes, const coda_cuda_epi_io_t *io, int simple,
                            void *stream) {
    struct coda_cuda *cu = ctx->cuda;
    const coda_cuda_gemm_cfg_t *cfg = &coda__cuda_gemm_cfgs[cfg_index];
    int64_t m = 0, n = 0, k = 0;
    coda__gemm_extents(layout, a, b, &m, &n, &k);

    int store_c = c_out != NULL, c_f32 = c_out && c_out->dtype == CODA_F32;
    /* the kernel: got once the launch knows whether it runs a stream-K tail
     * (a variant of its own), or earlier if the cluster occupancy query
     * needs one */
    CUfunction fn = NULL;

    /* Tensor maps (inner dimension first); boxes match gemm_mainloop.cuh. */
    CUtensorMap map_a, map_b, map_c;
    memset(&map_c, 0, sizeof map_c);
    /* 16 rows x 128 bytes: one consumer warp's staging buffer. The map
     * ends at the last whole 16-byte unit of a row (n16 columns): the copy
     * engine writes whole units, so a map to N would write past column N
     * into the row's padding (measured on the H200: up to 14 bytes a row);
     * the kernel stores columns n16 .. N-1 itself (gemm_mainloop.cuh). */
    int64_t n16 = n & ~(int64_t)(c_f32 ? 3 : 7);
    if (c_out) CODA_TRY(encode(ctx, &map_c, c_out, n16, m, c_f32 ? 32 : 64, 16, "cuTensorMapEncodeTiled(c)"));
    if (layout == CODA_LAYOUT_TN)
        CODA_TRY(encode(ctx, &map_a, a, m, k, 64, 64, "cuTensorMapEncodeTiled(a)"));
    else
        CODA_TRY(encode(ctx, &map_a, a, k, m, 64, cfg->bm, "cuTensorMapEncodeTiled(a)"));
    if (layout == CODA_LAYOUT_NT)
        CODA_TRY(encode(ctx, &map_b, b, k, n, 64, cfg->bn / cfg->cluster_m,
                        "cuTensorMapEncodeTiled(b)"));
    else
        CODA_TRY(encode(ctx, &map_b, b, n, k, 64, 64, "cuTensorMapEncodeTiled(b)"));

    size_t smem = coda__cuda_gemm_smem(cfg) + scratch_bytes;
    if (smem > (size_t)d->smem_optin)
        return coda__fail(CODA_ERR_INTERNAL, "CUDA GEMM: %zu bytes of shared memory > %d", smem,
                          d->smem_optin);

    int64_t tiles_m2 = coda__cdiv(coda__cdiv(m, cfg->bm), cfg->cluster_m);
    int64_t units = tiles_m2 * coda__cdiv(n, cfg->bn);
    int Mi = (int)m, Ni = (int)n, Ki = (int)k;
    ring_params_t rp;
    CODA_TRY(ring_maps(ctx, io, &rp));
    store_maps_t sm;
    CODA_TRY(store_maps(ctx, io, &sm));

    CUlaunchAttribute attr[1];
    attr[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr[0].value.clusterDim.x = (unsigned)cfg->cluster_m;
    attr[0].value.clusterDim.y = 1;
    attr[0].value.clusterDim.z = 1;
    CUlaunchConfig lc;
    memset(&lc, 0, sizeof lc);
    lc.gridDimX = (unsigned)d->sm_count;
    lc.gridDimY = 1;
    lc.gridDimZ = 1;
    lc.blockDimX = 384;
    lc.blockDimY = 1;
    lc.blockDimZ = 1;
    lc.sharedMemBytes = (unsigned)smem;
    lc.hStream = (CUstream)stream;
    lc.attrs = attr;
    lc.numAttrs = 1;
    /* Persistent grid: as many clusters as can be resident at once. Not all
     * SMs can host a 2-CTA cluster (GPCs with odd SM counts), and a cluster
     * that waits for a free slot would run its tiles after everyone else. */
    int64_t clusters = d->sm_count / cfg->cluster_m;
    if (cfg->cluster_m > 1) {
        if (!d->max_clusters[cfg_index]) {
            int mc = 0;
            CODA_TRY(get_kernel(ctx, d, layout, cfg_index, store_c, c_f32, CODA_SCHED_TILES, simple, epilogue_src,
                                epilogue_key, &fn));
            lc.gridDimX = (unsigned)(clusters * cfg->cluster_m);
            if (cu->cu.OccupancyMaxActiveClusters &&
                cu->cu.OccupancyMaxActiveClusters(&mc, fn, &lc) == CUDA_SUCCESS && mc > 0)
                d->max_clusters[cfg_index] = mc;
            else
                d->max_clusters[cfg_index] = (int)clusters;
        }
        if (d->max_clusters[cfg_index] < clusters) clusters = d->max_clusters[cfg_index];
        /* tuning's override (benchmarks): never more than fit at once, since
         * stream-K waits on its peers */
        int want = ctx->tuning.clusters;
        if (want > 0 && want <= d->max_clusters[cfg_index]) clusters = want;
    }
    if (units < clusters) clusters = units;
    if (clusters < 1) clusters = 1;
    lc.gridDimX = (unsigned)(clusters * cfg->cluster_m);

    sk_params_t skp;
    memset(&skp, 0, sizeof skp);
    int64_t kiters = coda__cdiv(k, cfg->bk);
    CUfunction ofn = coda__cuda_overlap_candidate(store_c, cfg->pingpong, io ? io->nbox : -1, io && io->acc_bf16,
                                                  kiters, units, clusters, ctx->tuning.epi_overlap,
                                                  ctx->tuning.streamk)
                         ? overlap_kernel(ctx, d, layout, cfg_index, epilogue_src, epilogue_key)
                         : NULL;
    const int overlap = ofn != NULL;
    if (overlap) fn = ofn;
    int dp_units = overlap ? (int)units
                           : coda__cuda_streamk_dp_units(units, clusters, kiters, cfg->pingpong, ctx->tuning.streamk,
                                                         d->mem_gbps);
    int split = overlap || dp_units < units
                    ? 0
                    : coda__cuda_streamk_split(units, clusters, kiters, cfg->pingpong, ctx->tuning.streamk);
    if (split) dp_units = (int)(units / clusters * clusters);
    coda_cuda_sk_ws_t *ws = dp_units < units ? sk_workspace(cu, d, (CUstream)stream) : NULL;
    skp.dp_units = ws ? dp_units : (int)units;
    if (ws) {
        int64_t tail = (units - dp_units) * kiters;
        skp.share = split ? (int)coda__cdiv(kiters, split) : (int)(tail / clusters);
        skp.extra = split ? 0 : (int)(tail % clusters);
        skp.end = (int)(units * kiters);
        skp.part = (void *)(uintptr_t)ws->part;
        skp.flag = (void *)(uintptr_t)ws->flag;
    }
    /* the stream-K kernel is a variant of its own (gemm_mainloop.cuh) */
    if (ws || !fn)
        CODA_TRY(get_kernel(ctx, d, layout, cfg_index, store_c, c_f32, ws ? CODA_SCHED_STREAMK : CODA_SCHED_TILES,
                            simple, epilogue_src, epilogue_key, &fn));
    void *args[] = {&map_a, &map_b, &map_c, &Mi, &Ni, &Ki, (void *)params, &rp, &sm, &skp};
    if (ctx->tuning.log_launch)
        fprintf(stderr, "coda gemm: cfg %d %dx%d cluster %d, %lld units%s, grid %u, smem %zu, max clusters %d\n",
                cfg_index, cfg->bm, cfg->bn, cfg->cluster_m, (long long)units,
                overlap                ? " (epilogue overlap)"
                : skp.dp_units == units ? ""
                : split                 ? " (stream-K split tail)"
                                        : " (stream-K tail)",
                lc.gridDimX,
                smem, d->max_clusters[cfg_index]);
    CODA_CU(cu, cu->cu.LaunchKernelEx(&lc, fn, args, NULL), "cuLaunchKernelEx(coda_gemm_kernel)");
    if (overlap) atomic_fetch_add_explicit(&ctx->overlap_launches, 1, memory_order_relaxed);
    if (ws) sk_workspace_used(cu, ws, (CUstream)stream);
    return CODA_OK;
}

/* C (the TMA-stored main output): bf16 or f32, 16-byte aligned rows. */
static coda_status_t check_c(const coda_tensor_t *c, const coda_tensor_t *a) {
    if (c->dtype != CODA_BF16 && c->dtype != CODA_F32)
        return coda__fail(CODA_ERR_DTYPE, "c: CUDA GEMM output must be bf16 or f32, got %s",
                          coda_dtype_name(c->dtype) ? coda_dtype_name(c->dtype) : "?");
    if (c->device_index != a->device_index)
        return coda__fail(CODA_ERR_DEVICE, "c is on cuda:%d, a on cuda:%d", c->device_index,
                          a->device_index);
    if ((uintptr_t)c->data % 16 != 0)
        return coda__fail(CODA_ERR_STRIDE, "c: data pointer %p is not 16-byte aligned", c->data);
    if (c->stride[0] % 16 != 0)
        return coda__fail(CODA_ERR_STRIDE, "c: row stride %lld bytes is not a multiple of 16",
                          (long long)c->stride[0]);
    if (c->stride[0] >= ((int64_t)1 << 40))
        return coda__fail(CODA_ERR_STRIDE, "c: row stride %lld bytes is too large (max 2^40)",
                          (long long)c->stride[0]);
    return CODA_OK;
}

coda_status_t coda__cuda_gemm_run(coda_context_t *ctx, coda_layout_t layout,
                                  const coda_tensor_t *a, const coda_tensor_t *b,
                                  const coda_tensor_t *c_out,
                                  const char *epilogue_src, const uint64_t *epilogue_key,
                                  const void *params, size_t params_size, size_t scratch_bytes,
                                  int cfg_index, const coda_cuda_epi_io_t *io, void *stream) {
    (void)params_size;
    if (cfg_index < 0 || cfg_index >= CODA_CUDA_GEMM_NCFG)
        return coda__fail(CODA_ERR_INVALID_ARG, "CUDA GEMM: tile configuration %d out of range",
                          cfg_index);
    if (a->device_index != b->device_index)
        return coda__fail(CODA_ERR_DEVICE, "a is on cuda:%d, b on cuda:%d", a->device_index,
                          b->device_index);
    CODA_TRY(coda__cuda_check_operands(layout, a, b));
    if (c_out) CODA_TRY(check_c(c_out, a));
    int64_t m = 0, n = 0, k = 0;
    coda__gemm_extents(layout, a, b, &m, &n, &k);
    if (m == 0 || n == 0) return CODA_OK;
    coda_cuda_device_t *d;
    CODA_TRY(coda__cuda_device(ctx, a->device_index, &d));
    struct coda_cuda *cu = ctx->cuda;
    CODA_CU(cu, cu->cu.CtxPushCurrent(d->pctx), "cuCtxPushCurrent");
    coda_status_t s = coda__cuda_check_pointer(cu, a, "a");
    if (s == CODA_OK) s = coda__cuda_check_pointer(cu, b, "b");
    if (s == CODA_OK && c_out) s = coda__cuda_check_pointer(cu, c_out, "c");
    for (int i = 0; s == CODA_OK && io && i < io->nbound; i++)
        if (io->bound[i]) s = coda__cuda_check_pointer(cu, io->bound[i], io->bound_name[i] ? io->bound_name[i] : "argument");
    if (s == CODA_OK)
        s = launch(ctx, d, layout, a, b, c_out, epilogue_src, epilogue_key, params, cfg_index,
                   scratch_bytes, io, 0, stream);
    CUcontext prev;
    cu->cu.CtxPopCurrent(&prev);
    return s;
}

/* Host mirror of struct coda_epi_params in kernels/epi_plain.cuh (which
 * asserts the same layout). */
typedef struct plain_params {
    void *c;
    long long ldc;
    float alpha, beta;
    int c_f32;
    int pad_;
} plain_params_t;
_Static_assert(offsetof(plain_params_t, ldc) == 8 && offsetof(plain_params_t, alpha) == 16 &&
                   offsetof(plain_params_t, beta) == 20 && offsetof(plain_params_t, c_f32) == 24 &&
                   sizeof(plain_params_t) == 32,
               "plain_params_t: the layout of struct coda_epi_params (kernels/epi_plain.cuh)");

coda_status_t coda__cuda_gemm(coda_context_t *ctx, coda_layout_t layout, const coda_tensor_t *a,
                              const coda_tensor_t *b, coda_tensor_t *c, float alpha, float beta,
                              void *stream) {
    CODA_TRY(check_c(c, a));
    int64_t m = 0, n = 0, k = 0;
    coda__gemm_extents(layout, a, b, &m, &n, &k);
    CODA_TRY(coda__cuda_check_operands(layout, a, b));
    if (m == 0 || n == 0) return CODA_OK;

    coda_cuda_device_t *d;
    CODA_TRY(coda__cuda_device(ctx, a->device_index, &d));
    int cfg = coda__cuda_gemm_cfg_override(ctx);
    if (cfg < 0) cfg = coda__cuda_gemm_pick(m, n, k, d->sm_count);

    plain_params_t p;
    memset(&p, 0, sizeof p);
    p.c = c->data;
    p.ldc = c->stride[0] / (int64_t)coda_dtype_size(c->dtype);
    p.alpha = alpha;
    p.beta = beta;
    p.c_f32 = c->dtype == CODA_F32;
    struct coda_cuda *cu = ctx->cuda;
    CODA_CU(cu, cu->cu.CtxPushCurrent(d->pctx), "cuCtxPushCurrent");
    coda_status_t s = coda__cuda_check_pointer(cu, c, "c");
    if (s == CODA_OK) s = coda__cuda_check_pointer(cu, a, "a");
    if (s == CODA_OK) s = coda__cuda_check_pointer(cu, b, "b");
    if (s == CODA_OK) {
        const char *epi = coda__cuda_source("epi_plain.cuh");
        /* beta = 0 (nearly every call) has a kernel of its own: the general
         * pair code tests beta and the bounds per column pair, and that cost
         * 2-3% of the whole GEMM at K = 2048-4096 (measured on the H200,
         * bench/HISTORY.md) */
        int simple = (beta == 0.0f ? PLAIN_SIMPLE : 0) | (n % (c->dtype == CODA_F32 ? 4 : 8) ? PLAIN_C_TAIL : 0);
        s = epi ? launch(ctx, d, layout, a, b, c, epi, NULL, &p, cfg, 0, NULL, simple, stream)
                : coda__fail(CODA_ERR_INTERNAL, "CUDA GEMM: epi_plain.cuh is not embedded");
    }
    CUcontext prev;
    cu->cu.CtxPopCurrent(&prev);
    return s;
}
