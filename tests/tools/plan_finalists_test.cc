#include "tools/moe/plan_finalists.h"

#include <gtest/gtest.h>

#include <vector>

namespace moe::cli {
namespace {

TEST(PlanFinalists, PlansWithinTheMarginOfTheBest) {
  // 8192 tokens of the fifty-second session's sweep: tma/128, tma_eager/128, mma/128, wgmma/128,
  // tma_pair/128, tma_dynamic/128.
  const std::vector<double> medians = {1435.5, 1358.0, 3416.7, 2228.9, 1467.7, 1637.6};
  EXPECT_EQ(plan_finalists(medians, 0.10), (std::vector<size_t>{0, 1, 4}));
  EXPECT_EQ(plan_finalists(medians, 0.06), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(plan_finalists(medians, 0.25), (std::vector<size_t>{0, 1, 4, 5}));
}

TEST(PlanFinalists, TheBoundItselfCountsAndUntimedPlansNever) {
  EXPECT_EQ(plan_finalists({100.0, 125.0, 0.0, -1.0}, 0.25), (std::vector<size_t>{0, 1}));
  EXPECT_EQ(plan_finalists({0.0, 200.0, 100.0, 110.5}, 0.10), std::vector<size_t>{});
}

TEST(PlanFinalists, NoFinalRoundForALonePlan) {
  EXPECT_TRUE(plan_finalists({}, 0.10).empty());
  EXPECT_TRUE(plan_finalists({0.0, 0.0}, 0.10).empty());
  EXPECT_TRUE(plan_finalists({50.0}, 0.10).empty());
  EXPECT_TRUE(plan_finalists({50.0, 80.0}, 0.10).empty());
  EXPECT_EQ(plan_finalists({50.0, 50.0}, 0.0), (std::vector<size_t>{0, 1}));
}

}  // namespace
}  // namespace moe::cli
