// Synthetic routing traces: what a trained router's choices look like to a placement or
// balancing algorithm, without a model. Per layer, experts get a Zipf popularity over a random
// ranking; experts form co-selection clusters of 2k (a token's later picks tend to come from its
// first pick's cluster); the ranking rotates a little every step (the hot set drifts).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "moe/error.h"
#include "moe/trace.h"

namespace moe {

namespace {

// Uniform in [0, 1) from the raw engine output: the standard fixes mt19937_64's sequence but not
// the distributions', so this keeps traces identical across standard libraries.
double uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Index drawn with probability weight[i] / sum over the candidates whose weight is > 0.
int64_t draw(const std::vector<double>& weight, double total, std::mt19937_64& rng) {
  double target = uniform(rng) * total;
  for (size_t i = 0; i < weight.size(); ++i) {
    if (weight[i] <= 0) continue;
    if (target < weight[i]) return static_cast<int64_t>(i);
    target -= weight[i];
  }
  // Rounding left target past the end: the last candidate.
  for (size_t i = weight.size(); i-- > 0;) {
    if (weight[i] > 0) return static_cast<int64_t>(i);
  }
  return 0;
}

void check(const MoeConfig& config, const SyntheticTraceOptions& o) {
  if (o.num_layers < 0) fail("trace synth: expected num_layers >= 0; got {}", o.num_layers);
  if (o.num_steps < 1) fail("trace synth: expected steps >= 1; got {}", o.num_steps);
  if (o.tokens_per_step < 0) {
    fail("trace synth: expected tokens per step >= 0; got {}", o.tokens_per_step);
  }
  // Beyond 8 the popularity of the last ranks underflows toward zero and stops meaning anything.
  if (!(o.zipf_exponent >= 0 && o.zipf_exponent <= 8)) {
    fail("trace synth: expected a zipf exponent in [0, 8]; got {}", o.zipf_exponent);
  }
  if (!(o.co_selection >= 0 && o.co_selection <= 1)) {
    fail("trace synth: expected co-selection in [0, 1]; got {}", o.co_selection);
  }
  if (!std::isfinite(o.drift_per_step)) {
    fail("trace synth: expected a finite drift; got {}", o.drift_per_step);
  }
  if (o.num_gpus < 1) fail("trace synth: expected num_gpus >= 1; got {}", o.num_gpus);
  validate(config);
}

}  // namespace

RoutingTrace synthesize_trace(const MoeConfig& config, const SyntheticTraceOptions& o) {
  check(config, o);
  const int64_t E = config.routing.num_experts, k = config.routing.top_k;
  const int64_t cluster_size = std::min(E, 2 * k);
  RoutingTrace trace;
  trace.num_layers = o.num_layers > 0 ? o.num_layers : config.num_moe_layers();
  trace.num_experts = E;
  trace.top_k = k;
  trace.layers.resize(static_cast<size_t>(trace.num_layers));

  std::vector<double> weight(static_cast<size_t>(E)), masked(static_cast<size_t>(E));
  std::vector<double> candidates(static_cast<size_t>(E), 0.0);  // the first pick's cluster
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(l));
    std::vector<int32_t> ranking(static_cast<size_t>(E));
    std::iota(ranking.begin(), ranking.end(), 0);
    for (int64_t i = E - 1; i > 0; --i) {  // Fisher-Yates with the portable uniform
      std::swap(ranking[i], ranking[static_cast<size_t>(uniform(rng) * (i + 1))]);
    }
    TraceLayer& layer = trace.layers[static_cast<size_t>(l)];
    layer.step_offsets.push_back(0);
    for (int64_t step = 0; step < o.num_steps; ++step) {
      const int64_t shift = static_cast<int64_t>(std::floor(o.drift_per_step * step));
      for (int64_t r = 0; r < E; ++r) {
        const int64_t expert = ranking[static_cast<size_t>(((r + shift) % E + E) % E)];
        weight[expert] = 1.0 / std::pow(static_cast<double>(r + 1), o.zipf_exponent);
      }
      for (int64_t t = 0; t < o.tokens_per_step; ++t) {
        masked = weight;
        int64_t cluster = -1;
        for (int64_t j = 0; j < k; ++j) {
          // Later picks stay in the first pick's cluster with probability co_selection, while
          // that cluster has experts left.
          bool in_cluster = false;
          if (cluster >= 0 && uniform(rng) < o.co_selection) {
            const int64_t begin = cluster * cluster_size;
            const int64_t end = std::min(E, begin + cluster_size);
            std::fill(candidates.begin(), candidates.end(), 0.0);
            double total = 0;
            for (int64_t e = begin; e < end; ++e) total += candidates[e] = masked[e];
            if (total > 0) {
              const int64_t e = draw(candidates, total, rng);
              layer.topk_ids.push_back(static_cast<int32_t>(e));
              masked[e] = 0;
              in_cluster = true;
            }
          }
          if (!in_cluster) {
            const double total = std::accumulate(masked.begin(), masked.end(), 0.0);
            const int64_t e = draw(masked, total, rng);
            layer.topk_ids.push_back(static_cast<int32_t>(e));
            masked[e] = 0;
            if (cluster < 0) cluster = e / cluster_size;
          }
        }
        layer.source_gpu.push_back(static_cast<int32_t>(t % o.num_gpus));
      }
      layer.step_offsets.push_back(layer.step_offsets.back() + o.tokens_per_step);
    }
  }
  return trace;
}

}  // namespace moe
