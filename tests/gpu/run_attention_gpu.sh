#!/bin/bash
# run_attention_gpu.sh - coda_attention on an sm_90a GPU (logs under $OUT):
#   1. build/tests/gpu/test_attention_gpu   forward and backward vs float64 on odd shapes
#      (the 2x-bf16 rule), determinism, padded views, NaN, refusals; with
#      "bench" also the LLaMA-3 shapes (batch 2 x 8192), ms and TFLOP/s
#   2. compute-sanitizer memcheck, racecheck and synccheck on the default
#      kernel set (pass=0) and racecheck on the many-part backward (pass=6):
#      all eight sets under a sanitizer take longer than a device call
#   3. tests/test_attention_torch.py on CUDA (coda::attention, CUDA graphs,
#      torch.compile)
#   4. bench/bench_attention.py (with "bench") against SDPA's flash and
#      cuDNN backends, seq sweep at the 8B shape
set -u
MODE=${1:-}
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 lib build/tests/gpu/test_attention_gpu > "$OUT/build-attn.log" 2>&1 || { tail -30 "$OUT/build-attn.log"; exit 1; }
echo "== test_attention_gpu $MODE"
timeout 420 build/tests/gpu/test_attention_gpu $MODE > "$OUT/attn.log" 2>&1; echo "rc=$?"
grep -E "FAIL|FATAL|bench" "$OUT/attn.log" | head -40; tail -1 "$OUT/attn.log"
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# The refusal tests hand the library host pointers on purpose: the driver's
# "invalid argument" from cuPointerGetAttribute on them is the check working,
# so API errors are not counted (memory errors and hazards still are).
for run in memcheck:0 racecheck:0 synccheck:0 racecheck:6; do
  tool=${run%:*} ks=${run#*:}
  echo "== $tool test_attention_gpu pass=$ks"
  timeout 240 $CS --tool $tool --report-api-errors no build/tests/gpu/test_attention_gpu pass=$ks > "$OUT/attn-$tool-$ks.log" 2>&1; echo "rc=$?"
  grep -E "SUMMARY" "$OUT/attn-$tool-$ks.log" | head -2; tail -1 "$OUT/attn-$tool-$ks.log"
done
echo "== test_attention_torch.py (CUDA)"
CODA_TEST_DEVICE=cuda PYTHONUNBUFFERED=1 CODA_ORACLE_LIB=$PWD/build/tests/liboracle.so \
  timeout 300 python3 tests/test_attention_torch.py > "$OUT/attn-torch.log" 2>&1; echo "rc=$?"
grep -E "FAIL|graph|compile" "$OUT/attn-torch.log" | head -12; tail -1 "$OUT/attn-torch.log"
if [ "$MODE" = "bench" ]; then
  echo "== bench_attention.py"
  timeout 300 python3 bench/bench_attention.py --sweep --json "$OUT/attention.json" > "$OUT/bench-attn.log" 2>&1
  echo "rc=$?"; grep -A32 "^| shape" "$OUT/bench-attn.log"
fi
