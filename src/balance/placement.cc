// Placements that do not come from rebalance_experts (one known by its phy2log, the contiguous
// start), the derived log2phy table, and the per-GPU load of any placement.
#include <algorithm>

#include "balance/eplb_validation.h"
#include "balance/placement_tables.h"
#include "moe/eplb.h"

namespace moe::balance {

void fill_log2phy(ExpertPlacement& p) {
  p.max_replicas = *std::max_element(p.logcnt.begin(), p.logcnt.end());
  p.log2phy.assign(static_cast<size_t>(p.num_layers * p.num_logical_experts * p.max_replicas), -1);
  for (int64_t layer = 0; layer < p.num_layers; ++layer) {
    const int64_t first_slot = layer * p.num_replicas;
    int32_t* log2phy = p.log2phy.data() + layer * p.num_logical_experts * p.max_replicas;
    for (int64_t slot = 0; slot < p.num_replicas; ++slot) {
      const int64_t expert = p.phy2log[static_cast<size_t>(first_slot + slot)];
      log2phy[expert * p.max_replicas + p.replica_rank[static_cast<size_t>(first_slot + slot)]] =
          static_cast<int32_t>(slot);
    }
  }
}

}  // namespace moe::balance

namespace moe {

ExpertPlacement placement_from_phy2log(std::span<const int32_t> phy2log, int64_t num_layers,
                                       int64_t num_logical_experts, int64_t num_gpus,
                                       int64_t num_nodes) {
  const int64_t num_replicas = balance::replicas_per_layer(phy2log.size(), num_layers, "phy2log");
  balance::check_slot_layout(num_layers, num_logical_experts, num_replicas, num_gpus, num_nodes);
  balance::check_phy2log(phy2log, num_layers, num_logical_experts, num_replicas, "phy2log");

  ExpertPlacement p;
  p.num_layers = num_layers;
  p.num_logical_experts = num_logical_experts;
  p.num_replicas = num_replicas;
  p.num_gpus = num_gpus;
  p.num_nodes = num_nodes;
  p.phy2log.assign(phy2log.begin(), phy2log.end());
  p.replica_rank.resize(phy2log.size());
  p.logcnt.assign(static_cast<size_t>(num_layers * num_logical_experts), 0);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    int32_t* logcnt = p.logcnt.data() + layer * num_logical_experts;
    for (int64_t slot = layer * num_replicas; slot < (layer + 1) * num_replicas; ++slot) {
      p.replica_rank[static_cast<size_t>(slot)] = logcnt[p.phy2log[static_cast<size_t>(slot)]]++;
    }
  }
  balance::fill_log2phy(p);
  return p;
}

ExpertPlacement contiguous_placement(int64_t num_layers, int64_t num_logical_experts,
                                     int64_t num_replicas, int64_t num_gpus, int64_t num_nodes) {
  balance::check_slot_layout(num_layers, num_logical_experts, num_replicas, num_gpus, num_nodes);
  std::vector<int32_t> phy2log(static_cast<size_t>(num_layers * num_replicas));
  for (size_t i = 0; i < phy2log.size(); ++i) {
    phy2log[i] = static_cast<int32_t>(static_cast<int64_t>(i) % num_replicas % num_logical_experts);
  }
  return placement_from_phy2log(phy2log, num_layers, num_logical_experts, num_gpus, num_nodes);
}

GpuLoad gpu_load(const ExpertPlacement& placement, std::span<const double> weight) {
  balance::check_placement(placement, "placement");
  balance::check_weight(weight, placement.num_layers, placement.num_logical_experts);

  const ExpertPlacement& p = placement;
  GpuLoad result;
  result.num_layers = p.num_layers;
  result.num_gpus = p.num_gpus;
  result.load.assign(static_cast<size_t>(p.num_layers * p.num_gpus), 0.0);
  result.max.resize(static_cast<size_t>(p.num_layers));
  result.mean.resize(static_cast<size_t>(p.num_layers));
  const int64_t slots_per_gpu = p.slots_per_gpu();
  for (int64_t layer = 0; layer < p.num_layers; ++layer) {
    const double* layer_weight = weight.data() + layer * p.num_logical_experts;
    const int32_t* logcnt = p.logcnt.data() + layer * p.num_logical_experts;
    const int32_t* phy2log = p.phy2log.data() + layer * p.num_replicas;
    double* load = result.load.data() + layer * p.num_gpus;
    for (int64_t slot = 0; slot < p.num_replicas; ++slot) {
      load[slot / slots_per_gpu] += layer_weight[phy2log[slot]] / logcnt[phy2log[slot]];
    }
    double total = 0;
    for (int64_t g = 0; g < p.num_gpus; ++g) total += load[g];
    result.max[static_cast<size_t>(layer)] = *std::max_element(load, load + p.num_gpus);
    result.mean[static_cast<size_t>(layer)] = total / static_cast<double>(p.num_gpus);
  }
  return result;
}

}  // namespace moe
