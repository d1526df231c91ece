// Replication: how many physical replicas each logical expert gets.
#pragma once

#include <cstdint>
#include <span>

namespace moe::balance {

// Replica i < num_experts is expert i itself (rank 0); every further replica goes to the expert
// whose load per replica is then the largest, the lowest expert id on ties. Sizes:
// load [num_experts], replica_expert and replica_rank [num_replicas >= num_experts],
// count [num_experts]. Inputs are trusted (validated at the API edge).
void replicate_experts(std::span<const double> load, std::span<int32_t> replica_expert,
                       std::span<int32_t> replica_rank, std::span<int32_t> count);

}  // namespace moe::balance
