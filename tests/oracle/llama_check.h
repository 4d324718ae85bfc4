/* llama_check.h - run coda's layer against the reference layer.
 *
 * Not part of libcoda (build/tests/liboracle.a, beside libcoda.a). Shared by
 * tests/test_layer.c, tests/gpu/test_layer_gpu.c and `coda demo`
 * (tools/cli_demo.c): random weights and inputs in PyTorch's layout, packed
 * to coda's layout; coda's forward and backward (outputs NaN-poisoned
 * first); the reference in float64 (the truth) and in bf16-unfused mode (the
 * baseline); per output the relative error ||out - f64|| / ||f64|| and the
 * bound of DESIGN.md section 5, 2 * (baseline error) + 1e-6. */
#ifndef CODA_ORACLE_LLAMA_CHECK_H
#define CODA_ORACLE_LLAMA_CHECK_H

#include "core/internal.h"

typedef struct coda__llama_check_opts {
    uint64_t seed;
    int use_loss;         /* targets and loss (needs vocab > 0)              */
    int use_dy;           /* a gradient dy from above                        */
    float loss_scale;
    int ignore_every;     /* every k-th target is -100 (0: none)             */
    coda_dtype_t grad_dtype; /* CODA_F32 or CODA_BF16                        */
    coda_device_t device; /* where the layer runs (CUDA: device 0)           */
    void *stream;         /* CUDA stream for the layer (NULL: the default)   */
} coda__llama_check_opts_t;

#define CODA__LLAMA_CHECK_MAX 16

typedef struct coda__llama_check_row {
    const char *name;     /* "y", "loss", "dx", "wq", ... "wlm"              */
    double err;           /* coda vs float64                                 */
    double base;          /* bf16 unfused vs float64                         */
    double bound;         /* 2 * base + 1e-6                                 */
    int pass;
} coda__llama_check_row_t;

typedef struct coda__llama_check {
    int n_rows;
    coda__llama_check_row_t rows[CODA__LLAMA_CHECK_MAX];
    double t_forward, t_backward;   /* seconds, coda (CUDA: with its host round trips) */
    double t_reference;             /* seconds, both reference modes        */
    int all_pass;
} coda__llama_check_t;

coda_status_t coda__llama_check(coda_context_t *ctx, const coda_llama_config_t *cfg, int64_t batch,
                                int64_t seq, const coda__llama_check_opts_t *opts,
                                coda__llama_check_t *out);

#endif
