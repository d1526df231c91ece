#include "moe/load_recorder.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "moe/error.h"

namespace moe {
namespace {

// The window's sums equal a plain recomputation over the last steps, on random counts.
TEST(LoadRecorder, WindowSumsMatchRecomputation) {
  const int64_t layers = 3, experts = 5, window = 4;
  LoadRecorder recorder(layers, experts, window);
  std::mt19937 rng(12);
  std::vector<std::vector<int64_t>> history;  // closed steps and the open one
  history.emplace_back(layers * experts, 0);
  for (int step = 0; step < 20; ++step) {
    for (int call = 0; call < 2; ++call) {
      const int64_t layer = static_cast<int64_t>(rng() % layers);
      std::vector<int32_t> counts(experts);
      for (int32_t& c : counts) c = static_cast<int32_t>(rng() % 9);
      recorder.record(layer, counts.data());
      for (int64_t e = 0; e < experts; ++e) history.back()[layer * experts + e] += counts[e];
    }
    std::vector<int64_t> expected(layers * experts, 0);
    const size_t first = history.size() > static_cast<size_t>(window + 1)
                             ? history.size() - static_cast<size_t>(window + 1)
                             : 0;
    for (size_t s = first; s < history.size(); ++s) {
      for (size_t i = 0; i < expected.size(); ++i) expected[i] += history[s][i];
    }
    ASSERT_EQ(recorder.window_load(), expected) << "step " << step;
    recorder.end_step();
    history.emplace_back(layers * experts, 0);
    EXPECT_EQ(recorder.steps_in_window(), std::min<int64_t>(step + 1, window));
  }
}

TEST(LoadRecorder, RejectsBadSizesAndLayers) {
  EXPECT_THROW(LoadRecorder(0, 4, 2), Error);
  EXPECT_THROW(LoadRecorder(2, 4, 0), Error);
  LoadRecorder recorder(2, 4, 2);
  const int32_t counts[4] = {1, 2, 3, 4};
  EXPECT_THROW(recorder.record(2, counts), Error);
  EXPECT_THROW(recorder.record(-1, counts), Error);
}

}  // namespace
}  // namespace moe
