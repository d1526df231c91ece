// LoadRecorder: per-layer, per-expert pair counts over a sliding window of serving steps, the
// load that EPLB balances. MoeLayer's counts of each call go in; the window's sums come out.
#pragma once

#include <cstdint>
#include <vector>

namespace moe {

class LoadRecorder {
 public:
  // Throws moe::Error unless every size is >= 1.
  LoadRecorder(int64_t num_layers, int64_t num_experts, int64_t window_steps);

  // Adds one call's pairs per expert [num_experts] to `layer` in the current step. A layer may
  // be recorded several times in a step (micro-batches); its counts add up.
  void record(int64_t layer, const int32_t* expert_counts);
  // Closes the current step; the oldest step leaves the window once it holds window_steps.
  void end_step();

  // Sums over the steps in the window (the current, unfinished step included):
  // [num_layers, num_experts] row-major.
  const std::vector<int64_t>& window_load() const { return window_sum_; }
  int64_t steps_in_window() const;  // closed steps in the window, at most window_steps
  int64_t num_layers() const { return num_layers_; }
  int64_t num_experts() const { return num_experts_; }

 private:
  int64_t num_layers_, num_experts_, window_steps_;
  int64_t current_ = 0;              // ring slot of the step being recorded
  int64_t closed_steps_ = 0;         // steps closed since construction
  std::vector<int64_t> steps_;       // [window_steps + 1, num_layers, num_experts] ring
  std::vector<int64_t> window_sum_;  // [num_layers, num_experts]
};

}  // namespace moe
