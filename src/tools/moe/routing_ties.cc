#include "tools/moe/routing_ties.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "moe/routing.h"

namespace moe::cli {

bool routed_at_a_tie(const MoeLayer& reference, const float* hidden_row, const int32_t* ids) {
  const MoeConfig& config = reference.config();
  const LayerWeights& w = reference.weights();
  const int64_t H = config.experts.hidden_size, E = config.routing.num_experts;
  const int64_t k = config.routing.top_k;
  const size_t router_row_bytes = static_cast<size_t>(H) * dtype_size(w.router.dtype());

  std::vector<double> logits(static_cast<size_t>(E));
  std::vector<float> router_row(static_cast<size_t>(H));
  double largest = 0;
  for (int64_t e = 0; e < E; ++e) {
    convert_to_f32(w.router.data<char>() + e * router_row_bytes, w.router.dtype(),
                   router_row.data(), router_row.size());
    double logit = w.router_bias.defined() ? w.router_bias.data<float>()[e] : 0.0;
    for (int64_t h = 0; h < H; ++h) logit += static_cast<double>(hidden_row[h]) * router_row[h];
    logits[e] = logit;
    largest = std::max(largest, std::abs(logit));
  }

  const double band = kRoutingTieBand * largest;
  std::vector<double> moves(static_cast<size_t>(E), -band);
  for (int64_t j = 0; j < k; ++j) {
    if (ids[j] < 0 || ids[j] >= E) return false;
    moves[ids[j]] = band * static_cast<double>(2 * k - j) / static_cast<double>(2 * k);
  }
  Tensor moved(DType::kF32, {1, E});
  for (int64_t e = 0; e < E; ++e) moved.data<float>()[e] = static_cast<float>(logits[e] + moves[e]);

  Tensor chosen(DType::kI32, {1, k}), weights(DType::kF32, {1, k});
  RoutingInputs inputs;
  if (w.correction_bias.defined()) inputs.correction_bias = w.correction_bias;
  select_experts(config.routing, moved, inputs, chosen, weights, {}, Backend::kReference);
  return std::equal(ids, ids + k, chosen.data<int32_t>());
}

std::string routing_note(int64_t misrouted, int64_t routed_at_ties) {
  std::string note;
  if (misrouted > 0) note = fmt::format("{} routed wrongly", misrouted);
  if (routed_at_ties > 0) {
    note += fmt::format("{}{} routed at a tie", note.empty() ? "" : ", ", routed_at_ties);
  }
  return note;
}

ReferenceOutput reference_output(MoeLayer& reference, const Tensor& hidden, const TensorView& ids,
                                 const TensorView& weights) {
  const int64_t n = hidden.size(0), H = hidden.size(1), k = reference.config().routing.top_k;
  ReferenceOutput result;
  result.expected = reference.forward(hidden);
  const Tensor reference_ids = Tensor::copy_of(reference.last_topk_ids(), DType::kI32);
  Tensor row_ids(DType::kI32, {1, k}), row_weights(DType::kF32, {1, k});
  for (int64_t t = 0; t < n; ++t) {
    const int32_t* layer_ids = ids.as<int32_t>() + t * k;
    if (std::equal(layer_ids, layer_ids + k, reference_ids.data<int32_t>() + t * k)) continue;
    float* hidden_row = hidden.data<float>() + t * H;
    if (!routed_at_a_tie(reference, hidden_row, layer_ids)) {
      ++result.misrouted;
      continue;
    }
    ++result.routed_at_ties;
    std::copy_n(layer_ids, k, row_ids.data<int32_t>());
    std::copy_n(weights.as<float>() + t * k, k, row_weights.data<float>());
    reference.forward_experts(
        TensorView(hidden_row, DType::kF32, {1, H}), row_ids, row_weights,
        TensorView(result.expected.data<float>() + t * H, DType::kF32, {1, H}));
  }
  return result;
}

}  // namespace moe::cli
