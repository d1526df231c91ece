#!/usr/bin/env bash
# `mpirun -np NP moe run --ep --device cuda ...` on one host, one GPU per rank; skipped (exit 77)
# where gpu_per_rank_probe finds fewer GPUs than ranks, as the GPU expert-parallel tests are:
#   run_ep_cli.sh PROBE MOE NP [moe run options...]
# moe run exits non-zero when its sampled tokens leave the bf16 bound against the single-GPU
# layer, so the exit status is the verdict.
set -uo pipefail
probe=$1 moe=$2 np=$3
shift 3
mpirun=("${MOE_MPIEXEC:-mpirun}" --oversubscribe --bind-to none -np "$np")
"${mpirun[@]}" "$probe"
status=$?
if [ "$status" -ne 0 ]; then exit "$status"; fi
exec "${mpirun[@]}" "$moe" run --ep --device cuda "$@"
