#!/bin/bash
# overlap_ab.sh - two questions about the epilogue overlap
# (src/cuda/kernels/gemm_overlap.cuh), at the 1B block's shapes, one device
# call (about 3 minutes; logs under $OUT):
#
# 1. Batch slots (CODA_OV_BATCH_SLOTS=1, off by default): each batch of a
#    held tile behind a k-block of its own (8 pieces a 128 x 256 tile, not
#    4 chunks). Same batches in the same order, so the same bits: A (chunk
#    slots) against B (batch slots), both forced to overlap
#    (CODA_DEBUG_OVERLAP=1: past the rule's spill veto), with
#    CODA_BENCH_AB_CHECK comparing every output byte for byte, then timing
#    both, for the programs the rule overlaps (gate/up's training form,
#    QKV + RoPE).
# 2. The heavy programs with their tile inputs read from global memory
#    (CODA_DEBUG_NO_RING=1) instead of the stage ring: stop 62 timed them
#    overlapped only with the ring (1.02-1.37x slower). For each: the
#    library (ring, not overlapped), then A = ring off, not overlapped
#    (the rule: these read acc unrounded) against B = ring off, overlap
#    forced, then ring off and overlap forced on both sides, A chunk slots
#    against B batch slots.
#
# Compare B/A within a line; across lines compare the fused time over the
# plain GEMM timed beside it ("fused/pl", or "A/plain" and "B/plain").
# Every run logs its launches (CODA_DEBUG_LAUNCH): the "launches" lines
# count the distinct launch kinds, "(epilogue overlap)" among them. A
# result only counts from the GPU that ran it (the first line).
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/overlap-device.txt"
make -j16 lib build/bench/bench_epilogue > "$OUT/build-overlap.log" 2>&1 ||
    { tail -30 "$OUT/build-overlap.log"; exit 1; }
B=build/bench/bench_epilogue
SLOTS=-DCODA_OV_BATCH_SLOTS=1
# run LOG SHAPE [VAR=VALUE...]: bench_epilogue at SHAPE with the launch log,
# its exit status, its A/B and check lines, and the launch kinds it used
run() {
    local log=$1 shape=$2; shift 2
    env CODA_DEBUG_LAUNCH=1 "$@" timeout 120 $B "$shape" > "$OUT/$log.log" 2>&1
    echo "rc=$?"
    grep -E "check|A/B|^[a-z_]+ +[0-9]+x" "$OUT/$log.log" | head -6
    grep "coda gemm" "$OUT/$log.log" | sed 's/, grid.*//' | sort | uniq -c | sed 's/^/  launches: /'
}
echo "== 1. batch slots, the rule's programs (A chunk slots, B batch slots; bit for bit)"
for ps in "gateup_swiglu_train 16384x16384x2048" "qkv_rope 16384x3072x2048" "gateup_swiglu_train 16384x28672x4096"; do
    set -- $ps
    echo "-- $1 $2"
    run "slots_$1_$2" $2 CODA_DEBUG_OVERLAP=1 CODA_BENCH_AB=$SLOTS CODA_BENCH_AB_CHECK=1 CODA_BENCH_PROGRAMS=$1
done
echo "== 2. the heavy programs, ring off"
for ps in "swiglu_bwd_kept,swiglu_bwd 16384x8192x2048" "resid_norm 16384x2048x2048"; do
    set -- $ps
    echo "-- $1 $2: the library (ring)"
    run "ring_$1_$2" $2 CODA_BENCH_PROGRAMS=$1
    echo "-- ring off: A not overlapped, B overlap forced"
    run "noring_$1_$2" $2 CODA_DEBUG_NO_RING=1 CODA_BENCH_AB=overlap=1 CODA_BENCH_PROGRAMS=$1
    echo "-- ring off, overlap forced: A chunk slots, B batch slots"
    run "noring_slots_$1_$2" $2 CODA_DEBUG_NO_RING=1 CODA_DEBUG_OVERLAP=1 CODA_BENCH_AB=$SLOTS CODA_BENCH_PROGRAMS=$1
done
