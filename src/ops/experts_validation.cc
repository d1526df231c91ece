#include "ops/experts_validation.h"

#include <cmath>

#include "kernels/cpu/fused_experts.h"
#include "moe/error.h"

namespace moe {

namespace {

constexpr std::initializer_list<DType> kFloatTypes = {DType::kF32, DType::kBF16, DType::kF16};

// Every tensor of one call lives on hidden's device.
void check_tensor(const TensorView& t, const char* name, Device device) {
  check_device(t, name, device);
  check_contiguous(t, name);
  if (t.numel() > 0 && t.data == nullptr) fail("{}: data pointer is null", name);
}

// Returns an f32 pointer to `bias` [rows, cols], converting into `storage` when needed.
const float* bias_f32(const TensorView& bias, const char* name, int64_t rows, int64_t cols,
                      Tensor& storage) {
  if (bias.empty()) return nullptr;
  check_tensor(bias, name, Device::kCpu);
  check_dtype(bias, name, kFloatTypes);
  check_shape(bias, name, {rows, cols});
  if (bias.dtype == DType::kF32) return bias.as<float>();
  storage = Tensor::copy_of(bias, DType::kF32);
  return storage.data<float>();
}

void check_topk(const TensorView& topk_weights, const TensorView& topk_ids, int64_t num_tokens,
                int64_t num_experts, Device device) {
  check_tensor(topk_ids, "topk_ids", device);
  check_tensor(topk_weights, "topk_weights", device);
  check_dtype(topk_ids, "topk_ids", {DType::kI32});
  check_dtype(topk_weights, "topk_weights", {DType::kF32});
  check_rank(topk_ids, "topk_ids", 2);
  if (topk_ids.numel() >= kMaxPairs) {
    fail(
        "topk_ids: expected fewer than {} pairs (M * k), which the kernels number in int32; got "
        "shape {}",
        kMaxPairs, shape_string(topk_ids.shape));
  }
  if (topk_ids.size(0) != num_tokens) {
    fail("topk_ids: expected {} rows (one per token of hidden); got shape {}", num_tokens,
         shape_string(topk_ids.shape));
  }
  const int64_t k = topk_ids.size(1);
  if (k < 1 || k > num_experts) {
    fail("topk_ids: expected top_k (its second extent) in [1, {}] (the number of experts); got {}",
         num_experts, k);
  }
  check_shape(topk_weights, "topk_weights", topk_ids.shape);
  // Device memory is not read here (that would synchronize): the CUDA kernels skip ids outside
  // [0, E) instead, so such a pair adds nothing and touches no other token.
  if (device != Device::kCpu) return;
  check_routing_values(topk_ids.as<int32_t>(), topk_weights.as<float>(), topk_ids.numel(), k,
                       num_experts);
}

void check_expert_map(const TensorView& map, int64_t num_local_experts, Device device) {
  check_tensor(map, "expert_map", device);
  check_dtype(map, "expert_map", {DType::kI32});
  check_rank(map, "expert_map", 1);
  if (device != Device::kCpu) return;  // the CUDA kernels treat bad entries as not local
  const int32_t* entries = map.as<int32_t>();
  for (int64_t e = 0; e < map.numel(); ++e) {
    if (entries[e] < -1 || entries[e] >= num_local_experts) {
      fail("expert_map: expected -1 or a local expert id in [0, {}); got {} for expert {}",
           num_local_experts, entries[e], e);
    }
  }
}

void check_shared(const SharedExpertWeights& shared, DType weight_dtype, int64_t hidden_size,
                  ExpertsProblem& problem) {
  check_tensor(shared.w13, "shared.w13", Device::kCpu);
  check_tensor(shared.w2, "shared.w2", Device::kCpu);
  check_rank(shared.w13, "shared.w13", 2);
  check_dtype(shared.w13, "shared.w13", {weight_dtype});
  check_dtype(shared.w2, "shared.w2", {weight_dtype});
  const int64_t two_is = shared.w13.size(0);
  if (two_is < 2 || two_is % 2 != 0) {
    fail("shared.w13: expected [2 * Is, H] with Is >= 1; got shape {}",
         shape_string(shared.w13.shape));
  }
  check_shape(shared.w13, "shared.w13", {two_is, hidden_size});
  check_shape(shared.w2, "shared.w2", {hidden_size, two_is / 2});
  problem.shared_intermediate_size = two_is / 2;
  problem.shared_w13 = shared.w13.data;
  problem.shared_w2 = shared.w2.data;
  if (!shared.gate.empty()) {
    check_tensor(shared.gate, "shared.gate", Device::kCpu);
    check_dtype(shared.gate, "shared.gate", {weight_dtype});
    if (shared.gate.numel() != hidden_size || shared.gate.dim() > 2 ||
        (shared.gate.dim() == 2 && shared.gate.size(0) != 1)) {
      fail("shared.gate: expected shape [1, {}] or [{}]; got {}", hidden_size, hidden_size,
           shape_string(shared.gate.shape));
    }
    problem.shared_gate = shared.gate.data;
  }
}

// The kernels dispatch on the activation without a default, so a value outside the enum (a
// cast, a stale binding) is stopped here; the clamped SwiGLU's parameters as MoeConfig's are.
void check_activation(const ExpertsOptions& options) {
  switch (options.activation) {
    case Activation::kSilu:
    case Activation::kGelu:
    case Activation::kGeluTanh:
      return;
    case Activation::kClampedSwiglu:
      if (!(options.swiglu_limit > 0) || !std::isfinite(options.swiglu_limit)) {
        fail("swiglu_limit: expected a positive finite number for the clamped SwiGLU; got {}",
             options.swiglu_limit);
      }
      if (!std::isfinite(options.swiglu_alpha)) {
        fail("swiglu_alpha: expected a finite number for the clamped SwiGLU; got {}",
             options.swiglu_alpha);
      }
      return;
  }
  fail("activation: expected silu, gelu, gelu_tanh or clamped_swiglu; got the value {}",
       static_cast<int>(options.activation));
}

// What the CUDA backend runs today; the rest is refused before launch rather than done wrong.
void check_cuda_support(const ExpertsOptions& options, DType hidden_dtype, DType weight_dtype) {
  if (hidden_dtype != DType::kBF16 || weight_dtype != DType::kBF16) {
    fail("fused_experts on CUDA: expected bf16 hidden and weights; got hidden {}, weights {}",
         dtype_name(hidden_dtype), dtype_name(weight_dtype));
  }
  if (options.activation != Activation::kSilu) {
    fail("fused_experts on CUDA: only the SiLU-gated activation is implemented; got {}",
         activation_name(options.activation));
  }
  if (!options.w13_bias.empty() || !options.w2_bias.empty()) {
    fail("fused_experts on CUDA: expert biases (w13_bias, w2_bias) are not implemented yet");
  }
  if (options.apply_router_weight_on_input) {
    fail("fused_experts on CUDA: apply_router_weight_on_input is not implemented yet");
  }
  if (options.shared.defined()) {
    fail("fused_experts on CUDA: shared experts are not implemented yet; run them separately");
  }
}

}  // namespace

void check_routing_values(const int32_t* topk_ids, const float* topk_weights, int64_t num_pairs,
                          int64_t top_k, int64_t num_experts) {
  for (int64_t p = 0; p < num_pairs; ++p) {
    if (topk_ids[p] < 0 || topk_ids[p] >= num_experts) {
      fail("topk_ids: expected expert ids in [0, {}); got {} at token {}, slot {}", num_experts,
           topk_ids[p], p / top_k, p % top_k);
    }
    if (!std::isfinite(topk_weights[p])) {
      fail("topk_weights: expected finite router weights; got {} at token {}, slot {}",
           topk_weights[p], p / top_k, p % top_k);
    }
  }
}

ValidatedExperts validate_experts(const TensorView& hidden, const TensorView& w13,
                                  const TensorView& w2, const TensorView& topk_weights,
                                  const TensorView& topk_ids, const TensorView& out,
                                  const ExpertsOptions& options) {
  ValidatedExperts v;
  ExpertsProblem& pb = v.problem;

  const Device device = hidden.device;
  check_tensor(hidden, "hidden", device);
  check_rank(hidden, "hidden", 2);
  check_dtype(hidden, "hidden", kFloatTypes);
  pb.num_tokens = hidden.size(0);
  pb.hidden_size = hidden.size(1);
  if (pb.hidden_size < 1)
    fail("hidden: expected a hidden size >= 1; got shape {}", shape_string(hidden.shape));

  check_tensor(w13, "w13", device);
  check_rank(w13, "w13", 3);
  check_dtype(w13, "w13", kFloatTypes);
  pb.num_local_experts = w13.size(0);
  const int64_t two_i = w13.size(1);
  if (pb.num_local_experts < 1 || two_i < 2 || two_i % 2 != 0) {
    fail("w13: expected [E, 2 * I, H] with E >= 1 and I >= 1; got shape {}",
         shape_string(w13.shape));
  }
  pb.intermediate_size = two_i / 2;
  check_shape(w13, "w13", {pb.num_local_experts, two_i, pb.hidden_size});
  check_tensor(w2, "w2", device);
  check_dtype(w2, "w2", {w13.dtype});
  check_shape(w2, "w2", {pb.num_local_experts, pb.hidden_size, pb.intermediate_size});
  pb.weight_dtype = w13.dtype;

  pb.num_experts = pb.num_local_experts;
  if (!options.expert_map.empty()) {
    check_expert_map(options.expert_map, pb.num_local_experts, device);
    pb.num_experts = options.expert_map.numel();
    pb.expert_map = options.expert_map.as<int32_t>();
  }
  check_topk(topk_weights, topk_ids, pb.num_tokens, pb.num_experts, device);
  pb.top_k = topk_ids.size(1);

  check_tensor(out, "out", device);
  check_dtype(out, "out", {hidden.dtype});
  check_shape(out, "out", hidden.shape);

  check_activation(options);
  if (device == Device::kCuda) check_cuda_support(options, hidden.dtype, w13.dtype);
  pb.w13_bias = bias_f32(options.w13_bias, "w13_bias", pb.num_local_experts, two_i, v.w13_bias_f32);
  pb.w2_bias =
      bias_f32(options.w2_bias, "w2_bias", pb.num_local_experts, pb.hidden_size, v.w2_bias_f32);
  if (options.shared.defined()) check_shared(options.shared, pb.weight_dtype, pb.hidden_size, pb);

  if (options.block_m < 0 || options.block_m > cpu::kMaxBlockM) {
    fail("block_m: expected 0 (backend default) or 1..{}; got {}", cpu::kMaxBlockM,
         options.block_m);
  }

  pb.hidden = hidden.data;
  pb.hidden_dtype = hidden.dtype;
  pb.w13 = w13.data;
  pb.w2 = w2.data;
  pb.topk_weights = topk_weights.as<float>();
  pb.topk_ids = topk_ids.as<int32_t>();
  pb.activation = options.activation;
  pb.swiglu_alpha = options.swiglu_alpha;
  pb.swiglu_limit = options.swiglu_limit;
  pb.weight_on_input = options.apply_router_weight_on_input;
  pb.out = out.data;
  return v;
}

}  // namespace moe
