// The raw-pointer description of one fused-experts call, shared by every backend's kernels.
// Built once at the API edge (src/ops/experts.cc) after validation; kernels trust it.
#pragma once

#include <cstdint>

#include "moe/config.h"
#include "moe/dtype.h"

namespace moe {

struct ExpertsProblem {
  int64_t num_tokens = 0;         // M
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I
  int64_t top_k = 0;              // k
  int64_t num_experts = 0;        // E: range of topk_ids (global ids)
  int64_t num_local_experts = 0;  // experts held in w13 / w2

  const void* hidden = nullptr;  // [M, H] of hidden_dtype
  // [M * k]: where pair p's input row is, when not at row p / k of `hidden` (under expert
  // parallelism: a row received from another rank, sent once for all its pairs there, or a row of
  // the rank's own batch). hidden is then unused.
  const void* const* hidden_row_ptrs = nullptr;
  DType hidden_dtype = DType::kF32;
  const void* w13 = nullptr;  // [E_local, 2I, H] of weight_dtype
  const void* w2 = nullptr;   // [E_local, H, I] of weight_dtype
  DType weight_dtype = DType::kF32;
  const float* w13_bias = nullptr;      // [E_local, 2I] or null
  const float* w2_bias = nullptr;       // [E_local, H] or null
  const float* topk_weights = nullptr;  // [M, k]
  const int32_t* topk_ids = nullptr;    // [M, k], in [0, E)
  const int32_t* expert_map = nullptr;  // [E]: local id or -1; null = identity

  Activation activation = Activation::kSilu;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  bool weight_on_input = false;

  // Shared experts (one MLP), in weight_dtype; shared_intermediate_size = 0 means none.
  int64_t shared_intermediate_size = 0;  // Is
  const void* shared_w13 = nullptr;      // [2 * Is, H]
  const void* shared_w2 = nullptr;       // [H, Is]
  const void* shared_gate = nullptr;     // [H] or null (no gate)

  void* out = nullptr;  // [M, H] of hidden_dtype

  int64_t num_pairs() const { return num_tokens * top_k; }
};

}  // namespace moe
