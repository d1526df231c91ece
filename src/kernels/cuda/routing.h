// Routing on the GPU: the router GEMM through cuBLAS, then one fused kernel for scores, biases,
// group-limited top-k, renormalization and scaling. Same rules as kernels/cpu/select_experts.cc
// (order, NaN, ties, group scores); tests/cuda compares the two.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "moe/config.h"
#include "moe/dtype.h"

namespace moe::cuda {

inline constexpr int64_t kMaxRoutedExperts = 512;
inline constexpr int64_t kMaxTopK = 16;
inline constexpr int64_t kMaxGroups = 32;

// logits [M, E] f32 = hidden [M, H] · router_weight [E, H]^T; both bf16, or both f32.
void router_gemm(cublasHandle_t handle, const void* hidden, const void* router_weight, DType dtype,
                 int64_t num_tokens, int64_t hidden_size, int64_t num_experts, float* logits,
                 cudaStream_t stream);

struct SelectArgs {
  const float* logits = nullptr;           // [M, E]
  const float* router_bias = nullptr;      // [E] added to the logits, or null
  const float* correction_bias = nullptr;  // [E] added for selection only, or null
  int64_t num_tokens = 0;
  int32_t* topk_ids = nullptr;       // [M, k]
  float* topk_weights = nullptr;     // [M, k]
  int32_t* expert_counts = nullptr;  // [E] or null: incremented (zero it first)
};

// Requires E <= kMaxRoutedExperts, k <= kMaxTopK, num_groups <= kMaxGroups (checked at the edge).
void select_experts(const RoutingConfig& config, const SelectArgs& args, cudaStream_t stream);

}  // namespace moe::cuda
