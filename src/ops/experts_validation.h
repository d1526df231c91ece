// Argument checks of fused_experts, shared by the public function and MoeLayer (which checks
// its weights once at construction and the batch on every call).
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/experts_problem.h"
#include "moe/experts.h"
#include "moe/tensor.h"

namespace moe {

struct ValidatedExperts {
  ExpertsProblem problem;
  // f32 copies of biases given in another dtype; problem points into them.
  Tensor w13_bias_f32;
  Tensor w2_bias_f32;
};

// (token, expert) pairs a call may hold: align and the expert kernels number them in int32.
inline constexpr int64_t kMaxPairs = std::numeric_limits<int32_t>::max();

// Host routing of num_pairs (token, slot) pairs, top_k a token: each id in [0, num_experts),
// each weight finite; throws moe::Error naming the first bad pair.
void check_routing_values(const int32_t* topk_ids, const float* topk_weights, int64_t num_pairs,
                          int64_t top_k, int64_t num_experts);

// Throws moe::Error naming the first bad argument; otherwise returns the problem to run.
ValidatedExperts validate_experts(const TensorView& hidden, const TensorView& w13,
                                  const TensorView& w2, const TensorView& topk_weights,
                                  const TensorView& topk_ids, const TensorView& out,
                                  const ExpertsOptions& options);

}  // namespace moe
