// Pairs each local slot served in one step, counted on the GPU from the ids the experts read: the
// received rows' [num_rows, k] slot ids (-1 where no slot of this rank serves the pair). Queued on
// the lane's stream after the experts and before combine, since a peer may write its next step
// over the ids once this rank's combine reached it; no host synchronization, so a counted step
// stays capturable in a CUDA graph. Tests: tests/parallel/cuda (mpirun -np 2, label gpu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda::ep {

struct ServedPairsArgs {
  const int32_t* ids = nullptr;            // [num_ids]: slot ids, or -1
  int64_t num_ids = 0;                     // num_rows * k
  const int32_t* local_of_slot = nullptr;  // [num_slots]: the slot's local index, or -1
  int64_t num_slots = 0;
  int32_t* counts = nullptr;  // [local slots]: added to, so zeroed by the caller first
};

void count_served_pairs(const ServedPairsArgs& args, cudaStream_t stream);

}  // namespace moe::cuda::ep
