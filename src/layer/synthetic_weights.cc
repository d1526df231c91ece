// Deterministic synthetic layer weights. Each element is a pure function of (seed, tensor,
// index), so generation can be split over threads without changing a bit.
#include <cmath>
#include <span>
#include <vector>

#include "moe/error.h"
#include "moe/layer.h"

namespace moe {

namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finalizer: a well-spread 64-bit hash
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform values with mean 0 and standard deviation `stddev`: trained weights are not Gaussian
// either, and what matters for the outputs' scale is the variance. With `experts`, only those
// rows of the first axis (in that order), each exactly as in the whole tensor.
Tensor synthetic(DType dtype, Shape shape, uint64_t seed, uint64_t tensor_id, float stddev,
                 std::span<const int32_t> experts = {}) {
  int64_t per_expert = 1;  // elements per row of the first axis
  for (size_t axis = 1; axis < shape.size(); ++axis) per_expert *= shape[axis];
  if (!experts.empty()) shape[0] = static_cast<int64_t>(experts.size());
  Tensor t(dtype, std::move(shape));
  const int64_t count = t.numel();
  const uint64_t stream = mix(seed ^ mix(tensor_id));
  const float half_width = stddev * std::sqrt(3.0f);
  constexpr int64_t kChunk = 1 << 16;
  const size_t element_bytes = dtype_size(dtype);
  // Element i of the result is element source(i) of the whole tensor.
  const auto source = [&](int64_t i) {
    if (experts.empty()) return i;
    return experts[static_cast<size_t>(i / per_expert)] * per_expert + i % per_expert;
  };
#pragma omp parallel for schedule(static)
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t end = std::min(count, begin + kChunk);
    std::vector<float> values(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t index = static_cast<uint64_t>(source(i));
      const double unit = static_cast<double>(mix(stream + index) >> 11) * 0x1.0p-53;  // [0, 1)
      values[static_cast<size_t>(i - begin)] = static_cast<float>((2 * unit - 1) * half_width);
    }
    convert_from_f32(values.data(), dtype, t.data<char>() + begin * element_bytes, values.size());
  }
  return t;
}

}  // namespace

LayerWeights synthetic_layer_weights(const MoeConfig& config, DType dtype, uint64_t seed) {
  return synthetic_layer_weights(config, dtype, seed, {});
}

LayerWeights synthetic_layer_weights(const MoeConfig& config, DType dtype, uint64_t seed,
                                     std::span<const int32_t> experts) {
  for (int32_t e : experts) {
    if (e < 0 || e >= config.routing.num_experts) {
      fail("synthetic_layer_weights: experts: expected ids in [0, {}); got {}",
           config.routing.num_experts, e);
    }
  }
  const int64_t H = config.experts.hidden_size, I = config.experts.intermediate_size;
  const int64_t E = config.routing.num_experts, Is = config.experts.shared_intermediate_size;
  const float h_scale = 1.0f / std::sqrt(static_cast<float>(H));
  LayerWeights w;
  w.router = synthetic(dtype, {E, H}, seed, 0, h_scale);
  if (config.routing.has_router_bias) w.router_bias = synthetic(DType::kF32, {E}, seed, 1, 0.1f);
  if (config.routing.has_correction_bias) {
    w.correction_bias = synthetic(DType::kF32, {E}, seed, 2, 0.05f);
  }
  w.w13 = synthetic(dtype, {E, 2 * I, H}, seed, 3, h_scale, experts);
  w.w2 = synthetic(dtype, {E, H, I}, seed, 4, 1.0f / std::sqrt(static_cast<float>(I)), experts);
  if (config.experts.has_bias) {
    w.w13_bias = synthetic(DType::kF32, {E, 2 * I}, seed, 5, 0.1f, experts);
    w.w2_bias = synthetic(DType::kF32, {E, H}, seed, 6, 0.1f, experts);
  }
  if (Is > 0) {
    w.shared_w13 = synthetic(dtype, {2 * Is, H}, seed, 7, h_scale);
    w.shared_w2 = synthetic(dtype, {H, Is}, seed, 8, 1.0f / std::sqrt(static_cast<float>(Is)));
    if (config.experts.shared_gate) w.shared_gate = synthetic(dtype, {1, H}, seed, 9, h_scale);
  }
  return w;
}

}  // namespace moe
