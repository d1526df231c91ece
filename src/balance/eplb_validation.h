// Argument checks of the public EPLB functions. Each throws moe::Error naming the argument, what
// was expected and what was given; past them the algorithms trust their inputs.
#pragma once

#include <cstdint>
#include <span>

#include "moe/eplb.h"

namespace moe::balance {

// Sizes of one layer of slots: counts >= 1, num_gpus a multiple of num_nodes, num_replicas a
// multiple of num_gpus and >= num_logical_experts, ids within int32.
void check_slot_layout(int64_t num_layers, int64_t num_logical_experts, int64_t num_replicas,
                       int64_t num_gpus, int64_t num_nodes);

// check_slot_layout plus num_groups >= 1 dividing num_logical_experts.
void check_eplb_config(const EplbConfig& config, int64_t num_layers, int64_t num_logical_experts);

// weight: num_layers * num_logical_experts loads, each finite and >= 0.
void check_weight(std::span<const double> weight, int64_t num_layers, int64_t num_logical_experts);
void check_weight(std::span<const int64_t> weight, int64_t num_layers, int64_t num_logical_experts);

// The slots per layer of a phy2log of `size` entries: checks num_layers and that it divides size.
int64_t replicas_per_layer(size_t size, int64_t num_layers, const char* name);

// phy2log: num_layers * num_replicas ids in [0, num_logical_experts), every expert present in
// every layer.
void check_phy2log(std::span<const int32_t> phy2log, int64_t num_layers,
                   int64_t num_logical_experts, int64_t num_replicas, const char* name);

// Every table of a placement consistent with the others: the sizes, phy2log as above, logcnt
// counting phy2log, replica_rank numbering each expert's slots 0..count-1, log2phy their inverse.
void check_placement(const ExpertPlacement& placement, const char* name);

}  // namespace moe::balance
