#include "layer/layer_checks.h"

#include <tuple>

#include "moe/error.h"

namespace moe {

namespace {

void check_optional(const Tensor& t, bool wanted, const char* name, const char* why) {
  if (wanted && !t.defined()) fail("layer weights: {} is missing; the config has {}", name, why);
  if (!wanted && t.defined())
    fail("layer weights: {} is given but the config has no {}", name, why);
}

}  // namespace

ExpertsOptions layer_experts_options(const MoeConfig& config, const LayerWeights& w,
                                     const LayerOptions& options) {
  ExpertsOptions o;
  o.activation = config.experts.activation;
  o.swiglu_alpha = config.experts.swiglu_alpha;
  o.swiglu_limit = config.experts.swiglu_limit;
  o.apply_router_weight_on_input = config.routing.apply_weight_on_input;
  if (w.w13_bias.defined()) o.w13_bias = w.w13_bias;
  if (w.w2_bias.defined()) o.w2_bias = w.w2_bias;
  if (w.shared_w13.defined()) {
    o.shared.w13 = w.shared_w13;
    o.shared.w2 = w.shared_w2;
    if (w.shared_gate.defined()) o.shared.gate = w.shared_gate;
  }
  o.block_m = options.block_m;
  o.backend = options.backend;
  o.num_threads = options.num_threads;
  return o;
}

ValidatedExperts validate_layer_weights(const MoeConfig& config, const LayerWeights& w,
                                        const LayerOptions& options, int64_t num_local_experts,
                                        const TensorView& expert_map) {
  const RoutingConfig& r = config.routing;
  const ExpertsConfig& x = config.experts;
  if (!w.router.defined()) fail("layer weights: router is missing");
  check_shape(w.router, "router", {r.num_experts, x.hidden_size});
  check_optional(w.router_bias, r.has_router_bias, "router_bias", "a router bias");
  check_optional(w.correction_bias, r.has_correction_bias, "correction_bias", "a correction bias");
  check_optional(w.w13_bias, x.has_bias, "w13_bias", "expert biases");
  check_optional(w.w2_bias, x.has_bias, "w2_bias", "expert biases");
  check_optional(w.shared_w13, x.shared_intermediate_size > 0, "shared_w13", "shared experts");
  check_optional(w.shared_gate, x.shared_gate, "shared_gate", "a shared-expert gate");
  if (!w.w13.defined() || !w.w2.defined()) fail("layer weights: w13 and w2 are required");
  check_shape(w.w13, "w13", {num_local_experts, 2 * x.intermediate_size, x.hidden_size});
  if (w.shared_w13.defined()) {
    check_shape(w.shared_w13, "shared_w13", {2 * x.shared_intermediate_size, x.hidden_size});
  }

  const TensorView no_hidden(nullptr, w.w13.dtype(), {0, x.hidden_size});
  const TensorView no_ids(nullptr, DType::kI32, {0, r.top_k});
  const TensorView no_weights(nullptr, DType::kF32, {0, r.top_k});
  ExpertsOptions experts = layer_experts_options(config, w, options);
  experts.expert_map = expert_map;
  return validate_experts(no_hidden, w.w13, w.w2, no_weights, no_ids, no_hidden, experts);
}

void check_cpu_layer_tokens(const TensorView& hidden, const TensorView& out, int64_t hidden_size,
                            int64_t top_k) {
  check_device(hidden, "hidden", Device::kCpu);
  check_contiguous(hidden, "hidden");
  check_rank(hidden, "hidden", 2);
  check_dtype(hidden, "hidden", {DType::kF32, DType::kBF16, DType::kF16});
  if (hidden.size(1) != hidden_size) {
    fail("hidden: expected [M, {}] (the layer's hidden size); got {}", hidden_size,
         shape_string(hidden.shape));
  }
  if (hidden.numel() > 0 && hidden.data == nullptr) fail("hidden: data pointer is null");
  const int64_t max_tokens = (kMaxPairs - 1) / top_k;
  if (hidden.size(0) > max_tokens) {
    fail("hidden: expected at most {} tokens (fewer than {} pairs at top_k {}); got {}", max_tokens,
         kMaxPairs, top_k, hidden.size(0));
  }
  check_device(out, "out", Device::kCpu);
  check_contiguous(out, "out");
  check_dtype(out, "out", {hidden.dtype});
  check_shape(out, "out", hidden.shape);
  if (out.numel() > 0 && out.data == nullptr) fail("out: data pointer is null");
}

void check_cpu_layer_routing(const TensorView& topk_ids, const TensorView& topk_weights,
                             int64_t num_tokens, int64_t top_k, int64_t num_experts) {
  for (const auto& [t, name, dtype] : {std::tuple{&topk_ids, "topk_ids", DType::kI32},
                                       std::tuple{&topk_weights, "topk_weights", DType::kF32}}) {
    check_device(*t, name, Device::kCpu);
    check_contiguous(*t, name);
    check_dtype(*t, name, {dtype});
    if (t->dim() != 2 || t->shape[0] != num_tokens || t->shape[1] != top_k) {
      fail("{}: expected shape [{}, {}] (tokens of hidden, top_k of the layer); got {}", name,
           num_tokens, top_k, shape_string(t->shape));
    }
    if (num_tokens > 0 && t->data == nullptr) fail("{}: data pointer is null", name);
  }
  check_routing_values(topk_ids.as<const int32_t>(), topk_weights.as<const float>(),
                       num_tokens * top_k, top_k, num_experts);
}

}  // namespace moe
