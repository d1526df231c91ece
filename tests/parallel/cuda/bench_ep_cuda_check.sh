#!/usr/bin/env bash
# `mpirun -np NP moe bench --ep --device cuda` on one host, one GPU per rank, on a skewed trace
# that `moe trace synth` writes and a placement with replicas that `moe eplb` makes from it; skipped
# (exit 77) where gpu_per_rank_probe finds fewer GPUs than ranks:
#   bench_ep_cuda_check.sh PROBE MOE CONFIG NP
# Four GPU runs: the trace made in place on contiguous experts (high-throughput, peer to peer), the
# file on contiguous experts over NCCL and with two-batch overlap (low-latency), and the file on
# the placement (low-latency); and the CPU bench on the file and the placement. Every GPU run must
# print sane JSON (pairs served summing to T*k, max/mean >= 1, bytes sent equal to bytes
# received, rows within the T*k*H*b bound, stage times where measured); the contiguous runs must
# agree on loads and bytes whatever the data path; and the placement run must serve the pairs the
# CPU bench serves, rank by rank and slot by slot, and send the same token rows.
set -euo pipefail
probe=$1 moe=$2 config=$3 np=$4
mpirun=("${MOE_MPIEXEC:-mpirun}" --oversubscribe --bind-to none -np "$np")
"${mpirun[@]}" "$probe" || exit $?
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tokens=24 steps=3 zipf=1.5 seed=5 slots=24
bench=(bench --ep --config "$config" --repeats 2 --seed "$seed" --json)
"$moe" trace synth "$config" --layers 1 --steps "$steps" --tokens $((tokens * np)) --zipf "$zipf" \
  --gpus "$np" --seed "$seed" --out "$dir/trace.safetensors"
"$moe" eplb --trace "$dir/trace.safetensors" --slots "$slots" --groups 1 --gpus "$np" \
  --out "$dir/placement.json"
gpu() {
  local name=$1
  shift
  "${mpirun[@]}" "$moe" "${bench[@]}" --device cuda "$@" >"$dir/$name.out"
}
gpu in_place --tokens "$tokens" --steps "$steps" --zipf "$zipf" --dispatcher ht
gpu over_nccl --trace "$dir/trace.safetensors" --dispatcher ht --over-nccl
gpu two_batch --trace "$dir/trace.safetensors" --dispatcher ll --overlap
gpu placement --trace "$dir/trace.safetensors" --placement "$dir/placement.json" --dispatcher ll
"${mpirun[@]}" "$moe" "${bench[@]}" --device cpu --threads 1 --trace "$dir/trace.safetensors" \
  --placement "$dir/placement.json" >"$dir/cpu_placement.out"
python3 - "$dir" "$np" "$slots" <<'PY'
import json, sys

folder, np_, slots = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {name: json.load(open(f"{folder}/{name}.out"))
        for name in ("in_place", "over_nccl", "two_batch", "placement", "cpu_placement")}
failures = []

def check(condition, what):
    if not condition:
        failures.append(what)

for name in ("in_place", "over_nccl", "two_batch", "placement"):
    run = runs[name]
    check(run["device"] == "cuda" and run["ranks"] == np_, f"{name}: {run['device']}, {run['ranks']} ranks")
    check(len(run["groups"]) == 1, f"{name}: groups {len(run['groups'])}")
    g = run["groups"][0]
    k, H = run["top_k"], run["hidden_size"]
    load, b = g["load"], g["bytes_per_pass"]
    check(sum(load["pairs_per_rank"]) == g["tokens"] * k,
          f"{name}: pairs served {sum(load['pairs_per_rank'])}, expected {g['tokens'] * k}")
    check(load["max_over_mean"] >= 1 and load["slot_max_over_mean"] >= 1,
          f"{name}: max/mean load {load['max_over_mean']}, per slot {load['slot_max_over_mean']}")
    check(g["step_ms"] > 0, f"{name}: step_ms {g['step_ms']}")
    check(b["upper_bound"] == g["tokens"] * k * H * 2, f"{name}: bound {b['upper_bound']}")
    check(0 < b["token_rows_to_other_ranks"] <= b["upper_bound"],
          f"{name}: rows {b['token_rows_to_other_ranks']} vs bound {b['upper_bound']}")
    check(b["dispatch_same_host"] > 0 and b["combine_same_host"] > 0,
          f"{name}: no bytes to the other GPUs")
    check(b["dispatch_cross_host"] == 0 and b["combine_cross_host"] == 0,
          f"{name}: bytes across hosts on one host")
    sent = sum(b[f"{stage}_{domain}"] for stage in ("dispatch", "combine")
               for domain in ("self", "same_host", "cross_host"))
    received = sum(r["bytes_received"][domain] for r in g["ranks"]
                   for domain in ("self", "same_host", "cross_host"))
    check(sent == received, f"{name}: {sent} bytes sent, {received} received")
    check(len(g["ranks"]) == np_, f"{name}: per-rank entries {len(g['ranks'])}")
    for r, rank in enumerate(g["ranks"]):
        stages = rank["stages_us"]
        check(rank["pairs_received"] == load["pairs_per_rank"][r], f"{name}: rank {r} load")
        check(rank["local_pairs"] is None and stages["sum"] is None,
              f"{name}: rank {r} reports what the GPU layer does not measure")
        check(stages["total"] > 0, f"{name}: rank {r} total time")
        timed_apart = [stages[s] for s in ("dispatch", "experts", "combine")]
        if name == "two_batch":
            check(timed_apart == [None] * 3, f"{name}: rank {r} stages {timed_apart}")
        else:
            check(all(t is not None and t > 0 for t in timed_apart),
                  f"{name}: rank {r} stages {timed_apart}")

# The trace file is the trace made in place: on contiguous experts every data path serves the
# same pairs and moves the same bytes.
for name in ("over_nccl", "two_batch"):
    for field in ("load", "bytes_per_pass"):
        check(runs[name]["groups"][0][field] == runs["in_place"]["groups"][0][field],
              f"{name}: {field} differs from the trace made in place")
gpu, cpu = runs["placement"], runs["cpu_placement"]
check(gpu["num_slots"] == slots and cpu["num_slots"] == slots,
      f"placement: {gpu['num_slots']} / {cpu['num_slots']} slots")
g, c = gpu["groups"][0], cpu["groups"][0]
check(g["load"] == c["load"], f"placement: GPU loads {g['load']}, CPU {c['load']}")
for r, (gr, cr) in enumerate(zip(g["ranks"], c["ranks"])):
    check(gr["pairs_per_local_slot"] == cr["pairs_per_local_slot"],
          f"placement: rank {r} slots {gr['pairs_per_local_slot']} on the GPU, "
          f"{cr['pairs_per_local_slot']} on the CPU")
    check(gr["rows_sent"] == cr["rows_sent"],
          f"placement: rank {r} rows sent {gr['rows_sent']} on the GPU, {cr['rows_sent']} on the CPU")
check(g["bytes_per_pass"]["token_rows_to_other_ranks"] ==
      c["bytes_per_pass"]["token_rows_to_other_ranks"], "placement: token rows differ from the CPU's")
contiguous = runs["in_place"]["groups"][0]["load"]["max_over_mean"]
check(g["load"]["max_over_mean"] <= contiguous + 1e-9,
      f"placement max/mean load {g['load']['max_over_mean']} above contiguous {contiguous}")
if failures:
    sys.exit("bench_ep_cuda_check: " + "; ".join(failures))
print(f"bench_ep_cuda_check: {np_} GPUs: max/mean load contiguous {contiguous:.3f}, placement "
      f"{g['load']['max_over_mean']:.3f}; step {runs['in_place']['groups'][0]['step_ms']:.3f} / "
      f"{g['step_ms']:.3f} ms")
PY
