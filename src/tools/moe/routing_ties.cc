#include "tools/moe/routing_ties.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

}  // namespace moe::cli
