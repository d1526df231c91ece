// rebalance_experts: DeepSeek's README example exactly, the properties that define a placement on
// random loads under both policies, determinism, per-GPU load, the start placements, and the time
// of a DeepSeek-V3-sized problem (printed, never asserted).
#include "moe/eplb.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "balance/eplb_cases.h"

namespace moe {
namespace {

using testing::eplb_case_seeds;
using testing::EplbCase;
using testing::is_consistent_placement;
using testing::random_eplb_case;

// The example of github.com/deepseek-ai/EPLB's README: 2 layers of 12 experts in 4 groups, 16
// slots on 2 nodes of 4 GPUs (hierarchical). The README prints only phy2log; the replica counts
// are how often each expert appears in it.
TEST(EplbRebalance, ReadmeExample) {
  const std::vector<int64_t> weight = {
      90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,  // layer 0
      20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27,  // layer 1
  };
  const EplbConfig config{.num_replicas = 16, .num_groups = 4, .num_nodes = 2, .num_gpus = 8};
  ASSERT_EQ(eplb_policy(config), EplbPolicy::kHierarchical);
  const ExpertPlacement p = rebalance_experts(weight, 2, 12, config);

  EXPECT_EQ(p.phy2log, (std::vector<int32_t>{5, 6,  5, 7, 8, 4,  3, 4, 10, 9, 10, 2, 0, 1, 11, 1,
                                             7, 10, 6, 8, 6, 11, 8, 9, 2,  4, 5,  1, 5, 0, 3,  1}));
  EXPECT_EQ(p.logcnt, (std::vector<int32_t>{1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1,
                                            1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1}));
  EXPECT_EQ(p.max_replicas, 2);
  EXPECT_TRUE(is_consistent_placement(p, 2, 12, 16, 8));
}

// The reference falls back to one group on one node when groups do not divide over the nodes.
TEST(EplbRebalance, GlobalPolicyIgnoresGroupsAndNodes) {
  for (const uint64_t seed : eplb_case_seeds(1000, 200)) {
    EplbCase c = random_eplb_case(seed);
    if (c.config.num_nodes == 1) continue;  // every group count divides one node
    c.config.num_groups = c.num_logical_experts % 3 == 0 && c.config.num_nodes % 3 != 0 ? 3 : 1;
    if (c.config.num_groups % c.config.num_nodes == 0) continue;
    ASSERT_EQ(eplb_policy(c.config), EplbPolicy::kGlobal);
    const ExpertPlacement p =
        rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, c.config);
    EplbConfig flat = c.config;
    flat.num_groups = 1;
    flat.num_nodes = 1;
    const ExpertPlacement q =
        rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, flat);
    EXPECT_EQ(p.phy2log, q.phy2log) << c.describe();
    EXPECT_EQ(p.replica_rank, q.replica_rank) << c.describe();
    EXPECT_EQ(p.logcnt, q.logcnt) << c.describe();
    EXPECT_EQ(p.num_nodes, c.config.num_nodes);
  }
}

// Under the hierarchical policy a group and all replicas of its experts share one node.
::testing::AssertionResult groups_stay_on_one_node(const EplbCase& c, const ExpertPlacement& p) {
  const int64_t group_size = c.num_logical_experts / c.config.num_groups;
  const int64_t slots_per_node = c.config.num_replicas / c.config.num_nodes;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    std::vector<int64_t> node_of_group(static_cast<size_t>(c.config.num_groups), -1);
    for (int64_t s = 0; s < c.config.num_replicas; ++s) {
      const int64_t group =
          p.phy2log[static_cast<size_t>(layer * c.config.num_replicas + s)] / group_size;
      int64_t& node = node_of_group[static_cast<size_t>(group)];
      if (node == -1) node = s / slots_per_node;
      if (node != s / slots_per_node) {
        return ::testing::AssertionFailure() << fmt::format("layer {}: group {} on nodes {} and {}",
                                                            layer, group, node, s / slots_per_node);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// What the greedy replication guarantees: an expert got its last replica while its load per
// replica was the largest, and every ratio only falls afterwards, so
// load[b] / (count[b] - 1) >= load[a] / count[a] for all experts a, b sharing the slots (a node
// under the hierarchical policy, every expert under the global one).
::testing::AssertionResult replication_is_greedy(const EplbCase& c, const ExpertPlacement& p) {
  const bool hierarchical = eplb_policy(c.config) == EplbPolicy::kHierarchical;
  const int64_t num_nodes = hierarchical ? c.config.num_nodes : 1;
  const int64_t slots_per_node = c.config.num_replicas / num_nodes;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const double* w = c.weight.data() + layer * c.num_logical_experts;
    const int32_t* count = p.logcnt.data() + layer * c.num_logical_experts;
    for (int64_t node = 0; node < num_nodes; ++node) {
      std::vector<int32_t> experts;
      for (int64_t s = node * slots_per_node; s < (node + 1) * slots_per_node; ++s) {
        experts.push_back(p.phy2log[static_cast<size_t>(layer * c.config.num_replicas + s)]);
      }
      double largest_ratio = 0;
      for (const int32_t a : experts) largest_ratio = std::max(largest_ratio, w[a] / count[a]);
      for (const int32_t b : experts) {
        if (count[b] > 1 && w[b] / (count[b] - 1) < largest_ratio) {
          return ::testing::AssertionFailure() << fmt::format(
                     "layer {}: expert {} (load {}) has {} replicas, yet some expert carries {} "
                     "per replica",
                     layer, b, w[b], count[b], largest_ratio);
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(EplbRebalance, RandomCasesHoldEveryProperty) {
  for (const uint64_t seed : eplb_case_seeds(1, 2000)) {
    const EplbCase c = random_eplb_case(seed);
    const ExpertPlacement p =
        rebalance_experts(c.counts, c.num_layers, c.num_logical_experts, c.config);
    ASSERT_TRUE(is_consistent_placement(p, c.num_layers, c.num_logical_experts,
                                        c.config.num_replicas, c.config.num_gpus))
        << c.describe();
    ASSERT_TRUE(replication_is_greedy(c, p)) << c.describe();
    if (eplb_policy(c.config) == EplbPolicy::kHierarchical) {
      ASSERT_TRUE(groups_stay_on_one_node(c, p)) << c.describe();
    }

    // Token counts and the same loads as double give the same placement.
    const ExpertPlacement q =
        rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, c.config);
    ASSERT_EQ(p.phy2log, q.phy2log) << c.describe();
    ASSERT_EQ(p.log2phy, q.log2phy) << c.describe();

    // With one slot per GPU and replication over every slot (global policy, or one node), a GPU's
    // load is one replica's, and the greedy replication minimizes the largest replica load: no
    // placement of the same slots does better, experts laid out in order included. Beyond that
    // case, beating the contiguous layout is typical but not guaranteed (see
    // HierarchicalTradesBalanceForLocality and DeepSeekV3SizesBeatContiguous).
    const bool one_scope = eplb_policy(c.config) == EplbPolicy::kGlobal || c.config.num_nodes == 1;
    if (one_scope && c.config.num_replicas == c.config.num_gpus) {
      const GpuLoad balanced = gpu_load(p, c.weight);
      const GpuLoad naive =
          gpu_load(contiguous_placement(c.num_layers, c.num_logical_experts, c.config.num_replicas,
                                        c.config.num_gpus, c.config.num_nodes),
                   c.weight);
      for (size_t l = 0; l < static_cast<size_t>(c.num_layers); ++l) {
        ASSERT_LE(balanced.max[l], naive.max[l]) << "layer " << l << ": " << c.describe();
      }
    }
  }
}

TEST(EplbRebalance, SameInputSameOutput) {
  for (const uint64_t seed : eplb_case_seeds(5000, 200)) {
    const EplbCase c = random_eplb_case(seed);
    const ExpertPlacement a =
        rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, c.config);
    const ExpertPlacement b =
        rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, c.config);
    ASSERT_EQ(a.phy2log, b.phy2log) << c.describe();
    ASSERT_EQ(a.replica_rank, b.replica_rank) << c.describe();
    ASSERT_EQ(a.log2phy, b.log2phy) << c.describe();
    ASSERT_EQ(a.logcnt, b.logcnt) << c.describe();
  }
}

// 4 experts with loads 8, 4, 2, 2 on 3 GPUs of 2 slots; experts 0 and 1 have two replicas each.
TEST(EplbGpuLoad, HandExample) {
  const std::vector<int32_t> phy2log = {0, 3, 0, 2, 1, 1};
  const ExpertPlacement p = placement_from_phy2log(phy2log, 1, 4, 3);
  const GpuLoad load = gpu_load(p, std::vector<double>{8, 4, 2, 2});
  EXPECT_EQ(load.load, (std::vector<double>{8.0 / 2 + 2, 8.0 / 2 + 2, 4.0 / 2 + 4.0 / 2}));
  EXPECT_EQ(load.max, (std::vector<double>{6}));
  EXPECT_EQ(load.mean, (std::vector<double>{16.0 / 3}));
}

TEST(EplbPlacement, ContiguousLayout) {
  const ExpertPlacement p = contiguous_placement(2, 4, 6, 3);
  EXPECT_EQ(p.phy2log, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(p.replica_rank, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(p.logcnt, (std::vector<int32_t>{2, 2, 1, 1, 2, 2, 1, 1}));
  EXPECT_EQ(p.max_replicas, 2);
  EXPECT_EQ(p.log2phy, (std::vector<int32_t>{0, 4, 1, 5, 2, -1, 3, -1,  //
                                             0, 4, 1, 5, 2, -1, 3, -1}));
  EXPECT_TRUE(is_consistent_placement(p, 2, 4, 6, 3));
}

// Ties break toward the lower index everywhere: the first of equally loaded experts gets the next
// replica (torch.max returns the first maximum), equal items pack in expert order, an expert's
// replicas together (where the reference's unstable sort leaves the order to its implementation),
// and the first of equally light GPUs takes the next item.
TEST(EplbRebalance, TiesBreakTowardLowerIndex) {
  const EplbConfig config{.num_replicas = 4, .num_groups = 1, .num_nodes = 1, .num_gpus = 2};
  const ExpertPlacement equal = rebalance_experts(std::vector<double>{4, 4, 4, 4}, 1, 4, config);
  EXPECT_EQ(equal.phy2log, (std::vector<int32_t>{0, 2, 1, 3}));
  const ExpertPlacement replicated =
      rebalance_experts(std::vector<double>{6, 6, 6}, 1, 3, {.num_replicas = 4, .num_gpus = 1});
  EXPECT_EQ(replicated.logcnt, (std::vector<int32_t>{2, 1, 1}));
  // One GPU still sorts its slots by load: the halves of expert 0 come last.
  EXPECT_EQ(replicated.phy2log, (std::vector<int32_t>{1, 2, 0, 0}));
}

// The hierarchical policy keeps a group's replicas on its node, which can cost balance. Loads
// 90, 5, 3, 2 in groups {0, 1} and {2, 3}; 8 slots on 2 nodes of 2 GPUs with 2 slots each.
// Hierarchical: node 0 holds group 0 alone and replicates expert 0 into 3 of its 4 slots (30
// each), so one GPU carries two of them: loads 60, 35, 2.5, 2.5. Contiguous (0 1 2 3 0 1 2 3):
// expert 0 in two halves of 45 on GPUs 0 and 2, loads 47.5, 2.5, 47.5, 2.5. Global: expert 0 gets
// 5 replicas of 18: loads 36, 23, 21, 20.
TEST(EplbRebalance, HierarchicalTradesBalanceForLocality) {
  const std::vector<double> weight = {90, 5, 3, 2};
  const EplbConfig hierarchical{.num_replicas = 8, .num_groups = 2, .num_nodes = 2, .num_gpus = 4};
  const ExpertPlacement h = rebalance_experts(weight, 1, 4, hierarchical);
  EXPECT_EQ(h.phy2log, (std::vector<int32_t>{0, 0, 0, 1, 2, 3, 2, 3}));
  EXPECT_EQ(h.replica_rank, (std::vector<int32_t>{0, 2, 1, 0, 0, 0, 1, 1}));
  EXPECT_EQ(gpu_load(h, weight).load, (std::vector<double>{60, 35, 2.5, 2.5}));
  EXPECT_EQ(gpu_load(contiguous_placement(1, 4, 8, 4, 2), weight).load,
            (std::vector<double>{47.5, 2.5, 47.5, 2.5}));

  EplbConfig global = hierarchical;
  global.num_groups = 1;
  global.num_nodes = 1;
  const ExpertPlacement g = rebalance_experts(weight, 1, 4, global);
  EXPECT_EQ(g.phy2log, (std::vector<int32_t>{0, 0, 0, 1, 0, 2, 0, 3}));
  EXPECT_EQ(gpu_load(g, weight).load, (std::vector<double>{36, 23, 21, 20}));
}

// Zipf-like token counts (exponent `skew`; 0 gives equal loads), a fresh popularity order per
// layer.
std::vector<double> skewed_loads(int64_t num_layers, int64_t num_experts, uint64_t seed,
                                 double skew) {
  std::mt19937_64 rng(seed);
  std::vector<double> weight(static_cast<size_t>(num_layers * num_experts));
  std::vector<int64_t> rank(static_cast<size_t>(num_experts));
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    for (int64_t e = 0; e < num_experts; ++e) rank[static_cast<size_t>(e)] = e;
    std::shuffle(rank.begin(), rank.end(), rng);
    for (int64_t e = 0; e < num_experts; ++e) {
      weight[static_cast<size_t>(layer * num_experts + e)] =
          std::floor(1e6 / std::pow(1.0 + rank[static_cast<size_t>(e)], skew) +
                     static_cast<double>(rng() % 1000));
    }
  }
  return weight;
}

// DeepSeek-V3 sizes: 61 layers of 256 routed experts in 8 groups. Decode as DeepSeek deploys it,
// EP320: 320 GPUs on 40 nodes, one slot each, so 64 redundant slots (8 groups do not divide over
// 40 nodes: global policy). Prefill, EP32: 32 GPUs on 4 nodes, 9 slots each, so 32 redundant
// (hierarchical). Times are printed for the record; tests never assert on time (bench/ has the
// measured figure).
TEST(EplbRebalance, DeepSeekV3SizesTimed) {
  constexpr int64_t kLayers = 61;
  constexpr int64_t kExperts = 256;
  const std::vector<double> weight = skewed_loads(kLayers, kExperts, 7, 0.8);
  struct Deployment {
    const char* name;
    EplbConfig config;
  };
  const Deployment deployments[] = {
      {"decode EP320", {.num_replicas = 320, .num_groups = 8, .num_nodes = 40, .num_gpus = 320}},
      {"prefill EP32", {.num_replicas = 288, .num_groups = 8, .num_nodes = 4, .num_gpus = 32}},
  };
  for (const Deployment& d : deployments) {
    const auto start = std::chrono::steady_clock::now();
    const ExpertPlacement p = rebalance_experts(weight, kLayers, kExperts, d.config);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(
        is_consistent_placement(p, kLayers, kExperts, d.config.num_replicas, d.config.num_gpus));
    const GpuLoad after = gpu_load(p, weight);
    const GpuLoad before = gpu_load(contiguous_placement(kLayers, kExperts, d.config.num_replicas,
                                                         d.config.num_gpus, d.config.num_nodes),
                                    weight);
    double imbalance_before = 0;
    double imbalance_after = 0;
    for (size_t l = 0; l < kLayers; ++l) {
      imbalance_before += before.max[l] / before.mean[l] / kLayers;
      imbalance_after += after.max[l] / after.mean[l] / kLayers;
    }
    fmt::print("{} ({}): {:.2f} ms; mean max/mean GPU load {:.3f} contiguous -> {:.3f}\n", d.name,
               policy_name(eplb_policy(d.config)), ms, imbalance_before, imbalance_after);
  }
}

// At deployment sizes the greedy beats the contiguous layout on every layer, from equal loads to
// a steep Zipf, in both policies and with wide redundancy.
TEST(EplbRebalance, DeepSeekV3SizesBeatContiguous) {
  constexpr int64_t kLayers = 61;
  constexpr int64_t kExperts = 256;
  const EplbConfig configs[] = {
      {.num_replicas = 320, .num_groups = 8, .num_nodes = 40, .num_gpus = 320},
      {.num_replicas = 640, .num_groups = 8, .num_nodes = 40, .num_gpus = 320},
      {.num_replicas = 288, .num_groups = 8, .num_nodes = 4, .num_gpus = 32},
      {.num_replicas = 256, .num_groups = 8, .num_nodes = 4, .num_gpus = 32},
  };
  for (const EplbConfig& config : configs) {
    for (const double skew : {0.0, 0.8, 2.0}) {
      for (const uint64_t seed : {1, 2}) {
        const std::vector<double> weight = skewed_loads(kLayers, kExperts, seed, skew);
        const GpuLoad balanced =
            gpu_load(rebalance_experts(weight, kLayers, kExperts, config), weight);
        const GpuLoad contiguous =
            gpu_load(contiguous_placement(kLayers, kExperts, config.num_replicas, config.num_gpus,
                                          config.num_nodes),
                     weight);
        for (size_t l = 0; l < kLayers; ++l) {
          ASSERT_LE(balanced.max[l], contiguous.max[l])
              << fmt::format("layer {}, skew {}, seed {}, {} slots on {} GPUs", l, skew, seed,
                             config.num_replicas, config.num_gpus);
        }
      }
    }
  }
}

}  // namespace
}  // namespace moe
