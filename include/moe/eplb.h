// Expert-parallel load balancing (EPLB): give hot experts redundant replicas and pack the replicas
// onto GPUs so that every GPU serves about the same load, with the semantics of DeepSeek's
// open-source EPLB (github.com/deepseek-ai/EPLB).
//
// A logical expert is one of the model's experts; a physical slot holds one replica of one
// logical expert. Slots are numbered GPU by GPU: slot s lives on GPU s / slots_per_gpu, and GPU g
// on node g / (num_gpus / num_nodes). The load model is the reference's: the tokens routed to a
// logical expert split evenly over its replicas.
//
// The algorithm, per layer:
//   replicate  start with one replica per expert; while slots are left, give one more replica to
//              the expert with the largest load per replica (the lowest expert id on ties).
//   pack       place weighted items into bins holding an equal number of items: items in
//              descending weight (the lower expert first on ties, an expert's replicas one after
//              another), each into the lightest bin that still has room (the lowest bin on ties),
//              passing over bins that hold its expert already while another bin with room does
//              not. Where that would leave later experts no way to spread, the expert goes to the
//              bins with the most free slots instead. So an expert with at most as many replicas
//              as bins never has two in one bin (the reference does not ensure this). An item's
//              slot in its bin is its arrival order. With one item per bin, item i goes to bin i
//              unsorted, as the reference does.
//   policy     hierarchical when num_groups % num_nodes == 0: pack expert groups (load = the sum
//              of their experts' loads) onto nodes, so that the experts of a group and all their
//              replicas share a node; then in each node replicate its experts into the node's
//              slots and pack the replicas (weight = load / replica count) onto the node's GPUs,
//              so the bound for spreading an expert's replicas is the node's GPUs.
//              Otherwise global: the same with one group and one node.
// Everything is deterministic: the same input gives the same output on every machine.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moe {

struct EplbConfig {
  int64_t num_replicas = 0;  // physical slots over all GPUs: >= the number of logical experts and
                             // a multiple of num_gpus
  int64_t num_groups = 1;    // expert groups of group-limited routing (DeepSeek-V3: 8); must
                             // divide the number of logical experts; 1 when the model has none
  int64_t num_nodes = 1;     // hosts; the GPUs of one node share the fast network (NVLink)
  int64_t num_gpus = 1;      // a multiple of num_nodes
};

enum class EplbPolicy : uint8_t {
  kHierarchical,  // num_groups % num_nodes == 0: groups stay on one node each
  kGlobal,        // otherwise: groups and nodes are ignored
};

EplbPolicy eplb_policy(const EplbConfig& config);
const char* policy_name(EplbPolicy policy);  // "hierarchical" | "global"

// Where every replica of every layer lives. Row-major tables.
struct ExpertPlacement {
  int64_t num_layers = 0;
  int64_t num_logical_experts = 0;
  int64_t num_replicas = 0;  // physical slots per layer
  int64_t num_gpus = 0;
  int64_t num_nodes = 1;
  int64_t max_replicas = 0;           // the largest replica count: last dimension of log2phy
  std::vector<int32_t> phy2log;       // [num_layers, num_replicas]: the logical expert in a slot
  std::vector<int32_t> replica_rank;  // [num_layers, num_replicas]: which replica of its expert
                                      // a slot holds, 0..logcnt-1
  std::vector<int32_t> log2phy;       // [num_layers, num_logical_experts, max_replicas]: the slot
                                      // of replica r, -1 past the expert's count
  std::vector<int32_t> logcnt;        // [num_layers, num_logical_experts]: replica counts

  int64_t slots_per_gpu() const { return num_replicas / num_gpus; }
  int64_t gpus_per_node() const { return num_gpus / num_nodes; }
};

// weight: [num_layers, num_logical_experts] row-major loads (token counts, or a moving average of
// them), finite and >= 0. Throws moe::Error naming the argument on a bad size, a negative or
// non-finite load, or a config the algorithm cannot place (see EplbConfig).
ExpertPlacement rebalance_experts(std::span<const double> weight, int64_t num_layers,
                                  int64_t num_logical_experts, const EplbConfig& config);
// Token counts; each is converted to double (exact below 2^53).
ExpertPlacement rebalance_experts(std::span<const int64_t> weight, int64_t num_layers,
                                  int64_t num_logical_experts, const EplbConfig& config);

// The full tables of a placement known by its phy2log alone (for example, the one serving now).
// Replica ranks follow slot order. Throws moe::Error unless every id is in range, every logical
// expert has a slot in every layer and the sizes divide as in EplbConfig.
ExpertPlacement placement_from_phy2log(std::span<const int32_t> phy2log, int64_t num_layers,
                                       int64_t num_logical_experts, int64_t num_gpus,
                                       int64_t num_nodes = 1);

// The placement to start from before any load is known: slot s holds expert
// s % num_logical_experts, so experts lie in order GPU by GPU and the redundant slots repeat the
// first experts.
ExpertPlacement contiguous_placement(int64_t num_layers, int64_t num_logical_experts,
                                     int64_t num_replicas, int64_t num_gpus, int64_t num_nodes = 1);

// The load each GPU serves under a placement, each expert's load split evenly over its replicas.
struct GpuLoad {
  int64_t num_layers = 0;
  int64_t num_gpus = 0;
  std::vector<double> load;  // [num_layers, num_gpus]
  std::vector<double> max;   // [num_layers]
  std::vector<double> mean;  // [num_layers]; max / mean is the layer's imbalance (1 is perfect)
};

// weight as for rebalance_experts, [placement.num_layers, placement.num_logical_experts].
GpuLoad gpu_load(const ExpertPlacement& placement, std::span<const double> weight);

// One expert's weights sent to a GPU that does not hold them yet.
struct ExpertTransfer {
  int32_t layer = 0;
  int32_t expert = 0;   // logical expert
  int32_t src_gpu = 0;  // a GPU that holds the expert in the current placement
  int32_t dst_gpu = 0;
};

struct MovementPlan {
  // The target placement with each GPU's slots reordered so that a slot that already holds one of
  // the GPU's target experts keeps it: the order of slots within a GPU changes no load, so this
  // placement is as balanced as the target and rewrites the fewest slots.
  ExpertPlacement placement;
  // One transfer per (layer, GPU, expert) where the GPU holds the expert in the target and not
  // now; ordered by layer, destination GPU, expert. A second replica on a GPU that receives or
  // already holds the expert is a copy on that GPU, not a transfer.
  std::vector<ExpertTransfer> transfers;
  int64_t bytes = 0;                // transfers.size() * bytes_per_expert
  int64_t num_slots_rewritten = 0;  // slots whose expert changes, whether received or copied
};

// Plans the switch from `current` to `target` (same layers, experts, slots, GPUs and nodes).
// Each transfer's source is a current holder of the expert, preferring the destination's node,
// then the holder with the fewest sends so far in that layer, then the lowest GPU id.
MovementPlan plan_expert_movement(const ExpertPlacement& current, const ExpertPlacement& target,
                                  int64_t bytes_per_expert);

}  // namespace moe
