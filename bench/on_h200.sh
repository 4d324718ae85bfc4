#!/bin/bash
# on_h200.sh - run a command only on an NVIDIA H200; on any other GPU (or
# none) print what is there and exit 3 at once.
#
#   bash bench/on_h200.sh bash bench/run_block_model.sh
#
# For the lent device, whose plain calls land on an H100 or an H200: a table
# that must come from the H200 (issue 20's) costs about 30 s of device time
# when an H100 comes instead, against the whole run's minutes.
set -u
[ $# -gt 0 ] || { echo "usage: bash bench/on_h200.sh COMMAND [ARGS...]" >&2; exit 2; }
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$name" in
  "NVIDIA H200"*) exec "$@" ;;
  *) echo "on_h200.sh: not an H200 (${name:-no GPU found}): nothing run"; exit 3 ;;
esac
