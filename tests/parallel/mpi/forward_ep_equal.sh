#!/usr/bin/env bash
# `mpirun -np NP moe forward --ep` must write exactly the file the single-process run writes:
#   forward_ep_equal.sh MOE CHECKPOINT NP [--ep options...]
set -euo pipefail
moe=$1 checkpoint=$2 np=$3
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$moe" forward --checkpoint "$checkpoint" --input "$checkpoint/io.safetensors" \
  --output "$dir/single.safetensors" --threads 1
"${MOE_MPIEXEC:-mpirun}" --oversubscribe --bind-to none -np "$np" "$moe" forward --ep "$@" \
  --checkpoint "$checkpoint" --input "$checkpoint/io.safetensors" \
  --output "$dir/ep.safetensors" --threads 1
cmp "$dir/single.safetensors" "$dir/ep.safetensors"
echo "forward_ep_equal: $np ranks $*: the same bytes as the single-process run"
