/* backend.h - the CUDA backend's internal interface (src/cuda only, and tests).
 *
 * The driver is opened with dlopen("libcuda.so.1"), so the library loads on
 * machines without one; cuda.h is used for its types only. Kernels are CUDA C
 * compiled at run time by NVRTC (nvrtc.c) for sm_90a and cached as cubins on
 * disk and per device in memory. */
#ifndef CODA_CUDA_BACKEND_H
#define CODA_CUDA_BACKEND_H

#include "codegen/codegen.h"
#include "core/context.h"

#include <cuda.h>

#define CODA_CUDA_MAX_DEVICES 16
#define CODA_CUDA_GEMM_NCFG 6

/* A compiled and loaded kernel, cached per device by key. */
typedef struct coda_cuda_kernel {
    uint64_t key[2];       /* hash of the full source, options, NVRTC version */
    uint64_t quick[2];     /* caller's cheaper key (e.g. epilogue hash + variant), or 0 */
    CUmodule module;
    CUfunction fn;
    struct coda_cuda_kernel *next;
} coda_cuda_kernel_t;

/* A stream-K workspace (kernels/gemm_streamk.cuh): partial sums and flags
 * for one stream, so that GEMMs on different streams never share one. A
 * slot whose last GEMM has finished (its event) is handed to a new stream
 * when all slots are taken, unless a graph captured it (pinned). */
#define CODA_CUDA_SK_STREAMS 8
typedef struct coda_cuda_sk_ws {
    unsigned long long key; /* the stream it serves: its cuStreamGetId id, unique in the
                               process (a handle is not: cudaStreamPerThread is one handle
                               for every thread's stream, and a destroyed stream's handle
                               may come back while its last GEMM still runs); without
                               cuStreamGetId, the handle */
    CUdeviceptr part;      /* (sm_count, 2, 64 * 256) f32; 0: slot unused */
    CUdeviceptr flag;      /* (sm_count, 2, 4) u32, zero between launches */
    CUevent done;          /* recorded once its flags are first zeroed, then after each
                              GEMM that used it (not captured) */
    int pinned;            /* a GEMM using it was captured into a graph: never handed on */
} coda_cuda_sk_ws_t;

typedef struct coda_cuda_device {
    int known;             /* name and attributes read (describe reads them alone) */
    int opened;            /* primary context retained: coda__cuda_device opened it */
    CUdevice dev;
    CUcontext pctx;        /* the device's primary context (shared with PyTorch) */
    int sm_count;
    int smem_optin;        /* max dynamic shared memory per block, bytes */
    int mem_gbps;          /* peak memory bandwidth, GB/s (memory clock x bus width); 0: unknown */
    int l2_bytes;          /* L2 cache size, bytes; 0: unknown */
    int cc_major, cc_minor;
    char name[128];
    coda_cuda_kernel_t *kernels;
    CUfunction plain_fn[3][CODA_CUDA_GEMM_NCFG][2][2][4]; /* plain GEMM: layout, config, C f32,
                                                             stream-K, variant bits (beta = 0,
                                                             C tail: src/cuda/gemm.c) */
    int max_clusters[CODA_CUDA_GEMM_NCFG];  /* co-resident clusters per config; 0: not asked yet */
    coda_cuda_sk_ws_t sk_ws[CODA_CUDA_SK_STREAMS];   /* stream-K workspaces (gemm.c) */
} coda_cuda_device_t;

/* Driver entry points, by their ABI symbol names (cuda.h maps some to _v2). */
typedef struct coda_cuda_api {
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
    CUresult (*FuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
    CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                     const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                     const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    CUresult (*PointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*Memcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
    CUresult (*MemsetD2D8Async)(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    /* optional (NULL if the driver lacks it) */
    CUresult (*OccupancyMaxActiveClusters)(int *, CUfunction, const CUlaunchConfig *);
    CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
    CUresult (*StreamGetId)(CUstream, unsigned long long *);
} coda_cuda_api_t;

struct coda_cuda {
    void *lib;              /* dlopen handle of libcuda.so.1 */
    coda_cuda_api_t cu;
    int driver_version;
    int device_count;
    coda_cuda_device_t devices[CODA_CUDA_MAX_DEVICES];
};

/* driver.c: fail with CODA_ERR_DEVICE and the driver's error name and text. */
coda_status_t coda__cu_fail(struct coda_cuda *cuda, CUresult r, const char *what);
#define CODA_CU(cuda, call, what)                                           \
    do {                                                                    \
        CUresult coda__r = (call);                                          \
        if (coda__r != CUDA_SUCCESS) return coda__cu_fail((cuda), coda__r, (what)); \
    } while (0)

/* Open device `index` (retain its primary context, read its properties);
 * CODA_ERR_DEVICE if it does not exist or is not compute capability 9.0. */
coda_status_t coda__cuda_device(coda_context_t *ctx, int index, coda_cuda_device_t **out);

/* The device a tensor's data really lives on, as the driver reports it:
 * CODA_ERR_DEVICE for host memory unknown to CUDA or another device's
 * memory (catches a host pointer in a CUDA descriptor before a kernel
 * faults on it). The first form runs with the device's context current;
 * the second pushes it and checks ts[0..n) (NULL entries skipped). */
coda_status_t coda__cuda_check_pointer(struct coda_cuda *cu, const coda_tensor_t *t, const char *what);
/* (coda__cuda_check_pointers, the second form, is in core/context.h: the
 * layer uses it too.) */

/* nvrtc.c: compile CUDA C `src` for sm_90a with `opts` (n_opts strings) to a
 * cubin; the caller frees *cubin. Needs no GPU. On failure the message holds
 * the head of the compile log. */
coda_status_t coda__nvrtc_compile(const char *src, const char *const *opts, int n_opts,
                                  char **cubin, size_t *size);
/* The same, and with log non-NULL the compile log of a success too (what
 * ptxas said under --ptxas-options=-v: registers, spills, serialised
 * wgmma), malloc'ed for the caller to free, NULL when empty. */
coda_status_t coda__nvrtc_compile_log(const char *src, const char *const *opts, int n_opts, char **cubin,
                                      size_t *size, char **log);
/* Hash of source, options and the NVRTC version: the cache key. */
void coda__nvrtc_key(const char *src, const char *const *opts, int n_opts, uint64_t key[2]);
/* Compile (or find in the memory or disk cache) and load `src`; return the
 * kernel named `entry` on device d, its dynamic shared memory limit raised
 * to the device maximum. `quick` (may be NULL) is remembered with it for
 * coda__cuda_kernel_find. The caller has d's context current. */
coda_status_t coda__cuda_kernel(coda_context_t *ctx, coda_cuda_device_t *d, const char *src,
                                const char *const *opts, int n_opts, const char *entry,
                                const uint64_t quick[2], CUfunction *fn);
/* A kernel loaded before under the quick key, or NULL. */
CUfunction coda__cuda_kernel_find(coda_cuda_device_t *d, const uint64_t quick[2]);
/* FNV-1a 64 continued from h (for quick keys). */

/* Embedded kernel source by file name (build/gen/kernels.c), or NULL. */
const char *coda__cuda_source(const char *name);
/* The embedded files[0..n) joined by newlines into one source in *out
 * (malloc'd; the caller frees it), a NULL name standing for `fill` (the
 * GEMM's epilogue). Fails (naming `what`, *out NULL) when one is not
 * embedded or memory runs out. */
coda_status_t coda__cuda_join_sources(const char *const *files, size_t n, const char *fill, const char *what,
                                      char **out);

/* Up to 4 more options from tuning's extra_opts (CODA_DEBUG_OPTS, split at
 * spaces, each at most 60 characters) appended to opts[0..n) as long as n
 * < max, copied into buf (cap bytes); returns the new count. */
int coda__cuda_extra_options(const char *x, const char **opts, int n, int max, char *buf, size_t cap);

/* ---- attention.c: the attention kernels' one NVRTC source ---- */

#define CODA_CUDA_ATTN_NFILES 5
#define CODA_CUDA_ATTN_NOPTS 12
/* The embedded files joined into the attention source, in order. */
extern const char *const coda__cuda_attention_files[CODA_CUDA_ATTN_NFILES];
/* The NVRTC options of the attention source into opts[0..CODA_CUDA_ATTN_NOPTS)
 * (buf holds the formatted ones): head dimension 64 or 128, the backward's
 * ring (CODA_AB_STAGES) and pipelining (CODA_AB_PIPE, which also turns the
 * forward's ping-pong on), the permuted dq staging, the forward's ring
 * (CODA_AW_STAGES), its k and v freed apart (CODA_AW_APART) and its
 * consumer warpgroups (CODA_AW_CONSUMERS, 2 or 3). Returns the count. */
int coda__cuda_attention_options(int hd, int bwd_stages, int pipe, int dq_perm, int fwd_stages, int fwd_apart,
                                 int fwd_consumers, const char **opts, char (*buf)[32]);
/* The same with the options an untuned launch passes (the backward's with
 * seq a multiple of 8): what the tools and tests that inspect the compiled
 * attention kernels compile. */
int coda__cuda_attention_default_options(int hd, const char **opts, char (*buf)[32]);
/* The fused attention backward's layout for a kv group of `group` query
 * heads over `seq` positions of head_dim hd, on an L2 of l2_bytes (0:
 * unknown, taken as 50 MiB): *parts, the blocks a group's heads are shared
 * over, and *chunk, the (part, sequence) pairs a launch chunk of the
 * kernel's blocks (ab_block; 0 all, 1 key blocks fastest). tune_parts (0: the
 * rule's, -1: one head a block) and tune_order (-1: the rule's) are
 * tuning's overrides (attention.c's bwd_layout says why). */
void coda__cuda_attn_bwd_layout(int group, int64_t seq, int64_t hd, int64_t l2_bytes, int tune_parts,
                                int tune_order, int *parts, int *chunk);
/* The wgmma backward's ring stages: tuned (tuning's attn_stages, 0: the
 * default), for the fused kernel (split = 0) cut to what fits its shared
 * memory at head_dim hd in smem_optin bytes (0: Hopper's 227 KiB). */
int coda__cuda_attn_bwd_stages(int tuned, int split, int hd, int smem_optin);

/* ---- gemm.c: the GEMM mainloop with a spliced-in epilogue (docs/gpu.md) ---- */

/* A tile configuration of the kernel; each is one NVRTC compilation per
 * layout and epilogue. */
typedef struct coda_cuda_gemm_cfg {
    int bm, bn, bk;   /* block tile; bm is 128; ping-pong needs bn 128 */
    int stages;       /* shared-memory pipeline depth */
    int cluster_m;    /* CTAs per cluster along M (1 or 2); B tile multicast */
    int group_m;      /* tile rows (in clusters) per group of the tile order */
    int pingpong;     /* 1: each consumer warpgroup owns whole tiles, in turn */
} coda_cuda_gemm_cfg_t;

extern const coda_cuda_gemm_cfg_t coda__cuda_gemm_cfgs[CODA_CUDA_GEMM_NCFG];

/* Pick the configuration for a problem (index into coda__cuda_gemm_cfgs). */
int coda__cuda_gemm_pick(int64_t m, int64_t n, int64_t k, int sm_count);
/* Whether a launch may take the epilogue overlap (kernels/gemm_overlap.cuh),
 * before the overlapped kernel's own say (its local memory): gemm.c. nbox:
 * the program's ring boxes, -1 for a plain GEMM; mode: tuning's epi_overlap;
 * streamk_mode: tuning's streamk (a forced stream-K wins). */
int coda__cuda_overlap_candidate(int store_c, int pingpong, int nbox, int acc_bf16, int64_t kiters, int64_t units,
                                 int64_t clusters, int mode, int streamk_mode);
/* Stream-K split (kernels/gemm_streamk.cuh): how many of `units` tile pairs
 * run whole on `clusters` clusters before the rest is shared out by
 * k-blocks (kiters per unit); `units` means no stream-K. mem_gbps: the
 * device's peak memory bandwidth (0: unknown). */
int coda__cuda_streamk_dp_units(int64_t units, int64_t clusters, int64_t kiters, int pingpong, int mode,
                                int mem_gbps);
/* The split form of the tail for a few waves (used where the rule above
 * gives none): the partial wave's units cut into S aligned k-ranges; S >= 2,
 * or 0 for none. */
int coda__cuda_streamk_split(int64_t units, int64_t clusters, int64_t kiters, int pingpong, int mode);

/* The configuration ctx's tuning forces (gemm_cfg, a benchmarking
 * override, when it is a valid index), or -1. */
int coda__cuda_gemm_cfg_override(const coda_context_t *ctx);

/* The full kernel source for an epilogue: prelude + epilogue + mainloop,
 * and the NVRTC options for a layout and config. Returns a malloc'd string;
 * opts[] (CODA_CUDA_GEMM_MAX_OPTS entries) point into static storage or into
 * optbuf (>= 512 bytes). */
#define CODA_CUDA_GEMM_MAX_OPTS 24

/* The form of the generated epilogue a fused GEMM of n columns runs with
 * these arguments bound (bound[k] for argument k, NULL if none): N16 only
 * when N allows it and every tile argument is 16-byte aligned (base and row
 * stride), since that form moves tiles as 16-byte vectors; RING when N16
 * holds, the schedule is cooperative (pingpong 0; the caller passes 1 also for tuning's no_ring) and the program has tile
 * inputs for the stage ring (2-D tensors). plan (may be NULL) gets the ring
 * plan the form runs with: empty unless RING. */
coda_cg_form_t coda__cuda_fused_form(const coda_program_t *p, const coda_tensor_t *const *bound, int64_t n,
                                     int pingpong, coda_ring_plan_t *plan);
char *coda__cuda_gemm_source(const char *epilogue_src);
/* A kernel's tile schedule beyond the plain one (cooperative configurations
 * only): the stream-K tail (kernels/gemm_streamk.cuh), or each tile's
 * epilogue beside the next tile's k-loop (kernels/gemm_overlap.cuh). */
enum { CODA_SCHED_TILES = 0, CODA_SCHED_STREAMK = 1, CODA_SCHED_OVERLAP = 2 };
/* store_c: the mainloop stores the main output C by TMA (dtype f32 if c_f32).
 * sched: CODA_SCHED_*. */
int coda__cuda_gemm_options(coda_layout_t layout, const coda_cuda_gemm_cfg_t *cfg, int store_c,
                            int c_f32, int sched, const char **opts, char *optbuf, size_t optcap);

/* What a launch must know of the epilogue's own tensors (all may be empty):
 *   ring    tile inputs the producer copies into the stage ring (the RING
 *           form, codegen.h): box b of a 64-column chunk at accumulator
 *           column col0 is tensor[b] (bf16 or f32, 2-D, 16-byte aligned
 *           rows) from column xmul[b] col0 + xadd[b]; nbox 0: none
 *   store   staged tile outputs that coda_epi_flush hands to TMA (the store
 *           plan, codegen.h): map s is store[s], boxes of 16 rows x
 *           store_cols[s] elements, swizzled store_cols[s] x element bytes
 *   bound   every tensor bound to the program, whose pointers are checked
 *           to be device memory of a's device before the launch
 *   acc_bf16  the program reads the accumulator only rounded to bf16
 *           (coda__program_acc_bf16): the epilogue overlap gives it the
 *           same bits, so the launch may take it */
typedef struct coda_cuda_epi_io {
    int nbox;
    const coda_tensor_t *tensor[CODA_RING_MAX_BOX];
    int xmul[CODA_RING_MAX_BOX], xadd[CODA_RING_MAX_BOX];
    int nstore;
    const coda_tensor_t *store[CODA_STORE_MAX_MAP];
    int store_cols[CODA_STORE_MAX_MAP];
    int nbound;
    const coda_tensor_t *bound[CODA_EPI_MAX_ARGS]; /* NULL: not a tensor */
    const char *bound_name[CODA_EPI_MAX_ARGS];     /* its argument's name, for messages */
    int acc_bf16;
} coda_cuda_epi_io_t;

/* Run the GEMM with an epilogue: the epilogue source defines struct
 * coda_epi_params (docs/gpu.md) and `params` (params_size bytes, the same
 * layout) is passed to the kernel by value; scratch_bytes of shared memory
 * are given to the epilogue (coda_epi_tile.scratch). epilogue_key (may be
 * NULL: computed here): a 128-bit hash of epilogue_src (coda__hash, seeds
 * CODA_HASH_SEED0/1), so that a launch need not hash a long generated text
 * to find its kernel. c_out (may be NULL):
 * the main (M, N) output, bf16 or f32, stored by the mainloop with TMA from
 * the values the epilogue's pair hook leaves. io (may be NULL): the
 * epilogue's ring inputs (used only by an epilogue text of the RING form on
 * a cooperative configuration), TMA-stored outputs and bound tensors. A, B
 * are descriptors already checked by the front end; this checks them (and
 * c_out) for the copy engine, and every pointer's device. */
coda_status_t coda__cuda_gemm_run(coda_context_t *ctx, coda_layout_t layout,
                                  const coda_tensor_t *a, const coda_tensor_t *b,
                                  const coda_tensor_t *c_out,
                                  const char *epilogue_src, const uint64_t *epilogue_key,
                                  const void *params,
                                  size_t params_size, size_t scratch_bytes, int cfg_index,
                                  const coda_cuda_epi_io_t *io, void *stream);

/* Shared memory the mainloop uses besides the epilogue's scratch. */
size_t coda__cuda_gemm_smem(const coda_cuda_gemm_cfg_t *cfg);

/* Check A and B for the GPU copy engine: bf16, 16-byte aligned base, row
 * stride a multiple of 16 bytes, K a multiple of 8. */
coda_status_t coda__cuda_check_operands(coda_layout_t layout, const coda_tensor_t *a,
                                        const coda_tensor_t *b);

#endif
