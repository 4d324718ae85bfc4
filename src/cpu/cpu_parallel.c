/* cpu_parallel.c - run independent tasks on a few pthreads.
 *
 * Threads are started per call and pull task indices from a shared counter.
 * That is simple and, for the sizes the CPU backend sees (tests, CI), cheap
 * enough; the result never depends on which thread ran which task. */
#include "cpu/cpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct pool {
    coda__cpu_task_fn fn;
    void *arg;
    int64_t n_tasks;
    atomic_llong next;
} pool_t;

typedef struct worker {
    pool_t *pool;
    float *scratch;
} worker_t;

static void *work(void *p) {
    worker_t *w = p;
    for (;;) {
        int64_t t = (int64_t)atomic_fetch_add(&w->pool->next, 1);
        if (t >= w->pool->n_tasks) break;
        w->pool->fn(w->pool->arg, t, w->scratch);
    }
    return NULL;
}

#define MAX_THREADS 64

coda_status_t coda__cpu_parallel(int n_threads, int64_t n_tasks, size_t scratch_floats,
                                 coda__cpu_task_fn fn, void *arg) {
    if (n_tasks <= 0) return CODA_OK;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if ((int64_t)n_threads > n_tasks) n_threads = (int)n_tasks;

    worker_t w[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    pool_t pool = {fn, arg, n_tasks, 0};
    size_t bytes = (scratch_floats * sizeof(float) + 63) & ~(size_t)63;
    for (int i = 0; i < n_threads; i++) {
        w[i].pool = &pool;
        w[i].scratch = NULL;
        if (bytes && !(w[i].scratch = aligned_alloc(64, bytes))) {
            for (int j = 0; j < i; j++) free(w[j].scratch);
            return coda__fail(CODA_ERR_NO_MEMORY, "cpu backend: cannot allocate %zu bytes of scratch",
                              bytes);
        }
    }
    /* If a thread cannot be started its share is simply done by the others. */
    for (int i = 1; i < n_threads; i++) started[i] = pthread_create(&tid[i], NULL, work, &w[i]) == 0;
    work(&w[0]);
    for (int i = 1; i < n_threads; i++)
        if (started[i]) pthread_join(tid[i], NULL);
    for (int i = 0; i < n_threads; i++) free(w[i].scratch);
    return CODA_OK;
}
