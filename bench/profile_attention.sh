#!/bin/bash
# profile_attention.sh - where the attention kernels' warps wait: Nsight
# Compute (--set full plus source counters) on one launch of the fused
# backward, coda_attn_bwd_wgmma_kernel (KERNEL=bwd, the default), or the
# forward, coda_attn_fwd_wgmma_kernel (KERNEL=fwd), per shape of
# `test_attention_gpu benchonly pass=0` (18 calls a shape in each
# direction: launch 5 is LLaMA-3 1B, 23 8B, 41 70B), exported as CSV, then
# summarised by bench/ncu_sass_summary.py (instructions and stall samples
# by opcode, the hottest instructions, the samples between consecutive
# waits/products).
#   [KERNEL=fwd] bench/profile_attention.sh [LAUNCH ...]      default: 5 23
# Writes $OUT/KERNEL-LAUNCH-{sass,details}.csv and -summary.txt. Needs an
# sm_90a GPU and ncu; build first (make lib build/tests/gpu/test_attention_gpu).
set -u
KERNEL=${KERNEL:-bwd}
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
B=build/tests/gpu/test_attention_gpu
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
$B benchonly pass=0 | grep bench # also fills the NVRTC cache
for sk in "${@:-5 23}"; do
  for k in $sk; do
    rep="$OUT/$KERNEL-$k"
    timeout 200 "$NCU" --clock-control none -k regex:coda_attn_${KERNEL}_wgmma_kernel --launch-skip "$k" -c 1 -f \
      -o "$rep" --set full --section SourceCounters $B benchonly pass=0 > "$rep.log" 2>&1
    echo "ncu launch $k rc=$?"
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep-sass.csv" 2> "$rep.err" || head -5 "$rep.err"
    "$NCU" -i "$rep.ncu-rep" --page details --csv > "$rep-details.csv" 2>&1
    rm -f "$rep.ncu-rep"
    python3 bench/ncu_sass_summary.py "$rep-sass.csv" > "$rep-summary.txt" && head -40 "$rep-summary.txt"
  done
done
