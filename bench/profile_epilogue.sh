#!/bin/bash
# profile_epilogue.sh - Nsight Compute on one plain and one fused GEMM launch.
#   bench/profile_epilogue.sh PROGRAM SIZE      e.g. resid_norm 4096
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 build/bench/bench_epilogue > "$OUT/build-prof.log" 2>&1 || { tail -20 "$OUT/build-prof.log"; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
CODA_BENCH_ONLY=$1 timeout 300 $NCU --clock-control none -k regex:coda_gemm_kernel -c 2 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
    build/bench/bench_epilogue $2 > "$OUT/ncu-$1-$2.txt" 2>&1
echo "rc=$?"
grep -E "Duration|Throughput|Registers|Stall|Warp Cycles|Issued|Elapsed|coda_gemm_kernel|Dynamic Shared|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu-$1-$2.txt" | head -80
