// The cpu backend against the float64 reference on random problems of every routing variant.
//
// The two backends see the same operand values (the conversion of bf16/f16 to f32 is exact), so
// they differ only by f32 rounding, which is bounded per token:
//   logits     |dl| <= L = (H + 2) u (sum_h |x_h w_h| + |b|)   (any summation order; u = 2^-24)
//   softmax    relative error of a score <= 2 (L + u R) + (E + 4) u, R = max logit - min logit:
//              the shift by the max and log of the normalizer each move by at most L + u R,
//              and exp, the E-term sum and the division add their roundings
//   sigmoid    relative error <= L + 4 u (the slope of log sigmoid is below 1)
// Scores are at most 1, so that relative bound S is also an absolute one; a biased selection
// score adds u (1 + |bias|), a group's top-2 sum doubles that. The backends can only order two
// experts (or groups) differently when the reference puts them within twice that tolerance, so
// ids must be identical unless the reference's sorted selection scores have such a close pair
// among the first k + 1 candidates, or the last kept and the first dropped group are that close.
// Weights are compared with the reference's unbiased scores of the ids the cpu chose, relative
// error <= S + 2u, or 2 S + (k + 3) u when renormalized (the sum and the division).
#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "kernels/reference/routing.h"
#include "moe/routing.h"
#include "routing/guarded_buffer.h"

namespace moe {
namespace {

constexpr double kUnitRoundoff = 0x1p-24;

const char* const kVariantNames[] = {
    "softmax (OLMoE)",
    "softmax renormalized (Qwen3, Mixtral)",
    "softmax + router bias, renormalized (gpt-oss)",
    "sigmoid (Llama-4)",
    "sigmoid + correction bias, groups, renormalized, scaled (DeepSeek-V3)",
    "softmax, groups, scaled (DeepSeek-V2)",
    "sigmoid + correction bias, renormalized",
};
constexpr int kNumVariants = 7;

// Splits the experts into a random number of groups (when E has a divisor > 1) and keeps
// enough of them to hold k experts.
void pick_groups(RoutingConfig& c, std::mt19937_64& rng) {
  std::vector<int64_t> divisors;
  for (int64_t g = 2; g <= c.num_experts; ++g) {
    if (c.num_experts % g == 0) divisors.push_back(g);
  }
  if (divisors.empty()) return;
  c.num_groups = divisors[rng() % divisors.size()];
  const int64_t group_size = c.num_experts / c.num_groups;
  const int64_t min_groups = (c.top_k + group_size - 1) / group_size;
  c.topk_groups = min_groups + static_cast<int64_t>(rng() % (c.num_groups - min_groups + 1));
}

RoutingConfig make_config(int variant, int64_t num_experts, int64_t top_k, std::mt19937_64& rng) {
  RoutingConfig c;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.scoring =
      variant == 3 || variant == 4 || variant == 6 ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  c.renormalize = variant == 1 || variant == 2 || variant == 4 || variant == 6;
  c.has_router_bias = variant == 2;
  c.has_correction_bias = variant == 4 || variant == 6;
  c.apply_weight_on_input = variant == 3;
  if (variant == 4) c.routed_scaling_factor = 2.5f;
  if (variant == 5) c.routed_scaling_factor = 16.0f;
  if (variant == 4 || variant == 5) pick_groups(c, rng);
  return c;
}

struct Tolerance {
  double selection;   // absolute, on one selection score
  double group;       // absolute, on one group score
  double weight_rel;  // relative, on one weight
};

Tolerance tolerance_for(const RoutingConfig& c, int64_t hidden_size, const double* logits,
                        const double* magnitudes, double max_abs_bias) {
  const double u = kUnitRoundoff;
  double logit_bound = 0;
  double lo = INFINITY;
  double hi = -INFINITY;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    logit_bound = std::max(logit_bound, static_cast<double>(hidden_size + 2) * u * magnitudes[e]);
    lo = std::min(lo, logits[e]);
    hi = std::max(hi, logits[e]);
  }
  logit_bound *= 1.01;  // the 1 / (1 - n u) factor of gamma_n
  const double score =
      c.scoring == ScoringFunc::kSoftmax
          ? 2 * (logit_bound + u * (hi - lo)) + static_cast<double>(c.num_experts + 4) * u
          : logit_bound + 4 * u;
  const double selection = score + u * (1 + max_abs_bias);
  const double weight =
      c.renormalize ? 2 * score + static_cast<double>(c.top_k + 3) * u : score + 2 * u;
  return Tolerance{selection, 2 * selection + 2 * u * (1 + max_abs_bias), weight};
}

// Whether f32 rounding may legitimately change this token's ids or their order.
bool is_close_call(const RoutingConfig& c, const reference::TokenRouting& r, const Tolerance& tol) {
  if (c.num_groups > 1 && c.topk_groups < c.num_groups) {
    std::vector<double> groups = r.group_scores;
    std::sort(groups.begin(), groups.end(), std::greater<>());
    const size_t last_kept = static_cast<size_t>(c.topk_groups - 1);
    if (groups[last_kept] - groups[last_kept + 1] <= 2 * tol.group) return true;
  }
  std::vector<double> candidates;
  const int64_t group_size = c.num_experts / c.num_groups;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    if (r.group_kept[static_cast<size_t>(e / group_size)]) {
      candidates.push_back(r.selection[static_cast<size_t>(e)]);
    }
  }
  std::sort(candidates.begin(), candidates.end(), std::greater<>());
  const size_t last = std::min(candidates.size(), static_cast<size_t>(c.top_k + 1));
  for (size_t i = 0; i + 1 < last; ++i) {
    if (candidates[i] - candidates[i + 1] <= 2 * tol.selection) return true;
  }
  return false;
}

struct Problem {
  int64_t num_tokens;
  int64_t hidden_size;
  DType hidden_dtype;
  DType weight_dtype;
  RoutingConfig config;
  int variant;
  uint64_t seed;

  std::string describe() const {
    return fmt::format("M={} E={} k={} H={} hidden {} weight {} groups {}/{} variant '{}' seed {}",
                       num_tokens, config.num_experts, config.top_k, hidden_size,
                       dtype_name(hidden_dtype), dtype_name(weight_dtype), config.topk_groups,
                       config.num_groups, kVariantNames[variant], seed);
  }
};

// A copy with every element replaced by its magnitude (exact in every float dtype).
Tensor absolute(const Tensor& t) {
  Tensor copy = Tensor::copy_of(t, DType::kF32);
  for (int64_t i = 0; i < copy.numel(); ++i)
    copy.data<float>()[i] = std::abs(copy.data<float>()[i]);
  return Tensor::copy_of(copy, t.dtype());
}

struct CpuOutput {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

CpuOutput run_cpu(const Problem& p, const Tensor& hidden, const Tensor& weight,
                  const RoutingInputs& inputs, int num_threads) {
  const RoutingConfig& c = p.config;
  testing::GuardedBuffer<int32_t> ids(p.num_tokens * c.top_k);
  testing::GuardedBuffer<float> weights(p.num_tokens * c.top_k);
  testing::GuardedBuffer<int32_t> counts(c.num_experts);
  route(c, hidden, weight, inputs, ids.view(DType::kI32, {p.num_tokens, c.top_k}),
        weights.view(DType::kF32, {p.num_tokens, c.top_k}),
        counts.view(DType::kI32, {c.num_experts}), Backend::kCpu, num_threads);
  EXPECT_TRUE(ids.guard_intact() && weights.guard_intact() && counts.guard_intact())
      << "a write past the end of an output";
  std::vector<int32_t> histogram(static_cast<size_t>(c.num_experts), 0);
  for (int64_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 0 && ids[i] < c.num_experts) ++histogram[static_cast<size_t>(ids[i])];
  }
  EXPECT_EQ(std::vector<int32_t>(counts.data(), counts.data() + counts.size()), histogram);
  return CpuOutput{std::vector<int32_t>(ids.data(), ids.data() + ids.size()),
                   std::vector<float>(weights.data(), weights.data() + weights.size())};
}

void check_problem(const Problem& p) {
  const RoutingConfig& c = p.config;
  const int64_t num_experts = c.num_experts;
  const int64_t k = c.top_k;
  const Tensor hidden =
      testing::random_normal(p.hidden_dtype, {p.num_tokens, p.hidden_size}, p.seed, 1.0f);
  const Tensor weight =
      testing::random_normal(p.weight_dtype, {num_experts, p.hidden_size}, p.seed + 1,
                             1.0f / std::sqrt(static_cast<float>(p.hidden_size)));
  const Tensor router_bias = testing::random_normal(DType::kF32, {num_experts}, p.seed + 2, 0.5f);
  const Tensor correction_bias =
      testing::random_normal(DType::kF32, {num_experts}, p.seed + 3, 0.1f);
  RoutingInputs inputs;
  if (c.has_router_bias) inputs.router_bias = router_bias;
  if (c.has_correction_bias) inputs.correction_bias = correction_bias;
  const float* rb = c.has_router_bias ? router_bias.data<float>() : nullptr;
  const float* cb = c.has_correction_bias ? correction_bias.data<float>() : nullptr;
  double max_abs_bias = 0;
  for (int64_t e = 0; cb != nullptr && e < num_experts; ++e) {
    max_abs_bias = std::max<double>(max_abs_bias, std::abs(cb[e]));
  }

  const CpuOutput cpu = run_cpu(p, hidden, weight, inputs, 1);
  const CpuOutput cpu2 = run_cpu(p, hidden, weight, inputs, 2);
  ASSERT_EQ(cpu.ids, cpu2.ids) << "1 vs 2 threads";
  ASSERT_TRUE(std::equal(cpu.weights.begin(), cpu.weights.end(), cpu2.weights.begin(),
                         [](float a, float b) { return f32_bits(a) == f32_bits(b); }))
      << "1 vs 2 threads: weights differ bitwise";

  // The oracle, with the per-token magnitudes sum_h |x_h w_h| + |b| for the logit bound.
  const size_t num_logits = static_cast<size_t>(p.num_tokens * num_experts);
  std::vector<double> logits(num_logits), magnitudes(num_logits);
  reference::router_logits(hidden.data<void>(), p.hidden_dtype, weight.data<void>(), p.weight_dtype,
                           rb, p.num_tokens, p.hidden_size, num_experts, logits.data());
  const Tensor abs_bias = absolute(router_bias);
  reference::router_logits(absolute(hidden).data<void>(), p.hidden_dtype,
                           absolute(weight).data<void>(), p.weight_dtype,
                           rb ? abs_bias.data<float>() : nullptr, p.num_tokens, p.hidden_size,
                           num_experts, magnitudes.data());
  const RoutingOutput public_reference = route(c, hidden, weight, inputs, Backend::kReference);

  int close_calls = 0;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const double* token_logits = logits.data() + t * num_experts;
    const reference::TokenRouting r = reference::route_token(c, token_logits, cb);
    const Tolerance tol = tolerance_for(c, p.hidden_size, token_logits,
                                        magnitudes.data() + t * num_experts, max_abs_bias);
    const int32_t* ids = cpu.ids.data() + t * k;
    const float* weights = cpu.weights.data() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      ASSERT_EQ(public_reference.topk_ids.data<int32_t>()[t * k + j], r.ids[static_cast<size_t>(j)])
          << "the reference backend disagrees with reference::route_token at token " << t;
    }
    const std::set<int32_t> distinct(ids, ids + k);
    ASSERT_EQ(distinct.size(), static_cast<size_t>(k)) << "token " << t << ": repeated id";
    ASSERT_GE(*distinct.begin(), 0) << "token " << t;
    ASSERT_LT(*distinct.rbegin(), num_experts) << "token " << t;

    if (!std::equal(r.ids.begin(), r.ids.end(), ids)) {
      ASSERT_TRUE(is_close_call(c, r, tol))
          << "token " << t << ": ids differ from the reference ("
          << fmt::format("cpu {} vs reference {}", fmt::join(ids, ids + k, ","),
                         fmt::join(r.ids, ","))
          << ") though no two candidates are within 2 x " << tol.selection;
      ++close_calls;
    }
    // Expected weights: the reference's unbiased scores of the ids the cpu chose.
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += r.scores[static_cast<size_t>(ids[j])];
    for (int64_t j = 0; j < k; ++j) {
      double expected = r.scores[static_cast<size_t>(ids[j])];
      if (c.renormalize && sum > 0) expected /= sum;
      expected *= c.routed_scaling_factor;
      ASSERT_LE(std::abs(weights[j] - expected), tol.weight_rel * std::abs(expected))
          << "token " << t << " slot " << j << " (expert " << ids[j] << "): expected " << expected
          << ", got " << weights[j] << ", relative tolerance " << tol.weight_rel;
    }
  }
  // A close call is rare on continuous random data; many of them would mean the tolerance is
  // so loose that the comparison no longer tests anything.
  EXPECT_LE(close_calls, std::max<int64_t>(2, p.num_tokens / 10));
}

class RoutingRandom : public ::testing::TestWithParam<int64_t> {};

TEST_P(RoutingRandom, CpuMatchesReference) {
  const int64_t num_experts = GetParam();
  const std::pair<DType, DType> dtypes[] = {{DType::kF32, DType::kF32},
                                            {DType::kBF16, DType::kBF16},
                                            {DType::kBF16, DType::kF32},
                                            {DType::kF16, DType::kBF16}};
  const int64_t hidden_sizes[] = {1, 8, 63, 200, 520};
  int index = static_cast<int>(num_experts);  // varies the variant sequence between E values
  for (int64_t num_tokens : {0, 1, 2, 3, 7, 33, 257}) {
    // 32 and 33: either side of select_experts' switch from insertion to partial_sort.
    for (int64_t top_k : {1, 2, 4, 8, 32, 33}) {
      if (top_k > num_experts) continue;
      for (int repeat = 0; repeat < 2; ++repeat, ++index) {
        const uint64_t seed =
            0x5eed0000u + static_cast<uint64_t>(num_experts) * 1000 + static_cast<uint64_t>(index);
        std::mt19937_64 rng(seed);
        const int variant = index % kNumVariants;
        const Problem p{num_tokens,
                        hidden_sizes[index % 5],
                        dtypes[index % 4].first,
                        dtypes[index % 4].second,
                        make_config(variant, num_experts, top_k, rng),
                        variant,
                        seed};
        SCOPED_TRACE(p.describe() +
                     fmt::format("; reproduce: moe_tests "
                                 "--gtest_filter=Sweep/RoutingRandom.CpuMatchesReference/E{}",
                                 num_experts));
        check_problem(p);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, RoutingRandom, ::testing::Values(1, 2, 3, 8, 60, 64, 128, 256),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return fmt::format("E{}", info.param);
                         });

}  // namespace
}  // namespace moe
