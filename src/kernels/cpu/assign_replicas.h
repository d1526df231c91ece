// Replica assignment: which physical slot serves each (token, expert) pair when some experts
// have several replicas. The n-th pair (in pair order) of expert e goes to replica n mod
// replica_count[e], so every replica of an expert gets the same number of pairs, give or take
// one, and the choice depends only on the routing: deterministic on every rank.
// Tested by tests/layer/replicas_test.cc.
#pragma once

#include <cstdint>

namespace moe::cpu {

// topk_ids [num_pairs] logical ids in [0, num_experts); expert_slots [num_experts, max_replicas]
// the slot of each replica; replica_count [num_experts] >= 1. Writes slot_ids [num_pairs];
// next_replica [num_experts] is scratch.
void assign_replicas(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                     const int32_t* expert_slots, int64_t max_replicas,
                     const int32_t* replica_count, int32_t* slot_ids, int32_t* next_replica);

}  // namespace moe::cpu
