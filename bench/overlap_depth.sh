#!/bin/bash
# overlap_depth.sh - the epilogue overlap's queue depth (CODA_OV_DEPTH,
# src/cuda/kernels/gemm_overlap.cuh, 1 by default): how many k-blocks of
# wgmma a consumer leaves in flight, so how much tensor work a batch of the
# held tile starts behind, and the heavy programs' way to it. One device
# call, about 6 minutes (parts 1-2 about 3; its timeouts allow more than
# a call's 10), logs under $OUT:
#
# 1. The rule's programs (gate/up's training form, QKV + RoPE) at the 1B
#    and 8B shapes on their own configuration (3: 128 x 256, 4 stages):
#    A depth 1 against B depth 2, both forced to overlap, compared byte for
#    byte (CODA_BENCH_AB_CHECK: the same wgmma in the same order), then
#    timed.
# 2. The heavy programs, which spill with the overlap on configuration 3
#    and read ring inputs there: on configuration 1 (128 x 128, 6 stages,
#    no spills with the overlap: kernel_stats 1), tile inputs read from
#    global memory (CODA_DEBUG_NO_RING=1): not overlapped (stream-K off,
#    as the overlap always runs: a tail would add in another order)
#    against overlapped, then overlapped at depth 1 against 2, 3 and 4
#    (each bit for bit: CODA_BENCH_AB_CHECK, which also keeps
#    CODA_GEMM_CFG on both sides), and, for scale, the library's own kernel
#    (configuration 3, ring, not overlapped) at the same shape: compare its
#    "fused/cb" with the A/B lines' times over cuBLAS (the library run's
#    cuBLAS column).
# 3. The same by the library's own routing (CODA_DEBUG_OVERLAP_HEAVY=D,
#    src/cuda/fused_gemm.c): A the default kernel, B the heavy programs on
#    configuration 1, ring off, overlapped at depth D
#    (CODA_BENCH_AB=heavy=D), at the 1B block's shapes; then the 1B
#    block's kernels (bench/profile_block.py, floor and coda+attn) without
#    and with it: the down dgrad, the norm backwards and O/down rows.
#
# Every run logs its launches (CODA_DEBUG_LAUNCH): "(epilogue overlap)"
# must be among them for a forced side. A result counts only from the GPU
# that ran it (the first line).
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/depth-device.txt"
make -j16 lib build/bench/bench_epilogue > "$OUT/build-depth.log" 2>&1 ||
    { tail -30 "$OUT/build-depth.log"; exit 1; }
B=build/bench/bench_epilogue
# run LOG SHAPE [VAR=VALUE...]: bench_epilogue at SHAPE with the launch log;
# its exit status, table, A/B and check lines, and the launch kinds it used
run() {
    local log=$1 shape=$2; shift 2
    env CODA_DEBUG_LAUNCH=1 "$@" timeout 120 $B "$shape" > "$OUT/$log.log" 2>&1
    echo "rc=$?"
    grep -E "check|A/B|^[a-z_]+ +[0-9]+x" "$OUT/$log.log" | head -8
    grep "coda gemm" "$OUT/$log.log" | sed 's/, grid.*//' | sort | uniq -c | sed 's/^/  launches: /'
}
echo "== 1. depth 2 against 1, the rule's programs, configuration 3"
for ps in "gateup_swiglu_train,gateup_swiglu 16384x16384x2048" "qkv_rope 16384x3072x2048" \
          "gateup_swiglu_train 16384x28672x4096"; do
    set -- $ps
    echo "-- $1 $2"
    run "depth2_$2" $2 CODA_DEBUG_OVERLAP=1 CODA_BENCH_AB=-DCODA_OV_DEPTH=2 CODA_BENCH_AB_CHECK=1 \
        CODA_BENCH_PROGRAMS=$1
done
echo "== 2. the heavy programs on configuration 1, ring off, overlapped: depth 1 against 2-4"
for ps in "swiglu_bwd,swiglu_bwd_kept 16384x8192x2048" "resid_norm,rmsnorm_bwd 16384x2048x2048"; do
    set -- $ps
    echo "-- $1 $2: the library (configuration 3, ring, no overlap)"
    run "lib_$2" $2 CODA_BENCH_PROGRAMS=$1
    echo "-- configuration 1, ring off: A not overlapped (acc rounded, its bitwise reference), B overlapped (depth 1)"
    run "cfg1_ov_$2" $2 CODA_GEMM_CFG=1 CODA_DEBUG_NO_RING=1 CODA_DEBUG_OVERLAP=0 CODA_STREAMK=0 \
        CODA_DEBUG_OPTS=-DCODA_EPI_ROUND_ACC=1 CODA_BENCH_AB=overlap=1 CODA_BENCH_AB_CHECK=1 CODA_BENCH_PROGRAMS=$1
    for d in 2 3 4; do
        echo "-- configuration 1, ring off, overlapped: A depth 1, B depth $d"
        run "cfg1_d${d}_$2" $2 CODA_GEMM_CFG=1 CODA_DEBUG_NO_RING=1 CODA_DEBUG_OVERLAP=1 \
            CODA_BENCH_AB=-DCODA_OV_DEPTH=$d CODA_BENCH_AB_CHECK=1 CODA_BENCH_PROGRAMS=$1
    done
done
echo "== 3. the library's routing: A default, B CODA_DEBUG_OVERLAP_HEAVY=D"
for d in 4 2; do
    run "heavy${d}_swiglu" 16384x8192x2048 CODA_BENCH_AB=heavy=$d CODA_BENCH_PROGRAMS=swiglu_bwd,swiglu_bwd_kept
    run "heavy${d}_norm" 16384x2048x2048 CODA_BENCH_AB=heavy=$d CODA_BENCH_PROGRAMS=resid_norm,resid_add,rmsnorm_bwd
done
for h in 0 4; do
    echo "-- profile_block 1b, CODA_DEBUG_OVERLAP_HEAVY=$h"
    CODA_DEBUG_OVERLAP_HEAVY=$h timeout 150 python3 bench/profile_block.py --shapes 1b --variants floor,coda+attn \
        --sequence > "$OUT/profile_heavy$h.log" 2>&1
    echo "rc=$?"; grep -iE "busy|sum|total" "$OUT/profile_heavy$h.log" | head -6
done
