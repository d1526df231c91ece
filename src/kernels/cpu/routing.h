// CPU routing kernels: the router GEMM and expert selection, on raw pointers that the API edge
// (src/ops/routing.cc) or MoeLayer has validated. Semantics are those of include/moe/routing.h;
// the float64 oracle is kernels/reference/routing.h. Tests: tests/routing/.
//
// None of these allocate. Their scratch lives on each thread's stack (router_logits: 24 KiB,
// select_experts: 17 * kMaxExperts bytes = 68 KiB), so a caller only provides the outputs and,
// for a whole route, the [num_tokens, num_experts] f32 logits between the two kernels.
// Results are bitwise independent of num_threads (<= 0 means omp_get_max_threads()).
#pragma once

#include <cstdint>

#include "moe/config.h"
#include "moe/dtype.h"

namespace moe::cpu {

// Largest num_experts select_experts accepts: its per-token scratch is sized for this many.
inline constexpr int64_t kMaxExperts = 4096;

// logits[t, e] = sum_h hidden[t, h] * weight[e, h] (+ router_bias[e]), products and sums in f32.
// hidden [num_tokens, hidden_size] and weight [num_experts, hidden_size] are f32, bf16 or f16
// (independently); router_bias [num_experts] f32 or null.
void router_logits(const void* hidden, DType hidden_dtype, const void* weight, DType weight_dtype,
                   const float* router_bias, int64_t num_tokens, int64_t hidden_size,
                   int64_t num_experts, float* logits /* [num_tokens, num_experts] */,
                   int num_threads);

// Picks config.top_k experts per token from logits [num_tokens, num_experts] f32 and writes
// their ids and weights in descending selection-score order. correction_bias [num_experts] f32
// when config.has_correction_bias, else null. Requires num_experts <= kMaxExperts.
void select_experts(const RoutingConfig& config, const float* logits, int64_t num_tokens,
                    const float* correction_bias, int32_t* topk_ids /* [num_tokens, k] */,
                    float* topk_weights /* [num_tokens, k] */, int num_threads);

// expert_counts[e] = number of entries of topk_ids [num_pairs] equal to e; ids must be in range.
void count_experts(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                   int32_t* expert_counts /* [num_experts] */);

}  // namespace moe::cpu
