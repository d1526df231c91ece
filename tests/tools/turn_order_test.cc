#include "tools/moe/turn_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

namespace moe::cli {
namespace {

TEST(TurnOrder, EveryRoundIsAPermutation) {
  for (size_t plans = 0; plans <= 17; ++plans) {
    for (size_t round = 0; round < 2 * turn_order_cycle(plans) + 1; ++round) {
      std::vector<size_t> order = turn_order(plans, round);
      ASSERT_EQ(order.size(), plans) << "plans " << plans << " round " << round;
      std::sort(order.begin(), order.end());
      std::vector<size_t> all(plans);
      std::iota(all.begin(), all.end(), size_t{0});
      EXPECT_EQ(order, all) << "plans " << plans << " round " << round;
    }
  }
}

// The point of the design: over one cycle each plan follows each other plan equally often, and
// takes each place in a round equally often, so no plan keeps one predecessor or one place.
TEST(TurnOrder, OneCycleBalancesPredecessorsAndPlaces) {
  for (size_t plans = 2; plans <= 17; ++plans) {
    const size_t cycle = turn_order_cycle(plans);
    std::map<std::pair<size_t, size_t>, int> follows;
    std::map<std::pair<size_t, size_t>, int> places;
    for (size_t round = 0; round < cycle; ++round) {
      const std::vector<size_t> order = turn_order(plans, round);
      for (size_t j = 0; j < plans; ++j) {
        ++places[{j, order[j]}];
        if (j > 0) ++follows[{order[j - 1], order[j]}];
      }
    }
    const int times = static_cast<int>(cycle / plans);
    EXPECT_EQ(follows.size(), plans * (plans - 1)) << "plans " << plans;
    for (const auto& [pair, count] : follows) {
      EXPECT_NE(pair.first, pair.second);
      EXPECT_EQ(count, times) << "plans " << plans << ": " << pair.second << " after "
                              << pair.first;
    }
    EXPECT_EQ(places.size(), plans * plans) << "plans " << plans;
    for (const auto& [place, count] : places) {
      EXPECT_EQ(count, times) << "plans " << plans << ": plan " << place.second << " at "
                              << place.first;
    }
  }
}

TEST(TurnOrder, CycleLengthsAndWrapAround) {
  EXPECT_EQ(turn_order_cycle(1), 1u);
  EXPECT_EQ(turn_order_cycle(2), 2u);
  EXPECT_EQ(turn_order_cycle(5), 10u);
  EXPECT_EQ(turn_order_cycle(14), 14u);
  EXPECT_EQ(turn_order(14, 3), turn_order(14, 3 + 14));
  EXPECT_EQ(turn_order(5, 7), turn_order(5, 7 + 10));
  // Two plans alternate which goes first, as the old cyclic order did.
  EXPECT_EQ(turn_order(2, 0), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(turn_order(2, 1), (std::vector<size_t>{1, 0}));
}

}  // namespace
}  // namespace moe::cli
