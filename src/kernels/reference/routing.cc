// Reference routing in float64. Test: tests/routing/ (every backend is compared with this one).
#include "kernels/reference/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace moe::reference {
namespace {

double load(const void* data, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[index];
    case DType::kBF16:
      return to_f32(static_cast<const bf16*>(data)[index]);
    case DType::kF16:
      return to_f32(static_cast<const f16*>(data)[index]);
    // The API edge admits only the three types above for router inputs.
    case DType::kF8E4M3:
    case DType::kF64:
    case DType::kI32:
    case DType::kI8:
    case DType::kU8:
    case DType::kI64:
      break;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// The one order used for every ranking: larger first, NaN after every number, ties to the lower id.
bool ranks_before(double a, int64_t id_a, double b, int64_t id_b) {
  if (std::isnan(a) != std::isnan(b)) return std::isnan(b);
  if (!std::isnan(a) && a != b) return a > b;
  return id_a < id_b;
}

// `ids` sorted best first by `values[id]`.
void sort_by_rank(std::vector<int64_t>& ids, const std::vector<double>& values) {
  std::sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
    return ranks_before(values[static_cast<size_t>(a)], a, values[static_cast<size_t>(b)], b);
  });
}

std::vector<double> scores_of(const RoutingConfig& config, const double* logits) {
  const size_t num_experts = static_cast<size_t>(config.num_experts);
  std::vector<double> scores(num_experts);
  if (config.scoring == ScoringFunc::kSigmoid) {
    for (size_t e = 0; e < num_experts; ++e) scores[e] = 1.0 / (1.0 + std::exp(-logits[e]));
    return scores;
  }
  // Softmax. The max skips NaN; a NaN logit still makes the sum, hence every score, NaN.
  double max_logit = -std::numeric_limits<double>::infinity();
  for (size_t e = 0; e < num_experts; ++e) max_logit = std::max(max_logit, logits[e]);
  double sum = 0;
  for (size_t e = 0; e < num_experts; ++e) {
    scores[e] = std::exp(logits[e] - max_logit);
    sum += scores[e];
  }
  for (size_t e = 0; e < num_experts; ++e) scores[e] /= sum;
  return scores;
}

}  // namespace

void router_logits(const void* hidden, DType hidden_dtype, const void* weight, DType weight_dtype,
                   const float* router_bias, int64_t num_tokens, int64_t hidden_size,
                   int64_t num_experts, double* logits) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t e = 0; e < num_experts; ++e) {
      double sum = router_bias ? router_bias[e] : 0.0;
      for (int64_t h = 0; h < hidden_size; ++h) {
        sum += load(hidden, hidden_dtype, t * hidden_size + h) *
               load(weight, weight_dtype, e * hidden_size + h);
      }
      logits[t * num_experts + e] = sum;
    }
  }
}

TokenRouting route_token(const RoutingConfig& config, const double* logits,
                         const float* correction_bias) {
  const int64_t num_experts = config.num_experts;
  const int64_t num_groups = config.num_groups;
  const int64_t group_size = num_experts / num_groups;
  TokenRouting r;
  r.scores = scores_of(config, logits);
  r.selection = r.scores;
  if (correction_bias) {
    for (int64_t e = 0; e < num_experts; ++e) {
      r.selection[static_cast<size_t>(e)] += correction_bias[e];
    }
  }

  r.group_kept.assign(static_cast<size_t>(num_groups), num_groups == 1);
  if (num_groups > 1) {
    // DeepSeek-V3 (noaux_tc, with a correction bias) scores a group by the sum of its two best
    // selection scores; DeepSeek-V2 and vLLM's grouped_topk without a bias by its best one.
    for (int64_t g = 0; g < num_groups; ++g) {
      std::vector<int64_t> members(static_cast<size_t>(group_size));
      std::iota(members.begin(), members.end(), g * group_size);
      sort_by_rank(members, r.selection);
      double score = r.selection[static_cast<size_t>(members[0])];
      if (config.has_correction_bias && group_size > 1) {
        score += r.selection[static_cast<size_t>(members[1])];
      }
      r.group_scores.push_back(score);
    }
    std::vector<int64_t> groups(static_cast<size_t>(num_groups));
    std::iota(groups.begin(), groups.end(), 0);
    sort_by_rank(groups, r.group_scores);
    for (int64_t i = 0; i < config.topk_groups; ++i) {
      r.group_kept[static_cast<size_t>(groups[static_cast<size_t>(i)])] = true;
    }
  }

  // Experts outside the kept groups are not candidates at all: they rank below every kept
  // expert, NaN included. vLLM masks them with -inf, which agrees unless a kept expert is itself
  // -inf or NaN; HF's DeepSeek-V3 masks them with 0.0, which picks a dropped expert whenever the
  // kept biased scores are negative.
  std::vector<int64_t> candidates;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (r.group_kept[static_cast<size_t>(e / group_size)]) candidates.push_back(e);
  }
  sort_by_rank(candidates, r.selection);

  double sum = 0;
  for (int64_t j = 0; j < config.top_k; ++j) {
    const int64_t id = candidates[static_cast<size_t>(j)];
    r.ids.push_back(static_cast<int32_t>(id));
    r.weights.push_back(r.scores[static_cast<size_t>(id)]);
    sum += r.weights.back();
  }
  // A zero sum (every kept sigmoid underflowed) leaves the zeros as they are rather than 0/0.
  for (double& w : r.weights) {
    if (config.renormalize && sum > 0) w /= sum;
    w *= config.routed_scaling_factor;
  }
  return r;
}

void select_experts(const RoutingConfig& config, const double* logits, int64_t num_tokens,
                    const float* correction_bias, int32_t* topk_ids, float* topk_weights) {
  const int64_t k = config.top_k;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const TokenRouting r = route_token(config, logits + t * config.num_experts, correction_bias);
    for (int64_t j = 0; j < k; ++j) {
      topk_ids[t * k + j] = r.ids[static_cast<size_t>(j)];
      topk_weights[t * k + j] = static_cast<float>(r.weights[static_cast<size_t>(j)]);
    }
  }
}

void count_experts(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                   int32_t* expert_counts) {
  for (int64_t e = 0; e < num_experts; ++e) expert_counts[e] = 0;
  for (int64_t p = 0; p < num_pairs; ++p) ++expert_counts[topk_ids[p]];
}

}  // namespace moe::reference
