// CPU routing kernels: the router GEMM and expert selection, on raw pointers that the API edge
// (src/ops/routing.cc) or MoeLayer has validated. Semantics are those of include/moe/routing.h;
// the float64 oracle is kernels/reference/routing.h. Tests: tests/routing/.
//
// Only pack_router_weight allocates (its result, once per layer). The other kernels' scratch
// lives on each thread's stack (router_logits: 72 KiB, select_experts: 17 * kMaxExperts bytes =
// 68 KiB), so a caller only provides the outputs and, for a whole route, the
// [num_tokens, num_experts] f32 logits between the two kernels.
// Results are bitwise independent of num_threads (<= 0 means omp_get_max_threads()).
#pragma once

#include <cstdint>

#include "kernels/cpu/router_kernel.h"
#include "moe/config.h"
#include "moe/dtype.h"
#include "moe/tensor.h"

namespace moe::cpu {

// Largest num_experts select_experts accepts: its per-token scratch is sized for this many.
inline constexpr int64_t kMaxExperts = 4096;

// The router weight [num_experts, hidden_size] (f32, bf16 or f16) as router_logits reads it: f32
// [ceil(num_experts / width), hidden_size, width], panels of width = router_panel_width(
// num_experts) experts stored h-major, the experts past num_experts zero. Converting once keeps
// the conversion out of the GEMM; a layer packs at construction (4 bytes per weight: 1 MiB for
// Qwen3-30B-A3B's router).
Tensor pack_router_weight(const void* weight, DType weight_dtype, int64_t num_experts,
                          int64_t hidden_size, int num_threads);

// logits[t, e] = sum_h hidden[t, h] * weight[e, h] (+ router_bias[e]), products and sums in f32:
// each logit adds its products in ascending h (router_kernel.h), then the bias, so it depends
// only on its token's row, never on the batch it is part of or the thread count. hidden
// [num_tokens, hidden_size] is f32, bf16 or f16; router_panels is pack_router_weight's result;
// router_bias [num_experts] f32 or null.
void router_logits(const RouterKernel& kernel, const void* hidden, DType hidden_dtype,
                   const float* router_panels, const float* router_bias, int64_t num_tokens,
                   int64_t hidden_size, int64_t num_experts,
                   float* logits /* [num_tokens, num_experts] */, int num_threads);

// Tokens of one work item of router_logits: the weights pass through each item once.
inline constexpr int64_t kRouterBlockTokens = 24;

// router_logits on the plain weight [num_experts, hidden_size] (f32, bf16 or f16), converted on
// the way: the same logits, bit for bit. Each block of kRouterBlockTokens tokens converts the
// weights again, so this suits a call that runs once on few tokens; a caller that runs many
// tokens, or many calls, packs once.
void router_logits_unpacked(const RouterKernel& kernel, const void* hidden, DType hidden_dtype,
                            const void* weight, DType weight_dtype, const float* router_bias,
                            int64_t num_tokens, int64_t hidden_size, int64_t num_experts,
                            float* logits /* [num_tokens, num_experts] */, int num_threads);

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
