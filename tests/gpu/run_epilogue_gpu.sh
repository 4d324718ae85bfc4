#!/bin/bash
# run_epilogue_gpu.sh - fused GEMMs on an sm_90a machine (logs under $OUT).
#   tests/gpu/run_epilogue_gpu.sh          NVRTC/codegen test, GPU test under
#                                          compute-sanitizer memcheck and racecheck
#                                          (small), full GPU test
#   tests/gpu/run_epilogue_gpu.sh bench    bench_epilogue, bench_vs_torch and
#                                          bench_vs_torch_train
#                                          (Liger from $LIGER_SRC, default .liger/src)
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 lib build/tests/test_codegen build/tests/gpu/test_epilogue_gpu build/bench/bench_epilogue \
    > "$OUT/build-epi.log" 2>&1 || { tail -30 "$OUT/build-epi.log"; exit 1; }
if [ "${1:-}" != "bench" ]; then
  echo "== test_codegen"; build/tests/test_codegen > "$OUT/codegen.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/codegen.log"
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  echo "== epilogue memcheck (small)"
  timeout 240 $CS --tool memcheck build/tests/gpu/test_epilogue_gpu small > "$OUT/epi-memcheck.log" 2>&1
  echo "rc=$?"; grep -E "ERROR SUMMARY|FAIL" "$OUT/epi-memcheck.log" | head -10; tail -1 "$OUT/epi-memcheck.log"
  # the staged (N16) form moves tiles through shared memory: check its ordering
  echo "== epilogue racecheck (small)"
  timeout 240 $CS --tool racecheck build/tests/gpu/test_epilogue_gpu small > "$OUT/epi-racecheck.log" 2>&1
  echo "rc=$?"; grep -E "RACECHECK SUMMARY|FAIL" "$OUT/epi-racecheck.log" | head -10; tail -1 "$OUT/epi-racecheck.log"
  echo "== epilogue full"
  timeout 300 build/tests/gpu/test_epilogue_gpu > "$OUT/epi-full.log" 2>&1
  echo "rc=$?"; grep -E "FAIL" "$OUT/epi-full.log" | head -30; tail -1 "$OUT/epi-full.log"
  exit 0
fi
echo "== bench_epilogue"
timeout 300 build/bench/bench_epilogue > "$OUT/bench-epi.log" 2>&1; echo "rc=$?"; cat "$OUT/bench-epi.log"
echo "== bench_vs_torch"
LIGER_SRC=${LIGER_SRC:-$PWD/.liger/src} CODA_LIB=$PWD/build/libcoda.so PYTHONUNBUFFERED=1 \
  timeout 400 python3 bench/bench_vs_torch.py > "$OUT/bench-torch.log" 2>&1; echo "rc=$?"
tail -50 "$OUT/bench-torch.log"
echo "== bench_vs_torch_train"
LIGER_SRC=${LIGER_SRC:-$PWD/.liger/src} CODA_LIB=$PWD/build/libcoda.so PYTHONUNBUFFERED=1 \
  timeout 500 python3 bench/bench_vs_torch_train.py > "$OUT/bench-torch-train.log" 2>&1; echo "rc=$?"
tail -110 "$OUT/bench-torch-train.log"
