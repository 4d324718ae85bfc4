#!/bin/bash
# run_lm_loss_gpu.sh - coda_lm_loss on an sm_90a GPU (logs under $OUT):
#   1.  the rows / count / total kernels vs the CPU steps
#   2. build/tests/gpu/test_lm_loss_gpu   the whole call vs float64 (test_lm_loss.c's checks
#                                         on device tensors, larger odd shapes)
#      (+ compute-sanitizer memcheck on it)
#   3. tests/test_lm_loss_torch.py        the PyTorch op on CUDA vs float64, CUDA graphs
#   4. bench/bench_lm_loss.py             (with "bench") against eager, compile, Liger
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 all build/tests/gpu/test_lm_loss_gpu \
    > "$OUT/build-lm.log" 2>&1 || { tail -30 "$OUT/build-lm.log"; exit 1; }
for t in test_lm_loss_gpu; do
  echo "== $t"
  timeout 300 build/tests/gpu/$t > "$OUT/$t.log" 2>&1; echo "rc=$?"
  grep -E "FAIL|FATAL|GB/s" "$OUT/$t.log" | head -12; tail -1 "$OUT/$t.log"
done
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "== memcheck test_lm_loss_gpu"
timeout 300 $CS --tool memcheck build/tests/gpu/test_lm_loss_gpu > "$OUT/lm-memcheck.log" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY" "$OUT/lm-memcheck.log" | head -2; tail -1 "$OUT/lm-memcheck.log"
echo "== test_lm_loss_torch.py (CUDA)"
CODA_TEST_DEVICE=cuda PYTHONUNBUFFERED=1 CODA_ORACLE_LIB=$PWD/build/tests/liboracle.so \
  timeout 300 python3 tests/test_lm_loss_torch.py > "$OUT/lm-torch.log" 2>&1; echo "rc=$?"
grep -E "FAIL|graph|compile|opcheck" "$OUT/lm-torch.log" | head -12; tail -1 "$OUT/lm-torch.log"
if [ "${1:-}" = "bench" ]; then
  echo "== bench_lm_loss.py"
  LIGER_SRC=$PWD/.liger/src timeout 400 python3 bench/bench_lm_loss.py --out "$OUT/lm_loss.json" ${LM_BENCH_ARGS:-} \
    > "$OUT/bench-lm.log" 2>&1; echo "rc=$?"
  tail -40 "$OUT/bench-lm.log"
fi
