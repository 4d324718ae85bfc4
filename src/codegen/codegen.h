/* codegen.h - epilogue programs to CUDA C (not public).
 *
 * The generator turns a verified program into CUDA C device functions that a
 * GEMM kernel calls on its wgmma accumulator fragment. The code works on one
 * accumulator *pair* at a time: columns (col, col+1) of one row, which a
 * Hopper thread holds in adjacent registers. In that unit every value of the
 * program is a tiny vector: 1 element in the half space (column col/2),
 * 2 in the full space (col, col+1), 4 in the double space (2col .. 2col+3),
 * so every pairwise map (even, odd, interleave, swap on full/double values)
 * stays in registers.
 *
 * The contract with the kernel (docs/epilogue-codegen.md has the long form).
 * Before the generated text the kernel defines:
 *
 *   CODA_EPI_ROW_SLOTS   rows one thread holds in a tile
 *   CODA_EPI_COL_SLOTS   accumulator pairs one thread holds in each row
 *   CODA_EPI_TILE_N      accumulator columns of a tile (the partials' tile_n)
 *   CODA_EPI_NWARPS      warps that hold the tile (for column reductions)
 *   CODA_EPI_SYNC()      a barrier over exactly those warps
 *
 * and the generated text defines (names fixed, so the kernel never changes):
 *
 *   struct coda_epi_state;                       per-thread reduction state
 *   coda_epi_begin(S)                            once per tile
 *   coda_epi_pair(P, S, rs, cs, row, col, a0, a1)
 *        for every pair the thread holds: row slot rs, column slot cs,
 *        global row, global even accumulator column col, the two values;
 *        it masks row >= M and col >= N itself
 *   coda_epi_end(P, S, rows, cols, m_tile, n_tile, lane, warp, tid, scratch)
 *        once per tile, by every thread of the CODA_EPI_NWARPS warps:
 *        finishes row reductions across the 4 lanes that share a row (lanes
 *        4q..4q+3 hold all of a row's columns in the wgmma layout) and column
 *        reductions across lanes and warps (scratch: shared memory of
 *        CODA_EPI_NWARPS * 4 * CODA_EPI_TILE_N floats), and writes the
 *        partials of tile (m_tile, n_tile).
 *
 * Arguments reach the kernel in struct coda_epi_params (coda_epi_params_t
 * below, the same layout on host and device): one pointer, two element
 * strides and one scalar per program argument.
 */
#ifndef CODA_CODEGEN_H
#define CODA_CODEGEN_H

#include "program/ir.h"

#define CODA_EPI_MAX_ARGS 16

/* Host mirror of the generated `struct coda_epi_params`. */
typedef struct coda_epi_params {
    uint64_t ptr[CODA_EPI_MAX_ARGS];  /* device address of each bound tensor */
    int64_t s0[CODA_EPI_MAX_ARGS];    /* stride of dim 0, in elements         */
    int64_t s1[CODA_EPI_MAX_ARGS];    /* stride of dim 1, in elements         */
    float scalar[CODA_EPI_MAX_ARGS];  /* scalar arguments                     */
    int32_t m, n;                     /* GEMM extents                         */
} coda_epi_params_t;

/* CUDA C text for program p (malloc'd, NUL-terminated; caller frees).
 * CODA_ERR_UNSUPPORTED for a program the GPU cannot run (too many arguments,
 * a pairwise map that would cross threads). */
coda_status_t coda__codegen_cuda(const coda_program_t *p, char **out);

#endif
