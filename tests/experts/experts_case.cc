#include "experts/experts_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "kernels/cpu/fused_experts.h"
#include "ops/experts_validation.h"

namespace moe::testing {

std::string ExpertsCase::describe() const {
  return fmt::format(
      "M={} H={} I={} E={} k={} dtype={} weights={} act={} routing={} on_input={} biases={} "
      "map={} shared={}{} block_m={} seed={}",
      num_tokens, hidden_size, intermediate_size, num_experts, top_k, dtype_name(dtype),
      dtype_name(weight_dtype), static_cast<int>(activation), static_cast<int>(routing),
      weight_on_input, biases, expert_map, shared_intermediate_size, shared_gate ? "+gate" : "",
      block_m, seed);
}

namespace {

// k distinct experts per token; weights positive and summing to 1 per token.
void fill_routing(const ExpertsCase& c, const TensorView& ids, const TensorView& weights) {
  std::mt19937_64 rng(c.seed * 7919 + 17);
  std::vector<int32_t> experts(static_cast<size_t>(c.num_experts));
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    // kSkewed: three tokens in four keep experts 0..k-1, so expert 0 takes most pairs;
    // kAllToOneExpert: every token keeps them, so expert 0 takes every token.
    const bool shuffle =
        c.routing == Routing::kUniform || (c.routing == Routing::kSkewed && rng() % 4 == 0);
    if (shuffle) std::shuffle(experts.begin(), experts.end(), rng);
    float total = 0;
    for (int64_t j = 0; j < c.top_k; ++j) {
      ids.as<int32_t>()[t * c.top_k + j] = experts[static_cast<size_t>(j)];
      total += weights.as<float>()[t * c.top_k + j] = uniform(rng);
    }
    for (int64_t j = 0; j < c.top_k; ++j) weights.as<float>()[t * c.top_k + j] /= total;
  }
}

}  // namespace

ExpertsInputs make_inputs(const ExpertsCase& c) {
  const int64_t M = c.num_tokens, H = c.hidden_size, I = c.intermediate_size;
  const int64_t E = c.num_experts, k = c.top_k;
  const int64_t local = c.expert_map ? E - (E + 2) / 3 : E;
  ExpertsInputs in;
  // Scaled like trained weights: each projection keeps activations of order one.
  in.hidden = random_normal(c.dtype, {M, H}, c.seed);
  in.w13 = random_normal(c.weight_dtype, {local, 2 * I, H}, c.seed + 1, 1.0f / std::sqrt(H));
  in.w2 = random_normal(c.weight_dtype, {local, H, I}, c.seed + 2, 1.0f / std::sqrt(I));
  in.topk_ids = Tensor(DType::kI32, {M, k});
  in.topk_weights = Tensor(DType::kF32, {M, k});
  fill_routing(c, in.topk_ids, in.topk_weights);

  ExpertsOptions& o = in.options;
  o.activation = c.activation;
  o.apply_router_weight_on_input = c.weight_on_input;
  o.block_m = c.block_m;
  if (c.biases) {
    in.w13_bias = random_normal(DType::kF32, {local, 2 * I}, c.seed + 3, 0.5f);
    in.w2_bias = random_normal(DType::kF32, {local, H}, c.seed + 4, 0.5f);
    o.w13_bias = in.w13_bias;
    o.w2_bias = in.w2_bias;
  }
  if (c.expert_map) {
    // Experts 0, 3, 6, ... are on another rank; the others are numbered in order.
    in.expert_map = Tensor(DType::kI32, {E});
    int32_t next = 0;
    for (int64_t e = 0; e < E; ++e) in.expert_map.data<int32_t>()[e] = e % 3 == 0 ? -1 : next++;
    o.expert_map = in.expert_map;
  }
  if (c.shared_intermediate_size > 0) {
    const int64_t Is = c.shared_intermediate_size;
    in.shared_w13 = random_normal(c.weight_dtype, {2 * Is, H}, c.seed + 5, 1.0f / std::sqrt(H));
    in.shared_w2 = random_normal(c.weight_dtype, {H, Is}, c.seed + 6, 1.0f / std::sqrt(Is));
    o.shared.w13 = in.shared_w13;
    o.shared.w2 = in.shared_w2;
    if (c.shared_gate) {
      in.shared_gate = random_normal(c.weight_dtype, {1, H}, c.seed + 7, 1.0f / std::sqrt(H));
      o.shared.gate = in.shared_gate;
    }
  }
  return in;
}

namespace {

// Runs `call` on a NaN-poisoned output followed by a guard row; fails the current test if the
// guard row changed.
template <typename Call>
Tensor run_guarded(const ExpertsInputs& in, const std::string& what, Call call) {
  const int64_t M = in.hidden.size(0), H = in.hidden.size(1);
  Tensor storage(in.hidden.dtype(), {M + 1, H});
  poison(storage);
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(in.hidden.dtype());
  char* guard = storage.data<char>() + M * row_bytes;
  std::memset(guard, 0x5a, row_bytes);
  call(TensorView(storage.data<void>(), in.hidden.dtype(), {M, H}));
  for (size_t b = 0; b < row_bytes; ++b) {
    if (static_cast<unsigned char>(guard[b]) != 0x5a) {
      ADD_FAILURE() << what << " wrote past the output, byte " << b;
      break;
    }
  }
  Tensor result(in.hidden.dtype(), {M, H});
  std::memcpy(result.data<void>(), storage.data<void>(), result.nbytes());
  return result;
}

}  // namespace

Tensor run_backend(const ExpertsInputs& in, Backend backend, int num_threads) {
  return run_guarded(in, "backend " + std::string(backend_name(backend)), [&](TensorView out) {
    ExpertsOptions options = in.options;
    options.backend = backend;
    options.num_threads = num_threads;
    fused_experts(in.hidden, in.w13, in.w2, in.topk_weights, in.topk_ids, out, options);
  });
}

Tensor run_cpu_kernels(const ExpertsInputs& in, const cpu::ExpertKernels& kernels,
                       int num_threads) {
  return run_guarded(in, "cpu kernels", [&](TensorView out) {
    const ValidatedExperts v =
        validate_experts(in.hidden, in.w13, in.w2, in.topk_weights, in.topk_ids, out, in.options);
    cpu::ExpertsWorkspace workspace;
    const int64_t block_m = in.options.block_m > 0 ? in.options.block_m : cpu::kDefaultBlockM;
    cpu::fused_experts(v.problem, nullptr, kernels, block_m, workspace, num_threads, nullptr);
  });
}

Tensor run_reference_f32(const ExpertsInputs& in) {
  const Tensor hidden = Tensor::copy_of(in.hidden, DType::kF32);
  Tensor out(DType::kF32, hidden.shape());
  poison(out);
  fused_experts(hidden, in.w13, in.w2, in.topk_weights, in.topk_ids, out, [&] {
    ExpertsOptions options = in.options;
    options.backend = Backend::kReference;
    return options;
  }());
  return out;
}

}  // namespace moe::testing
