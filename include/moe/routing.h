// Routing: router logits -> scores -> (group-limited) top-k -> renormalize -> scale.
//
// Outputs topk_ids [M, k] int32 and topk_weights [M, k] float32, plus the number of pairs per
// expert [E] int32. Ties break toward the lower expert id; a NaN score ranks below every number,
// so a token with a NaN row still gets k distinct in-range experts (and NaN weights) without
// touching any other token. Each token's k experts come in descending selection score.
//
// With num_groups > 1 a group scores the sum of its two best selection scores when there is a
// correction bias (DeepSeek-V3), else its best one (DeepSeek-V2); experts of dropped groups are
// never chosen. Weights are the unbiased scores of the chosen experts, divided by their sum when
// renormalizing (unless that sum is 0), then multiplied by routed_scaling_factor.
//
// Tensors in GPU memory run on the CUDA backend (backend kAuto or kCuda; all tensors on the
// current device): every shape, dtype and size is checked before anything is queued on
// `cuda_stream` (a cudaStream_t; null is the legacy default stream), and the call returns without
// synchronizing. The GPU takes bf16 or f32 hidden and router_weight of one dtype, up to 512
// experts, top-16 and 32 groups.
#pragma once

#include "moe/backend.h"
#include "moe/config.h"
#include "moe/tensor.h"

namespace moe {

struct RoutingOutput {
  Tensor topk_ids;       // [M, k] int32
  Tensor topk_weights;   // [M, k] float32
  Tensor expert_counts;  // [E] int32
};

struct RoutingInputs {
  TensorView correction_bias;  // [E] float32, when config.has_correction_bias
  TensorView router_bias;      // [E] float32, when config.has_router_bias (route() only)
};

// Selects experts from precomputed logits [M, E] float32 (vLLM's fused_topk / grouped_topk).
// Writes topk_ids [M, k] int32, topk_weights [M, k] float32 and, if given, expert_counts [E]
// int32. Throws moe::Error on a shape, dtype or config mismatch.
void select_experts(const RoutingConfig& config, const TensorView& logits,
                    const RoutingInputs& inputs, const TensorView& topk_ids,
                    const TensorView& topk_weights, const TensorView& expert_counts = {},
                    Backend backend = Backend::kAuto, int num_threads = 0,
                    void* cuda_stream = nullptr);

// The whole router: logits = hidden [M, H] · router_weight [E, H]^T (+ router_bias), then
// select_experts. hidden and router_weight may be f32, bf16 or f16; accumulation is f32 (f64 on
// the reference backend).
void route(const RoutingConfig& config, const TensorView& hidden, const TensorView& router_weight,
           const RoutingInputs& inputs, const TensorView& topk_ids, const TensorView& topk_weights,
           const TensorView& expert_counts = {}, Backend backend = Backend::kAuto,
           int num_threads = 0, void* cuda_stream = nullptr);

// Allocating form of route(), for tensors on the CPU (its outputs are host tensors).
RoutingOutput route(const RoutingConfig& config, const TensorView& hidden,
                    const TensorView& router_weight, const RoutingInputs& inputs = {},
                    Backend backend = Backend::kAuto, int num_threads = 0);

}  // namespace moe
