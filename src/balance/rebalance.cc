// rebalance_experts: DeepSeek's EPLB, one layer at a time (layers are independent).
//
// Hierarchical policy, per layer:
//   1. pack the expert groups onto nodes (group load = the sum of its experts' loads);
//   2. lay each node's experts out in order (its groups by arrival in the pack, then expert
//      order inside a group) and replicate them into the node's num_replicas / num_nodes slots;
//   3. pack the node's replicas (weight = load / replica count) onto the node's GPUs, the
//      replicas of an expert with at most one per GPU of the node on distinct GPUs.
// The global policy is the same with one group and one node, which makes step 1 the identity.
// The layout order of step 2 decides ties in steps 2 and 3, so it follows the reference exactly.
#include <numeric>
#include <vector>

#include "balance/balanced_packing.h"
#include "balance/eplb_validation.h"
#include "balance/placement_tables.h"
#include "balance/replicate.h"
#include "moe/eplb.h"

namespace moe {
namespace {

// The sizes of one layer under the chosen policy.
struct LayerShape {
  int64_t num_experts;
  int64_t num_groups;
  int64_t num_nodes;
  int64_t group_size;
  int64_t experts_per_node;
  int64_t slots_per_node;
  int64_t gpus_per_node;
  int64_t slots_per_gpu;
};

LayerShape layer_shape(const EplbConfig& config, int64_t num_experts) {
  const bool hierarchical = eplb_policy(config) == EplbPolicy::kHierarchical;
  LayerShape s;
  s.num_experts = num_experts;
  s.num_groups = hierarchical ? config.num_groups : 1;
  s.num_nodes = hierarchical ? config.num_nodes : 1;
  s.group_size = num_experts / s.num_groups;
  s.experts_per_node = num_experts / s.num_nodes;
  s.slots_per_node = config.num_replicas / s.num_nodes;
  s.gpus_per_node = config.num_gpus / s.num_nodes;
  s.slots_per_gpu = config.num_replicas / config.num_gpus;
  return s;
}

// Work buffers of one layer, sized once and reused by every layer.
struct Scratch {
  explicit Scratch(const LayerShape& s)
      : group_load(static_cast<size_t>(s.num_groups)),
        group_id(static_cast<size_t>(s.num_groups)),
        group_node(static_cast<size_t>(s.num_groups)),
        group_position(static_cast<size_t>(s.num_groups)),
        node_experts(static_cast<size_t>(s.num_experts)),
        expert_load(static_cast<size_t>(s.experts_per_node)),
        expert_count(static_cast<size_t>(s.experts_per_node)),
        replica_expert(static_cast<size_t>(s.slots_per_node)),
        replica_rank(static_cast<size_t>(s.slots_per_node)),
        replica_load(static_cast<size_t>(s.slots_per_node)),
        replica_gpu(static_cast<size_t>(s.slots_per_node)),
        replica_position(static_cast<size_t>(s.slots_per_node)) {
    std::iota(group_id.begin(), group_id.end(), 0);
  }

  std::vector<double> group_load;         // [num_groups]
  std::vector<int32_t> group_id;          // [num_groups] 0, 1, ...: each group is its own item
  std::vector<int32_t> group_node;        // [num_groups]
  std::vector<int32_t> group_position;    // [num_groups] arrival order on its node
  std::vector<int32_t> node_experts;      // [num_nodes, experts_per_node] logical expert ids
  std::vector<double> expert_load;        // [experts_per_node] of the node in hand
  std::vector<int32_t> expert_count;      // [experts_per_node]
  std::vector<int32_t> replica_expert;    // [slots_per_node] index into the node's experts
  std::vector<int32_t> replica_rank;      // [slots_per_node]
  std::vector<double> replica_load;       // [slots_per_node]
  std::vector<int32_t> replica_gpu;       // [slots_per_node] GPU within the node
  std::vector<int32_t> replica_position;  // [slots_per_node] slot within the GPU
};

// load [num_experts] -> phy2log and replica_rank [num_replicas], logcnt [num_experts].
void rebalance_layer(const LayerShape& s, const double* load, int32_t* phy2log,
                     int32_t* replica_rank, int32_t* logcnt, Scratch& w) {
  // 1. Groups onto nodes.
  for (int64_t g = 0; g < s.num_groups; ++g) {
    double sum = 0;
    for (int64_t i = 0; i < s.group_size; ++i) sum += load[g * s.group_size + i];
    w.group_load[static_cast<size_t>(g)] = sum;
  }
  balance::balanced_packing(w.group_load, w.group_id, s.num_nodes, w.group_node, w.group_position);
  const int64_t groups_per_node = s.num_groups / s.num_nodes;
  for (int64_t g = 0; g < s.num_groups; ++g) {
    const int64_t first = (w.group_node[static_cast<size_t>(g)] * groups_per_node +
                           w.group_position[static_cast<size_t>(g)]) *
                          s.group_size;
    for (int64_t i = 0; i < s.group_size; ++i) {
      w.node_experts[static_cast<size_t>(first + i)] = static_cast<int32_t>(g * s.group_size + i);
    }
  }

  for (int64_t node = 0; node < s.num_nodes; ++node) {
    const int32_t* experts = w.node_experts.data() + node * s.experts_per_node;
    // 2. Replicas within the node.
    for (int64_t i = 0; i < s.experts_per_node; ++i) {
      w.expert_load[static_cast<size_t>(i)] = load[experts[i]];
    }
    balance::replicate_experts(w.expert_load, w.replica_expert, w.replica_rank, w.expert_count);
    // 3. Replicas onto the node's GPUs.
    for (int64_t r = 0; r < s.slots_per_node; ++r) {
      const size_t i = static_cast<size_t>(w.replica_expert[static_cast<size_t>(r)]);
      w.replica_load[static_cast<size_t>(r)] = w.expert_load[i] / w.expert_count[i];
    }
    balance::balanced_packing(w.replica_load, w.replica_expert, s.gpus_per_node, w.replica_gpu,
                              w.replica_position);

    for (int64_t r = 0; r < s.slots_per_node; ++r) {
      const size_t ri = static_cast<size_t>(r);
      const int64_t slot =
          (node * s.gpus_per_node + w.replica_gpu[ri]) * s.slots_per_gpu + w.replica_position[ri];
      phy2log[slot] = experts[w.replica_expert[ri]];
      replica_rank[slot] = w.replica_rank[ri];
    }
    for (int64_t i = 0; i < s.experts_per_node; ++i) {
      logcnt[experts[i]] = w.expert_count[static_cast<size_t>(i)];
    }
  }
}

}  // namespace

EplbPolicy eplb_policy(const EplbConfig& config) {
  return config.num_nodes >= 1 && config.num_groups % config.num_nodes == 0
             ? EplbPolicy::kHierarchical
             : EplbPolicy::kGlobal;
}

const char* policy_name(EplbPolicy policy) {
  return policy == EplbPolicy::kHierarchical ? "hierarchical" : "global";
}

ExpertPlacement rebalance_experts(std::span<const double> weight, int64_t num_layers,
                                  int64_t num_logical_experts, const EplbConfig& config) {
  balance::check_eplb_config(config, num_layers, num_logical_experts);
  balance::check_weight(weight, num_layers, num_logical_experts);

  ExpertPlacement p;
  p.num_layers = num_layers;
  p.num_logical_experts = num_logical_experts;
  p.num_replicas = config.num_replicas;
  p.num_gpus = config.num_gpus;
  p.num_nodes = config.num_nodes;
  p.phy2log.resize(static_cast<size_t>(num_layers * config.num_replicas));
  p.replica_rank.resize(p.phy2log.size());
  p.logcnt.resize(static_cast<size_t>(num_layers * num_logical_experts));

  const LayerShape shape = layer_shape(config, num_logical_experts);
  Scratch scratch(shape);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    rebalance_layer(shape, weight.data() + layer * num_logical_experts,
                    p.phy2log.data() + layer * config.num_replicas,
                    p.replica_rank.data() + layer * config.num_replicas,
                    p.logcnt.data() + layer * num_logical_experts, scratch);
  }
  balance::fill_log2phy(p);
  return p;
}

ExpertPlacement rebalance_experts(std::span<const int64_t> weight, int64_t num_layers,
                                  int64_t num_logical_experts, const EplbConfig& config) {
  balance::check_eplb_config(config, num_layers, num_logical_experts);
  balance::check_weight(weight, num_layers, num_logical_experts);
  const std::vector<double> loads(weight.begin(), weight.end());
  return rebalance_experts(loads, num_layers, num_logical_experts, config);
}

}  // namespace moe
