#!/bin/bash
# run_gpu.sh - build, test and benchmark the CUDA GEMM on an sm_90a machine.
#   bench/run_gpu.sh [quick]     (logs under $OUT, or ./gpu-logs)
# Steps: build; the NVRTC test; the GPU test (small set under
# compute-sanitizer memcheck and racecheck, then the full set); the benchmark.
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export CODA_CACHE_DIR=${CODA_CACHE_DIR:-/tmp/coda-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/device.txt"
BINS="build/tests/test_nvrtc build/tests/gpu/test_gemm_gpu build/bench/bench_gemm"
if ! make -j16 lib $BINS > "$OUT/build.log" 2>&1; then
  # Someone's half-finished file elsewhere in the tree: build a scratch
  # library from the sources that compile (the GEMM needs none of the rest).
  echo "make failed; scratch build without: $(grep -o '^src/[^:]*\.c' "$OUT/build.log" | sort -u | tr '\n' ' ')"
  CUDA=${CUDA_HOME:-/usr/local/cuda}
  FLAGS="-Iinclude -Isrc -Itests -DCODA_WITH_CUDA=1 -I$CUDA/include -Ibuild/gen -O2 -g -std=c11 -fPIC -pthread -D_GNU_SOURCE"
  LIBS="-lm -lpthread -ldl -L$CUDA/lib64 -lnvrtc -lcudart -lcublas -Wl,-rpath,$CUDA/lib64"
  make build/gen/kernels.c >> "$OUT/build.log" 2>&1 || exit 1
  mkdir -p build/scratch build/tests/gpu build/bench; rm -f build/scratch/*.o
  for f in src/*/*.c build/gen/kernels.c; do
    cc $FLAGS -c "$f" -o "build/scratch/$(echo "$f" | tr / _).o" 2>>"$OUT/build.log" || echo "  skipped $f"
  done
  rm -f build/scratch/libcoda.a; ar rcs build/scratch/libcoda.a build/scratch/*.o
  for t in $BINS; do
    src=$(echo "$t" | sed 's|^build/||; s|^tests/|tests/|').c
    cc $FLAGS -o "$t" "$src" build/scratch/libcoda.a $LIBS >> "$OUT/build.log" 2>&1 || { echo "link $t failed"; tail -20 "$OUT/build.log"; exit 1; }
  done
fi
echo "== test_nvrtc"; timeout 120 build/tests/test_nvrtc 2>&1 | tail -3
echo "== gpu test (small)"
timeout 120 build/tests/gpu/test_gemm_gpu small > "$OUT/small.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/small.log"
if [ "${1:-}" != "quick" ]; then
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  echo "== memcheck"; timeout 200 $CS --tool memcheck build/tests/gpu/test_gemm_gpu small > "$OUT/memcheck.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/memcheck.log"
  echo "== racecheck"; timeout 200 $CS --tool racecheck build/tests/gpu/test_gemm_gpu small > "$OUT/racecheck.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/racecheck.log"
fi
echo "== gpu test (full)"
timeout 300 build/tests/gpu/test_gemm_gpu > "$OUT/full.log" 2>&1; echo "rc=$?"; grep -E "FAIL" "$OUT/full.log" | head -20; tail -2 "$OUT/full.log"
echo "== bench"
timeout 400 build/bench/bench_gemm ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v "^    cfg" | tail -40
# the stream-K rule (src/cuda/gemm.c): long-K shapes with and without the
# tail, side by side with cuBLAS ("3" is the default's configuration, "3-"
# without a tail, "3s" with one forced); the first line of `bench` names the
# card's memory bandwidth, which the rule reads
echo "== stream-K at K = 16384 (ratio to cuBLAS)"
for s in down.wgrad gu.wgrad 70b.down.wgrad 70b.qkv.wgrad; do
  CODA_VARIANTS="3 3- 3s" CODA_BENCH_ONLY=$s timeout 120 build/bench/bench_gemm variants 2>&1 |
    grep -E "^[0-9a-z.]+ +(NT|NN|TN) " | head -1
done | tee "$OUT/streamk.log"
