// rebalance_experts and plan_expert_movement at DeepSeek-V3 sizes: 61 layers of 256 routed experts
// in 8 groups, Zipf-like loads.
//   decode EP320   320 GPUs on 40 nodes, 1 slot each (64 redundant): global policy, the headline
//   wide EP320     the same GPUs with 2 slots each (384 redundant): global, packing on every GPU
//   prefill EP32   32 GPUs on 4 nodes, 9 slots each (32 redundant): hierarchical
// The floor printed next to each time is the bytes the call must read and write (loads in, tables
// out) over this machine's measured memcpy bandwidth; the algorithm is sort- and heap-bound, so
// expect a small fraction of it.
//
// Run: build/release/bench/moe_bench_eplb
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

#include "moe/eplb.h"

namespace {

constexpr int64_t kLayers = 61;
constexpr int64_t kExperts = 256;
constexpr int64_t kBytesPerExpert = 44'040'192;  // fp8 w13 + w2 of one DeepSeek-V3 expert

// Bytes per second of a large memcpy (read + write), best of a few runs.
double measured_copy_bandwidth() {
  static const double bandwidth = [] {
    const size_t size = size_t{256} << 20;
    std::vector<char> src(size, 1);
    std::vector<char> dst(size, 0);
    double best = 0;
    for (int run = 0; run < 5; ++run) {
      const auto start = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), size);
      benchmark::DoNotOptimize(dst.data());
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::max(best, 2.0 * static_cast<double>(size) / seconds);
    }
    return best;
  }();
  return bandwidth;
}

std::vector<double> zipf_loads(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<double> weight(static_cast<size_t>(kLayers * kExperts));
  std::vector<int64_t> rank(static_cast<size_t>(kExperts));
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (int64_t e = 0; e < kExperts; ++e) rank[static_cast<size_t>(e)] = e;
    std::shuffle(rank.begin(), rank.end(), rng);
    for (int64_t e = 0; e < kExperts; ++e) {
      weight[static_cast<size_t>(layer * kExperts + e)] =
          std::floor(1e6 / std::pow(1.0 + static_cast<double>(rank[static_cast<size_t>(e)]), 0.8));
    }
  }
  return weight;
}

moe::EplbConfig deployment(int64_t index) {
  switch (index) {
    case 0:
      return {.num_replicas = 320, .num_groups = 8, .num_nodes = 40, .num_gpus = 320};
    case 1:
      return {.num_replicas = 640, .num_groups = 8, .num_nodes = 40, .num_gpus = 320};
    default:
      return {.num_replicas = 288, .num_groups = 8, .num_nodes = 4, .num_gpus = 32};
  }
}

const char* deployment_name(int64_t index) {
  const char* names[] = {"decode EP320", "wide EP320", "prefill EP32"};
  return names[index];
}

// Bytes a placement's tables occupy: phy2log, replica_rank, log2phy, logcnt.
double table_bytes(const moe::ExpertPlacement& p) {
  return 4.0 * static_cast<double>(p.phy2log.size() + p.replica_rank.size() + p.log2phy.size() +
                                   p.logcnt.size());
}

// `seconds`: wall time of all iterations.
void report_floor(benchmark::State& state, double bytes, double seconds) {
  const double floor_seconds = bytes / measured_copy_bandwidth();
  state.counters["floor_us"] = floor_seconds * 1e6;
  state.counters["of_floor"] = floor_seconds * static_cast<double>(state.iterations()) / seconds;
  state.SetLabel(deployment_name(state.range(0)));
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void BM_RebalanceExperts(benchmark::State& state) {
  const moe::EplbConfig config = deployment(state.range(0));
  const std::vector<double> weight = zipf_loads(1);
  moe::ExpertPlacement placement;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    placement = moe::rebalance_experts(weight, kLayers, kExperts, config);
    benchmark::DoNotOptimize(placement.phy2log.data());
  }
  const double seconds = seconds_since(start);
  report_floor(state, 8.0 * static_cast<double>(weight.size()) + table_bytes(placement), seconds);
}
BENCHMARK(BM_RebalanceExperts)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

// From the placement of one load sample to the next: the second EPLB step of a live deployment.
void BM_PlanExpertMovement(benchmark::State& state) {
  const moe::EplbConfig config = deployment(state.range(0));
  const moe::ExpertPlacement current =
      moe::rebalance_experts(zipf_loads(1), kLayers, kExperts, config);
  const moe::ExpertPlacement target =
      moe::rebalance_experts(zipf_loads(2), kLayers, kExperts, config);
  moe::MovementPlan plan;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    plan = moe::plan_expert_movement(current, target, kBytesPerExpert);
    benchmark::DoNotOptimize(plan.transfers.data());
  }
  const double seconds = seconds_since(start);
  report_floor(state,
               2.0 * table_bytes(current) + table_bytes(plan.placement) +
                   16.0 * static_cast<double>(plan.transfers.size()),
               seconds);
  state.counters["transfers"] = static_cast<double>(plan.transfers.size());
}
BENCHMARK(BM_PlanExpertMovement)->DenseRange(0, 2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
