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
 * The contract with the kernel is the epilogue splice point of
 * src/cuda/kernels/gemm_mainloop.cuh (docs/gpu.md): the generated text
 * defines struct coda_epi_params, struct coda_epi_state and
 *
 *   coda_epi_preload(P, t, Q)                  once per tile, before its
 *        k-loop: the row vectors of the thread's row slots (struct
 *        coda_epi_pre); in the N16 and RING forms also the tile's slice of
 *        each column vector, copied into the warp's slab (cp.async)
 *   coda_epi_begin(P, t, S, Q)                once per tile, after the k-loop
 *   coda_epi_fetch_batch(P, t, row, col0, L[2 * CODA_EPI_BATCH])
 *        reads the tile and column-vector inputs of a batch's pairs (rows
 *        row and row + 8, chunks col0 + 8 jj; pair (jj, h) into L[2 jj + h],
 *        struct coda_epi_in, raw words) before the kernel calls
 *        coda_epi_pair on any of them: coda_epi_fetch(P, t, row, col, L)
 *        for each pair, and with CG_LDSM (slabs, CODA_EPI_STAGE) the 4-byte
 *        pairs kept in shared memory by ldmatrix, which coda_epi_fetch alone
 *        then leaves unread
 *   coda_epi_pair(P, t, S, rs, cs, row, col, a0, a1, L)
 *        for every accumulator pair a thread holds: row slot rs (rows t.row
 *        + 8 (rs & 1) + 64 (rs >> 1)), column slot cs (chunk j = cs % (BN/8),
 *        col = t.col + 8j), the global row,
 *        the global even accumulator column, the two values. It masks
 *        row >= M and col >= N itself and writes every output itself
 *        (the kernel is built with CODA_EPI_STORE_C = 0). Within a batch
 *        the kernel calls it chunk by chunk, row h = 0 before h = 1: with
 *        CG_LDSM a staged output's words wait in the state until the
 *        second pair of an odd chunk writes two chunks' at once.
 *   coda_epi_flush(P, S, t, mh, j0)           after every batch of
 *        CODA_EPI_BATCH chunks: writes the staged outputs (N16, RING) and
 *        folds the batch's lse values into their states (every form)
 *   coda_epi_end(P, t, S)                     once per tile, every thread:
 *        row reductions and lse states are combined over the 4 lanes that
 *        share a row (in the wgmma layout they hold all the tile's columns of
 *        it) and written as the partials of tile (row, t.tile_n); column
 *        reductions are combined over the 8 lanes that share columns (one
 *        warp's 16 rows), then over the tile's 8 such row groups through
 *        the warps' slabs between two barriers over the tile's threads
 *        (CODA_EPI_TILE_SYNC), and written as the partials of the 128-row
 *        tile t.tile_m. So on the GPU the tiling is tile_m = 128 (for column
 *        partials; row partials do not depend on it), tile_n = CODA_BN.
 *
 * Arguments reach the kernel in struct coda_epi_params (coda_epi_params_t
 * below, the same layout on host and device): one pointer, two element
 * strides, one scalar and one dim-1 extent per program argument.
 */
#ifndef CODA_CODEGEN_H
#define CODA_CODEGEN_H

#include "program/ir.h"

#include <stddef.h>

#define CODA_EPI_MAX_ARGS 16

/* Host mirror of the generated `struct coda_epi_params` (epi_prelude.cuh,
 * which asserts the same layout). */
typedef struct coda_epi_params {
    uint64_t ptr[CODA_EPI_MAX_ARGS];  /* device address of each bound tensor */
    int64_t s0[CODA_EPI_MAX_ARGS];    /* stride of dim 0, in elements         */
    int64_t s1[CODA_EPI_MAX_ARGS];    /* stride of dim 1, in elements         */
    float scalar[CODA_EPI_MAX_ARGS];  /* scalar arguments                     */
    int32_t m, n;                     /* GEMM extents                         */
    int32_t e1[CODA_EPI_MAX_ARGS];    /* extent of dim 1 (an in rowpart's T)  */
} coda_epi_params_t;
_Static_assert(offsetof(coda_epi_params_t, s0) == 128 && offsetof(coda_epi_params_t, s1) == 256 &&
                   offsetof(coda_epi_params_t, scalar) == 384 && offsetof(coda_epi_params_t, m) == 448 &&
                   offsetof(coda_epi_params_t, n) == 452 && offsetof(coda_epi_params_t, e1) == 456 &&
                   sizeof(coda_epi_params_t) == 520,
               "coda_epi_params_t mirrors struct coda_epi_params in epi_prelude.cuh");

/* CUDA C text for program p (malloc'd, NUL-terminated; caller frees).
 * CODA_ERR_UNSUPPORTED for a program the GPU cannot run (too many arguments,
 * a pairwise map that would cross threads). */
coda_status_t coda__codegen_cuda(const coda_program_t *p, char **out);
/* The forms of a program's CUDA text, by what the number of accumulator
 * columns N allows:
 *   ANY   any N (pairs may be half outside; a pair outside returns early)
 *   EVEN  N even: every pair whole, branch-free, so loads of many pairs overlap
 *   N16   N a multiple of 16: EVEN, and the tile outputs are staged through
 *         shared memory and written as 16-byte vectors (coda_epi_flush),
 *         none of which straddles N */
typedef enum coda_cg_form {
    CODA_CG_ANY = 0,
    CODA_CG_EVEN = 1,
    CODA_CG_N16 = 2,
    CODA_CG_RING = 3,
    CODA_CG_NFORMS = 4
} coda_cg_form_t;
/*   RING  N16, and the tile inputs of the ring plan (coda__codegen_ring_plan)
 *         come through the mainloop's stage ring: on the cooperative
 *         schedule the producer copies them with TMA after each tile's
 *         k-blocks, so they are in flight while the tile's last k-blocks
 *         run, and the epilogue reads them from shared memory. Elsewhere
 *         (ping-pong, the test harness) the same text reads them from
 *         global memory. */
/* The form for n columns (ANY, EVEN or N16; RING is the host's choice). */
coda_cg_form_t coda__codegen_form(int64_t n);

/* The ring plan: which tile inputs the RING form takes through the stage
 * ring. A 64-column chunk of the tile (all 128 rows) goes into one ring
 * stage as boxes of 128 rows x 128 bytes (16 KiB, 128-byte swizzle, the TMA
 * layout): a bf16 input in the full space is one box, in the double space
 * or f32 in the full space two. Box b of the chunk at accumulator column
 * col0 holds columns xmul[b] * col0 + xadd[b] .. of argument arg[b]. Inputs
 * qualify when they are bf16 or f32 tiles in the full or double space, every
 * load of them in their own space, until the plan has CODA_RING_MAX_BOX
 * boxes (a 128 x 128 tile's stage holds two). nbox 0: no ring. */
#define CODA_RING_MAX_BOX 2
#define CODA_RING_BOX_BYTES 16384
typedef struct coda_ring_plan {
    int nbox;
    int arg[CODA_RING_MAX_BOX];
    int xmul[CODA_RING_MAX_BOX], xadd[CODA_RING_MAX_BOX];
    int first_box[CODA_EPI_MAX_ARGS]; /* argument k's first box, -1 if not in the ring */
} coda_ring_plan_t;
/* The store plan: which staged tile outputs (N16 and RING forms) coda_epi_flush
 * hands to TMA (cp.async.bulk.tensor) instead of writing them itself. The
 * slab region of such an output is 16 rows of `cols` elements (32, 64 or
 * 128 bytes a row), swizzled as TMA's 32B, 64B or 128B modes (16-byte unit u
 * of row r at u ^ (r / (128 / bytes)) mod units: cg_layout.c's layout) and
 * aligned to the mode's period, so that one bulk copy writes the warp's 16
 * rows of a batch and clips them at the tensor's edges. Only programs with
 * two such outputs or more use it (with one it measured slower: cg_layout.c);
 * outputs whose rows are 256 bytes (f32 in the double space), whose region
 * is not aligned, or beyond CODA_STORE_MAX_MAP, keep the 16-byte vector
 * stores. The kernel
 * gets one tensor map per entry (struct coda_store_maps, gemm_prelude.cuh);
 * nmap 0: none (other forms, or no staged output). */
#define CODA_STORE_MAX_MAP 4
typedef struct coda_store_plan {
    int nmap;
    int arg[CODA_STORE_MAX_MAP];  /* the output argument */
    int cols[CODA_STORE_MAX_MAP]; /* elements per box row */
    int map_of[CODA_EPI_MAX_ARGS]; /* argument k's map, -1 if none */
} coda_store_plan_t;
void coda__codegen_store_plan(const coda_program_t *p, coda_cg_form_t form, coda_store_plan_t *plan);
/* 1 if column vector k of p may be copied into the slabs in the N16 and
 * RING forms (it is loaded in its own space; the copy needs its base
 * 16-byte aligned, coda__cuda_fused_form). */
int coda__codegen_col_staged(const coda_program_t *p, int k);
void coda__codegen_ring_plan(const coda_program_t *p, coda_ring_plan_t *plan);
coda_status_t coda__codegen_cuda_ex(const coda_program_t *p, coda_cg_form_t form, char **out);
/* The same text, made once per program and form and kept with the program
 * (freed by coda_program_free): *out is owned by p. key (may be NULL) gets
 * the text's 128-bit hash (coda__hash, seeds CODA_HASH_SEED0/1), made with
 * it: a launch finds its kernel by the key without hashing the text. */
coda_status_t coda__codegen_cuda_cached(const coda_program_t *p, coda_cg_form_t form, const char **out,
                                        const uint64_t **key);
/* What the cache holds: one allocation, freed with free(). */
struct coda_cg_text {
    uint64_t key[2];
    char text[];
};

#endif
