/* codegen_harness.h - a stand-in mainloop for generated epilogues (tests).
 *
 * A kernel that hands the generated epilogue the accumulator fragment exactly
 * as gemm_mainloop.cuh does (two consumer warpgroups of 64 rows, the wgmma
 * register layout: thread t of a warpgroup holds rows 16*(t/32) + (t%32)/4
 * and +8, columns 8j + 2*(t%4) and +1), but reads the accumulator from a
 * (M, N) f32 matrix instead of computing it. Tests use it to compile every
 * generated program quickly (no mainloop) and, on a GPU, to check the
 * epilogue apart from the mainloop. Grid: (n tiles, m tiles), 256 threads. */
#ifndef CODA_CODEGEN_HARNESS_H
#define CODA_CODEGEN_HARNESS_H

static const char coda_test_harness_kernel[] =
    "extern \"C\" __global__ void __launch_bounds__(256) coda_epi_harness(\n"
    "        const __grid_constant__ coda_epi_params P, const float *acc, long long ld,\n"
    "        const __grid_constant__ coda_store_maps O) {\n"
    "    coda_epi_tile t;\n"
    "    const int c = threadIdx.x / 128, tid = threadIdx.x % 128;\n"
    "    t.m = P.m; t.n = P.n; t.tile_m = blockIdx.y; t.tile_n = blockIdx.x;\n"
    "    t.row = blockIdx.y * 128 + 64 * c + 16 * (tid / 32) + (tid % 32) / 4;\n"
    "    t.col = blockIdx.x * CODA_BN + 2 * (tid % 4);\n"
    "    t.wg = c; t.tid = tid; t.scratch = 0;\n"
    "    __shared__ __align__(16) unsigned char slabs[8 * 4096]; /* each warp's slab, as the kernel's */\n"
    "    t.stage = (unsigned)__cvta_generic_to_shared(slabs) + (unsigned)(c * 4 + tid / 32) * 4096u;\n"
    "    coda_epi_pre pre;\n"
    "    coda_epi_preload(P, t, pre);\n"
    "    coda_epi_state st;\n"
    "    coda_epi_begin(P, t, st, pre);\n"
    "#pragma unroll\n"
    "    for (int j0 = 0; j0 < CODA_BN / 8; j0 += CODA_EPI_BATCH) {\n"
    "        coda_epi_in in[2 * CODA_EPI_BATCH];\n"
    "        coda_epi_fetch_batch(P, t, t.row, t.col + 8 * j0, in);\n"
    "        __syncwarp();\n"
    "        coda_epi_slab_wait(t);\n"
    "#pragma unroll\n"
    "        for (int jj = 0; jj < CODA_EPI_BATCH; jj++)\n"
    "#pragma unroll\n"
    "        for (int h = 0; h < 2; h++) {\n"
    "            const int row = t.row + 8 * h, col = t.col + 8 * (j0 + jj);\n"
    "            float v0 = 0.0f, v1 = 0.0f;\n"
    "            if (row < P.m && col < P.n) v0 = acc[row * ld + col];\n"
    "            if (row < P.m && col + 1 < P.n) v1 = acc[row * ld + col + 1];\n"
    "            coda_epi_pair(P, t, st, h, j0 + jj, row, col, v0, v1, in[2 * jj + h]);\n"
    "        }\n"
    "        coda_epi_flush(P, st, t, 0, j0, O);\n"
    "    }\n"
    "    coda_epi_end(P, t, st);\n"
    "}\n";

#endif
