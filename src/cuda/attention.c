/* attention.c - causal grouped-query attention on CUDA tensors: marshals
 * the arguments of the attention kernels and launches them
 * (src/api/attention.c has checked every argument but the pointers).
 *
 *   forward    kernels/attention_wgmma.cuh: wgmma + TMA, warp-specialised,
 *              persistent (a block a multiprocessor; CODA_DEBUG_ATTN_FWD_PERSIST=0
 *              a block an item) (kernels/attention.cuh's mma.sync forward under the tuning
 *              switch CODA_DEBUG_ATTN_MMA, for A/B runs and its tests)
 *   backward   kernels/attention.cuh's prep kernel (D and lse log2(e) into
 *              the workspace), then kernels/attention_bwd_wgmma.cuh: dk,
 *              dv and dq in one kernel on wgmma + TMA (its separate dk/dv
 *              and dq kernels under CODA_DEBUG_ATTN_SPLIT_BWD or where
 *              dqkv is not aligned for TMA; attention.cuh's mma.sync dq and
 *              dk/dv under CODA_DEBUG_ATTN_MMA)
 *
 * One source (the GEMM's PTX prelude and wgmma wrappers, then both
 * attention files) is compiled by NVRTC once per head dimension
 * (-DCODA_ATTN_HD) and cached like every other kernel; each launch finds
 * its function again by a constant quick key (the entry's name and the
 * head dimension), so the source is only put together on a miss. */
#ifdef CODA_WITH_CUDA

#include "core/context.h"
#include "cuda/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY0 0xc0daa77e0ull
#define KV_TILE 64
#define FWD_ROWS 128 /* the mma.sync kernels' FWD_ROWS (the wgmma forward's items: 64 x consumers), BWD_ROWS, BWD_QTILE */
#define BWD_ROWS 64
#define MAX_GRID 65535

const char *const coda__cuda_attention_files[CODA_CUDA_ATTN_NFILES] = {
    "gemm_prelude.cuh", "gemm_wgmma.cuh", "attention.cuh", "attention_wgmma.cuh", "attention_bwd_wgmma.cuh"};
#define N_OPTS CODA_CUDA_ATTN_NOPTS

/* The kernels' argument block (attention.cuh's coda_attn_args_t). */
typedef struct {
    const void *qkv, *o, *dout;
    float *lse, *dsum;
    void *out;
    long long ld_qkv, ld_o, ld_do, ld_lse, ld_out;
    int seq, n_heads, n_kv_heads;
    float scale;
    int kv_parts, kv_chunk;
    int batch;
} attn_args_t;

static long long es(const coda_tensor_t *t) {
    return t ? (long long)(t->stride[0] / (int64_t)coda_dtype_size(t->dtype)) : 0;
}

/* Dynamic shared memory of each kernel, bytes (the layouts of attention.cuh
 * and attention_wgmma.cuh: q (64 rows a consumer warpgroup), `stages` stages of k and v tiles of 128 rows,
 * 2 + 4 stages mbarriers (q full and empty, a stage's four), 1024 bytes of slack to align the swizzled tiles;
 * at head_dim 128 three stages take 225 KiB of the 227 an SM offers). */
static int smem_fwd_wgmma(int hd, int stages, int consumers) {
    return (64 * consumers + 2 * stages * 128) * (hd / 64) * 128 + 8 * (2 + 4 * stages) + 1024;
}
static int smem_fwd(int hd) { return (FWD_ROWS + 4 * KV_TILE) * hd * 2; }
/* threads of the mma.sync forward: a warp per 16 rows, 32 at HD 128 (its FWD_MT) */
static int fwd_threads(int hd) { return FWD_ROWS / (hd == 128 ? 32 : 16) * 32; }
/* The wgmma backward (attention_bwd_wgmma.cuh's AB_SMEM_DQ, _DKDV, _FUSED):
 * two 128-row operands, `stages` stages of two tiles (the dq kernel's and
 * the fused kernel's 64 rows, dk/dv's AB_KV_QT) and of the tiles'
 * statistics (D and lse, not the dq kernel's), the fused kernel's two dS^T
 * buffers (128 x 64 bf16) and two dq tiles, the mbarriers, the slack. */
enum { BWD_DQ, BWD_DKDV, BWD_FUSED };
/* Rows of the dk/dv kernel's query tiles (AB_KV_QT): 128 at head_dim 64,
 * 64 at 128 (the fused kernel's ring holds 64-row tiles at both). */
static int kv_tile_rows(int hd) { return hd == 64 ? 128 : 64; }
static int smem_bwd_wgmma(int hd, int stages, int kind) {
    const int rows = kind == BWD_DKDV ? kv_tile_rows(hd) : 64;                /* the ring's tiles */
    int at = 2 * (hd / 64) * 128 * 128 + stages * 2 * (hd / 64) * rows * 128; /* block operands, the ring */
    if (kind != BWD_DQ) at += stages * 2 * rows * 4;                          /* the statistics */
    if (kind == BWD_FUSED) /* P^T and dS^T (1024-aligned), 2 dq tiles (64 x hd f32), their 4 barriers */
        at = (at + 1023) / 1024 * 1024 + 2 * 128 * 128 + 2 * 64 * hd * 4 + 8 * 4;
    return at + 8 * (1 + 2 * stages) + 1024;
}

/* Stages of the wgmma backward's ring (CODA_AB_STAGES): 3, so that the
 * pipelined dq consumers, which hold two tiles at once, still have the
 * next one's load in flight (2 stages one step at a time: 204 / 310 / 310
 * TFLOP/s at 1B / 8B / 70B; 4 stages serial 200 / 306 / 308; pipelined, 3
 * stages 215 / 318 / 319, 4 stages 211 / 319 / 319; H200, test_attention_gpu
 * bench, one call; the split kernels). Tuning's attn_stages overrides;
 * the fused kernel at HD 128 takes at most 2 (its dq tiles take the room
 * of a third), and so do the split kernels where they stand in for it. */
#define BWD_STAGES 3
/* Pipelining of the dq kernel (CODA_AB_PIPE): 1 its steps overlapped, 0 one
 * at a time; the same switch turns the forward's ping-pong between its two
 * consumer warpgroups on (CODA_AW_PINGPONG); tuning's attn_pipe overrides. (Overlapping dk/dv's steps the
 * same way, at HD 64 where the registers would fit, ptxas serialised the
 * products for lack of registers and it ran at 175 against 211.) */
#define BWD_PIPE 1
/* The wgmma forward's ring of k and v tiles (CODA_AW_STAGES) and whether a
 * stage's k is freed once the tile's S is made, before its v is used
 * (CODA_AW_APART), and whether it is persistent (a block a multiprocessor,
 * each looping over its items, the next item's q and tiles loaded under
 * this one's last products and stores) or takes a block an item; tuning's
 * attn_fwd_stages, attn_fwd_apart and attn_fwd_persist override.
 * Persistent, 2 stages, k freed apart from v (H100, stop 50,
 * `test_attention_gpu fwdab benchonly`, two rounds, TFLOP/s at 1B / 8B /
 * 70B): 443 / 650 / 651 and 442 / 649 / 647, against 437 / 647 / 638 with
 * 3 stages freed together, and 417 / 626 / 634 and 417 / 627 / 594 for
 * the default of stop 49 (3 stages together, a block an item). A block an
 * item, the third stage paid where the early release did not (stop 49:
 * 449 / 633 / 639 against 434 / 630 / 624); persistent, the next item's
 * loads fill the ring at the turn of items either way. */
#define FWD_STAGES 2
#define FWD_APART 1
#define FWD_PERSIST 1
/* The wgmma forward's consumer warpgroups (CODA_AW_CONSUMERS), 64 query
 * rows each: an item of 128 rows (2) or 192 (3, head_dim 64 only: at 128
 * the o accumulator would not fit the 160 registers three leave a
 * thread). Three at head_dim 64: 537 / 533 TFLOP/s at LLaMA-3 1B against
 * 469 / 462 with two (H100, stop 51, `test_attention_gpu fwdab
 * benchonly`, two rounds; the softmax is issue-bound and a third
 * warpgroup's warps hide more of its latencies, FlashAttention-3's choice
 * at 64 too). Tuning's attn_fwd_consumers overrides. */
static int fwd_consumers_of(int tuned, int hd) {
    return hd != 64 ? 2 : tuned ? tuned : 3;
}
/* The fused backward's layout: the blocks a kv group's query heads are
 * shared over (`parts`, dk and dv added in the parts' order) and the launch
 * order (chunk: the (group part, sequence) pairs of a launch chunk, 1 one
 * group's key blocks fastest, 0 all pairs, the groups of one
 * key block fastest). Each key block reads q and do and adds dq over every
 * head of its group, so what the blocks running at once share is that
 * group's q, do and f32 dq over a sequence: group x seq x hd x 8 bytes.
 *   - While that fits the L2 (LLaMA-3 1B: 17 MB, 8B: 34 MB of the H100's
 *     50), one block a group, groups fastest (the longest blocks first):
 *     375 / 437 TFLOP/s at 1B / 8B, against 343 / 426 with key blocks
 *     fastest, whose longest blocks of the last groups start late.
 *   - Past it (70B: 67 MB) the 16 groups' blocks running at once evict
 *     each other's tiles: 62% L2 hits, 28 GB of DRAM traffic a call, 362
 *     TFLOP/s. Then key blocks fastest, the group in the fewest parts
 *     whose share fits (70B: 2, 448-454 TFLOP/s; 1 part 438-444; one head
 *     a block 401-402, 97% L2 hits but short blocks).
 * (H100, `test_attention_gpu bwdab`, two rounds; ncu's dram__bytes and
 * lts__t_sector_hit_rate; bench/HISTORY.md, stop 43.)
 *   - At head_dim 128 where the share fits (8B), two heads a block, launched
 *     in chunks of 8 (part, sequence) pairs (16 query heads; ab_block):
 *     478.1 / 478.5 TFLOP/s against 466.6 / 457.4 for a group a block,
 *     all pairs at once; chunks of 4 pairs 471, of 1 458, all pairs 302.
 *     At 1B (head_dim 64) no layout beat the rule's (403-421, noise); at
 *     70B two heads a block in chunks of 2 pairs read 494 / 496 against
 *     492 / 483 for the rule's: level, kept. (H100, stop 50, `bwdab
 *     benchonly layouts=...`, two rounds.) Tuning's
 * attn_bwd_parts (-1: one head a block) and attn_bwd_order override; a
 * count that does not divide the group is taken as 1. test_nvrtc checks
 * the rule at the LLaMA-3 shapes. */
void coda__cuda_attn_bwd_layout(int group, int64_t seq, int64_t hd, int64_t l2_bytes, int tune_parts,
                                int tune_order, int *parts, int *chunk) {
    const double l2 = l2_bytes > 0 ? (double)l2_bytes : 50.0 * (1 << 20);
    const double share = (double)group * (double)seq * (double)hd * 8.0;
    const int fits = share <= l2;
    /* the L2 rule's order: 1, one (part, sequence)'s key blocks at a time;
     * 0, all pairs' (tuning's parts take it too: the chunks of 8 were
     * measured for two heads a block only) */
    const int l2_order = !fits;
    int n = 1;
    *chunk = l2_order;
    if (!fits)
        while (n < group && (group % n || share / n > l2)) n++;
    else if (hd == 128 && group >= 4 && group % 2 == 0)
        n = group / 2, *chunk = 8;
    if (tune_parts) n = tune_parts == -1 ? group : tune_parts, *chunk = l2_order;
    if (tune_order >= 0) *chunk = tune_order;
    *parts = n >= 1 && group % n == 0 ? n : 1;
}
/* The backward's ring: tuning's attn_stages (0: BWD_STAGES), for the fused
 * kernel (split = 0; the split kernels stand in for it with the same count
 * where dqkv is not aligned for TMA) no more stages than fit in the block's
 * shared memory (smem_optin, the device's; 0: Hopper's 227 KiB): 2 at
 * head_dim 128 (its dq tiles take the room of a third); at 64 all that
 * tuning offers (up to 4; 7 would fit) since stop 56 sized its ring for
 * its own 64-query tiles (with 128-row slots 4 took 229 KiB, and tuning's
 * 4 failed the launch with CUDA_ERROR_INVALID_VALUE before stop 54). 4
 * measured no faster than 3 (H200, stop 56: 1B backward 413.6 / 428.2
 * against 426.0 / 433.6 TFLOP/s, `test_attention_gpu benchonly pass=0` in
 * turns). */
int coda__cuda_attn_bwd_stages(int tuned, int split, int hd, int smem_optin) {
    const int room = smem_optin > 0 ? smem_optin : 227 * 1024;
    int n = tuned ? tuned : BWD_STAGES;
    while (!split && n > 2 && smem_bwd_wgmma(hd, n, BWD_FUSED) > room) n--;
    return n;
}
static int bwd_stages(const coda_context_t *ctx, const coda_cuda_device_t *dev, int hd) {
    return coda__cuda_attn_bwd_stages(ctx->tuning.attn_stages, ctx->tuning.attn_split_bwd, hd, dev->smem_optin);
}
static int smem_dq(int hd) { return (2 * BWD_ROWS + 4 * KV_TILE) * hd * 2; }
static int smem_dkdv(int hd) {
    int qt = hd == 128 ? 32 : 64;
    return (2 * BWD_ROWS + 4 * qt) * hd * 2 + 4 * qt * (int)sizeof(float);
}

int coda__cuda_attention_options(int hd, int bwd_stages, int pipe, int dq_perm, int fwd_stages, int fwd_apart,
                                 int fwd_consumers, const char **opts, char (*buf)[32]) {
    opts[0] = "--gpu-architecture=sm_90a";
    opts[1] = "-default-device";
    opts[2] = hd == 64 ? "-DCODA_ATTN_HD=64" : "-DCODA_ATTN_HD=128";
    opts[3] = "-DCODA_TA=0"; /* gemm_wgmma.cuh's transpose bits: q, k K-major */
    opts[4] = "-DCODA_TB=0";
    snprintf(buf[5], 32, "-DCODA_AB_STAGES=%d", bwd_stages);
    snprintf(buf[6], 32, "-DCODA_AB_PIPE=%d", pipe);
    snprintf(buf[7], 32, "-DCODA_AW_PINGPONG=%d", pipe);
    snprintf(buf[8], 32, "-DCODA_AB_DQ_PERM=%d", dq_perm);
    snprintf(buf[9], 32, "-DCODA_AW_STAGES=%d", fwd_stages);
    snprintf(buf[10], 32, "-DCODA_AW_APART=%d", fwd_apart);
    snprintf(buf[11], 32, "-DCODA_AW_CONSUMERS=%d", fwd_consumers);
    for (int i = 5; i < CODA_CUDA_ATTN_NOPTS; i++) opts[i] = buf[i];
    return CODA_CUDA_ATTN_NOPTS;
}

int coda__cuda_attention_default_options(int hd, const char **opts, char (*buf)[32]) {
    return coda__cuda_attention_options(hd, coda__cuda_attn_bwd_stages(0, 0, hd, 0), BWD_PIPE, 1, FWD_STAGES, FWD_APART,
                                        fwd_consumers_of(0, hd), opts, buf);
}

typedef struct {
    coda_context_t *ctx;
    coda_cuda_device_t *dev;
    const char *opts[N_OPTS];
    int hd;
    int stages, pipe;   /* the backward's CODA_AB_STAGES and CODA_AB_PIPE */
    int dq_perm;        /* CODA_AB_DQ_PERM: the fused backward's dq tile staged with rows permuted */
    int fwd_stages;     /* CODA_AW_STAGES: the wgmma forward's k/v ring */
    int fwd_apart;      /* CODA_AW_APART: its k and v stages freed apart */
    int fwd_consumers;  /* CODA_AW_CONSUMERS: its consumer warpgroups, 64 query rows each */
    char optbuf[CODA_CUDA_ATTN_NOPTS][32];
    void *stream;
} launcher_t;

/* entry's function for L's options: found in the device's cache, or
 * compiled (or loaded from the disk cache) on first use, which also raises
 * the shared-memory limit. */
static coda_status_t kernel_fn(launcher_t *L, const char *entry, CUfunction *out) {
    uint64_t quick[2] = {KEY0 + (uint64_t)L->hd + 256u * (uint64_t)L->stages + 4096u * (uint64_t)L->pipe +
                             65536u * (uint64_t)L->dq_perm + (1u << 20) * (uint64_t)L->fwd_stages +
                             (1u << 24) * (uint64_t)L->fwd_apart + (1u << 28) * (uint64_t)L->fwd_consumers,
                         coda__hash(CODA_HASH_SEED0, entry, strlen(entry))};
    const coda__tuning_t *tu = &L->ctx->tuning;
    if (tu->code_key) /* CODA_DEBUG_OPTS (experiments) change the code: part of the key */
        quick[0] = coda__hash(quick[0], &tu->code_key, sizeof tu->code_key);
    CUfunction fn = coda__cuda_kernel_find(L->dev, quick);
    if (!fn) { /* first use: compile (or load from the cache), which also raises the smem limit */
        char *src;
        CODA_TRY(coda__cuda_join_sources(coda__cuda_attention_files, CODA_CUDA_ATTN_NFILES, NULL, "CUDA attention", &src));
        const char *opts[N_OPTS + 4];
        char xbuf[CODA_TUNING_OPTS_CAP + 64];
        memcpy(opts, L->opts, sizeof L->opts);
        int n_opts = coda__cuda_extra_options(tu->extra_opts, opts, N_OPTS, N_OPTS + 4, xbuf, sizeof xbuf);
        coda_status_t st = coda__cuda_kernel(L->ctx, L->dev, src, opts, n_opts, entry, quick, &fn);
        free(src);
        CODA_TRY(st);
    }
    *out = fn;
    return CODA_OK;
}

/* The functions of entries[0..n), before a call's first launch: a failure
 * to build or load one (out of memory, a driver error) then returns before
 * anything is written, as coda.h promises, instead of after the kernels
 * before it wrote part of the output. */
static coda_status_t kernel_fns(launcher_t *L, const char *const *entries, int n) {
    CUfunction fn;
    for (int i = 0; i < n; i++) CODA_TRY(kernel_fn(L, entries[i], &fn));
    return CODA_OK;
}

/* Launch `entry` on a (gx, gy, gz) grid of `threads` with `smem` bytes of
 * dynamic shared memory. The caller has the device's context current. */
static coda_status_t launch(launcher_t *L, const char *entry, unsigned gx, unsigned gy, unsigned gz,
                            int threads, int smem, void **args) {
    struct coda_cuda *cu = L->ctx->cuda;
    CUfunction fn;
    CODA_TRY(kernel_fn(L, entry, &fn));
    CUlaunchConfig lc;
    memset(&lc, 0, sizeof lc);
    lc.gridDimX = gx;
    lc.gridDimY = gy;
    lc.gridDimZ = gz;
    lc.blockDimX = (unsigned)threads;
    lc.blockDimY = lc.blockDimZ = 1;
    lc.sharedMemBytes = (unsigned)smem;
    lc.hStream = (CUstream)L->stream;
    CUresult r = cu->cu.LaunchKernelEx(&lc, fn, args, NULL);
    return r == CUDA_SUCCESS ? CODA_OK : coda__cu_fail(cu, r, entry);
}

/* A TMA map of a (batch x seq, cols) matrix, bf16 (qkv, do) or f32 (dqkv,
 * which the fused backward adds dq into), as (column, position, sequence),
 * boxes of 128 bytes of columns (swizzled) x `rows` positions; positions
 * past a sequence's end read as zeros and are not written. */
static coda_status_t seq_map(coda_context_t *ctx, CUtensorMap *map, const coda_tensor_t *t,
                             const coda_attention_shape_t *s, int rows, const char *what) {
    const int f32 = t->dtype == CODA_F32;
    cuuint64_t dims[3] = {(cuuint64_t)t->shape[1], (cuuint64_t)s->seq, (cuuint64_t)s->batch};
    cuuint64_t strides[2] = {(cuuint64_t)t->stride[0], (cuuint64_t)(t->stride[0] * s->seq)};
    cuuint32_t box[3] = {f32 ? 32 : 64, (cuuint32_t)rows, 1}, estr[3] = {1, 1, 1};
    struct coda_cuda *cu = ctx->cuda;
    CODA_CU(cu,
            cu->cu.TensorMapEncodeTiled(map, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                        3, t->data, dims, strides, box,
                                        estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            what);
    return CODA_OK;
}

/* The fused backward's dq map where seq is a multiple of 8 (CODA_AB_DQ_PERM):
 * dqkv f32 as (column, h, q, g, sequence), position 8 g + 4 h + q, boxes
 * of 32 columns (128 bytes, swizzled) x 2 x 4 x 8 = 64 positions, laid
 * out in shared memory as rows 8 g + 2 q + h (attention_bwd_wgmma.cuh's
 * ab_dq_stage_perm says why); positions past a sequence's end (whole
 * groups g) are not written. */
static coda_status_t dq_perm_map(coda_context_t *ctx, CUtensorMap *map, const coda_tensor_t *t,
                                 const coda_attention_shape_t *s) {
    const cuuint64_t ld = (cuuint64_t)t->stride[0];
    cuuint64_t dims[5] = {(cuuint64_t)t->shape[1], 2, 4, (cuuint64_t)(s->seq / 8), (cuuint64_t)s->batch};
    cuuint64_t strides[4] = {4 * ld, ld, 8 * ld, ld * (cuuint64_t)s->seq};
    cuuint32_t box[5] = {32, 2, 4, 8, 1}, estr[5] = {1, 1, 1, 1, 1};
    struct coda_cuda *cu = ctx->cuda;
    CODA_CU(cu,
            cu->cu.TensorMapEncodeTiled(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 5, t->data, dims, strides, box, estr,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            "cuTensorMapEncodeTiled(dqkv, (column, h, q, g, sequence))");
    return CODA_OK;
}

/* The fused backward adds dq into dqkv by TMA, which wants it 16-byte
 * aligned with rows a multiple of 16 bytes apart; where it is not (or the
 * tuning switch says so), the two kernels run. */
static int bwd_fused(const launcher_t *L, const coda_tensor_t *out) {
    return !L->ctx->tuning.attn_split_bwd && (uintptr_t)out->data % 16 == 0 && out->stride[0] % 16 == 0;
}

/* The wgmma backward: by default one kernel for dk, dv and dq (128 key
 * rows a block over 64-query tiles, 5 products; dq added into dqkv by TMA
 * in the key blocks' fixed order through counters in the workspace, zeroed
 * here first); with the tuning switch attn_split_bwd, or where dqkv is not
 * aligned for TMA, dk/dv (over 128-query tiles at head_dim 64, 64 at 128),
 * then dq from its own kernel (128 query rows a block over 64-key tiles):
 * 7 products, nothing accumulated across blocks (docs/attention.md).
 * The tensor maps are made first, then the prep kernel (D and lse log2 e
 * into the workspace) runs, then the backward's kernels. */
static coda_status_t run_bwd_wgmma(launcher_t *L, const coda_attention_shape_t *s, const coda_tensor_t *qkv,
                                   const coda_tensor_t *do_, const coda_tensor_t *out, attn_args_t *a,
                                   int fused, unsigned prep_blocks) {
    CUtensorMap qkv128, qkv64, do128, do64, dqm;
    CODA_TRY(seq_map(L->ctx, &qkv128, qkv, s, 128, "cuTensorMapEncodeTiled(qkv, 128 rows)"));
    CODA_TRY(seq_map(L->ctx, &qkv64, qkv, s, 64, "cuTensorMapEncodeTiled(qkv, 64 rows)"));
    CODA_TRY(seq_map(L->ctx, &do64, do_, s, 64, "cuTensorMapEncodeTiled(do, 64 rows)"));
    CODA_TRY(seq_map(L->ctx, &do128, do_, s, 128, "cuTensorMapEncodeTiled(do, 128 rows)"));
    if (fused && L->dq_perm) CODA_TRY(dq_perm_map(L->ctx, &dqm, out, s));
    else if (fused) CODA_TRY(seq_map(L->ctx, &dqm, out, s, 64, "cuTensorMapEncodeTiled(dqkv, 64 rows)"));
    void *prep_args[] = {a};
    CODA_TRY(launch(L, "coda_attn_bwd_prep_kernel", prep_blocks, 1, 1, 256, 0, prep_args));
    const unsigned blocks = (unsigned)coda__cdiv(s->seq, 128), batch = (unsigned)s->batch;
    if (fused) {
        coda__cuda_attn_bwd_layout((int)(s->n_heads / s->n_kv_heads), s->seq, s->head_dim, L->dev->l2_bytes,
                                   L->ctx->tuning.attn_bwd_parts, L->ctx->tuning.attn_bwd_order, &a->kv_parts,
                                   &a->kv_chunk);
        void *kv_args[] = {&qkv128, &qkv64, &do64, &dqm, a}; /* the fused kernel's query tiles: 64 rows */
        const int64_t pad = coda__cdiv(s->seq, 128) * 128, plane = s->batch * s->n_heads * pad;
        struct coda_cuda *cu = L->ctx->cuda;
        CODA_CU(cu,
                cu->cu.MemsetD32Async((CUdeviceptr)(a->dsum + 2 * plane), 0, (size_t)(plane / 64 * 2),
                                      (CUstream)L->stream),
                "cuMemsetD32Async(attention's dq counters)");
        return launch(L, "coda_attn_bwd_wgmma_kernel", (unsigned)(s->n_kv_heads * a->kv_parts), batch, blocks, 384,
                      smem_bwd_wgmma(L->hd, L->stages, BWD_FUSED), kv_args);
    }
    const int wide = kv_tile_rows(L->hd) == 128;
    void *dkdv_args[] = {&qkv128, wide ? &qkv128 : &qkv64, wide ? &do128 : &do64, a};
    CODA_TRY(launch(L, "coda_attn_bwd_dkdv_wgmma_kernel", (unsigned)s->n_kv_heads, batch, blocks, 384,
                    smem_bwd_wgmma(L->hd, L->stages, BWD_DKDV), dkdv_args));
    void *q_args[] = {&qkv128, &qkv64, &do128, a};
    return launch(L, "coda_attn_bwd_dq_wgmma_kernel", (unsigned)s->n_heads, batch, blocks, 384,
                  smem_bwd_wgmma(L->hd, L->stages, BWD_DQ), q_args);
}

static coda_status_t run(launcher_t *L, const coda_attention_shape_t *s, const coda_tensor_t *qkv,
                         const coda_tensor_t *do_, const coda_tensor_t *out, attn_args_t *a, int backward) {
    const unsigned heads = (unsigned)s->n_heads, kv_heads = (unsigned)s->n_kv_heads, batch = (unsigned)s->batch;
    void *args[] = {a};
    if (!backward && !L->ctx->tuning.attn_mma) {
        /* items of 64 x consumers query rows; TMA boxes of 128 positions
         * with two consumers, 64 with three (attention_wgmma.cuh's
         * AW_BOX_ROWS: q of 192 rows and k of 128 in pieces) */
        const int nc = L->fwd_consumers, rows = 64 * nc;
        CUtensorMap map;
        CODA_TRY(seq_map(L->ctx, &map, qkv, s, nc == 2 ? 128 : 64, "cuTensorMapEncodeTiled(qkv)"));
        void *wargs[] = {&map, a};
        /* a 1-D grid over the items (query rows, head, sequence): one
         * block an item, or one a multiprocessor looping over them */
        const int64_t items = coda__cdiv(s->seq, rows) * s->n_heads * s->batch;
        if (items > INT32_MAX)
            return coda__fail(CODA_ERR_SHAPE, "coda_attention: %lld work items of %d rows (over 2^31)",
                              (long long)items, rows);
        const int persist = L->ctx->tuning.attn_fwd_persist >= 0 ? L->ctx->tuning.attn_fwd_persist : FWD_PERSIST;
        const int64_t grid = persist && items > L->dev->sm_count ? L->dev->sm_count : items;
        return launch(L, "coda_attn_fwd_wgmma_kernel", (unsigned)grid, 1, 1, 128 * (nc + 1),
                      smem_fwd_wgmma(L->hd, L->fwd_stages, nc), wargs);
    }
    if (!backward)
        return launch(L, "coda_attn_fwd_kernel", heads, batch, (unsigned)coda__cdiv(s->seq, FWD_ROWS),
                      fwd_threads(L->hd), smem_fwd(L->hd), args);
    /* every kernel of the backward built or loaded before the first runs */
    const int mma = L->ctx->tuning.attn_mma, fused = !mma && bwd_fused(L, out);
    static const char *const mma_entries[] = {"coda_attn_bwd_prep_kernel", "coda_attn_bwd_dq_kernel",
                                              "coda_attn_bwd_dkdv_kernel"};
    static const char *const fused_entries[] = {"coda_attn_bwd_prep_kernel", "coda_attn_bwd_wgmma_kernel"};
    static const char *const split_entries[] = {"coda_attn_bwd_prep_kernel", "coda_attn_bwd_dkdv_wgmma_kernel",
                                                "coda_attn_bwd_dq_wgmma_kernel"};
    if (mma) CODA_TRY(kernel_fns(L, mma_entries, 3));
    else if (fused) CODA_TRY(kernel_fns(L, fused_entries, 2));
    else CODA_TRY(kernel_fns(L, split_entries, 3));
    /* a warp per 32 positions of a (sequence, head), 8 warps a block */
    int64_t warps = s->batch * s->n_heads * coda__cdiv(s->seq, 32), blocks = coda__cdiv(warps, 8);
    const unsigned prep_blocks = (unsigned)(blocks < MAX_GRID ? blocks : MAX_GRID);
    if (!mma) return run_bwd_wgmma(L, s, qkv, do_, out, a, fused, prep_blocks);
    CODA_TRY(launch(L, "coda_attn_bwd_prep_kernel", prep_blocks, 1, 1, 256, 0, args));
    unsigned tiles = (unsigned)coda__cdiv(s->seq, BWD_ROWS);
    CODA_TRY(launch(L, "coda_attn_bwd_dq_kernel", heads, batch, tiles, BWD_ROWS / 16 * 32, smem_dq(L->hd), args));
    return launch(L, "coda_attn_bwd_dkdv_kernel", kv_heads, batch, tiles, BWD_ROWS / 16 * 32, smem_dkdv(L->hd),
                  args);
}

coda_status_t coda__cuda_attention(coda_context_t *ctx, const coda_attention_shape_t *shape,
                                   const coda_tensor_t *qkv, const coda_tensor_t *o, const coda_tensor_t *lse,
                                   const coda_tensor_t *do_, coda_tensor_t *out, void *ws, void *stream) {
    static const char fn[] = "coda_attention";
    const int backward = do_ != NULL;
    if (shape->batch > MAX_GRID || coda__cdiv(shape->seq, BWD_ROWS) > MAX_GRID)
        return coda__fail(CODA_ERR_UNSUPPORTED, "%s: batch = %lld, seq = %lld: the CUDA kernels take at most "
                          "%d sequences of at most %d tokens", fn, (long long)shape->batch,
                          (long long)shape->seq, MAX_GRID, MAX_GRID * BWD_ROWS);
    {   /* every pointer device memory of qkv's device */
        const size_t wsb = coda__attention_ws_bytes(shape, CODA_DEVICE_CUDA);
        coda_tensor_t wt = coda_tensor_1d(ws, CODA_F32, (int64_t)(wsb / sizeof(float)));
        wt.device = qkv->device;
        wt.device_index = qkv->device_index;
        const coda_tensor_t *ts[] = {qkv, o, lse, do_, out, ws ? &wt : NULL};
        const char *names[] = {"qkv", "o", "lse", "do_", backward ? "dqkv" : "o", "workspace"};
        CODA_TRY(coda__cuda_check_pointers(ctx, qkv->device_index, ts, names, 6));
    }
    if (shape->batch * shape->seq == 0) return CODA_OK;

    launcher_t L;
    memset(&L, 0, sizeof L);
    L.ctx = ctx;
    L.hd = (int)shape->head_dim;
    L.stream = stream;
    CODA_TRY(coda__cuda_device(ctx, qkv->device_index, &L.dev));
    L.stages = bwd_stages(ctx, L.dev, L.hd);
    L.pipe = ctx->tuning.attn_pipe >= 0 ? ctx->tuning.attn_pipe : BWD_PIPE;
    /* the permuted dq staging needs whole groups of 8 positions (its map
     * splits the position 8 g + 4 h + q); the forward takes the same
     * options as the usual backward, so they share one compilation */
    L.dq_perm = !backward || shape->seq % 8 == 0;
    L.fwd_stages = ctx->tuning.attn_fwd_stages ? ctx->tuning.attn_fwd_stages : FWD_STAGES;
    L.fwd_apart = ctx->tuning.attn_fwd_apart >= 0 ? ctx->tuning.attn_fwd_apart : FWD_APART;
    L.fwd_consumers = fwd_consumers_of(ctx->tuning.attn_fwd_consumers, L.hd);
    coda__cuda_attention_options(L.hd, L.stages, L.pipe, L.dq_perm, L.fwd_stages, L.fwd_apart, L.fwd_consumers,
                                 L.opts, L.optbuf);

    attn_args_t a;
    memset(&a, 0, sizeof a);
    a.qkv = qkv->data;                      // (M, nq + 2 nkv) bf16
    a.o = o ? o->data : NULL;               // (M, nq) bf16 (backward)
    a.dout = do_ ? do_->data : NULL;        // (M, nq) bf16 (backward)
    a.lse = (float *)lse->data;             // (M, n_heads) f32
    a.dsum = (float *)ws;                   // 2 x (batch, n_heads, seq padded) f32, counters (backward)
    a.out = out->data;                      // forward: o (M, nq) bf16; backward: dqkv (M, nqkv) f32
    a.ld_qkv = es(qkv);
    a.ld_o = backward ? es(o) : es(out);
    a.ld_do = es(do_);
    a.ld_lse = es(lse);
    a.ld_out = es(out);
    a.seq = (int)shape->seq;
    a.n_heads = (int)shape->n_heads;
    a.n_kv_heads = (int)shape->n_kv_heads;
    a.scale = (float)(1.0 / sqrt((double)shape->head_dim));
    a.batch = (int)shape->batch;
    a.kv_parts = 1; /* the fused backward's choices: run_bwd_wgmma */

    struct coda_cuda *cu = ctx->cuda;
    CODA_CU(cu, cu->cu.CtxPushCurrent(L.dev->pctx), "cuCtxPushCurrent");
    coda_status_t s = run(&L, shape, qkv, do_, out, &a, backward);
    CUcontext prev;
    cu->cu.CtxPopCurrent(&prev);
    return s;
}

#endif
