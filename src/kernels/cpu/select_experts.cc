// Expert selection on the CPU: scores, correction bias, group limit, top-k, renormalize, scale,
// one token per loop iteration in f32 with all scratch on the stack. The rules (order, NaN, ties,
// group scores) are those of kernels/reference/routing.cc; tests/routing/ compares the two.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/routing.h"
#include "kernels/cpu/threads.h"

namespace moe::cpu {
namespace {

// Larger first, NaN after every number, ties to the lower id: a total order, so partial_sort
// gives the same prefix as a full sort and a NaN row still yields k distinct ids.
bool ranks_before(float a, int32_t id_a, float b, int32_t id_b) {
  if (std::isnan(a) != std::isnan(b)) return std::isnan(b);
  if (!std::isnan(a) && a != b) return a > b;
  return id_a < id_b;
}

void compute_scores(ScoringFunc scoring, const float* logits, int64_t num_experts, float* scores) {
  if (scoring == ScoringFunc::kSigmoid) {
    for (int64_t e = 0; e < num_experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    return;
  }
  // Softmax. The max skips NaN; a NaN logit still makes the sum, hence every score, NaN.
  float max_logit = -std::numeric_limits<float>::infinity();
  for (int64_t e = 0; e < num_experts; ++e) max_logit = std::max(max_logit, logits[e]);
  float sum = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    scores[e] = std::exp(logits[e] - max_logit);
    sum += scores[e];
  }
  for (int64_t e = 0; e < num_experts; ++e) scores[e] /= sum;
}

// Marks the config.topk_groups best groups in `kept` [num_groups]. A group scores the sum of its
// two best selection scores with a correction bias (DeepSeek-V3), else its best one (DeepSeek-V2,
// vLLM's grouped_topk); a group of one expert scores that expert.
void keep_best_groups(const RoutingConfig& config, const float* selection, float* group_scores,
                      int32_t* order, bool* kept) {
  const int64_t num_groups = config.num_groups;
  const int64_t group_size = config.num_experts / num_groups;
  for (int64_t g = 0; g < num_groups; ++g) {
    int32_t best = static_cast<int32_t>(g * group_size);
    int32_t second = -1;
    for (int32_t e = best + 1; e < (g + 1) * group_size; ++e) {
      if (ranks_before(selection[e], e, selection[best], best)) {
        second = best;
        best = e;
      } else if (second < 0 || ranks_before(selection[e], e, selection[second], second)) {
        second = e;
      }
    }
    float score = selection[best];
    if (config.has_correction_bias && second >= 0) score += selection[second];
    group_scores[g] = score;
    order[g] = static_cast<int32_t>(g);
    kept[g] = false;
  }
  std::partial_sort(
      order, order + config.topk_groups, order + num_groups,
      [&](int32_t a, int32_t b) { return ranks_before(group_scores[a], a, group_scores[b], b); });
  for (int64_t i = 0; i < config.topk_groups; ++i) kept[order[i]] = true;
}

// Moves the k candidates of order[0, num_candidates) that rank first to order[0, k), in rank
// order: the prefix partial_sort gives, since ranks_before is a total order. Up to kInsertionTopK
// by insertion into the sorted prefix (most candidates take one comparison with the k-th best;
// on 128 and 256 experts, top-8, the whole selection took 15-18% less time than with
// partial_sort), beyond it by partial_sort, whose cost grows with log k rather than k.
constexpr int64_t kInsertionTopK = 32;
void keep_top_k(int32_t* order, int64_t num_candidates, int64_t k, const float* ranked) {
  auto before = [&](int32_t a, int32_t b) { return ranks_before(ranked[a], a, ranked[b], b); };
  if (k > kInsertionTopK) {
    std::partial_sort(order, order + k, order + num_candidates, before);
    return;
  }
  int64_t kept = 0;
  for (int64_t i = 0; i < num_candidates; ++i) {
    const int32_t candidate = order[i];
    if (kept == k && !before(candidate, order[k - 1])) continue;
    int64_t j = kept < k ? kept++ : k - 1;
    for (; j > 0 && before(candidate, order[j - 1]); --j) order[j] = order[j - 1];
    order[j] = candidate;
  }
}

void route_token(const RoutingConfig& config, const float* logits, const float* correction_bias,
                 int32_t* ids, float* weights) {
  const int64_t num_experts = config.num_experts;
  const int64_t k = config.top_k;
  float scores[kMaxExperts];        // [E] unbiased: the weights come from these
  float selection[kMaxExperts];     // [E] scores + correction bias: the ranking uses these
  int32_t order[kMaxExperts];       // [E] candidate ids (first the group ids)
  float group_scores[kMaxExperts];  // [num_groups]
  bool kept[kMaxExperts];           // [num_groups]

  compute_scores(config.scoring, logits, num_experts, scores);
  const float* ranked = scores;
  if (correction_bias) {
    for (int64_t e = 0; e < num_experts; ++e) selection[e] = scores[e] + correction_bias[e];
    ranked = selection;
  }

  // Experts of dropped groups are not candidates at all: they rank below every kept expert, NaN
  // included. vLLM's -inf mask agrees unless a kept expert is itself -inf or NaN; HF's
  // DeepSeek-V3 masks with 0.0, which differs when the kept biased scores are negative.
  int64_t num_candidates = 0;
  if (config.num_groups > 1) {
    keep_best_groups(config, ranked, group_scores, order, kept);
    const int64_t group_size = num_experts / config.num_groups;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (kept[e / group_size]) order[num_candidates++] = static_cast<int32_t>(e);
    }
  } else {
    for (int64_t e = 0; e < num_experts; ++e) order[num_candidates++] = static_cast<int32_t>(e);
  }
  keep_top_k(order, num_candidates, k, ranked);

  float sum = 0;
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[j];
    weights[j] = scores[order[j]];
    sum += weights[j];
  }
  // A zero sum (every kept sigmoid underflowed) leaves the zeros as they are rather than 0/0.
  const bool divide = config.renormalize && sum > 0;
  for (int64_t j = 0; j < k; ++j) {
    if (divide) weights[j] /= sum;
    weights[j] *= config.routed_scaling_factor;
  }
}

}  // namespace

void select_experts(const RoutingConfig& config, const float* logits, int64_t num_tokens,
                    const float* correction_bias, int32_t* topk_ids, float* topk_weights,
                    int num_threads) {
  if (num_tokens == 0) return;
  const int64_t k = config.top_k;
  // Always the caller's team size, even for fewer tokens than threads: threads.h says why.
  const int threads = resolve_num_threads(num_threads);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t t = 0; t < num_tokens; ++t) {
    route_token(config, logits + t * config.num_experts, correction_bias, topk_ids + t * k,
                topk_weights + t * k);
  }
}

void count_experts(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                   int32_t* expert_counts) {
  std::fill(expert_counts, expert_counts + num_experts, 0);
  for (int64_t p = 0; p < num_pairs; ++p) ++expert_counts[topk_ids[p]];
}

}  // namespace moe::cpu
