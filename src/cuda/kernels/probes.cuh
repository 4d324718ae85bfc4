/* probes.cuh - measurement probes of the GEMM kernel and its generated
 * epilogues, all in one place.
 *
 * The library never sets one: a benchmark adds it as a -D option through
 * CODA_DEBUG_OPTS (bench_epilogue: CODA_BENCH_AB="-DCODA_PROBE_..." for an
 * A/B in one process, CODA_BENCH_TIMELINE for the stamps). With none set,
 * every macro below is the production code's own expression or nothing:
 * the kernels the library compiles are what they would be without probes.
 * A probe that leaves work out gives wrong results: such a kernel only
 * measures what the work it leaves out costs. The NO_ probes are on when
 * nonzero (-DCODA_PROBE_NO_STORE sets 1).
 *
 *   CODA_PROBE_TIMELINE=ADDR  clock64 stamps of each CTA's consumer warp 0,
 *                             for its first 8 tiles: tile start, first
 *                             k-block's data in, k-loop done, epilogue done;
 *                             stored at device address ADDR, 36 long longs a
 *                             CTA (8 tiles x 4 stamps, then the tile count)
 *   CODA_PROBE_NO_STORE       the plain GEMM's TMA store of C is left out
 *                             (the epilogue still runs)
 *   CODA_PROBE_NO_EPI         the plain GEMM's whole epilogue is left out
 *   CODA_PROBE_NO_EPI_LOAD    generated epilogues: predicated tile loads
 *                             read zeros
 *   CODA_PROBE_NO_EPI_STORE   generated epilogues store nothing (tiles,
 *                             partials, TMA stores)
 *   CODA_PROBE_NO_PART_STORE  generated epilogues: row and column partials
 *                             are not stored
 *   CODA_PROBE_NO_COL_LOAD    generated epilogues: column vectors read as
 *                             ones, with no load (ptxas also drops the
 *                             multiplies by them)
 *
 * The kernel source starts with this file (src/cuda/gemm.c), so the
 * mainloop (gemm_mainloop.cuh), the epilogue prelude
 * (src/codegen/epi_prelude.cuh) and the generated text may all use it. */
#ifndef CODA_PROBES
#define CODA_PROBES

#ifndef CODA_PROBE_NO_STORE
#define CODA_PROBE_NO_STORE 0
#endif
#ifndef CODA_PROBE_NO_EPI
#define CODA_PROBE_NO_EPI 0
#endif
#ifndef CODA_PROBE_NO_EPI_LOAD
#define CODA_PROBE_NO_EPI_LOAD 0
#endif
#ifndef CODA_PROBE_NO_EPI_STORE
#define CODA_PROBE_NO_EPI_STORE 0
#endif
#ifndef CODA_PROBE_NO_PART_STORE
#define CODA_PROBE_NO_PART_STORE 0
#endif
#ifndef CODA_PROBE_NO_COL_LOAD
#define CODA_PROBE_NO_COL_LOAD 0
#endif

/* The plain GEMM's C store: lane 0 of a warp issues a chunk's TMA store
 * when ok. */
#if CODA_PROBE_NO_STORE
#define CODA_C_ST_OK(ok) 0
#else
#define CODA_C_ST_OK(ok) (ok)
#endif

/* No epilogue: the accumulators' sum keeps ptxas from dropping the wgmma
 * whose results would otherwise die (a first version without it ran at an
 * impossible rate: three of four wgmma gone). */
#if CODA_PROBE_NO_EPI
static __device__ __forceinline__ void coda_probe_keep(const float *acc, void *sink) {
    float keep = 0.0f;
#pragma unroll
    for (int i = 0; i < CODA_BN / 2; i++) keep += acc[i];
    if (keep == 1.5e-38f) *(float *)sink = keep;
}
#endif

/* The generated epilogues' predicates: loads (cg_ld*p), stores (cg_st*,
 * the TMA stores of coda_epi_flush) and partial stores. */
#if CODA_PROBE_NO_EPI_LOAD
#define CG_LD_OK(ok) 0
#else
#define CG_LD_OK(ok) (ok)
#endif
#if CODA_PROBE_NO_EPI_STORE
#define CG_ST_OK(ok) 0
#else
#define CG_ST_OK(ok) (ok)
#endif
#if CODA_PROBE_NO_PART_STORE
#define CG_PART_OK(ok) 0
#else
#define CG_PART_OK(ok) (ok)
#endif

/* The timeline, in the consumers of gemm_mainloop.cuh: the log (declared
 * once per thread), a tile's first stamp (its row of the log; tiles past
 * the 8th overwrite the last row), its stamps 1 and 2, its last stamp,
 * and the CTA's write-out by thread 128 (consumer warp 0's lane 0). */
#ifdef CODA_PROBE_TIMELINE
#define CODA_PROBE_TL_LOG long long tlog_[8][4]; int tl_n_ = 0
#define CODA_PROBE_TL_TILE long long *tl_ = tlog_[tl_n_ < 8 ? tl_n_ : 7]; tl_[0] = clock64()
#define CODA_PROBE_TL_STAMP(k) (tl_[k] = clock64())
#define CODA_PROBE_TL_TILE_END tl_[3] = clock64(); tl_n_++
#define CODA_PROBE_TL_WRITE                                                    \
    do {                                                                      \
        if (threadIdx.x == 128) {                                             \
            long long *out_ = (long long *)(CODA_PROBE_TIMELINE) + (size_t)blockIdx.x * 36; \
            for (int i = 0; i < tl_n_ && i < 8; i++)                          \
                for (int k = 0; k < 4; k++) out_[4 * i + k] = tlog_[i][k];    \
            out_[32] = tl_n_;                                                 \
        }                                                                     \
    } while (0)
#else
#define CODA_PROBE_TL_LOG ((void)0)
#define CODA_PROBE_TL_TILE ((void)0)
#define CODA_PROBE_TL_STAMP(k) ((void)0)
#define CODA_PROBE_TL_TILE_END ((void)0)
#define CODA_PROBE_TL_WRITE ((void)0)
#endif

#endif
