/* cuda_check.h - CUDA_OK(call) for GPU tests and benchmarks: a failing CUDA
 * runtime call ends the program with its error string (tests may exit). */
#ifndef CODA_TEST_CUDA_CHECK_H
#define CODA_TEST_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_OK(call)                                                                            \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

#endif
