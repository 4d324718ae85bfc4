#!/bin/bash
# run_epilogue_gpu.sh - build and run the fused-GEMM GPU tests on an sm_90a
# machine: the NVRTC/codegen test, the GPU test under compute-sanitizer
# (small set), then the full GPU test.   tests/gpu/run_epilogue_gpu.sh
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 lib build/tests/test_codegen build/tests/gpu/test_epilogue_gpu > "$OUT/build-epi.log" 2>&1 \
    || { tail -30 "$OUT/build-epi.log"; exit 1; }
echo "== test_codegen"; build/tests/test_codegen > "$OUT/codegen.log" 2>&1; echo "rc=$?"; tail -1 "$OUT/codegen.log"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "== epilogue memcheck (small)"
timeout 240 $CS --tool memcheck build/tests/gpu/test_epilogue_gpu small > "$OUT/epi-memcheck.log" 2>&1
echo "rc=$?"; grep -E "ERROR SUMMARY|FAIL" "$OUT/epi-memcheck.log" | head -10; tail -1 "$OUT/epi-memcheck.log"
echo "== epilogue full"
timeout 300 build/tests/gpu/test_epilogue_gpu > "$OUT/epi-full.log" 2>&1
echo "rc=$?"; grep -E "FAIL" "$OUT/epi-full.log" | head -30; tail -1 "$OUT/epi-full.log"
if [ "${1:-}" = "bench" ]; then
  make -j16 build/bench/bench_epilogue >> "$OUT/build-epi.log" 2>&1 || { tail -30 "$OUT/build-epi.log"; exit 1; }
  echo "== bench_epilogue"; build/bench/bench_epilogue 2>&1 | tee "$OUT/bench-epi.log"
fi
if [ "${1:-}" = "bench" ] || [ "${1:-}" = "torch" ]; then
  echo "== bench_vs_torch"
  LIGER_SRC=${LIGER_SRC:-$PWD/.liger/src} CODA_LIB=$PWD/build/libcoda.so PYTHONUNBUFFERED=1 \
    timeout 420 python3 bench/bench_vs_torch.py 2>&1 | tee "$OUT/bench-torch.log" | tail -40
fi
