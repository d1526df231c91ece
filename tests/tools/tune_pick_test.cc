#include "tools/moe/tune_pick.h"

#include <gtest/gtest.h>

namespace moe::cli {
namespace {

TEST(TunePick, TheDefaultStaysWithinTheMargin) {
  // DeepSeek-V3 at 2048 tokens on an H100 (sixty-sixth session): `tma_dynamic/64` led the final
  // round, 7835.9 us against the default `tma_dynamic/128`'s 7851.6.
  EXPECT_TRUE(table_keeps_default(7851.6 / 7835.9, kDefaultTieMargin));
  EXPECT_TRUE(table_keeps_default(1.0, kDefaultTieMargin)) << "the default is the best";
  EXPECT_TRUE(table_keeps_default(1.01, 0.01)) << "the bound itself counts";
}

TEST(TunePick, AFasterPlanTakesThePlaceBeyondTheMargin) {
  // Qwen3-30B-A3B at 3072 tokens on an H100: the default `tma/128` 815.7 us against `tma_pair/128`
  // 669.2 (sixty-seventh session).
  EXPECT_FALSE(table_keeps_default(815.7 / 669.2, kDefaultTieMargin));
  EXPECT_FALSE(table_keeps_default(1.0101, 0.01));
  EXPECT_FALSE(table_keeps_default(1.001, 0.0)) << "no margin: the best always";
}

}  // namespace
}  // namespace moe::cli
