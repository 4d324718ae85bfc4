#!/bin/bash
# run_block_model.sh - issue 20's measurements in one call of an sm_90a GPU
# (about 4 minutes on an H100; logs under $OUT, or ./gpu-logs):
#   1. build/tests/gpu/test_memory_gpu, test_block_gpu   a quick check first,
#      then build/bench/bench_epilogue 16384x8192x2048 on swiglu_bwd and
#      swiglu_bwd_kept: the 1B down dgrad with and without its c store
#      (what keeping c can save, under the block benchmark's noise)
#   2. bench/bench_block.py --shapes 1b,8b,70b --reps 5 --coda-attention --keep-c
#        the block vs the floor, eager, torch.compile, Liger, coda, coda+attn,
#        and both keeping c from the forward (coda+c, coda+attn+c)
#   3. bench/bench_model.py --variants eager,torch.compile,liger,coda,coda+attn
#        the 1B-shaped model's training step: tokens/s, peak memory
# Liger-Kernel from $LIGER_SRC, .liger/src or the installed package
# (bench/liger_import.py); on the lent device, carry .liger with the call.
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$OUT/device.txt"
T="build/tests/gpu/test_memory_gpu build/tests/gpu/test_block_gpu build/bench/bench_epilogue"
make -j16 lib $T > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
for t in test_memory_gpu test_block_gpu; do
  echo "== $t"; timeout 120 build/tests/gpu/$t > "$OUT/$t.log" 2>&1; echo "rc=$?"
  grep -E "FAIL" "$OUT/$t.log" | head -5; tail -1 "$OUT/$t.log"
done
echo "== bench_epilogue: the down dgrad at 1B with and without c"
CODA_BENCH_PROGRAMS=swiglu_bwd,swiglu_bwd_kept timeout 120 build/bench/bench_epilogue 16384x8192x2048 \
  > "$OUT/epilogue_keep_c.log" 2>&1
echo "rc=$?"; tail -6 "$OUT/epilogue_keep_c.log"
echo "== bench_block"
timeout 480 python3 bench/bench_block.py --shapes 1b,8b,70b --reps 5 --coda-attention --keep-c > "$OUT/block.log" 2>&1
echo "rc=$?"; grep -vE "^(device|SDPA|timing):" "$OUT/block.log" | tail -57
echo "== bench_model"
timeout 400 python3 bench/bench_model.py --variants eager,torch.compile,liger,coda,coda+attn --reps 5 \
  > "$OUT/model.log" 2>&1
echo "rc=$?"; tail -8 "$OUT/model.log"
