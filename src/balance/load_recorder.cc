#include "moe/load_recorder.h"

#include <algorithm>

#include "moe/error.h"

namespace moe {

LoadRecorder::LoadRecorder(int64_t num_layers, int64_t num_experts, int64_t window_steps)
    : num_layers_(num_layers), num_experts_(num_experts), window_steps_(window_steps) {
  if (num_layers < 1 || num_experts < 1 || window_steps < 1) {
    fail("LoadRecorder: expected num_layers, num_experts and window_steps >= 1; got {}, {}, {}",
         num_layers, num_experts, window_steps);
  }
  // One slot more than the window: the step being recorded plus window_steps closed ones.
  steps_.assign(static_cast<size_t>((window_steps + 1) * num_layers * num_experts), 0);
  window_sum_.assign(static_cast<size_t>(num_layers * num_experts), 0);
}

void LoadRecorder::record(int64_t layer, const int32_t* expert_counts) {
  if (layer < 0 || layer >= num_layers_) {
    fail("LoadRecorder::record: expected layer in [0, {}); got {}", num_layers_, layer);
  }
  int64_t* step = steps_.data() + (current_ * num_layers_ + layer) * num_experts_;
  int64_t* sum = window_sum_.data() + layer * num_experts_;
  for (int64_t e = 0; e < num_experts_; ++e) {
    step[e] += expert_counts[e];
    sum[e] += expert_counts[e];
  }
}

void LoadRecorder::end_step() {
  ++closed_steps_;
  current_ = (current_ + 1) % (window_steps_ + 1);
  // The slot now reused held the step that just fell out of the window: take it out of the sums.
  const int64_t slot_size = num_layers_ * num_experts_;
  int64_t* oldest = steps_.data() + current_ * slot_size;
  for (int64_t i = 0; i < slot_size; ++i) {
    window_sum_[static_cast<size_t>(i)] -= oldest[i];
    oldest[i] = 0;
  }
}

int64_t LoadRecorder::steps_in_window() const { return std::min(closed_steps_, window_steps_); }

}  // namespace moe
