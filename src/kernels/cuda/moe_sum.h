// The last stage on the GPU: out[t] = sum over j ascending of cache3[t * k + j], in f32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

struct SumArgs {
  const void* cache3 = nullptr;         // bf16 [M * k, H]
  const int32_t* topk_ids = nullptr;    // [M, k]: pairs of ids outside [0, E) add nothing
  const int32_t* expert_map = nullptr;  // [E] or null: pairs of non-local experts add nothing
  int64_t num_experts = 0;              // E
  int64_t num_local_experts = 0;
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  int64_t hidden_size = 0;
  void* out = nullptr;  // bf16 [M, H]
};

void moe_sum(const SumArgs& args, cudaStream_t stream);

}  // namespace moe::cuda
