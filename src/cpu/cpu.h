/* cpu.h - pieces shared by the files of the CPU reference backend (not public).
 *
 * The CPU backend is the oracle every GPU result is checked against, so it
 * favours obviously-right code; it is blocked and threaded only as far as CI
 * (2 cores) needs. Every output element is computed by one fixed sequence of
 * f32 operations, whatever the thread count: results are bitwise reproducible.
 */
#ifndef CODA_CPU_H
#define CODA_CPU_H

#include "core/context.h"

/* ---- threads (cpu_parallel.c) ---- */

/* Runs fn(arg, task, scratch) for task = 0..n_tasks-1 on up to n_threads
 * threads (the caller's included). Each thread gets its own scratch buffer of
 * scratch_floats floats (64-byte aligned), allocated before any task runs, so
 * tasks cannot fail. Which thread runs a task must not change its result.
 * Returns CODA_ERR_NO_MEMORY (nothing run) if the scratch cannot be allocated. */
typedef void (*coda__cpu_task_fn)(void *arg, int64_t task, float *scratch);
coda_status_t coda__cpu_parallel(int n_threads, int64_t n_tasks, size_t scratch_floats,
                                 coda__cpu_task_fn fn, void *arg);

/* ---- GEMM (cpu_gemm.c) ---- */

/* Floats of scratch coda__cpu_gemm_block needs. */
size_t coda__cpu_gemm_scratch_floats(void);

/* acc (mb, ldacc) f32 = the block [i0, i0+mb) x [j0, j0+nb) of op(A) op(B),
 * each element summed in f32 in increasing k order (k = 0: zeros). The same
 * element gets the same bits whatever block it is computed in. */
void coda__cpu_gemm_block(coda_layout_t layout, const coda_tensor_t *a, const coda_tensor_t *b,
                          int64_t i0, int64_t mb, int64_t j0, int64_t nb, float *acc,
                          int64_t ldacc, float *scratch);

#endif
