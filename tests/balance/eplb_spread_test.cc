// rebalance_experts spreads each expert's replicas over distinct GPUs whenever it can: on random
// loads under both policies, on crowded layouts where bins fill unevenly, and on hand cases that
// show the rule at work and what it can cost.
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "balance/eplb_cases.h"
#include "moe/eplb.h"

namespace moe {
namespace {

using testing::crowded_eplb_case;
using testing::eplb_case_seeds;
using testing::EplbCase;
using testing::experts_per_gpu;
using testing::is_consistent_placement;
using testing::random_eplb_case;

// The GPUs an expert's replicas may use: its node's under the hierarchical policy (a group and
// all its replicas stay on one node), all of them under the global one.
int64_t gpus_in_scope(const EplbConfig& config) {
  return eplb_policy(config) == EplbPolicy::kHierarchical ? config.num_gpus / config.num_nodes
                                                          : config.num_gpus;
}

// No GPU holds two replicas of an expert that has at most one replica per GPU of its scope. With
// more replicas than that, some GPU must hold two, so nothing is required of those experts.
::testing::AssertionResult replicas_on_distinct_gpus(const ExpertPlacement& p,
                                                     int64_t num_gpus_in_scope) {
  const auto gpus = experts_per_gpu(p);
  for (int64_t layer = 0; layer < p.num_layers; ++layer) {
    for (int64_t g = 0; g < p.num_gpus; ++g) {
      const std::vector<int32_t>& experts =
          gpus[static_cast<size_t>(layer)][static_cast<size_t>(g)];
      for (size_t i = 1; i < experts.size(); ++i) {
        const int32_t e = experts[i];
        const int32_t count = p.logcnt[static_cast<size_t>(layer * p.num_logical_experts + e)];
        if (e == experts[i - 1] && count <= num_gpus_in_scope) {
          return ::testing::AssertionFailure() << fmt::format(
                     "layer {}: GPU {} holds two replicas of expert {}, which has {} replicas "
                     "for {} GPUs",
                     layer, g, e, count, num_gpus_in_scope);
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

void expect_spread(const EplbCase& c) {
  const ExpertPlacement p =
      rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, c.config);
  ASSERT_TRUE(is_consistent_placement(p, c.num_layers, c.num_logical_experts, c.config.num_replicas,
                                      c.config.num_gpus))
      << c.describe();
  ASSERT_TRUE(replicas_on_distinct_gpus(p, gpus_in_scope(c.config))) << c.describe();
}

TEST(EplbSpread, RandomCasesPutReplicasOnDistinctGpus) {
  for (const uint64_t seed : eplb_case_seeds(1, 2000)) expect_spread(random_eplb_case(seed));
}

// Passing over bins that hold the expert is not enough here: without the check that the experts
// still to come can spread, 9 of these 3000 cases put two replicas of an expert on one GPU.
TEST(EplbSpread, CrowdedCasesPutReplicasOnDistinctGpus) {
  for (const uint64_t seed : eplb_case_seeds(1, 3000)) expect_spread(crowded_eplb_case(seed));
}

// Two experts of load 4 on 2 GPUs of 2 slots: each gets a second replica (2 per replica). The
// earlier packing took the lightest GPU whatever it held: 0 -> GPU 0, 1 -> GPU 1, then the second
// replica of 0 to GPU 0 (a tie, the lower GPU) and of 1 to GPU 1, so each GPU held one expert twice
// and the replicas served no other GPU. Now the second replica of 0 passes over GPU 0.
TEST(EplbSpread, SecondReplicaPassesOverItsExpertsGpu) {
  const ExpertPlacement p =
      rebalance_experts(std::vector<double>{4, 4}, 1, 2, {.num_replicas = 4, .num_gpus = 2});
  EXPECT_EQ(p.logcnt, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(p.phy2log, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(gpu_load(p, std::vector<double>{4, 4}).load, (std::vector<double>{4, 4}));
}

// Loads 4 10 4 4 10 10 4 4 on 3 GPUs of 6 slots: experts 1, 4, 5 get 3 replicas (10/3 each), 0,
// 2, 3, 6 get 2 (2 each), 7 keeps 1 (4). Packed heaviest first, 7 and the three-replica experts
// leave GPU 0 with 4 items and GPUs 1 and 2 with 3 each. Passing over alone would then send 0, 2
// and 3 to GPUs 1 and 2, filling them, and both replicas of 6 into GPU 0's two free slots. The
// check sees that when it comes to 3 and packs 3 into the bins with the most free slots instead
// (GPU 0, then GPU 1, the lower of two equal ones), which leaves 6 one slot on GPU 0 and one on
// GPU 2.
TEST(EplbSpread, ExpertGoesWhereItLeavesRoomToSpread) {
  const std::vector<double> weight = {4, 10, 4, 4, 10, 10, 4, 4};
  const ExpertPlacement p = rebalance_experts(weight, 1, 8, {.num_replicas = 18, .num_gpus = 3});
  EXPECT_EQ(p.logcnt, (std::vector<int32_t>{2, 3, 2, 2, 3, 3, 2, 1}));
  EXPECT_EQ(p.phy2log, (std::vector<int32_t>{7, 1, 4, 5, 3, 6,  //
                                             1, 4, 5, 0, 2, 3,  //
                                             1, 4, 5, 0, 2, 6}));
  EXPECT_TRUE(replicas_on_distinct_gpus(p, 3));
}

// Spreading can cost balance. Loads 0, 6, 6 on 2 GPUs of 2 slots: expert 1 gets the spare slot
// (3 per replica). Packing 2 (6) on GPU 0 and both halves of 1 on GPU 1 gives 6 and 6; with the
// halves on distinct GPUs one of them joins expert 2: 9 and 3.
TEST(EplbSpread, SpreadingCanCostBalance) {
  const std::vector<double> weight = {0, 6, 6};
  const ExpertPlacement p = rebalance_experts(weight, 1, 3, {.num_replicas = 4, .num_gpus = 2});
  EXPECT_EQ(p.phy2log, (std::vector<int32_t>{2, 1, 1, 0}));
  EXPECT_EQ(gpu_load(p, weight).load, (std::vector<double>{9, 3}));
}

// Under the hierarchical policy the scope is the node: expert 0 (load 90) takes 3 of its node's 4
// slots on 2 GPUs, so one GPU must hold two of its replicas, while a node's expert with 2
// replicas on 2 GPUs gets both.
TEST(EplbSpread, HierarchicalScopeIsTheNode) {
  const std::vector<double> weight = {90, 5, 3, 2};
  const EplbConfig config{.num_replicas = 8, .num_groups = 2, .num_nodes = 2, .num_gpus = 4};
  const ExpertPlacement p = rebalance_experts(weight, 1, 4, config);
  EXPECT_EQ(p.logcnt, (std::vector<int32_t>{3, 1, 2, 2}));
  EXPECT_EQ(p.phy2log, (std::vector<int32_t>{0, 0, 0, 1, 2, 3, 2, 3}));
  EXPECT_TRUE(replicas_on_distinct_gpus(p, gpus_in_scope(config)));
  EXPECT_FALSE(replicas_on_distinct_gpus(p, config.num_gpus));
}

}  // namespace
}  // namespace moe
