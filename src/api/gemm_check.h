/* gemm_check.h - argument checks shared by coda_gemm and coda_gemm_epilogue. */
#ifndef CODA_GEMM_CHECK_H
#define CODA_GEMM_CHECK_H

#include "core/context.h"

/* Layout enum, A and B descriptors (2-D, dtype, same device), K agreement;
 * on success the GEMM extents. `fn` names the public call in messages. */
coda_status_t coda__check_gemm_operands(const char *fn, coda_layout_t layout, const coda_tensor_t *a,
                                        const coda_tensor_t *b, int64_t *m, int64_t *n, int64_t *k);

#endif
