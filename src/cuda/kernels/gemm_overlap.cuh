/* gemm_overlap.cuh - a finished tile's epilogue beside the next tile's
 * k-loop (CODA_EPI_OVERLAP, cooperative fused kernels; gemm_mainloop.cuh).
 *
 * Without it a consumer warpgroup runs a tile's k-loop, then the tile's
 * epilogue, and the tensor cores wait through the epilogue (3 us of a 16 us
 * tile for gate/up at K = 2048, 10 us for swiglu_bwd: bench/RESULTS.md,
 * stop 61). With it the consumer keeps the finished tile as 64 bf16 pairs
 * (held, 64 registers: there is no room for another 128 f32 accumulators)
 * and runs its batch b (32 columns) right after issuing k-block
 * coda_ov_slot(b) of the next tile, while that k-block's wgmma runs; the
 * CTA's last tile runs its epilogue after the loop. The program therefore
 * sees each accumulator rounded to bf16 (CODA_EPI_ROUND_ACC gives the
 * ordinary kernel the same rounding: the tests' bitwise reference).
 *
 * The host takes it (src/cuda/gemm.c) only where it measured faster:
 * programs without ring inputs (a batch would wait for its ring stage
 * inside the k-loop) whose kernel does not spill with the 64 extra
 * registers, on CTAs with two tiles or more; no stream-K tail there. */
#ifndef CODA_EPI_OVERLAP
#define CODA_EPI_OVERLAP 0
#endif
/* A test option: the ordinary epilogue on accumulators rounded to bf16. */
#ifndef CODA_EPI_ROUND_ACC
#define CODA_EPI_ROUND_ACC 0
#endif

#if CODA_EPI_OVERLAP
#if CODA_PINGPONG || CODA_STREAMK || CODA_EPI_STORE_C || CODA_EPI_RING || !CODA_EPI_STAGE
#error "CODA_EPI_OVERLAP: cooperative fused kernels without stream-K, C store or ring inputs"
#endif
#if CODA_EPI_BATCH != 4
#error "CODA_EPI_OVERLAP runs a tile as batches of 4 column chunks (32 columns)"
#endif

#define CODA_OV_NB (CODA_BN / 32) /* batches of a tile, 32 columns each: the pieces it runs in */

/* The k-block after which batch b runs: spread evenly over the tile, one
 * batch a k-block, so that each has the tensor work of about kiters / NB
 * k-blocks to hide behind. A batch is covered only by the wgmma queued
 * when it starts (about 0.5 us a k-block at K = 2048 for 128 x 256), so
 * the pieces are kept small: a batch a slot took 0.979-0.998 of the time
 * of a 64-column chunk a slot (stop 64, H100, gate/up's training form at
 * the 1B and 8B shapes, the same bits; bench/RESULTS.md). Distinct for
 * kiters >= NB; a shorter loop runs them all after its last k-block (as
 * one path, not a second copy of the batches after the loop: that copy
 * made ptxas spill 8 bytes in gateup_swiglu, bench/kernel_stats). The
 * host launches it only with kiters >= 1 (coda__cuda_overlap_candidate):
 * with no k-block no batch would run. */
static __device__ __forceinline__ int coda_ov_slot(int b, int kiters) {
    return kiters >= CODA_OV_NB ? (2 * b + 1) * kiters / (2 * CODA_OV_NB) : kiters - 1;
}

/* Batch j0 (CODA_EPI_BATCH column chunks of 8, both row halves) of the
 * held tile t, as the ordinary epilogue runs it; held[2 j + h] is row half
 * h of column chunk j. */
static __device__ __forceinline__ void coda_ov_batch(const coda_epi_params &epi, coda_epi_tile &t,
                                                     coda_epi_state &st, coda_epi_vin &vin,
                                                     const u32 (&held)[CODA_BN / 4], int j0,
                                                     const coda_store_maps &smaps) {
    const int r = t.row;
    coda_epi_vput(t, vin);
    if (j0 + CODA_EPI_BATCH < CODA_BN / 8) coda_epi_vload(epi, t, 0, j0 + CODA_EPI_BATCH, vin);
    coda_epi_in in[2 * CODA_EPI_BATCH];
    coda_epi_fetch_batch(epi, t, r, t.col + 8 * j0, in);
    __syncwarp();          /* inputs read out of the slab before the pairs write outputs */
    coda_epi_slab_wait(t); /* and TMA has read the last batch's outputs */
#pragma unroll
    for (int jj = 0; jj < CODA_EPI_BATCH; jj++) {
        const int j = j0 + jj;
        float v0 = coda_bf16_lo(held[2 * j]), v1 = coda_bf16_hi(held[2 * j]);
        float v2 = coda_bf16_lo(held[2 * j + 1]), v3 = coda_bf16_hi(held[2 * j + 1]);
        coda_epi_pair(epi, t, st, 0, j, r, t.col + 8 * j, v0, v1, in[2 * jj]);
        coda_epi_pair(epi, t, st, 1, j, r + 8, t.col + 8 * j, v2, v3, in[2 * jj + 1]);
    }
    coda_epi_flush(epi, st, t, 0, j0, smaps);
}

#endif
