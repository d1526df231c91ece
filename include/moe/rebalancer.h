// Rebalancer: runtime expert load balancing for serving. It records each MoE layer's pairs per
// expert over a sliding window of steps and, every period_steps steps, asks EPLB for a new
// placement of the replicas and applies it to the layers. Outputs never change; which slot (and,
// with expert parallelism, which GPU) serves a pair does.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/eplb.h"
#include "moe/layer.h"
#include "moe/load_recorder.h"

namespace moe {

class Rebalancer {
 public:
  // `config` describes the physical slots (num_replicas >= num_experts) and their GPUs; the
  // layers start from the contiguous placement. Throws moe::Error on bad sizes.
  Rebalancer(int64_t num_layers, int64_t num_experts, const EplbConfig& config,
             int64_t period_steps, int64_t window_steps);

  // Gives `moe_layer` (the layer-th MoE layer) the current placement's slots.
  void attach(int64_t layer, MoeLayer& moe_layer) const;
  // Adds the pairs per expert of moe_layer's last forward to the window.
  void record(int64_t layer, const MoeLayer& moe_layer);
  // Closes a step. Every period_steps steps it computes a new placement from the window and
  // returns true; then attach() every layer again to apply it.
  bool end_step();

  const ExpertPlacement& placement() const { return placement_; }
  const LoadRecorder& recorder() const { return recorder_; }
  int64_t rebalances() const { return rebalances_; }

 private:
  EplbConfig config_;
  int64_t period_steps_;
  int64_t steps_ = 0;
  int64_t rebalances_ = 0;
  LoadRecorder recorder_;
  ExpertPlacement placement_;
};

}  // namespace moe
