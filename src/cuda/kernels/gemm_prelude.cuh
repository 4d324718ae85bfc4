/* gemm_prelude.cuh - PTX helpers for the Hopper GEMM (compiled by NVRTC, sm_90a).
 *
 * No CUDA headers: NVRTC does not find them by itself, so bf16 conversion,
 * TMA, mbarriers and wgmma are all inline PTX here. The kernel source is
 * probes.cuh, this file, gemm_wgmma.cuh, the epilogue (the splice point,
 * docs/gpu.md), gemm_streamk.cuh and gemm_mainloop.cuh, concatenated in
 * that order (src/cuda/gemm.c). */

#define CODA_STR(x) #x
#define CODA_XSTR(x) CODA_STR(x)

typedef unsigned int u32;
typedef unsigned long long u64;

/* offsetof for the layout checks below: NVRTC has neither <stddef.h> nor
 * __builtin_offsetof, and __INTADDR__ (a builtin of its EDG front end) is
 * what folds a member's address to a constant there. */
#ifndef CODA_OFFSETOF
#define CODA_OFFSETOF(T, f) __INTADDR__(&((T *)0)->f)
#endif

/* A CUtensorMap (128 bytes, 64-byte aligned), passed by value as a
 * __grid_constant__ parameter so TMA can read it from parameter space. */
struct __align__(64) coda_tmap { u64 opaque[16]; };
static_assert(sizeof(coda_tmap) == 128, "coda_tmap: the size of a CUtensorMap");

/* ---- bf16 (round to nearest even, NaN stays NaN: cvt.rn does both) ---- */
static __device__ __forceinline__ float coda_bf16_lo(u32 v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float coda_bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }
/* Two floats to packed bf16x2: lo (lower address) = a, hi = b. */
static __device__ __forceinline__ u32 coda_pack_bf16x2(float a, float b) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}
static __device__ __forceinline__ unsigned short coda_f32_to_bf16(float a) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(a));
    return r;
}
static __device__ __forceinline__ float coda_bf16_to_f32(unsigned short h) {
    return __uint_as_float((u32)h << 16);
}
/* What a bf16 store keeps of v. */
static __device__ __forceinline__ float coda_round_bf16(float v) {
    return coda_bf16_to_f32(coda_f32_to_bf16(v));
}

static __device__ __forceinline__ u32 coda_smem_addr(const void *p) {
    return (u32)__cvta_generic_to_shared(p);
}

/* ---- mbarrier ---- */
static __device__ __forceinline__ void coda_mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void coda_mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void coda_mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Arrive on the barrier at the same offset in CTA `cta` of the cluster.
 * Default (CTA-scope release) semantics: the consumers only say that their
 * wgmma reads of a stage are done (wgmma.wait_group), and a cluster-scope
 * release here costs a fence per k-step (measured: ~40% slower). */
static __device__ __forceinline__ void coda_mbar_arrive_cluster(u32 bar, u32 cta) {
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}" ::"r"(bar), "r"(cta)
                 : "memory");
}
static __device__ __forceinline__ void coda_mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ---- TMA: 2-D tile load into shared memory, completing on an mbarrier ---- */
static __device__ __forceinline__ void coda_tma_load(u32 dst, const coda_tmap *map, int c0, int c1,
                                                     u32 bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"((u64)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
/* The same, written into the same offset of every CTA in `mask` of the cluster. */
static __device__ __forceinline__ void coda_tma_load_mc(u32 dst, const coda_tmap *map, int c0,
                                                        int c1, u32 bar, unsigned short mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
                 "l"((u64)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
                 : "memory");
}

/* Fetch a tensor map into the TMA unit's cache ahead of the first copy. */
static __device__ __forceinline__ void coda_prefetch_tmap(const coda_tmap *map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"((u64)map) : "memory");
}

/* ---- TMA store of a 2-D tile from shared memory (bulk group) ---- */
static __device__ __forceinline__ void coda_tma_store(const coda_tmap *map, u32 src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];"
                 ::"l"((u64)map), "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
static __device__ __forceinline__ void coda_bulk_commit(void) {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
/* Wait until at most n bulk groups still read their shared-memory source. */
#define coda_bulk_wait_read(n) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(n) : "memory")
#define coda_bulk_wait(n) asm volatile("cp.async.bulk.wait_group %0;" ::"n"(n) : "memory")
/* Order this thread's ordinary shared-memory accesses before later ones by
 * the async proxy (TMA): stores that TMA then reads, reads of a buffer that
 * TMA then overwrites. */
static __device__ __forceinline__ void coda_fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
static __device__ __forceinline__ void coda_st_shared_b32(u32 addr, u32 v) {
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
static __device__ __forceinline__ void coda_st_shared_f32x2(u32 addr, float a, float b) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
/* Barrier among the 128 threads of one warpgroup (ids 2, 3: consumers 0, 1). */
static __device__ __forceinline__ void coda_wg_sync(int id) {
    asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory");
}

/* ---- cluster ---- */
static __device__ __forceinline__ u32 coda_cluster_rank(void) {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
static __device__ __forceinline__ void coda_cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::
                     : "memory");
}

/* ---- wgmma ---- */
static __device__ __forceinline__ void coda_wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
static __device__ __forceinline__ void coda_wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
#define coda_wgmma_wait(n) asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(n) : "memory")
/* Keep the compiler from moving accumulator reads/writes across wgmma waits. */
static __device__ __forceinline__ void coda_fence_reg(float &r) {
    asm volatile("" : "+f"(r)::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle (PTX ISA, "Matrix
 * Descriptor Format"): start address, leading and stride byte offsets, all
 * in 16-byte units; bits 62-63 = 1 selects the 128B swizzle. */
static __device__ __forceinline__ u64 coda_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3ffff) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) |
           (1ull << 62);
}

/* Flags between CTAs in global memory (the stream-K partials, the attention
 * backward's turns): a GPU-scope acquire load and release store. */
static __device__ __forceinline__ unsigned coda_ld_acquire_u32(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
static __device__ __forceinline__ void coda_st_release_u32(unsigned *p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Turn passing between the consumer warpgroups (a named barrier of 256
 * threads: one warpgroup arrives, the other waits): the attention
 * forward's ping-pong (4, 5), the backward's dS^T and dq order (6-9, 10). */
static __device__ __forceinline__ void coda_turn_pass(int id) {
    asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}
static __device__ __forceinline__ void coda_turn_wait(int id) {
    asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}

/* Named barrier among the two consumer warpgroups (256 threads), for
 * epilogues that combine values across warpgroups through shared memory
 * (cooperative schedule only: in ping-pong they work on different tiles). */
static __device__ __forceinline__ void coda_consumer_sync(void) {
    asm volatile("bar.sync 1, 256;" ::: "memory");
}

/* The schedule (gemm_mainloop.cuh) fixes how many 64-row blocks of a tile
 * one consumer warpgroup holds, and so the fragment an epilogue sees. */
#ifndef CODA_PINGPONG
#define CODA_PINGPONG 0
#endif
#if CODA_PINGPONG && CODA_BN != 128
#error "the ping-pong schedule has 128 x 128 tiles"
#endif
#define CODA_WG_MH (CODA_PINGPONG ? 2 : 1)
/* The threads of one tile, for a generated epilogue's barrier (column
 * partials): both consumer warpgroups, or in ping-pong the tile's own. */
#if CODA_PINGPONG
#define CODA_EPI_TILE_SYNC(t) coda_wg_sync(2 + (t).wg)
#else
#define CODA_EPI_TILE_SYNC(t) coda_consumer_sync()
#endif

/* What the mainloop tells the epilogue about the tile a consumer thread holds
 * (docs/gpu.md has the fragment picture). A thread holds rows row + 8 h +
 * 64 mh (h < 2, mh < CODA_WG_MH): row slot rs = 2 mh + h. */
/* Column chunks the mainloop hands the epilogue as one batch: their inputs
 * are fetched together, and staged outputs are written out together. */
#ifndef CODA_EPI_BATCH
#define CODA_EPI_BATCH 4
#endif

struct coda_epi_tile {
    int m, n;           /* problem extents: rows and columns of C               */
    int tile_m, tile_n; /* tile indices (the tile is CODA_BM x CODA_BN)          */
    int row;            /* this thread's first row (slot 0; see above)         */
    int col;            /* this thread's first column; chunk j starts col + 8j */
    int wg;             /* consumer warpgroup, 0 or 1                           */
    int tid;            /* thread in its warpgroup, 0..127                      */
    unsigned char *scratch; /* shared memory scratch, scratch_bytes long (host-chosen) */
    unsigned stage;     /* CODA_EPI_STAGE: this warp's 4 KiB staging slab (shared address) */
    unsigned ring;      /* CODA_EPI_RING: the stage holding the current 64-column
                           chunk's ring inputs (shared address) */
    unsigned ring_box;  /* CODA_EPI_RING: bytes from one ring box to the next */
};

/* Tile inputs the producer copies into the stage ring for the epilogue
 * (the RING form, src/codegen/codegen.h): per 64-column chunk at
 * accumulator column col0, box b (128 rows x 128 bytes, 16 KiB at offset
 * b t.ring_box of the stage) is map[b] at column xmul[b] col0 + xadd[b] and
 * the tile's first row. Host mirror: ring_params_t (src/cuda/gemm.c), made
 * from coda_cuda_epi_io_t (src/cuda/backend.h). CODA_RING_MAX_BOX and
 * CODA_STORE_MAX_MAP are also defined in src/codegen/codegen.h; test_codegen
 * checks that the two agree. */
#define CODA_RING_MAX_BOX 2
#define CODA_RING_BOX_BYTES 16384
struct coda_ring_params {
    coda_tmap map[CODA_RING_MAX_BOX];
    int nbox;
    int xmul[CODA_RING_MAX_BOX], xadd[CODA_RING_MAX_BOX];
};
/* The launch copies sizeof(coda_ring_params) bytes of ring_params_t; the
 * host asserts the same offsets, and a size at least this one. */
static_assert(CODA_OFFSETOF(coda_ring_params, nbox) == 256 && CODA_OFFSETOF(coda_ring_params, xmul) == 260 &&
                  CODA_OFFSETOF(coda_ring_params, xadd) == 268 && sizeof(coda_ring_params) == 320,
              "coda_ring_params: the layout of ring_params_t (src/cuda/gemm.c)");

/* Staged tile outputs that a generated coda_epi_flush hands to TMA (the
 * store plan, src/codegen/codegen.h): map s covers output s of the plan,
 * boxes of 16 rows, swizzled as the warp's slab region. Host mirror:
 * store_maps_t (src/cuda/gemm.c), made from coda_cuda_epi_io_t. */
#define CODA_STORE_MAX_MAP 4
struct coda_store_maps {
    coda_tmap map[CODA_STORE_MAX_MAP];
};
static_assert(sizeof(coda_store_maps) == 128 * CODA_STORE_MAX_MAP,
              "coda_store_maps: the layout of store_maps_t (src/cuda/gemm.c)");
