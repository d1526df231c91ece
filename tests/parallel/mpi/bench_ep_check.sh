#!/usr/bin/env bash
# `mpirun -np NP moe bench --ep` on a skewed synthetic trace, once on contiguous experts (the trace
# made in place) and once on a placement that `moe eplb` made from the same trace written by
# `moe trace synth` (replayed with --trace): both must succeed and print sane JSON, and the
# placement's max/mean load must not exceed the contiguous one's. The file replayed on contiguous
# experts must give the loads and bytes of the trace made in place.
#   bench_ep_check.sh MOE CONFIG NP
set -euo pipefail
moe=$1 config=$2 np=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tokens=24 steps=3 zipf=1.5 seed=5 slots=24
mpirun=("${MOE_MPIEXEC:-mpirun}" --oversubscribe --bind-to none -np "$np")
bench=(bench --ep --config "$config" --dtypes f32 --threads 1 --repeats 2 --seed "$seed" --json)
"$moe" trace synth "$config" --layers 1 --steps "$steps" --tokens $((tokens * np)) --zipf "$zipf" \
  --gpus "$np" --seed "$seed" --out "$dir/trace.safetensors"
"$moe" eplb --trace "$dir/trace.safetensors" --slots "$slots" --groups 1 --gpus "$np" \
  --out "$dir/placement.json"
"${mpirun[@]}" "$moe" "${bench[@]}" --tokens "$tokens" --steps "$steps" --zipf "$zipf" \
  >"$dir/contiguous.out"
"${mpirun[@]}" "$moe" "${bench[@]}" --trace "$dir/trace.safetensors" >"$dir/replayed.out"
"${mpirun[@]}" "$moe" "${bench[@]}" --trace "$dir/trace.safetensors" \
  --placement "$dir/placement.json" >"$dir/placement.out"
python3 - "$dir/contiguous.out" "$dir/replayed.out" "$dir/placement.out" "$np" "$slots" <<'PY'
import json, sys

contiguous, replayed, placement = (json.load(open(path)) for path in sys.argv[1:4])
np_, slots = int(sys.argv[4]), int(sys.argv[5])
failures = []

def check(condition, what):
    if not condition:
        failures.append(what)

for name, run in (("contiguous", contiguous), ("placement", placement)):
    check(run["ranks"] == np_, f"{name}: ranks {run['ranks']}")
    check(len(run["groups"]) == 1, f"{name}: groups {len(run['groups'])}")
    g = run["groups"][0]
    k, H = run["top_k"], run["hidden_size"]
    load = g["load"]
    check(load["max_over_mean"] >= 1, f"{name}: max/mean load {load['max_over_mean']}")
    check(sum(load["pairs_per_rank"]) == g["tokens"] * k,
          f"{name}: pairs served {sum(load['pairs_per_rank'])}, expected {g['tokens'] * k}")
    check(g["step_ms"] > 0, f"{name}: step_ms {g['step_ms']}")
    b = g["bytes_per_pass"]
    check(b["upper_bound"] == g["tokens"] * k * H * 4, f"{name}: bound {b['upper_bound']}")
    check(0 <= b["token_rows_to_other_ranks"] <= b["upper_bound"],
          f"{name}: rows {b['token_rows_to_other_ranks']} vs bound {b['upper_bound']}")
    if np_ > 1:
        for field in ("dispatch_same_host", "combine_same_host", "token_rows_to_other_ranks"):
            check(b[field] > 0, f"{name}: {field} {b[field]}")
    check(len(g["ranks"]) == np_, f"{name}: per-rank entries {len(g['ranks'])}")
    for r, rank in enumerate(g["ranks"]):
        check(rank["stages_us"]["total"] > 0, f"{name}: rank {r} total time")
        check(rank["pairs_received"] == load["pairs_per_rank"][r], f"{name}: rank {r} load")

check(contiguous["placement"] == "contiguous", "contiguous run: placement name")
# The trace made in place is the one `moe trace synth` wrote: the same loads and bytes.
for field in ("load", "bytes_per_pass"):
    check(contiguous["groups"][0][field] == replayed["groups"][0][field],
          f"{field}: the synthetic trace and its file differ")
check(placement["num_slots"] == slots, f"placement run: {placement['num_slots']} slots")
c, p = contiguous["groups"][0], placement["groups"][0]
check(c["tokens"] == p["tokens"], f"tokens differ: {c['tokens']} vs {p['tokens']}")
check(p["load"]["max_over_mean"] <= c["load"]["max_over_mean"] + 1e-9,
      f"placement max/mean load {p['load']['max_over_mean']} above contiguous "
      f"{c['load']['max_over_mean']}")
if failures:
    sys.exit("bench_ep_check: " + "; ".join(failures))
print(f"bench_ep_check: {np_} ranks: max/mean load contiguous {c['load']['max_over_mean']:.3f}, "
      f"placement {p['load']['max_over_mean']:.3f}; step {c['step_ms']:.3f} / {p['step_ms']:.3f} ms")
PY
