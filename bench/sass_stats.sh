#!/bin/bash
# sass_stats.sh - what each fused kernel's machine code holds, without a GPU:
# SASS lines, divergence regions (BSSY: each an if that ptxas kept as a
# branch), calls (slow paths), MUFU, global loads/stores, local memory.
#   bench/sass_stats.sh [cfg]      (default 3, the cooperative 128 x 256)
#   bench/sass_stats.sh cfg ops    also each kernel's most frequent opcodes
#                                  (instruction economy: conversions F2F/F2FP
#                                  and MUFU on the narrow pipe, FSEL/ISETP of
#                                  the edge-tile selects, ...)
# The generated epilogues should have no BSSY, CALL or LDL in the pair code
# (a few BSSY come from the mainloop and the reductions at a tile's end);
# compare a change's numbers with the ones before it. Needs nvdisasm: from
# $NVDISASM, the PATH, or pip's nvidia-cuda-nvdisasm (fetched into
# build/nvdisasm on first use; the machines have no cuobjdump).
set -eu
cfg=${1:-3}
make -s build/bench/kernel_stats
ND=${NVDISASM:-$(command -v nvdisasm || true)}
if [ -z "$ND" ]; then
    ND=$(ls build/nvdisasm/nvidia/*/bin/nvdisasm 2>/dev/null | head -1 || true)
    if [ -z "$ND" ]; then
        mkdir -p build/nvdisasm
        python3 -m pip download -q --no-deps -d build/nvdisasm nvidia-cuda-nvdisasm
        (cd build/nvdisasm && python3 -m zipfile -e nvidia_cuda_nvdisasm-*.whl .)
        ND=$(ls build/nvdisasm/nvidia/*/bin/nvdisasm | head -1)
        chmod +x "$ND"
    fi
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
build/bench/kernel_stats "$cfg" "$dir" > "$dir/ptxas.txt"
head -1 "$dir/ptxas.txt"
printf "%-20s %6s %5s %5s %5s %5s %5s %5s\n" kernel lines BSSY CALL MUFU LDG STG LDL
for c in "$dir"/*.cubin; do
    "$ND" -c "$c" > "$dir/k.sass"
    n() { grep -c "$1" "$dir/k.sass" || true; }
    printf "%-20s %6d %5d %5d %5d %5d %5d %5d\n" "$(basename "$c" .cubin)" "$(wc -l < "$dir/k.sass")" \
        "$(n BSSY)" "$(n 'CALL\.')" "$(n MUFU)" "$(n LDG)" "$(n STG)" "$(n LDL)"
    if [ "${2:-}" = ops ]; then
        # opcode without predicate and modifiers, the 14 most frequent
        awk '/\/\*[0-9a-f]+\*\// { sub(/.*\/\*[0-9a-f]+\*\/ */, ""); op = $1; if (op ~ /^@/) op = $2;
                                    sub(/\..*/, "", op); sub(/;$/, "", op); if (op != "") c[op]++ }
             END { for (k in c) print c[k], k }' "$dir/k.sass" |
            sort -rn | head -14 | awk '{printf "  %s %s", $2, $1} END {print ""}'
    fi
done
