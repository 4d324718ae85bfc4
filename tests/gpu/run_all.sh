#!/bin/bash
# run_all.sh - everything that needs an sm_90a GPU, in one call of the device
# (logs under $OUT):
#   1. bench/run_gpu.sh quick         GEMM: NVRTC test, GPU test (small, full), benchmark vs cuBLAS
#   2. tests/gpu/run_epilogue_gpu.sh  fused GEMMs: GPU test under compute-sanitizer, then full
#   3. build/tests/gpu/test_layer_gpu the layer on CUDA (default and non-blocking streams)
#   4. tests/gpu/run_guard_gpu.sh     guarded views, random API calls, compute-sanitizer (4 tools)
#   5. build/tests/gpu/test_nan_gpu   NaN semantics of every primitive class vs the CPU
#   6. build/tests/gpu/test_steps_gpu the layer's non-GEMM steps vs the CPU, then
#                                     compute-sanitizer (4 tools) on its small form
#   7. tests/gpu/run_attention_gpu.sh attention vs float64, sanitizers, the PyTorch op
#   8. tests/gpu/run_epilogue_gpu.sh bench   fused vs plain vs cuBLAS; vs eager, compile, Liger
# Steps 1 and 4 take a few minutes each; pass "tests" to skip the benchmarks.
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 lib build/tests/gpu/test_layer_gpu build/tests/gpu/test_nan_gpu build/tests/gpu/test_steps_gpu > "$OUT/build-all.log" 2>&1 || { tail -30 "$OUT/build-all.log"; exit 1; }
if [ "${1:-}" != "tests" ]; then bash bench/run_gpu.sh quick 2>&1 | tail -40; fi
bash tests/gpu/run_epilogue_gpu.sh 2>&1 | tail -16
echo "== layer on CUDA"
timeout 300 build/tests/gpu/test_layer_gpu > "$OUT/layer.log" 2>&1; echo "rc=$?"
grep -E "FAIL|stream" "$OUT/layer.log" | head -20; tail -1 "$OUT/layer.log"
bash tests/gpu/run_guard_gpu.sh 2>&1 | tail -40
echo "== NaN semantics on CUDA"
timeout 300 build/tests/gpu/test_nan_gpu > "$OUT/nan.log" 2>&1; echo "rc=$?"
grep -E "FAIL" "$OUT/nan.log" | head -10; tail -1 "$OUT/nan.log"
echo "== the layer's non-GEMM steps on CUDA"
timeout 300 build/tests/gpu/test_steps_gpu > "$OUT/steps.log" 2>&1; echo "rc=$?"
grep -E "FAIL|FATAL|^time:" "$OUT/steps.log" | head -20; tail -1 "$OUT/steps.log"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck initcheck synccheck; do
  echo "== $tool (test_steps_gpu small)"
  timeout 300 $CS --tool $tool build/tests/gpu/test_steps_gpu small > "$OUT/steps-$tool.log" 2>&1
  echo "rc=$?"; grep -E "SUMMARY|FAIL|FATAL" "$OUT/steps-$tool.log" | head -6; tail -1 "$OUT/steps-$tool.log"
done
bash tests/gpu/run_attention_gpu.sh 2>&1 | tail -30
if [ "${1:-}" != "tests" ]; then bash tests/gpu/run_epilogue_gpu.sh bench 2>&1 | tail -60; fi
