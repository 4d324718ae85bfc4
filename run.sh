#!/usr/bin/env bash
# run.sh - the two commands of the README, each doing all the set-up itself.
#
#   ./run.sh demo    build, then a small LLaMA layer forward + backward through
#                    the epilogue programs, checked against the unfused
#                    reference (on the GPU if there is one, else the CPU
#                    backend), and 60 training steps of a small model
#   ./run.sh test    build, then every test: C unit tests, the PyTorch autograd
#                    cross-checks (with Debian's torch, then again with a
#                    newer torch from PyPI), the C tests again under ASan +
#                    UBSan, and 60 s of fuzzing the program parser; a line per
#                    stage, the full output in build/logs/, a one-line summary
#                    at the end
#
# Set-up: installs the Debian packages it needs (gcc, make, clang with its
# fuzzer runtime, PyTorch for Python 3, pip/setuptools/wheel for the
# `pip install .` test) when they are missing. The CUDA toolkit
# is optional: with nvcc/NVRTC under $CUDA_HOME (default /usr/local/cuda) the
# CUDA backend is built too.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES="build-essential clang libclang-rt-14-dev python3 python3-torch python3-numpy python3-pip python3-setuptools python3-wheel python3-venv"

# The Python tests again under a newer torch, in a virtual environment of
# its own (build/venv-torch2, kept between runs): Debian's torch is 1.13,
# which has no torch.library.custom_op, so the custom operators, opcheck
# and torch.compile paths run only here. TORCH2_VERSION picks the release;
# where PyPI cannot be reached the stage says so and is skipped (a failing
# test fails it).
TORCH2_VERSION=${TORCH2_VERSION:-2.15.0}
torch2_tests() {
    local venv=build/venv-torch2
    if ! "$venv/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH2_VERSION')" \
            2>/dev/null; then
        rm -rf "$venv"
        /usr/bin/python3 -m venv "$venv"
        if ! "$venv/bin/pip" install -q "torch==$TORCH2_VERSION" numpy setuptools wheel; then
            echo "SKIPPED: torch $TORCH2_VERSION could not be installed from PyPI"
            return 0
        fi
    fi
    make test-py PYTHON="$(pwd)/$venv/bin/python"
}

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
    # a small byte-level model trained for 60 steps: on the GPU where there
    # is one (head_dim 64), else on the CPU backend
    ./build/coda train --d 256 --heads 4 --kv-heads 2 --ffn 688 --layers 2 --steps 60 --every 20
    ;;
test)
    setup
    # Each stage's output goes to build/logs/STAGE.log; a line per stage
    # here, the log's tail if one fails, one line at the end.
    mkdir -p build/logs
    stage() {
        local name=$1; shift
        local log="build/logs/$name.log" t0=$SECONDS
        if "$@" > "$log" 2>&1; then
            echo "run.sh: $name ok ($((SECONDS - t0)) s, $log)"
        else
            echo "run.sh: $name FAILED ($log); its last lines:"
            tail -n 60 "$log"
            exit 1
        fi
    }
    checks() { # the checks the tests of a log counted
        grep -hoE '[0-9]+ checks, 0 failures' "$1" | awk '{n += $1} END {print n + 0}'
    }
    stage build make -j"$jobs" all
    stage test-c make test-c
    stage test-py make test-py
    stage test-py-torch2 torch2_tests
    stage test-sanitize make test-sanitize
    stage fuzz env FUZZ_SECONDS="${FUZZ_SECONDS:-60}" make fuzz
    runs=$(grep -hoE 'Done [0-9]+ runs' build/logs/fuzz.log | awk '{print $2}' | tail -n 1)
    if grep -q '^SKIPPED' build/logs/test-py-torch2.log; then torch2="skipped (no PyPI)"
    else torch2="$(checks build/logs/test-py-torch2.log) checks"; fi
    echo "run.sh test: all passed: C tests $(checks build/logs/test-c.log) checks," \
         "Python $(checks build/logs/test-py.log) checks (torch $TORCH2_VERSION: $torch2), C tests under ASan+UBSan" \
         "$(checks build/logs/test-sanitize.log) checks, fuzzer ${runs:-?} runs"
    ;;
*)
    echo "usage: ./run.sh demo | test" >&2
    exit 2
    ;;
esac
