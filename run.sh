#!/usr/bin/env bash
# run.sh - the two commands of the README, each doing all the set-up itself.
#
#   ./run.sh demo    build, then a small LLaMA layer forward + backward through
#                    the epilogue programs, checked against the unfused
#                    reference (on the GPU if there is one, else the CPU backend)
#   ./run.sh test    build, then every test: C unit tests, the PyTorch autograd
#                    cross-checks, the C tests again under ASan + UBSan, and
#                    60 s of fuzzing the program parser
#
# Set-up: installs the Debian packages it needs (gcc, make, clang with its
# fuzzer runtime, PyTorch for Python 3) when they are missing. The CUDA toolkit
# is optional: with nvcc/NVRTC under $CUDA_HOME (default /usr/local/cuda) the
# CUDA backend is built too.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES="build-essential clang libclang-rt-14-dev python3 python3-torch python3-numpy"

setup() {
    local missing=()
    for p in $PACKAGES; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "run.sh: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

jobs=$(nproc 2>/dev/null || echo 2)
case "${1:-}" in
demo)
    setup
    make -j"$jobs" all
    ./build/coda info
    ./build/coda demo
    ;;
test)
    setup
    make -j"$jobs" all
    make test
    make test-sanitize
    FUZZ_SECONDS="${FUZZ_SECONDS:-60}" make fuzz
    ;;
*)
    echo "usage: ./run.sh demo | test" >&2
    exit 2
    ;;
esac
