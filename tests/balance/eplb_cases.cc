#include "balance/eplb_cases.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include <fmt/format.h>

namespace moe::testing {
namespace {

template <typename... Args>
::testing::AssertionResult failure(fmt::format_string<Args...> format, Args&&... args) {
  return ::testing::AssertionFailure() << fmt::format(format, std::forward<Args>(args)...);
}

}  // namespace

std::string EplbCase::describe() const {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return fmt::format(
      "seed {}: {} layers, {} experts in {} groups, {} slots on {} GPUs in {} nodes ({}), {} "
      "loads; reproduce with: MOE_EPLB_SEED={} moe_tests --gtest_filter={}.{}",
      seed, num_layers, num_logical_experts, config.num_groups, config.num_replicas,
      config.num_gpus, config.num_nodes, policy_name(eplb_policy(config)), distribution, seed,
      test->test_suite_name(), test->name());
}

EplbCase random_eplb_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  EplbCase c;
  c.seed = seed;
  c.config.num_nodes = uniform(1, 4);
  c.config.num_gpus = c.config.num_nodes * uniform(1, 6);
  // Half the cases make groups divide over nodes (hierarchical); the rest take any group count,
  // which is global whenever it does not divide.
  c.config.num_groups = uniform(0, 1) == 0 ? c.config.num_nodes * uniform(1, 4) : uniform(1, 8);
  c.num_logical_experts = c.config.num_groups * uniform(1, 6);
  const int64_t min_slots_per_gpu =
      (c.num_logical_experts + c.config.num_gpus - 1) / c.config.num_gpus;
  c.config.num_replicas = (min_slots_per_gpu + uniform(0, 3)) * c.config.num_gpus;
  c.num_layers = uniform(1, 4);

  const int64_t num_experts = c.num_logical_experts;
  c.counts.resize(static_cast<size_t>(c.num_layers * num_experts));
  const int64_t kind = uniform(0, 4);
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    int64_t* row = c.counts.data() + layer * num_experts;
    switch (kind) {
      case 0:
        c.distribution = "uniform";
        for (int64_t e = 0; e < num_experts; ++e) row[e] = uniform(0, 1000);
        break;
      case 1: {
        c.distribution = "zipf";
        std::vector<int64_t> rank(static_cast<size_t>(num_experts));
        std::iota(rank.begin(), rank.end(), 0);
        std::shuffle(rank.begin(), rank.end(), rng);
        for (int64_t e = 0; e < num_experts; ++e) {
          row[e] =
              static_cast<int64_t>(10000.0 / std::pow(1.0 + rank[static_cast<size_t>(e)], 1.2));
        }
        break;
      }
      case 2:
        c.distribution = "one hot expert";
        for (int64_t e = 0; e < num_experts; ++e) row[e] = uniform(0, 10);
        row[uniform(0, num_experts - 1)] = 100 * num_experts;
        break;
      case 3:
        c.distribution = "all zero";
        std::fill(row, row + num_experts, 0);
        break;
      default:
        c.distribution = "few distinct values";
        for (int64_t e = 0; e < num_experts; ++e) row[e] = 6 * uniform(0, 3);
    }
  }
  c.weight.assign(c.counts.begin(), c.counts.end());
  return c;
}

EplbCase crowded_eplb_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  EplbCase c;
  c.seed = seed;
  c.config.num_nodes = uniform(1, 3);
  c.config.num_gpus = c.config.num_nodes * uniform(2, 4);
  // One group per node (hierarchical) or one group in all (global, unless there is one node).
  c.config.num_groups = uniform(0, 1) == 0 ? c.config.num_nodes : 1;
  c.config.num_replicas = c.config.num_gpus * uniform(4, 8);
  const int64_t slots_per_group = c.config.num_replicas / c.config.num_groups;
  c.num_logical_experts =
      c.config.num_groups * uniform(slots_per_group / 3, slots_per_group * 2 / 3);
  c.num_layers = uniform(1, 4);
  const int64_t num_values = uniform(2, 3);
  c.distribution = fmt::format("crowded, loads 1..{}", num_values);
  c.counts.resize(static_cast<size_t>(c.num_layers * c.num_logical_experts));
  for (int64_t& count : c.counts) count = uniform(1, num_values);
  c.weight.assign(c.counts.begin(), c.counts.end());
  return c;
}

std::vector<uint64_t> eplb_case_seeds(uint64_t first, int count) {
  if (const char* only = std::getenv("MOE_EPLB_SEED")) return {std::stoull(only)};
  std::vector<uint64_t> seeds(static_cast<size_t>(count));
  std::iota(seeds.begin(), seeds.end(), first);
  return seeds;
}

::testing::AssertionResult is_consistent_placement(const ExpertPlacement& p, int64_t num_layers,
                                                   int64_t num_logical_experts,
                                                   int64_t num_replicas, int64_t num_gpus) {
  if (p.num_layers != num_layers || p.num_logical_experts != num_logical_experts ||
      p.num_replicas != num_replicas || p.num_gpus != num_gpus) {
    return failure("sizes: {} layers, {} experts, {} slots, {} GPUs", p.num_layers,
                   p.num_logical_experts, p.num_replicas, p.num_gpus);
  }
  const int64_t num_experts = num_logical_experts;
  if (static_cast<int64_t>(p.phy2log.size()) != num_layers * num_replicas ||
      p.replica_rank.size() != p.phy2log.size() ||
      static_cast<int64_t>(p.logcnt.size()) != num_layers * num_experts ||
      static_cast<int64_t>(p.log2phy.size()) != num_layers * num_experts * p.max_replicas) {
    return failure("table sizes: phy2log {}, replica_rank {}, logcnt {}, log2phy {}",
                   p.phy2log.size(), p.replica_rank.size(), p.logcnt.size(), p.log2phy.size());
  }
  int32_t largest = 0;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const int32_t* phy2log = p.phy2log.data() + layer * num_replicas;
    const int32_t* rank = p.replica_rank.data() + layer * num_replicas;
    const int32_t* logcnt = p.logcnt.data() + layer * num_experts;
    const int32_t* log2phy = p.log2phy.data() + layer * num_experts * p.max_replicas;
    std::vector<int32_t> counted(static_cast<size_t>(num_experts), 0);
    for (int64_t s = 0; s < num_replicas; ++s) {
      if (phy2log[s] < 0 || phy2log[s] >= num_experts) {
        return failure("layer {} slot {} holds {}", layer, s, phy2log[s]);
      }
      ++counted[static_cast<size_t>(phy2log[s])];
    }
    int64_t total = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (logcnt[e] < 1) return failure("layer {}: expert {} has {} replicas", layer, e, logcnt[e]);
      if (logcnt[e] != counted[static_cast<size_t>(e)]) {
        return failure("layer {}: logcnt[{}] = {} but {} slots hold it", layer, e, logcnt[e],
                       counted[static_cast<size_t>(e)]);
      }
      total += logcnt[e];
      largest = std::max(largest, logcnt[e]);
    }
    if (total != num_replicas) return failure("layer {}: counts sum to {}", layer, total);

    // log2phy lists every slot exactly once, at (its expert, its rank), and pads with -1.
    std::vector<int32_t> listed(static_cast<size_t>(num_replicas), 0);
    std::vector<int32_t> slots_on_gpu(static_cast<size_t>(num_gpus), 0);
    for (int64_t e = 0; e < num_experts; ++e) {
      for (int64_t r = 0; r < p.max_replicas; ++r) {
        const int32_t slot = log2phy[e * p.max_replicas + r];
        if (r >= logcnt[e]) {
          if (slot != -1)
            return failure("layer {}: log2phy[{}][{}] = {}, not -1", layer, e, r, slot);
          continue;
        }
        if (slot < 0 || slot >= num_replicas || phy2log[slot] != e || rank[slot] != r) {
          return failure("layer {}: log2phy[{}][{}] = {} does not hold replica {} of {}", layer, e,
                         r, slot, r, e);
        }
        ++listed[static_cast<size_t>(slot)];
        ++slots_on_gpu[static_cast<size_t>(slot / (num_replicas / num_gpus))];
      }
    }
    for (int64_t s = 0; s < num_replicas; ++s) {
      if (listed[static_cast<size_t>(s)] != 1) {
        return failure("layer {}: slot {} listed {} times in log2phy", layer, s,
                       listed[static_cast<size_t>(s)]);
      }
    }
    for (int64_t g = 0; g < num_gpus; ++g) {
      if (slots_on_gpu[static_cast<size_t>(g)] != num_replicas / num_gpus) {
        return failure("layer {}: GPU {} has {} slots", layer, g,
                       slots_on_gpu[static_cast<size_t>(g)]);
      }
    }
  }
  if (p.max_replicas != largest) {
    return failure("max_replicas {} but the largest count is {}", p.max_replicas, largest);
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::vector<std::vector<int32_t>>> experts_per_gpu(const ExpertPlacement& p) {
  const int64_t slots_per_gpu = p.num_replicas / p.num_gpus;
  std::vector<std::vector<std::vector<int32_t>>> result(static_cast<size_t>(p.num_layers));
  for (int64_t layer = 0; layer < p.num_layers; ++layer) {
    auto& gpus = result[static_cast<size_t>(layer)];
    gpus.resize(static_cast<size_t>(p.num_gpus));
    for (int64_t s = 0; s < p.num_replicas; ++s) {
      gpus[static_cast<size_t>(s / slots_per_gpu)].push_back(
          p.phy2log[static_cast<size_t>(layer * p.num_replicas + s)]);
    }
    for (auto& experts : gpus) std::sort(experts.begin(), experts.end());
  }
  return result;
}

}  // namespace moe::testing
