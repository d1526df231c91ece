#include "moe/rebalancer.h"

#include "moe/error.h"

namespace moe {

Rebalancer::Rebalancer(int64_t num_layers, int64_t num_experts, const EplbConfig& config,
                       int64_t period_steps, int64_t window_steps)
    : config_(config),
      period_steps_(period_steps),
      recorder_(num_layers, num_experts, window_steps),
      placement_(contiguous_placement(num_layers, num_experts, config.num_replicas, config.num_gpus,
                                      config.num_nodes)) {
  if (period_steps < 1) fail("Rebalancer: expected period_steps >= 1; got {}", period_steps);
}

void Rebalancer::attach(int64_t layer, MoeLayer& moe_layer) const {
  if (layer < 0 || layer >= placement_.num_layers) {
    fail("Rebalancer::attach: expected layer in [0, {}); got {}", placement_.num_layers, layer);
  }
  const auto row = placement_.phy2log.begin() + layer * placement_.num_replicas;
  moe_layer.set_replicas(std::vector<int32_t>(row, row + placement_.num_replicas));
}

void Rebalancer::record(int64_t layer, const MoeLayer& moe_layer) {
  const TensorView counts = moe_layer.last_expert_counts();
  if (counts.numel() != recorder_.num_experts()) {
    fail("Rebalancer::record: expected a layer with {} experts; got {}", recorder_.num_experts(),
         counts.numel());
  }
  recorder_.record(layer, counts.as<int32_t>());
}

bool Rebalancer::end_step() {
  recorder_.end_step();
  if (++steps_ % period_steps_ != 0) return false;
  placement_ = rebalance_experts(std::span<const int64_t>(recorder_.window_load()),
                                 recorder_.num_layers(), recorder_.num_experts(), config_);
  ++rebalances_;
  return true;
}

}  // namespace moe
