// The checks MoeLayer runs on its weights (once) and on each call's tokens, shared with the
// expert-parallel layer (src/parallel), whose w13 and w2 hold only the rank's own expert slots.
#pragma once

#include <cstdint>

#include "moe/config.h"
#include "moe/experts.h"
#include "moe/layer.h"
#include "ops/experts_validation.h"

namespace moe {

// The fused_experts options a layer's config and weights imply.
ExpertsOptions layer_experts_options(const MoeConfig& config, const LayerWeights& weights,
                                     const LayerOptions& options);

// Checks every weight against the config through the same checks as fused_experts, on an empty
// batch, and returns the problem to fill per call. w13 and w2 hold num_local_experts experts;
// expert_map (as ExpertsOptions::expert_map, empty = all local) maps the ids the kernels see.
ValidatedExperts validate_layer_weights(const MoeConfig& config, const LayerWeights& weights,
                                        const LayerOptions& options, int64_t num_local_experts,
                                        const TensorView& expert_map = {});

// A CPU layer's call: hidden [M, hidden_size] of f32, bf16 or f16 in host memory, out of the
// same dtype and shape, both contiguous, and fewer than 2^31 - 1 pairs (M * top_k), which the
// kernels number in int32.
void check_cpu_layer_tokens(const TensorView& hidden, const TensorView& out, int64_t hidden_size,
                            int64_t top_k);

// The routing a caller hands a CPU layer for M tokens: topk_ids [M, top_k] int32 with ids in
// [0, num_experts) and topk_weights [M, top_k] f32, finite, both contiguous in host memory.
// Nothing is allocated.
void check_cpu_layer_routing(const TensorView& topk_ids, const TensorView& topk_weights,
                             int64_t num_tokens, int64_t top_k, int64_t num_experts);

}  // namespace moe
