// ExpertMap: contiguous layouts (also E not divisible by N), EPLB's slot layout with replicas,
// the kernels' expert_map, and the layouts it refuses.
#include "moe/expert_map.h"

#include <vector>

#include <gtest/gtest.h>

#include "common/expect_error.h"

namespace moe {
namespace {

std::vector<int32_t> as_vector(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

TEST(ExpertMap, ContiguousGivesTheFirstRanksTheRemainder) {
  const ExpertMap map = ExpertMap::contiguous(10, 4);
  EXPECT_EQ(map.num_slots(), 10);
  EXPECT_FALSE(map.has_replicas());
  EXPECT_EQ(as_vector(map.local_slots(0)), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(as_vector(map.local_slots(1)), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(as_vector(map.local_slots(2)), (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(as_vector(map.local_slots(3)), (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(map.rank_of_slot(7), 2);
  EXPECT_EQ(map.local_index(7), 1);
  EXPECT_EQ(map.kernel_expert_map(2), (std::vector<int32_t>{-1, -1, -1, -1, -1, -1, 0, 1, -1, -1}));
}

TEST(ExpertMap, Phy2logPlacesSlotsRankByRankWithReplicas) {
  // EPLB's layout: 8 slots on 2 ranks; expert 0 on both ranks, expert 3 twice on rank 1.
  const std::vector<int32_t> phy2log = {0, 1, 2, 4, 3, 0, 5, 3};
  const ExpertMap map = ExpertMap::from_phy2log(phy2log, 6, 2);
  EXPECT_TRUE(map.has_replicas());
  EXPECT_EQ(as_vector(map.replicas(0)), (std::vector<int32_t>{0, 5}));
  EXPECT_EQ(as_vector(map.replicas(3)), (std::vector<int32_t>{4, 7}));
  EXPECT_EQ(map.local_experts(1), (std::vector<int32_t>{3, 0, 5, 3}));
  EXPECT_EQ(map.rank_of_slot(4), 1);
  EXPECT_EQ(map.local_index(4), 0);
  EXPECT_EQ(map.kernel_expert_map(0), (std::vector<int32_t>{0, 1, 2, 3, -1, -1, -1, -1}));
}

TEST(ExpertMap, SlotsInAnyOrder) {
  // Slots interleaved over ranks: local order is ascending global slot order.
  const ExpertMap map({2, 0, 1, 2}, {1, 0, 1, 0}, 3, 2);
  EXPECT_EQ(as_vector(map.local_slots(0)), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(map.local_experts(0), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(map.local_experts(1), (std::vector<int32_t>{2, 1}));
}

TEST(ExpertMap, RefusesLayoutsThatLoseAnExpertOrARank) {
  testing::expect_error([] { ExpertMap::contiguous(3, 4); }, {"3 experts over 4 ranks"});
  testing::expect_error(
      [] {
        ExpertMap::from_phy2log(std::vector<int32_t>{0, 1, 2}, 3, 2);
      },
      {"3 slots", "2 ranks"});
  testing::expect_error([] { ExpertMap({0, 1, 1}, {0, 0, 1}, 3, 2); }, {"expert 2 has none"});
  testing::expect_error([] { ExpertMap({0, 1, 2}, {0, 0, 0}, 3, 2); }, {"rank 1 holds none"});
  testing::expect_error([] { ExpertMap({0, 5}, {0, 1}, 3, 2); }, {"slot 1", "[0, 3)", "5"});
  testing::expect_error([] { ExpertMap({0, 1}, {0, 2}, 2, 2); }, {"slot 1", "rank", "2"});
}

}  // namespace
}  // namespace moe
