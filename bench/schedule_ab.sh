#!/bin/bash
# schedule_ab.sh - each fused program in the tile configuration the library
# picks (A) against another configuration (B), run by run in one process
# (bench_epilogue with CODA_BENCH_AB=cfg=N), and the start-up cost of a new
# user program (bench_startup: cold NVRTC compile, then the disk cache).
#   bench/schedule_ab.sh ["SIZE CFG" ...]    default: the pairs below
# Logs under $OUT. Configurations: src/cuda/gemm.c (1 cooperative 128 x 128,
# 4 ping-pong 128 x 128, 5 ping-pong 128 x 128 in 2-CTA clusters).
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
make -j16 lib build/bench/bench_epilogue build/bench/bench_startup > "$OUT/build-ab.log" 2>&1 ||
    { tail -30 "$OUT/build-ab.log"; exit 1; }
echo "== bench_startup (a fresh cache, then the same cache)"
fresh=$(mktemp -d)
for i in 1 2; do CODA_CACHE_DIR=$fresh build/bench/bench_startup || echo "rc=$?"; done
rm -rf "$fresh"
[ $# -gt 0 ] || set -- "2048 4" "2048 1" "4096 5" "8192 5"
for spec in "$@"; do
    set -- $spec
    echo "== size $1: B = cfg $2"
    CODA_BENCH_AB=cfg=$2 timeout 300 build/bench/bench_epilogue "$1" > "$OUT/ab-$1-cfg$2.log" 2>&1
    echo "rc=$?"
    sed -n 's/^\([a-z_]*\) *[0-9]* *A\/B cfg=[0-9]: plain \([0-9.]*\)  A \([0-9.]*\)  B \([0-9.]*\)  B\/A \([0-9.]*\)  (A\/plain \([0-9.]*\), B\/plain \([0-9.]*\))/\1 A\/pl \6 B\/pl \7 B\/A \5/p' \
        "$OUT/ab-$1-cfg$2.log" | column -t
    grep -E "FATAL|error|GEMM alone" "$OUT/ab-$1-cfg$2.log" | head -5
done
