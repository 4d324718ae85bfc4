#!/bin/bash
# run_guard_gpu.sh - issue 18's GPU checks on an sm_90a machine (logs under $OUT):
#   1. test_guard_gpu: every entry point through guarded views, then the
#      randomized API test (counts of calls run and refused in its last lines)
#   2. compute-sanitizer memcheck, racecheck, initcheck and synccheck on a
#      small set of every entry point (test_guard_gpu small: plain GEMM in
#      three layouts, every fused program, the finishing steps, the layer
#      forward and backward)
#   tests/gpu/run_guard_gpu.sh [N]     N random calls (default 600)
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 lib build/tests/gpu/test_guard_gpu > "$OUT/build-guard.log" 2>&1 || { tail -30 "$OUT/build-guard.log"; exit 1; }
echo "== test_guard_gpu"
timeout 400 build/tests/gpu/test_guard_gpu ${1:-} > "$OUT/guard.log" 2>&1
echo "rc=$?"; grep -E "FAIL|WROTE|FATAL" "$OUT/guard.log" | head -20; tail -2 "$OUT/guard.log"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck initcheck synccheck; do
  echo "== $tool (test_guard_gpu small)"
  timeout 300 $CS --tool $tool build/tests/gpu/test_guard_gpu small > "$OUT/guard-$tool.log" 2>&1
  echo "rc=$?"; grep -E "SUMMARY|FAIL|FATAL" "$OUT/guard-$tool.log" | head -6; tail -1 "$OUT/guard-$tool.log"
done
