// Reference routing: router logits and expert selection in float64, written as the plain loops
// of the definition. This is the oracle the other backends are tested against; keep it obvious,
// never optimize it.
//
// Selection follows include/moe/routing.h: scores (softmax | sigmoid), plus the correction bias
// for selection only, optional group limit, top-k ordered by descending selection score with ties
// toward the lower id and NaN below every number, weights from the unbiased scores, optional
// renormalization, then the routed scaling factor.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/config.h"
#include "moe/dtype.h"

namespace moe::reference {

// logits[t, e] = sum_h hidden[t, h] * weight[e, h] (+ router_bias[e]), accumulated in double.
// hidden [num_tokens, hidden_size] and weight [num_experts, hidden_size] are f32, bf16 or f16;
// router_bias [num_experts] f32 or null.
void router_logits(const void* hidden, DType hidden_dtype, const void* weight, DType weight_dtype,
                   const float* router_bias, int64_t num_tokens, int64_t hidden_size,
                   int64_t num_experts, double* logits /* [num_tokens, num_experts] */);

// One token's routing with every intermediate kept, so tests can see how close a decision was.
struct TokenRouting {
  std::vector<double> scores;        // [E] softmax or sigmoid of the logits
  std::vector<double> selection;     // [E] scores + correction bias
  std::vector<double> group_scores;  // [num_groups]; empty when num_groups == 1
  std::vector<bool> group_kept;      // [num_groups]; all true when num_groups == 1
  std::vector<int32_t> ids;          // [k] in output order
  std::vector<double> weights;       // [k] final weights (renormalized and scaled)
};

// `logits` [E]; `correction_bias` [E] or null.
TokenRouting route_token(const RoutingConfig& config, const double* logits,
                         const float* correction_bias);

// route_token for every token; weights are rounded to f32 on output.
void select_experts(const RoutingConfig& config, const double* logits /* [num_tokens, E] */,
                    int64_t num_tokens, const float* correction_bias /* [E] or null */,
                    int32_t* topk_ids /* [num_tokens, k] */,
                    float* topk_weights /* [num_tokens, k] */);

// expert_counts[e] = number of entries of topk_ids equal to e.
void count_experts(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                   int32_t* expert_counts /* [num_experts] */);

}  // namespace moe::reference
