#!/usr/bin/env bash
# `moe ARGS...` on this machine's GPU; skipped (exit 77) where gpu_probe finds no CUDA device:
#   run_cli.sh PROBE MOE [moe arguments...]
# moe run exits non-zero when its error against the float64 reference exceeds the bound, so the
# exit status is the verdict.
set -uo pipefail
probe=$1 moe=$2
shift 2
"$probe" || exit $?
exec "$moe" "$@"
