#!/bin/bash
# profile_source.sh - where a fused GEMM's warps wait, per SASS instruction:
# Nsight Compute's source counters (warp stall samples by reason) for one
# plain and one fused launch, exported as CSV (one row per SASS
# instruction: "Warp Stall Sampling (All Samples)", "Instructions Executed",
# one stall_* column per reason).
#   bench/profile_source.sh PROGRAM SIZE     e.g. rmsnorm_bwd 4096
# Writes $OUT/src-PROGRAM-SIZE-{plain,fused}.csv (and -details.csv).
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 build/bench/bench_epilogue > "$OUT/build-prof.log" 2>&1 || { tail -20 "$OUT/build-prof.log"; exit 1; }
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# launch 0 is the plain GEMM, launch 1 the fused one (bench_epilogue's
# CODA_BENCH_ONLY order): one report each
for i in 0 1; do
    name=$([ $i = 0 ] && echo plain || echo fused)
    rep="$OUT/src-$1-$2-$name"
    CODA_BENCH_ONLY=$1 timeout 240 $NCU --clock-control none -k regex:coda_gemm_kernel --launch-skip $i -c 1 \
        -f -o "$rep" --section SourceCounters --section WarpStateStats --section SpeedOfLight \
        build/bench/bench_epilogue $2 > "$rep.log" 2>&1
    echo "$name rc=$?"
    $NCU -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err" || head -5 "$rep.err"
    $NCU -i "$rep.ncu-rep" --page details --csv > "$rep-details.csv" 2>&1
    rm -f "$rep.ncu-rep"
done
ls -la "$OUT" | grep "src-"
