// Hand-computed routing cases, one per variant of DESIGN.md, run on every backend through the
// public API. Expected values are written as the formula of the case (std::exp in double), so
// each one can be checked by hand.
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "moe/backend.h"
#include "moe/routing.h"

namespace moe {
namespace {

// Every weight is a few f32 roundings (exp, a sum of at most 8 terms, a division, a scale) away
// from the exact value: well under 16 ulps of the largest weight.
constexpr double kTolerance = 16 * 0x1p-24;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Routed {
  std::vector<int32_t> ids;     // [M, k]
  std::vector<float> weights;   // [M, k]
  std::vector<int32_t> counts;  // [E]
};

class RoutingCases : public ::testing::TestWithParam<Backend> {
 protected:
  // select_experts on logits [M, E] given row-major.
  Routed select(const RoutingConfig& config, std::vector<float> logits,
                std::vector<float> correction_bias = {}) {
    const int64_t num_tokens = static_cast<int64_t>(logits.size()) / config.num_experts;
    Routed r{std::vector<int32_t>(static_cast<size_t>(num_tokens * config.top_k), -1),
             std::vector<float>(static_cast<size_t>(num_tokens * config.top_k), NAN),
             std::vector<int32_t>(static_cast<size_t>(config.num_experts), -1)};
    RoutingInputs inputs;
    if (!correction_bias.empty()) {
      inputs.correction_bias = TensorView(correction_bias.data(), DType::kF32,
                                          {static_cast<int64_t>(correction_bias.size())});
    }
    select_experts(config, TensorView(logits.data(), DType::kF32, {num_tokens, config.num_experts}),
                   inputs, TensorView(r.ids.data(), DType::kI32, {num_tokens, config.top_k}),
                   TensorView(r.weights.data(), DType::kF32, {num_tokens, config.top_k}),
                   TensorView(r.counts.data(), DType::kI32, {config.num_experts}), GetParam());
    return r;
  }

  // route() on hidden [M, H] and router_weight [E, H], both f32.
  Routed route_f32(const RoutingConfig& config, std::vector<float> hidden,
                   std::vector<float> router_weight, int64_t hidden_size,
                   std::vector<float> router_bias = {}) {
    const int64_t num_tokens = static_cast<int64_t>(hidden.size()) / hidden_size;
    RoutingInputs inputs;
    if (!router_bias.empty()) {
      inputs.router_bias = TensorView(router_bias.data(), DType::kF32, {config.num_experts});
    }
    const RoutingOutput out =
        route(config, TensorView(hidden.data(), DType::kF32, {num_tokens, hidden_size}),
              TensorView(router_weight.data(), DType::kF32, {config.num_experts, hidden_size}),
              inputs, GetParam());
    const auto* ids = out.topk_ids.data<int32_t>();
    const auto* weights = out.topk_weights.data<float>();
    const auto* counts = out.expert_counts.data<int32_t>();
    return Routed{std::vector<int32_t>(ids, ids + out.topk_ids.numel()),
                  std::vector<float>(weights, weights + out.topk_weights.numel()),
                  std::vector<int32_t>(counts, counts + out.expert_counts.numel())};
  }
};

void expect_weights(const std::vector<float>& got, const std::vector<double>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], kTolerance * std::max(1.0, std::abs(expected[i])))
        << "weight " << i;
  }
}

RoutingConfig softmax_config(int64_t num_experts, int64_t top_k, bool renormalize) {
  RoutingConfig c;
  c.num_experts = num_experts;
  c.top_k = top_k;
  c.scoring = ScoringFunc::kSoftmax;
  c.renormalize = renormalize;
  return c;
}

RoutingConfig sigmoid_config(int64_t num_experts, int64_t top_k, bool renormalize) {
  RoutingConfig c = softmax_config(num_experts, top_k, renormalize);
  c.scoring = ScoringFunc::kSigmoid;
  return c;
}

TEST_P(RoutingCases, SoftmaxTopKWithoutRenormalize) {
  const Routed r = select(softmax_config(4, 2, false), {1, 2, 3, 0});
  const double z = std::exp(0.0) + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1}));
  expect_weights(r.weights, {std::exp(3.0) / z, std::exp(2.0) / z});
  EXPECT_EQ(r.counts, (std::vector<int32_t>{0, 1, 1, 0}));
}

TEST_P(RoutingCases, SoftmaxTopKRenormalized) {
  // Renormalizing the softmax over the kept two is a softmax over their logits (3 and 2).
  const Routed r = select(softmax_config(4, 2, true), {1, 2, 3, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1}));
  expect_weights(r.weights, {1 / (1 + std::exp(-1.0)), 1 / (1 + std::exp(1.0))});
}

TEST_P(RoutingCases, SigmoidTopK) {
  const Routed r = select(sigmoid_config(4, 2, false), {0, 2, -1, 1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  expect_weights(r.weights, {sigmoid(2), sigmoid(1)});
}

TEST_P(RoutingCases, SigmoidRenormalizedAndScaled) {
  RoutingConfig c = sigmoid_config(4, 2, true);
  c.routed_scaling_factor = 2.5f;
  const Routed r = select(c, {0, 2, -1, 1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  const double sum = sigmoid(2) + sigmoid(1);
  expect_weights(r.weights, {2.5 * sigmoid(2) / sum, 2.5 * sigmoid(1) / sum});
}

// DeepSeek-V3: 8 experts in 4 groups of 2, keep 2 groups, pick 3 experts. Sigmoid scores are
// s = [σ2, .5, .5, .5, .5, σ1, .5, .5] = [.881, .5, .5, .5, .5, .731, .5, .5].
RoutingConfig deepseek_v3_like() {
  RoutingConfig c = sigmoid_config(8, 3, true);
  c.num_groups = 4;
  c.topk_groups = 2;
  c.routed_scaling_factor = 2.5f;
  return c;
}
const std::vector<float> kDeepSeekLogits = {2, 0, 0, 0, 0, 1, 0, 0};

TEST_P(RoutingCases, GroupLimitedWithoutBiasScoresGroupsByTheirBest) {
  RoutingConfig c = deepseek_v3_like();
  // Group bests .881, .5, .731, .5: keep groups 0 and 2, so the candidates are 0, 1, 4, 5;
  // 1 and 4 tie at .5 and the lower id wins.
  const Routed r = select(c, kDeepSeekLogits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 5, 1}));
  const double sum = sigmoid(2) + sigmoid(1) + sigmoid(0);
  expect_weights(r.weights, {2.5 * sigmoid(2) / sum, 2.5 * sigmoid(1) / sum, 2.5 * 0.5 / sum});
}

TEST_P(RoutingCases, CorrectionBiasChangesTheSelectionButNotTheWeights) {
  RoutingConfig c = deepseek_v3_like();
  c.has_correction_bias = true;
  // Biased scores [.881, .5, .5, .5, .5, 1.031, .95, .5]; group top-2 sums 1.381, 1.0, 1.531,
  // 1.45 keep groups 2 and 3. Expert 0 has the best score but its group is dropped; 4 and 7 tie
  // at .5 for the third place and the lower id wins.
  const Routed r = select(c, kDeepSeekLogits, {0, 0, 0, 0, 0, 0.3f, 0.45f, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{5, 6, 4}));
  const double sum = sigmoid(1) + 0.5 + 0.5;  // unbiased scores of the chosen experts
  expect_weights(r.weights, {2.5 * sigmoid(1) / sum, 2.5 * 0.5 / sum, 2.5 * 0.5 / sum});
}

TEST_P(RoutingCases, GroupScoreIsTopTwoSumOnlyWithCorrectionBias) {
  // Group 0 = σ(3), σ(-3) = .953, .047 (best .953, sum 1.0); group 1 = σ(1), σ(1) = .731, .731
  // (best .731, sum 1.462). Keep one group, pick one expert.
  RoutingConfig c = sigmoid_config(4, 1, false);
  c.num_groups = 2;
  c.topk_groups = 1;
  const std::vector<float> logits = {3, -3, 1, 1};
  Routed r = select(c, logits);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0}));
  expect_weights(r.weights, {sigmoid(3)});

  c.has_correction_bias = true;
  r = select(c, logits, {0, 0, 0, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2}));
  expect_weights(r.weights, {sigmoid(1)});
}

TEST_P(RoutingCases, DroppedGroupsRankBelowNegativeBiasedScores) {
  // Biased scores .5 + b = [-.5, -.5, -.4, -1.5]; group sums -1.0 and -1.9 keep group 0. HF's
  // DeepSeek-V3 masks the dropped group with 0.0, which would beat -.5 and pick expert 2; we
  // (like vLLM) never pick a dropped expert. Experts 0 and 1 tie: the lower id wins.
  RoutingConfig c = sigmoid_config(4, 1, false);
  c.num_groups = 2;
  c.topk_groups = 1;
  c.has_correction_bias = true;
  const Routed r = select(c, {0, 0, 0, 0}, {-1, -1, -0.9f, -2});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0}));
  expect_weights(r.weights, {0.5});
}

TEST_P(RoutingCases, GroupsOfOneExpertScoreThatExpert) {
  // Four groups of one: the top-2 sum of a group is its one biased score.
  RoutingConfig c = sigmoid_config(4, 2, false);
  c.num_groups = 4;
  c.topk_groups = 2;
  c.has_correction_bias = true;
  const Routed r = select(c, {0, 1, 2, -1}, {0.5f, 0, -0.5f, 0});
  // Biased: σ0 + .5 = 1.0, σ1 = .731, σ2 - .5 = .381, σ(-1) = .269.
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  expect_weights(r.weights, {0.5, sigmoid(1)});
}

TEST_P(RoutingCases, RouterBiasIsAddedToTheLogits) {
  // gpt-oss: logits = [1, 2, 3] + [2, 0, -1] = [3, 2, 2]; experts 1 and 2 tie, 1 wins. The
  // renormalized softmax over the top 2 is HF's softmax over the top-2 logits.
  RoutingConfig c = softmax_config(3, 2, true);
  c.has_router_bias = true;
  const Routed r = route_f32(c, {1, 2}, {1, 0, 0, 1, 1, 1}, 2, {2, 0, -1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  expect_weights(r.weights, {1 / (1 + std::exp(-1.0)), 1 / (1 + std::exp(1.0))});
}

TEST_P(RoutingCases, Llama4TopOneSigmoidOfTheBestLogit) {
  // HF's Llama-4 router takes top-1 of the raw logits and applies sigmoid to the kept logit;
  // sigmoid is increasing, so sigmoid scores + top-1 without renormalization is the same.
  // Token 0 logits: [.5 + 0 + .5, 1 - 1 + 0, -1 - .5 + 1, 0] = [1, 0, -.5, 0].
  // Token 1 logits: [0 + 0 + 1, 0 + 2 + 0, 0 + 1 + 2, 0] = [1, 2, 3, 0].
  RoutingConfig c = sigmoid_config(4, 1, false);
  c.apply_weight_on_input = true;
  const Routed r =
      route_f32(c, {1, -1, 0.5f, 0, 2, 1}, {0.5f, 0, 1, 1, 1, 0, -1, 0.5f, 2, 0, 0, 0}, 3);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  expect_weights(r.weights, {sigmoid(1), sigmoid(3)});
  EXPECT_EQ(r.counts, (std::vector<int32_t>{1, 0, 1, 0}));
}

TEST_P(RoutingCases, TiesBreakTowardTheLowerId) {
  Routed r = select(softmax_config(4, 3, false), {1, 3, 3, 1});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 2, 0}));
  r = select(softmax_config(4, 2, false), {0, 0, 0, 0});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  expect_weights(r.weights, {0.25, 0.25});
}

TEST_P(RoutingCases, ZeroSumIsNotRenormalized) {
  // Sigmoid of -1000 is 0 in f32 and f64: the kept weights stay 0 instead of becoming 0/0.
  const Routed r = select(sigmoid_config(4, 2, true), {-1000, -1000, -1000, -1000});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  expect_weights(r.weights, {0, 0});
}

// A token whose logits hold NaN still gets k distinct in-range ids, and the other tokens come
// out exactly as they do without it.
TEST_P(RoutingCases, NanRowGetsDistinctIdsAndLeavesOtherRowsAlone) {
  constexpr int64_t kExperts = 16;
  constexpr int64_t kTokens = 3;
  std::vector<float> clean(kTokens * kExperts);
  for (size_t i = 0; i < clean.size(); ++i) clean[i] = std::sin(0.7f * static_cast<float>(i));
  std::vector<float> poisoned = clean;
  poisoned[kExperts + 3] = NAN;
  poisoned[kExperts + 9] = NAN;

  RoutingConfig sigmoid = sigmoid_config(kExperts, 4, true);
  sigmoid.num_groups = 4;
  sigmoid.topk_groups = 2;
  sigmoid.has_correction_bias = true;
  const std::vector<float> bias(kExperts, 0.01f);
  for (const RoutingConfig& c : {softmax_config(kExperts, 4, true), sigmoid}) {
    SCOPED_TRACE(c.scoring == ScoringFunc::kSigmoid ? "sigmoid" : "softmax");
    const std::vector<float> b = c.has_correction_bias ? bias : std::vector<float>{};
    const Routed expected = select(c, clean, b);
    const Routed got = select(c, poisoned, b);
    const int64_t k = c.top_k;
    std::set<int32_t> distinct;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = got.ids[static_cast<size_t>(k + j)];
      EXPECT_GE(id, 0);
      EXPECT_LT(id, kExperts);
      distinct.insert(id);
      // With sigmoid only the NaN experts have NaN scores, and they rank last.
      if (c.scoring == ScoringFunc::kSigmoid) {
        EXPECT_NE(id, 3);
        EXPECT_NE(id, 9);
      }
    }
    EXPECT_EQ(distinct.size(), static_cast<size_t>(k));
    for (int64_t t : {0, 2}) {
      for (int64_t j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t * k + j);
        EXPECT_EQ(got.ids[i], expected.ids[i]) << "token " << t;
        EXPECT_EQ(got.weights[i], expected.weights[i]) << "token " << t;
      }
    }
  }
}

TEST_P(RoutingCases, NanHiddenRowLeavesOtherTokensAlone) {
  constexpr int64_t kHidden = 5;
  const RoutingConfig c = softmax_config(6, 2, true);
  std::vector<float> hidden(3 * kHidden), weight(6 * kHidden);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::cos(1.3f * static_cast<float>(i));
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = std::sin(0.9f * static_cast<float>(i));
  const Routed expected = route_f32(c, hidden, weight, kHidden);
  hidden[kHidden + 2] = NAN;
  const Routed got = route_f32(c, hidden, weight, kHidden);
  for (size_t i : {0, 1, 4, 5}) {
    EXPECT_EQ(got.ids[i], expected.ids[i]);
    EXPECT_EQ(got.weights[i], expected.weights[i]);
  }
  EXPECT_NE(got.ids[2], got.ids[3]);
}

TEST_P(RoutingCases, RenormalizedWeightsSumToOne) {
  constexpr int64_t kTokens = 64;
  constexpr int64_t kExperts = 64;
  const Tensor logits = testing::random_normal(DType::kF32, {kTokens, kExperts}, 7, 3.0f);
  const std::vector<float> values(logits.data<float>(), logits.data<float>() + logits.numel());
  for (const RoutingConfig& c :
       {softmax_config(kExperts, 8, true), sigmoid_config(kExperts, 8, true)}) {
    const Routed r = select(c, values);
    for (int64_t t = 0; t < kTokens; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < c.top_k; ++j) sum += r.weights[static_cast<size_t>(t * c.top_k + j)];
      EXPECT_NEAR(sum, 1.0, 1e-6) << "token " << t;
    }
  }
}

TEST_P(RoutingCases, ExpertCountsCountEveryPair) {
  constexpr int64_t kTokens = 50;
  constexpr int64_t kExperts = 12;
  const Tensor logits = testing::random_normal(DType::kF32, {kTokens, kExperts}, 11);
  const Routed r =
      select(softmax_config(kExperts, 3, false),
             std::vector<float>(logits.data<float>(), logits.data<float>() + logits.numel()));
  std::vector<int32_t> histogram(kExperts, 0);
  for (int32_t id : r.ids) ++histogram[static_cast<size_t>(id)];
  EXPECT_EQ(r.counts, histogram);
}

TEST_P(RoutingCases, NoTokens) {
  const Routed r = select(softmax_config(8, 2, true), {});
  EXPECT_TRUE(r.ids.empty());
  EXPECT_EQ(r.counts, std::vector<int32_t>(8, 0));
}

INSTANTIATE_TEST_SUITE_P(Backends, RoutingCases,
                         ::testing::Values(Backend::kReference, Backend::kCpu),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return std::string(backend_name(info.param));
                         });

}  // namespace
}  // namespace moe
