// local_layer_weights: the part of a layer's weights one rank of an expert-parallel group holds.
#include <cstring>

#include "moe/ep_layer.h"
#include "moe/error.h"

namespace moe {

namespace {

// Rows `experts` of the first axis of `t` (one row per expert), in that order.
Tensor rows_of(const Tensor& t, const char* name, int64_t num_experts,
               const std::vector<int32_t>& experts) {
  if (!t.defined()) return {};
  Shape shape = t.shape();
  if (shape.empty() || shape[0] != num_experts) {
    fail("local_layer_weights: {}: expected one row per expert ({}); got shape {}", name,
         num_experts, shape_string(shape));
  }
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(shape[0]);
  shape[0] = static_cast<int64_t>(experts.size());
  Tensor rows(t.dtype(), shape);
  for (size_t i = 0; i < experts.size(); ++i) {
    std::memcpy(rows.data<char>() + i * row_bytes, t.data<char>() + experts[i] * row_bytes,
                row_bytes);
  }
  return rows;
}

}  // namespace

LayerWeights local_layer_weights(const LayerWeights& full, const ExpertMap& map, int rank) {
  if (!full.w13.defined() || !full.w2.defined()) {
    fail("local_layer_weights: w13 and w2 are required");
  }
  const std::vector<int32_t> experts = map.local_experts(rank);
  const int64_t E = map.num_experts();
  LayerWeights local = full;
  local.w13 = rows_of(full.w13, "w13", E, experts);
  local.w2 = rows_of(full.w2, "w2", E, experts);
  local.w13_bias = rows_of(full.w13_bias, "w13_bias", E, experts);
  local.w2_bias = rows_of(full.w2_bias, "w2_bias", E, experts);
  return local;
}

}  // namespace moe
