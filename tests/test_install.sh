#!/bin/sh
# test_install.sh - `pip install .` as a user would (no network: the build
# needs setuptools and wheel from the system, torch is the system's), then
# `import coda` from outside the repository finds the library inside the
# installed package and computes a GEMM that matches torch.
#   sh tests/test_install.sh [PYTHON]
set -eu
PY=${1:-/usr/bin/python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# a copy, so the build's leftovers (build/lib, *.egg-info) stay out of the checkout
tar -C "$REPO" --exclude=./build --exclude='./build-*' --exclude=./.git -cf - . | (mkdir "$TMP/src" && tar -C "$TMP/src" -xf -)
"$PY" -m pip install --quiet --no-build-isolation --no-deps --no-index --target "$TMP/site" "$TMP/src" > "$TMP/pip.log" 2>&1 ||
    { tail -30 "$TMP/pip.log"; echo "FAIL: pip install"; exit 1; }
test -f "$TMP/site/coda/libcoda.so" || { echo "FAIL: no libcoda.so in the installed package"; exit 1; }
cd "$TMP"
env -u CODA_LIB PYTHONPATH="$TMP/site" "$PY" - "$TMP/site" <<'PYEOF'
import os, sys
import torch
import coda
site = sys.argv[1]
checks = fails = 0
def check(ok, what):
    global checks, fails
    checks += 1
    if not ok:
        fails += 1
        print("FAIL:", what)
check(os.path.realpath(coda.__file__).startswith(os.path.realpath(site)), "coda imported from %s" % coda.__file__)
check(os.path.realpath(coda.lib._name) == os.path.realpath(os.path.join(site, "coda", "libcoda.so")),
      "library loaded from %s" % coda.lib._name)
torch.manual_seed(0)
a = torch.randn(37, 24).to(torch.bfloat16)
b = torch.randn(19, 24).to(torch.bfloat16)
c = torch.full((37, 19), float("nan"), dtype=torch.float32)
coda.gemm(coda.Context(), "nt", a, b, c)  # c = a b^T
ref = a.double() @ b.double().t()
err = ((c.double() - ref).norm() / ref.norm()).item()
check(c.shape == (37, 19) and err < 1e-2, "gemm from the installed package: shape %s, rel err %.2e" % (tuple(c.shape), err))
print("test_install.sh: %d checks, %d failures" % (checks, fails))
sys.exit(1 if fails else 0)
PYEOF
