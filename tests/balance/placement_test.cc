// The trace traffic model on hand-computed cases, and optimize_placement: a trace whose tokens
// prefer their own node's experts, properties on random problems (never worse, never past a bound
// the start kept, same replicas), the search's own account against the model, determinism, and
// the time of a DeepSeek-V3-sized problem (printed, never asserted).
#include "moe/placement.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "balance/placement_cases.h"
#include "balance/swap_search.h"
#include "balance/trace_layer.h"

namespace moe {
namespace {

using testing::placement_case_seeds;
using testing::PlacementCase;
using testing::random_placement_case;
using testing::synthetic_trace;
using testing::TraceShape;

RoutingTrace one_layer_trace(int64_t num_experts, int64_t top_k, std::vector<int32_t> topk_ids,
                             std::vector<int32_t> source_gpu) {
  RoutingTrace trace;
  trace.num_layers = 1;
  trace.num_experts = num_experts;
  trace.top_k = top_k;
  trace.layers.push_back({std::move(topk_ids), std::move(source_gpu), {}});
  return trace;
}

// 2 nodes of 2 GPUs: GPUs 0, 1 on node 0 and GPUs 2, 3 on node 1. A row is 500 bf16 values.
constexpr Topology kTwoByTwo{
    .num_nodes = 2, .gpus_per_node = 2, .intra_node_gbps = 100, .inter_node_gbps = 10};
constexpr ActivationRow kRow{.hidden_size = 500, .bytes_per_value = 2};  // 1000 bytes

// Expert e alone on GPU e. Each token's rows, from its GPU to its experts' GPUs:
//   t0 GPU0 {0, 1}: 0->0 same GPU, 0->1 same node
//   t1 GPU0 {2, 3}: 0->2 cross,    0->3 cross
//   t2 GPU1 {1, 2}: 1->1 same GPU, 1->2 cross
//   t3 GPU3 {0, 3}: 3->0 cross,    3->3 same GPU
//   t4 GPU2 {3, 2}: 2->3 same node, 2->2 same GPU
// Rows: 4 same-GPU, 2 same-node, 4 cross-node (x 1000 bytes); 10 pairs, so the bound is 10000.
// Cross-node: GPU0 sends 2 rows and GPU2 receives 2, so the busiest GPU moves 2000 bytes:
// 2000 / 10 GB/s = 200 ns. Same-node: at most 1 row per GPU, 1000 / 100 GB/s = 10 ns.
// Loads: expert 0 has t0, t3; 1 has t0, t2; 2 has t1, t2, t4; 3 has t1, t3, t4.
TEST(PlacementTraffic, HandComputedOneSlotPerExpert) {
  const RoutingTrace trace = one_layer_trace(4, 2, {0, 1, 2, 3, 1, 2, 0, 3, 3, 2}, {0, 0, 1, 3, 2});
  const ExpertPlacement placement = contiguous_placement(1, 4, 4, 4, 2);
  const TrafficReport report = trace_traffic(trace, placement, kTwoByTwo, kRow);

  const LayerTraffic& layer = report.layers[0];
  EXPECT_EQ(layer.dispatch.same_gpu, 4000);
  EXPECT_EQ(layer.dispatch.same_node, 2000);
  EXPECT_EQ(layer.dispatch.cross_node, 4000);
  EXPECT_EQ(layer.upper_bound_bytes, 10000);
  EXPECT_DOUBLE_EQ(layer.cross_node_seconds, 2e-7);
  EXPECT_DOUBLE_EQ(layer.same_node_seconds, 1e-8);
  EXPECT_DOUBLE_EQ(layer.dispatch_seconds, 2e-7);
  EXPECT_DOUBLE_EQ(report.dispatch_combine_seconds(), 4e-7);
  EXPECT_EQ(report.gpu_load, (std::vector<int64_t>{2, 2, 3, 3}));
  EXPECT_EQ(layer.max_gpu_load, 3);
  EXPECT_DOUBLE_EQ(layer.mean_gpu_load, 2.5);
  EXPECT_DOUBLE_EQ(report.max_skew, 1.2);
  EXPECT_EQ(report.dispatch.cross_node, 4000);
  EXPECT_EQ(report.upper_bound_bytes, 10000);
}

// Every expert twice: GPU0 {0, 1}, GPU1 {2, 3}, GPU2 {0, 2}, GPU3 {1, 3} (slots 0..7).
//   t0, t1, t2 GPU0 {0, 1};  t3 GPU2 {0, 2};  t4 GPU1 {3, 0}
// Expert 0 has 5 pairs: slot 0 takes 3, slot 4 takes 2. Own GPU first: t0, t1, t2 fill slot 0 and
// t3 takes slot 4; t4 (GPU1) finds no room on its node and takes slot 4 (GPU2).
// Expert 1 has 3 pairs: slot 1 takes 2, slot 6 takes 1: t0, t1 on slot 1, t2 on slot 6 (GPU3).
// Expert 2 has 1 pair (t3): slot 2 (GPU1) takes it, slot 5 (on t3's own GPU) has no room.
// Expert 3 has 1 pair (t4): slot 3, on t4's own GPU1.
// Rows: t0 and t1 reach only GPU0 (one row each for two pairs); t2 GPU0 + cross to GPU3; t3 GPU2
// + cross to GPU1; t4 GPU1 + cross to GPU2. So 5 same-GPU, 0 same-node and 3 cross-node rows, 8
// rows for 10 pairs. Each cross row has its own sender and receiver: 1000 bytes, 100 ns.
// Loads: GPU0 3 + 2, GPU1 1 + 1, GPU2 2 + 0, GPU3 1 + 0.
TEST(PlacementTraffic, HandComputedReplicasAndOneRowPerGpu) {
  const RoutingTrace trace = one_layer_trace(4, 2, {0, 1, 0, 1, 0, 1, 0, 2, 3, 0}, {0, 0, 0, 2, 1});
  const ExpertPlacement placement =
      placement_from_phy2log(std::vector<int32_t>{0, 1, 2, 3, 0, 2, 1, 3}, 1, 4, 4, 2);
  const TrafficReport report = trace_traffic(trace, placement, kTwoByTwo, kRow);

  const LayerTraffic& layer = report.layers[0];
  EXPECT_EQ(layer.dispatch.same_gpu, 5000);
  EXPECT_EQ(layer.dispatch.same_node, 0);
  EXPECT_EQ(layer.dispatch.cross_node, 3000);
  EXPECT_EQ(layer.upper_bound_bytes, 10000);
  EXPECT_DOUBLE_EQ(layer.cross_node_seconds, 1e-7);
  EXPECT_DOUBLE_EQ(layer.same_node_seconds, 0);
  EXPECT_EQ(report.gpu_load, (std::vector<int64_t>{5, 2, 2, 1}));
  EXPECT_DOUBLE_EQ(report.max_skew, 2.0);
}

TEST(PlacementTraffic, RoundRobinSources) {
  RoutingTrace trace = one_layer_trace(4, 2, std::vector<int32_t>(14, 0), {});
  trace.num_layers = 2;
  trace.layers.push_back({std::vector<int32_t>(4, 0), {9}, {}});
  assign_sources_round_robin(trace, 3);
  EXPECT_EQ(trace.layers[0].source_gpu, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(trace.layers[1].source_gpu, (std::vector<int32_t>{0, 1}));
}

// One row per pair when top_k is 1; fewer when a token's experts share GPUs; loads sum to pairs.
TEST(PlacementTraffic, RowsNeverExceedTheUpperBound) {
  for (const uint64_t seed : placement_case_seeds(1, 100)) {
    const PlacementCase c = random_placement_case(seed);
    const TrafficReport report = trace_traffic(c.trace, c.start, c.topology, kRow);
    for (int64_t l = 0; l < c.trace.num_layers; ++l) {
      const LayerTraffic& layer = report.layers[static_cast<size_t>(l)];
      const int64_t rows =
          layer.dispatch.same_gpu + layer.dispatch.same_node + layer.dispatch.cross_node;
      const int64_t num_pairs =
          static_cast<int64_t>(c.trace.layers[static_cast<size_t>(l)].topk_ids.size());
      EXPECT_EQ(layer.upper_bound_bytes, num_pairs * kRow.bytes()) << c.describe();
      if (c.trace.top_k == 1) {
        EXPECT_EQ(rows, layer.upper_bound_bytes) << c.describe();
      }
      EXPECT_LE(rows, layer.upper_bound_bytes) << c.describe();
      const auto first = report.gpu_load.begin() + l * c.topology.num_gpus();
      EXPECT_EQ(std::accumulate(first, first + c.topology.num_gpus(), int64_t{0}), num_pairs)
          << c.describe();
    }
  }
}

// Tokens of GPU0 (node 0) all pick expert 1, held by GPU1 on node 1, and the other way round.
TEST(PlacementOptimizer, SwapsExpertsToTheirTokens) {
  const RoutingTrace trace = one_layer_trace(2, 1, {1, 1, 0}, {0, 0, 1});
  const Topology topology{
      .num_nodes = 2, .gpus_per_node = 1, .intra_node_gbps = 100, .inter_node_gbps = 10};
  const PlacementResult result = optimize_placement(trace, contiguous_placement(1, 2, 2, 2, 2),
                                                    topology, kRow, {.load_bound = 2.0});
  EXPECT_EQ(result.placement.phy2log, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(result.before.dispatch.cross_node, 3000);
  EXPECT_EQ(result.after.dispatch.cross_node, 0);
  EXPECT_EQ(result.after.dispatch.same_gpu, 3000);
  EXPECT_EQ(result.num_swaps, 1);
}

// The same trace under tighter bounds. The mean load is 1.5 pairs and the swap moves expert 1's
// 2 pairs onto GPU0: allowed under a cap of 1.34 * 1.5 = 2.01, not under 1.5 (GPU1 already holds
// 2 pairs in the start, but a GPU may only grow up to the cap).
TEST(PlacementOptimizer, LoadBoundBlocksASwap) {
  const RoutingTrace trace = one_layer_trace(2, 1, {1, 1, 0}, {0, 0, 1});
  const Topology topology{
      .num_nodes = 2, .gpus_per_node = 1, .intra_node_gbps = 100, .inter_node_gbps = 10};
  const ExpertPlacement start = contiguous_placement(1, 2, 2, 2, 2);
  const PlacementResult loose =
      optimize_placement(trace, start, topology, kRow, {.load_bound = 1.34});
  EXPECT_EQ(loose.num_swaps, 1);
  const PlacementResult tight =
      optimize_placement(trace, start, topology, kRow, {.load_bound = 1.0});
  EXPECT_EQ(tight.num_swaps, 0);
  EXPECT_EQ(tight.placement.phy2log, start.phy2log);
  EXPECT_EQ(tight.after.dispatch.cross_node, 3000);
}

// Nine picks in ten of a node-0 token come from experts 0..15 and the tenth from all 32 (node 1
// likewise with 16..31); the start puts experts 0..15 on node 1 and 16..31 on node 0. Moving them
// home is worth most of the traffic.
TEST(PlacementOptimizer, AffinityTraceMovesExpertsHome) {
  const Topology topology{
      .num_nodes = 2, .gpus_per_node = 4, .intra_node_gbps = 150, .inter_node_gbps = 50};
  const TraceShape shape{.num_layers = 2,
                         .num_experts = 32,
                         .top_k = 4,
                         .tokens_per_layer = 4096,
                         .affinity = 0.9,
                         .zipf = 0,
                         .shuffle_homes = false};
  const RoutingTrace trace = synthetic_trace(shape, topology, 42);
  std::vector<int32_t> wrong_nodes(2 * 32);
  for (size_t s = 0; s < wrong_nodes.size(); ++s)
    wrong_nodes[s] = static_cast<int32_t>((s + 16) % 32);
  const ExpertPlacement start = placement_from_phy2log(wrong_nodes, 2, 32, 8, 2);
  const ActivationRow row{.hidden_size = 4096, .bytes_per_value = 2};

  const PlacementResult result =
      optimize_placement(trace, start, topology, row, {.load_bound = 1.10});
  const TrafficReport& before = result.before;
  const TrafficReport& after = result.after;
  fmt::print(
      "cross-node {:.1f} -> {:.1f} MB, same-node {:.1f} -> {:.1f} MB, same-GPU {:.1f} -> {:.1f} "
      "MB of a {:.1f} MB bound; skew {:.3f} -> {:.3f}; dispatch+combine {:.1f} -> {:.1f} us; {} "
      "swaps\n",
      before.dispatch.cross_node / 1e6, after.dispatch.cross_node / 1e6,
      before.dispatch.same_node / 1e6, after.dispatch.same_node / 1e6,
      before.dispatch.same_gpu / 1e6, after.dispatch.same_gpu / 1e6, before.upper_bound_bytes / 1e6,
      before.max_skew, after.max_skew, before.dispatch_combine_seconds() * 1e6,
      after.dispatch_combine_seconds() * 1e6, result.num_swaps);
  ASSERT_LE(before.max_skew, 1.10) << "the start must keep the bound for this test to mean much";
  EXPECT_LE(after.max_skew, 1.10);
  EXPECT_LE(after.dispatch.cross_node * 5, before.dispatch.cross_node);
  EXPECT_LT(after.dispatch_seconds, before.dispatch_seconds);
  // Every expert ends on its home node: node 0 holds experts 0..15.
  for (int64_t l = 0; l < 2; ++l) {
    for (int64_t s = 0; s < 32; ++s) {
      EXPECT_EQ(result.placement.phy2log[static_cast<size_t>(l * 32 + s)] / 16, s / 16)
          << "layer " << l << ", slot " << s;
    }
  }
}

// Per layer: rows never grow (cross-node first), the largest load never passes the cap unless the
// start did, and never grows past the start's then; replica and slot counts stay.
::testing::AssertionResult never_worse(const ExpertPlacement& start, double load_bound,
                                       const PlacementResult& result) {
  for (int64_t l = 0; l < result.before.num_layers; ++l) {
    const LayerTraffic& before = result.before.layers[static_cast<size_t>(l)];
    const LayerTraffic& after = result.after.layers[static_cast<size_t>(l)];
    auto key = [](const LayerTraffic& t) {
      return std::tuple(t.dispatch.cross_node, t.dispatch.same_node);
    };
    if (key(after) > key(before)) {
      return ::testing::AssertionFailure() << fmt::format(
                 "layer {}: cross/same-node bytes {}/{} -> {}/{}", l, before.dispatch.cross_node,
                 before.dispatch.same_node, after.dispatch.cross_node, after.dispatch.same_node);
    }
    const double cap = load_bound * before.mean_gpu_load;
    const double allowed = std::max(cap, static_cast<double>(before.max_gpu_load));
    if (static_cast<double>(after.max_gpu_load) > allowed) {
      return ::testing::AssertionFailure()
             << fmt::format("layer {}: max GPU load {} -> {}, cap {}", l, before.max_gpu_load,
                            after.max_gpu_load, cap);
    }
  }
  if (result.placement.logcnt != start.logcnt) {
    return ::testing::AssertionFailure() << "replica counts changed";
  }
  if (result.placement.num_replicas != start.num_replicas ||
      result.placement.num_gpus != start.num_gpus) {
    return ::testing::AssertionFailure() << "slots or GPUs changed";
  }
  return ::testing::AssertionSuccess();
}

TEST(PlacementOptimizer, NeverWorseOnRandomTraces) {
  int64_t cross_before = 0;
  int64_t cross_after = 0;
  for (const uint64_t seed : placement_case_seeds(1, 300)) {
    const PlacementCase c = random_placement_case(seed);
    const PlacementResult result =
        optimize_placement(c.trace, c.start, c.topology, kRow, {.load_bound = c.load_bound});
    ASSERT_TRUE(never_worse(c.start, c.load_bound, result)) << c.describe();
    const TrafficReport remeasured = trace_traffic(c.trace, result.placement, c.topology, kRow);
    ASSERT_EQ(remeasured.gpu_load, result.after.gpu_load) << c.describe();
    ASSERT_EQ(remeasured.dispatch.cross_node, result.after.dispatch.cross_node) << c.describe();
    cross_before += result.before.dispatch.cross_node;
    cross_after += result.after.dispatch.cross_node;
  }
  if (!std::getenv("MOE_PLACEMENT_SEED")) {
    EXPECT_LT(cross_after * 10, cross_before * 9) << "the search should find real gains";
  }
}

// Without replicas the search's account of the rows it saved is the traffic model's difference,
// and its loads keep the cap: its incremental tables agree with the model after every swap.
TEST(PlacementOptimizer, SearchAccountMatchesTheModel) {
  int64_t num_searches_with_swaps = 0;
  for (const uint64_t seed : placement_case_seeds(1000, 200)) {
    PlacementCase c = random_placement_case(seed);
    const int64_t num_gpus = c.topology.num_gpus();
    const int64_t num_experts = c.trace.num_experts;
    if (num_experts % num_gpus != 0) continue;
    std::vector<int32_t> phy2log = c.start.phy2log;
    phy2log.resize(static_cast<size_t>(c.trace.num_layers * num_experts));
    for (int64_t l = 0; l < c.trace.num_layers; ++l) {
      for (int64_t s = 0; s < num_experts; ++s) {
        phy2log[static_cast<size_t>(l * num_experts + s)] =
            static_cast<int32_t>((s * 7 + l) % num_experts);
      }
    }
    const ExpertPlacement start = placement_from_phy2log(phy2log, c.trace.num_layers, num_experts,
                                                         num_gpus, c.topology.num_nodes);
    for (int64_t l = 0; l < c.trace.num_layers; ++l) {
      balance::LayerProblem layer = balance::layer_problem(c.trace, start, c.topology, l);
      std::vector<int64_t> load(static_cast<size_t>(num_gpus));
      const LayerTraffic before =
          balance::layer_traffic(layer, balance::choose_slots(layer), c.topology, 1, load);
      const double cap = c.load_bound * before.mean_gpu_load;
      const balance::SwapSearchResult found =
          balance::search_swaps(layer, balance::choose_slots(layer), cap, 32);
      layer.phy2log = found.phy2log;
      const LayerTraffic after =
          balance::layer_traffic(layer, balance::choose_slots(layer), c.topology, 1, load);
      EXPECT_EQ(before.dispatch.cross_node - after.dispatch.cross_node, found.cross_node_rows_saved)
          << "layer " << l << ", " << c.describe();
      EXPECT_EQ(before.dispatch.same_node - after.dispatch.same_node, found.same_node_rows_saved)
          << "layer " << l << ", " << c.describe();
      EXPECT_LE(static_cast<double>(after.max_gpu_load),
                std::max(cap, static_cast<double>(before.max_gpu_load)))
          << "layer " << l << ", " << c.describe();
      num_searches_with_swaps += found.num_swaps > 0;
    }
  }
  if (!std::getenv("MOE_PLACEMENT_SEED")) {
    EXPECT_GT(num_searches_with_swaps, 20);
  }
}

TEST(PlacementOptimizer, Deterministic) {
  for (const uint64_t seed : placement_case_seeds(2000, 20)) {
    const PlacementCase c = random_placement_case(seed);
    const PlacementSearch search{.load_bound = c.load_bound};
    const PlacementResult first = optimize_placement(c.trace, c.start, c.topology, kRow, search);
    const PlacementResult second = optimize_placement(c.trace, c.start, c.topology, kRow, search);
    EXPECT_EQ(first.placement.phy2log, second.placement.phy2log) << c.describe();
    EXPECT_EQ(first.after.gpu_load, second.after.gpu_load) << c.describe();
    EXPECT_EQ(first.num_swaps, second.num_swaps) << c.describe();
  }
}

// DeepSeek-V3's routed experts (61 layers of 256, top-8) on 8 nodes of 8 GPUs with 8192 tokens
// per layer whose picks lean toward their node (half of them from its home experts) and toward
// popular experts. Starts: contiguous, and EPLB with 64 redundant slots.
TEST(PlacementOptimizer, DeepSeekV3SizesTimed) {
  const Topology topology{
      .num_nodes = 8, .gpus_per_node = 8, .intra_node_gbps = 160, .inter_node_gbps = 50};
  const TraceShape shape{.num_layers = 61,
                         .num_experts = 256,
                         .top_k = 8,
                         .tokens_per_layer = 8192,
                         .affinity = 0.5,
                         .zipf = 0.8,
                         .shuffle_homes = true};
  const RoutingTrace trace = synthetic_trace(shape, topology, 7);
  std::vector<int64_t> counts(static_cast<size_t>(61 * 256), 0);
  for (int64_t l = 0; l < 61; ++l) {
    for (const int32_t e : trace.layers[static_cast<size_t>(l)].topk_ids) {
      ++counts[static_cast<size_t>(l * 256 + e)];
    }
  }
  const ActivationRow row{.hidden_size = 7168, .bytes_per_value = 2};
  struct Start {
    const char* name;
    ExpertPlacement placement;
  };
  const Start starts[] = {
      {"contiguous, 256 slots", contiguous_placement(61, 256, 256, 64, 8)},
      {"EPLB, 320 slots",
       rebalance_experts(counts, 61, 256,
                         {.num_replicas = 320, .num_groups = 8, .num_nodes = 8, .num_gpus = 64})},
  };
  for (const Start& start : starts) {
    // CPU time next to wall time: the search is single-threaded, and the machine may be shared.
    const auto begin = std::chrono::steady_clock::now();
    const std::clock_t cpu_begin = std::clock();
    const PlacementResult result = optimize_placement(trace, start.placement, topology, row);
    const double cpu_seconds = static_cast<double>(std::clock() - cpu_begin) / CLOCKS_PER_SEC;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    ASSERT_TRUE(never_worse(start.placement, PlacementSearch{}.load_bound, result));
    fmt::print(
        "{}: {:.2f} s CPU ({:.2f} s wall), {} swaps; per step cross-node {:.2f} -> {:.2f} GB, "
        "same-node {:.2f} -> "
        "{:.2f} GB, worst skew {:.3f} -> {:.3f}, dispatch+combine {:.2f} -> {:.2f} ms\n",
        start.name, cpu_seconds, seconds, result.num_swaps, result.before.dispatch.cross_node / 1e9,
        result.after.dispatch.cross_node / 1e9, result.before.dispatch.same_node / 1e9,
        result.after.dispatch.same_node / 1e9, result.before.max_skew, result.after.max_skew,
        result.before.dispatch_combine_seconds() * 1e3,
        result.after.dispatch_combine_seconds() * 1e3);
  }
}

}  // namespace
}  // namespace moe
