#include "balance/placement_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace moe::testing {
namespace {

// Per layer, one seeded generator draws the homes first and the popularity second, so
// home_nodes can replay the homes alone.
std::mt19937_64 layer_rng(uint64_t seed, int64_t layer) {
  return std::mt19937_64(seed * 1'000'003 + static_cast<uint64_t>(layer));
}

std::vector<int64_t> draw_homes(const TraceShape& shape, const Topology& topology,
                                std::mt19937_64& rng) {
  std::vector<int64_t> order(static_cast<size_t>(shape.num_experts));
  std::iota(order.begin(), order.end(), 0);
  if (shape.shuffle_homes) std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> home(static_cast<size_t>(shape.num_experts));
  for (int64_t i = 0; i < shape.num_experts; ++i) {
    home[static_cast<size_t>(order[static_cast<size_t>(i)])] =
        i * topology.num_nodes / shape.num_experts;
  }
  return home;
}

}  // namespace

std::vector<int64_t> home_nodes(const TraceShape& shape, const Topology& topology, uint64_t seed,
                                int64_t layer) {
  std::mt19937_64 rng = layer_rng(seed, layer);
  return draw_homes(shape, topology, rng);
}

RoutingTrace synthetic_trace(const TraceShape& shape, const Topology& topology, uint64_t seed) {
  RoutingTrace trace;
  trace.num_layers = shape.num_layers;
  trace.num_experts = shape.num_experts;
  trace.top_k = shape.top_k;
  trace.layers.resize(static_cast<size_t>(shape.num_layers));
  const int64_t num_experts = shape.num_experts;
  for (int64_t l = 0; l < shape.num_layers; ++l) {
    std::mt19937_64 rng = layer_rng(seed, l);
    const std::vector<int64_t> home = draw_homes(shape, topology, rng);
    std::vector<double> popularity(static_cast<size_t>(num_experts));
    std::vector<int64_t> rank(static_cast<size_t>(num_experts));
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), rng);
    for (int64_t e = 0; e < num_experts; ++e) {
      popularity[static_cast<size_t>(e)] =
          1.0 / std::pow(1.0 + static_cast<double>(rank[static_cast<size_t>(e)]), shape.zipf);
    }
    std::discrete_distribution<int32_t> anywhere(popularity.begin(), popularity.end());
    // A node without home experts (fewer experts than nodes) picks from all of them.
    std::vector<std::discrete_distribution<int32_t>> at_home;
    for (int64_t n = 0; n < topology.num_nodes; ++n) {
      std::vector<double> weights(popularity);
      for (int64_t e = 0; e < num_experts; ++e) {
        if (home[static_cast<size_t>(e)] != n) weights[static_cast<size_t>(e)] = 0;
      }
      if (std::find(home.begin(), home.end(), n) == home.end()) weights = popularity;
      at_home.emplace_back(weights.begin(), weights.end());
    }
    std::bernoulli_distribution from_home(shape.affinity);

    TraceLayer& layer = trace.layers[static_cast<size_t>(l)];
    layer.topk_ids.resize(static_cast<size_t>(shape.tokens_per_layer * shape.top_k));
    for (int64_t t = 0; t < shape.tokens_per_layer; ++t) {
      const int64_t node = (t % topology.num_gpus()) / topology.gpus_per_node;
      int32_t* ids = layer.topk_ids.data() + t * shape.top_k;
      for (int64_t j = 0; j < shape.top_k; ++j) {
        // A small home block may run out of fresh experts; the whole set never does (k <= E).
        for (int attempt = 0;; ++attempt) {
          const bool home_pick = attempt < 16 && from_home(rng);
          ids[j] = home_pick ? at_home[static_cast<size_t>(node)](rng) : anywhere(rng);
          if (std::find(ids, ids + j, ids[j]) == ids + j) break;
          if (attempt > 64) {
            ids[j] = 0;
            while (std::find(ids, ids + j, ids[j]) != ids + j) ++ids[j];
            break;
          }
        }
      }
    }
  }
  assign_sources_round_robin(trace, topology.num_gpus());
  return trace;
}

std::string PlacementCase::describe() const {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format(
      "seed {}: {} layers, {} experts, top_k {}, {} tokens in layer 0, {} slots on {} nodes x {} "
      "GPUs, {} start, load_bound {}; reproduce with: MOE_PLACEMENT_SEED={} moe_tests "
      "--gtest_filter={}.{}",
      seed, trace.num_layers, trace.num_experts, trace.top_k, trace.layers[0].source_gpu.size(),
      start.num_replicas, topology.num_nodes, topology.gpus_per_node, start_kind, load_bound, seed,
      test->test_suite_name(), test->name());
}

PlacementCase random_placement_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  PlacementCase c;
  c.seed = seed;
  c.topology = {.num_nodes = uniform(1, 3),
                .gpus_per_node = uniform(1, 4),
                .intra_node_gbps = 150,
                .inter_node_gbps = 50};
  const int64_t num_gpus = c.topology.num_gpus();
  TraceShape shape;
  shape.num_layers = uniform(1, 3);
  shape.num_experts = num_gpus * uniform(1, 4) - uniform(0, num_gpus - 1);
  shape.top_k = uniform(1, std::min<int64_t>(6, shape.num_experts));
  shape.tokens_per_layer = uniform(0, 300);
  shape.affinity = static_cast<double>(uniform(0, 10)) / 10;
  shape.zipf = static_cast<double>(uniform(0, 12)) / 10;
  shape.shuffle_homes = uniform(0, 1) == 1;
  c.trace = synthetic_trace(shape, c.topology, seed);

  const int64_t min_slots_per_gpu = (shape.num_experts + num_gpus - 1) / num_gpus;
  const int64_t num_slots = (min_slots_per_gpu + uniform(0, 2)) * num_gpus;
  const int64_t kind = uniform(0, 2);
  if (kind == 1) {
    c.start_kind = "eplb";
    std::vector<int64_t> counts(static_cast<size_t>(shape.num_layers * shape.num_experts), 0);
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      for (const int32_t e : c.trace.layers[static_cast<size_t>(l)].topk_ids) {
        ++counts[static_cast<size_t>(l * shape.num_experts + e)];
      }
    }
    c.start = rebalance_experts(counts, shape.num_layers, shape.num_experts,
                                {.num_replicas = num_slots,
                                 .num_groups = 1,
                                 .num_nodes = c.topology.num_nodes,
                                 .num_gpus = num_gpus});
  } else {
    c.start = contiguous_placement(shape.num_layers, shape.num_experts, num_slots, num_gpus,
                                   c.topology.num_nodes);
    c.start_kind = "contiguous";
    if (kind == 2) {
      c.start_kind = "shuffled";
      std::vector<int32_t> phy2log = c.start.phy2log;
      for (int64_t l = 0; l < shape.num_layers; ++l) {
        std::shuffle(phy2log.begin() + l * num_slots, phy2log.begin() + (l + 1) * num_slots, rng);
      }
      c.start = placement_from_phy2log(phy2log, shape.num_layers, shape.num_experts, num_gpus,
                                       c.topology.num_nodes);
    }
  }
  const double bounds[] = {1.0, 1.05, 1.1, 1.3, 2.0};
  c.load_bound = bounds[uniform(0, 4)];
  return c;
}

std::vector<uint64_t> placement_case_seeds(uint64_t first, int count) {
  if (const char* only = std::getenv("MOE_PLACEMENT_SEED")) return {std::stoull(only)};
  std::vector<uint64_t> seeds(static_cast<size_t>(count));
  std::iota(seeds.begin(), seeds.end(), first);
  return seeds;
}

}  // namespace moe::testing
