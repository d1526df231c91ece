#include "kernels/cpu/assign_replicas.h"

#include <algorithm>

namespace moe::cpu {

void assign_replicas(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                     const int32_t* expert_slots, int64_t max_replicas,
                     const int32_t* replica_count, int32_t* slot_ids, int32_t* next_replica) {
  std::fill(next_replica, next_replica + num_experts, 0);
  for (int64_t p = 0; p < num_pairs; ++p) {
    const int32_t expert = topk_ids[p];
    int32_t& replica = next_replica[expert];
    slot_ids[p] = expert_slots[expert * max_replicas + replica];
    replica = replica + 1 == replica_count[expert] ? 0 : replica + 1;
  }
}

}  // namespace moe::cpu
