#!/bin/bash
# run_block_gpu.sh - the split block and the layer steps on an sm_90a GPU
# (logs under $OUT):
#   1. build/tests/gpu/test_steps_gpu    the non-GEMM steps vs the CPU and float64
#   2. build/tests/gpu/test_block_gpu    the CUDA block vs the CPU block; a whole
#                                        step in one CUDA graph; forwards in flight
#      (+ compute-sanitizer memcheck on it)
#   3. build/tests/gpu/test_layer_gpu    the whole layer (now the block around
#                                        CPU attention) vs the reference layer;
#      again with every GEMM on configuration 3 and 2 clusters, so that the
#      epilogue overlap's rule takes it at these sizes, and with it off: the
#      errors must be the same (the programs it takes round acc first)
#   4. tests/test_block_torch.py         coda.nn.LlamaBlock on CUDA vs float64
#                                        autograd, custom ops, torch.compile
#   5. tests/test_lm_loss_torch.py       coda.nn.LMHeadLoss / coda::lm_loss on CUDA vs
#                                        float64, CUDA graph, opcheck, torch.compile
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 all build/tests/gpu/test_steps_gpu build/tests/gpu/test_block_gpu build/tests/gpu/test_layer_gpu \
    > "$OUT/build-block.log" 2>&1 || { tail -30 "$OUT/build-block.log"; exit 1; }
for t in test_steps_gpu test_block_gpu test_layer_gpu; do
  echo "== $t"
  timeout 300 build/tests/gpu/$t > "$OUT/$t.log" 2>&1; echo "rc=$?"
  grep -E "FAIL|graph|M = |ulp" "$OUT/$t.log" | head -12; tail -1 "$OUT/$t.log"
done
echo "== test_layer_gpu, configuration 3 on 2 clusters, the overlap's rule and off"
for ov in rule 0; do
  if [ $ov = rule ]; then unset CODA_DEBUG_OVERLAP; else export CODA_DEBUG_OVERLAP=0; fi
  CODA_DEBUG_LAUNCH=1 CODA_GEMM_CFG=3 CODA_DEBUG_CLUSTERS=2 timeout 300 build/tests/gpu/test_layer_gpu \
    > "$OUT/layer_$ov.log" 2> "$OUT/layer_${ov}_launch.log"
  echo "overlap $ov: rc=$?, $(grep -c 'epilogue overlap' "$OUT/layer_${ov}_launch.log") of $(grep -c 'coda gemm' "$OUT/layer_${ov}_launch.log") launches overlapped"
  tail -1 "$OUT/layer_$ov.log"
done
unset CODA_DEBUG_OVERLAP
if diff <(grep -E "^  [a-z_0-9]+ +cuda" "$OUT/layer_rule.log") <(grep -E "^  [a-z_0-9]+ +cuda" "$OUT/layer_0.log") > /dev/null; then
  echo "errors with and without the overlap: the same"
else
  echo "FAIL: errors with and without the overlap differ"
fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
echo "== memcheck test_block_gpu"
timeout 300 $CS --tool memcheck build/tests/gpu/test_block_gpu > "$OUT/block-memcheck.log" 2>&1; echo "rc=$?"
grep -E "ERROR SUMMARY" "$OUT/block-memcheck.log" | head -2; tail -1 "$OUT/block-memcheck.log"
# the test hands coda a host pointer on purpose; the driver's refusal of it is
# an API error in memcheck's count (coda__cuda_check_pointer): say which
echo "of them the test's deliberate host pointer (cuPointerGetAttribute refused): \
$(grep -c 'Program hit .*cuPointerGetAttribute' "$OUT/block-memcheck.log")"
echo "== test_block_torch.py (CUDA)"
CODA_TEST_DEVICE=cuda PYTHONUNBUFFERED=1 CODA_ORACLE_LIB=$PWD/build/tests/liboracle.so \
  timeout 300 python3 tests/test_block_torch.py > "$OUT/block-torch.log" 2>&1; echo "rc=$?"
grep -E "FAIL|custom ops|compile|opcheck|LlamaModel" "$OUT/block-torch.log" | head -12; tail -1 "$OUT/block-torch.log"
echo "== test_lm_loss_torch.py (CUDA)"
CODA_TEST_DEVICE=cuda PYTHONUNBUFFERED=1 CODA_ORACLE_LIB=$PWD/build/tests/liboracle.so \
  timeout 300 python3 tests/test_lm_loss_torch.py > "$OUT/lm-loss-torch.log" 2>&1; echo "rc=$?"
grep -E "FAIL|compile|opcheck|graph" "$OUT/lm-loss-torch.log" | head -12; tail -1 "$OUT/lm-loss-torch.log"
