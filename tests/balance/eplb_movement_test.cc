// plan_expert_movement: nothing moves when nothing changes, a reshuffle within GPUs moves nothing,
// and on random pairs of placements every transfer is needed, none is missing, bytes count them,
// and the reordered target keeps as many slots as any order could.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "balance/eplb_cases.h"
#include "moe/eplb.h"

namespace moe {
namespace {

using testing::eplb_case_seeds;
using testing::EplbCase;
using testing::experts_per_gpu;
using testing::is_consistent_placement;
using testing::random_eplb_case;

constexpr int64_t kBytesPerExpert = 44'040'192;  // DeepSeek-V3, fp8: 3 * 7168 * 2048 bytes

TEST(EplbMovement, IdentityWhenPlacementUnchanged) {
  for (const uint64_t seed : eplb_case_seeds(1, 300)) {
    const EplbCase c = random_eplb_case(seed);
    const ExpertPlacement p =
        rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, c.config);
    const MovementPlan plan = plan_expert_movement(p, p, kBytesPerExpert);
    ASSERT_TRUE(plan.transfers.empty()) << c.describe();
    EXPECT_EQ(plan.bytes, 0);
    EXPECT_EQ(plan.num_slots_rewritten, 0);
    EXPECT_EQ(plan.placement.phy2log, p.phy2log) << c.describe();
    EXPECT_EQ(plan.placement.replica_rank, p.replica_rank) << c.describe();
    EXPECT_EQ(plan.placement.log2phy, p.log2phy) << c.describe();
  }
}

// A target that only permutes slots inside GPUs is the current placement in another order: the
// plan restores the current order and moves nothing.
TEST(EplbMovement, ReorderWithinGpusMovesNothing) {
  for (const uint64_t seed : eplb_case_seeds(1, 300)) {
    const EplbCase c = random_eplb_case(seed);
    const ExpertPlacement current =
        rebalance_experts(c.weight, c.num_layers, c.num_logical_experts, c.config);
    std::vector<int32_t> shuffled = current.phy2log;
    std::mt19937_64 rng(seed);
    const int64_t slots_per_gpu = current.slots_per_gpu();
    for (auto first = shuffled.begin(); first != shuffled.end(); first += slots_per_gpu) {
      std::shuffle(first, first + slots_per_gpu, rng);
    }
    const ExpertPlacement target = placement_from_phy2log(
        shuffled, c.num_layers, c.num_logical_experts, c.config.num_gpus, c.config.num_nodes);
    const MovementPlan plan = plan_expert_movement(current, target, kBytesPerExpert);
    ASSERT_TRUE(plan.transfers.empty()) << c.describe();
    EXPECT_EQ(plan.num_slots_rewritten, 0) << c.describe();
    EXPECT_EQ(plan.placement.phy2log, current.phy2log) << c.describe();
  }
}

TEST(EplbMovement, RandomRebalancesTransferExactlyWhatIsNew) {
  for (const uint64_t seed : eplb_case_seeds(1, 1000)) {
    const EplbCase before = random_eplb_case(seed);
    // The same deployment with the loads of another case: the experts drift between rebalances.
    EplbCase after = random_eplb_case(seed + 1'000'000);
    after.weight.resize(before.weight.size());
    std::mt19937_64 rng(seed);
    for (double& w : after.weight) w = static_cast<double>(rng() % 1000);
    const int64_t num_layers = before.num_layers;
    const ExpertPlacement current =
        rebalance_experts(before.weight, num_layers, before.num_logical_experts, before.config);
    const ExpertPlacement target =
        rebalance_experts(after.weight, num_layers, before.num_logical_experts, before.config);
    const MovementPlan plan = plan_expert_movement(current, target, kBytesPerExpert);
    const ExpertPlacement& placed = plan.placement;
    ASSERT_TRUE(is_consistent_placement(placed, num_layers, before.num_logical_experts,
                                        before.config.num_replicas, before.config.num_gpus))
        << before.describe();

    // The reordered target holds the same experts on every GPU, hence the same loads.
    const auto now = experts_per_gpu(current);
    const auto wanted = experts_per_gpu(target);
    ASSERT_EQ(experts_per_gpu(placed), wanted) << before.describe();
    // (Equal up to the order of summation within a GPU.)
    const std::vector<double> load = gpu_load(placed, after.weight).load;
    const std::vector<double> expected_load = gpu_load(target, after.weight).load;
    for (size_t g = 0; g < load.size(); ++g) {
      ASSERT_NEAR(load[g], expected_load[g], 1e-12 * expected_load[g]) << before.describe();
    }

    // Exactly the (layer, GPU, expert) triples that are new, each from a current holder.
    std::set<std::tuple<int32_t, int32_t, int32_t>> needed;
    int64_t most_kept = 0;
    for (int64_t layer = 0; layer < num_layers; ++layer) {
      for (int64_t gpu = 0; gpu < before.config.num_gpus; ++gpu) {
        const auto& has = now[static_cast<size_t>(layer)][static_cast<size_t>(gpu)];
        const auto& gets = wanted[static_cast<size_t>(layer)][static_cast<size_t>(gpu)];
        for (const int32_t e : gets) {
          if (!std::binary_search(has.begin(), has.end(), e)) {
            needed.insert({static_cast<int32_t>(layer), static_cast<int32_t>(gpu), e});
          }
        }
        std::vector<int32_t> common;
        std::set_intersection(has.begin(), has.end(), gets.begin(), gets.end(),
                              std::back_inserter(common));
        most_kept += static_cast<int64_t>(common.size());
      }
    }
    std::set<std::tuple<int32_t, int32_t, int32_t>> planned;
    for (const ExpertTransfer& t : plan.transfers) {
      planned.insert({t.layer, t.dst_gpu, t.expert});
      const auto& src = now[static_cast<size_t>(t.layer)][static_cast<size_t>(t.src_gpu)];
      ASSERT_TRUE(std::binary_search(src.begin(), src.end(), t.expert))
          << "GPU " << t.src_gpu << " does not hold expert " << t.expert << ": "
          << before.describe();
    }
    ASSERT_EQ(planned.size(), plan.transfers.size()) << "a transfer repeats: " << before.describe();
    ASSERT_EQ(planned, needed) << before.describe();
    EXPECT_TRUE(std::is_sorted(plan.transfers.begin(), plan.transfers.end(),
                               [](const ExpertTransfer& a, const ExpertTransfer& b) {
                                 return std::tie(a.layer, a.dst_gpu, a.expert) <
                                        std::tie(b.layer, b.dst_gpu, b.expert);
                               }));
    EXPECT_EQ(plan.bytes, static_cast<int64_t>(needed.size()) * kBytesPerExpert);

    // Every slot whose current expert the GPU still wants (as a multiset) keeps it.
    const int64_t num_slots = static_cast<int64_t>(current.phy2log.size());
    EXPECT_EQ(plan.num_slots_rewritten, num_slots - most_kept) << before.describe();
    int64_t rewritten = 0;
    for (size_t s = 0; s < placed.phy2log.size(); ++s) {
      rewritten += placed.phy2log[s] != current.phy2log[s] ? 1 : 0;
    }
    EXPECT_EQ(rewritten, plan.num_slots_rewritten);
  }
}

// Two nodes of two GPUs, one slot each; expert 1 moves from GPU 1 to GPUs 2 and 3. GPU 2 takes
// it from GPU 1 (the only holder); so does GPU 3, though the holder is on the other node.
// Expert 0 joins GPU 1 from GPU 0, its node-local holder.
TEST(EplbMovement, SourcePrefersSameNodeThenFewestSends) {
  const std::vector<int32_t> before = {0, 1, 2, 0};
  const std::vector<int32_t> after = {2, 0, 1, 1};
  const ExpertPlacement current = placement_from_phy2log(before, 1, 3, 4, 2);
  const ExpertPlacement target = placement_from_phy2log(after, 1, 3, 4, 2);
  const MovementPlan plan = plan_expert_movement(current, target, 10);
  ASSERT_EQ(plan.transfers.size(), 4u);
  auto expect = [&](size_t i, int32_t expert, int32_t src, int32_t dst) {
    EXPECT_EQ(plan.transfers[i].expert, expert) << i;
    EXPECT_EQ(plan.transfers[i].src_gpu, src) << i;
    EXPECT_EQ(plan.transfers[i].dst_gpu, dst) << i;
  };
  expect(0, 2, 2, 0);  // expert 2 only on GPU 2
  expect(1, 0, 0, 1);  // expert 0 on GPUs 0 and 3: GPU 0 shares node 0 with GPU 1
  expect(2, 1, 1, 2);
  expect(3, 1, 1, 3);
  EXPECT_EQ(plan.bytes, 40);
  EXPECT_EQ(plan.num_slots_rewritten, 4);
}

// One node of 4 GPUs, 2 slots each: the pairs {0, 1} and {2, 3} swap GPUs. Each expert has two
// holders on the node, so the sends alternate between them.
TEST(EplbMovement, SourcesSpreadOverHolders) {
  const std::vector<int32_t> before = {0, 1, 0, 1, 2, 3, 2, 3};
  const std::vector<int32_t> after = {2, 3, 2, 3, 0, 1, 0, 1};
  const ExpertPlacement current = placement_from_phy2log(before, 1, 4, 4);
  const ExpertPlacement target = placement_from_phy2log(after, 1, 4, 4);
  const MovementPlan plan = plan_expert_movement(current, target, 1);
  std::vector<std::tuple<int32_t, int32_t, int32_t>> got;  // (dst, expert, src)
  for (const ExpertTransfer& t : plan.transfers) got.push_back({t.dst_gpu, t.expert, t.src_gpu});
  const std::vector<std::tuple<int32_t, int32_t, int32_t>> expected = {
      {0, 2, 2}, {0, 3, 3}, {1, 2, 2}, {1, 3, 3}, {2, 0, 0}, {2, 1, 1}, {3, 0, 0}, {3, 1, 1}};
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace moe
