// The fused CUDA routing kernel against the CPU backend, for every routing variant: same ids
// (except where two selection scores tie within f32 rounding of the softmax sum), same weights.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "cuda/routing_configs.h"
#include "kernels/cuda/routing.h"
#include "moe/routing.h"

namespace moe {
namespace {

using testing::deepseek_routing;
using testing::DeviceTensor;
using testing::softmax_routing;

struct SelectCase {
  const char* name;
  RoutingConfig config;
  bool router_bias = false;
};

class CudaSelectExperts : public testing::GpuTest {};

TEST_F(CudaSelectExperts, MatchesTheCpuOnEveryVariant) {
  RoutingConfig v2 = deepseek_routing(64, 6, 8, 3);
  v2.has_correction_bias = false;  // DeepSeek-V2: group score is its best expert
  RoutingConfig llama4 = softmax_routing(16, 1, false);
  llama4.scoring = ScoringFunc::kSigmoid;
  const SelectCase cases[] = {
      {"qwen3", softmax_routing(128, 8, true)},
      {"qwen2", softmax_routing(60, 4, false)},
      {"mixtral", softmax_routing(8, 2, true)},
      {"deepseek-v3", deepseek_routing(256, 8, 8, 4)},
      {"deepseek-v2", v2},
      {"llama4", llama4},
      {"gpt-oss", softmax_routing(32, 4, true), true},
      {"odd", softmax_routing(97, 16, true)},
      {"max", softmax_routing(512, 16, false)},
      {"one", softmax_routing(1, 1, true)},
  };
  for (const SelectCase& sc : cases) {
    for (int64_t M : {0, 1, 7, 300}) {
      SCOPED_TRACE(fmt::format("{} M={}", sc.name, M));
      const RoutingConfig& config = sc.config;
      const int64_t E = config.num_experts, k = config.top_k;
      Tensor logits = testing::random_normal(DType::kF32, {M, E}, 10 + M);
      if (M > 3) {
        logits.data<float>()[2 * E + 1] = std::numeric_limits<float>::quiet_NaN();  // NaN row
        for (int64_t e = 0; e < E; ++e) logits.data<float>()[3 * E + e] = 0.5f;     // all tie
      }
      Tensor correction = testing::random_normal(DType::kF32, {E}, 3, 0.1f);
      Tensor bias = testing::random_normal(DType::kF32, {E}, 4, 0.5f);
      RoutingInputs inputs;
      if (config.has_correction_bias) inputs.correction_bias = correction;
      Tensor biased =
          Tensor::copy_of(logits, DType::kF32);  // the CPU adds the router bias in route()
      if (sc.router_bias) {
        for (int64_t t = 0; t < M; ++t) {
          for (int64_t e = 0; e < E; ++e) biased.data<float>()[t * E + e] += bias.data<float>()[e];
        }
      }
      Tensor want_ids(DType::kI32, {M, k}), want_weights(DType::kF32, {M, k});
      select_experts(config, biased, inputs, want_ids, want_weights, {}, Backend::kCpu);

      DeviceTensor d_logits(logits), d_correction(correction), d_bias(bias);
      auto ids = DeviceTensor::empty_like(DType::kI32, {M, k});
      auto weights = DeviceTensor::empty_like(DType::kF32, {M, k});
      Tensor zeros = Tensor::zeros(DType::kI32, {E});
      DeviceTensor counts(zeros);
      cuda::SelectArgs args;
      args.logits = d_logits.view().as<float>();
      args.router_bias = sc.router_bias ? d_bias.view().as<float>() : nullptr;
      args.correction_bias = config.has_correction_bias ? d_correction.view().as<float>() : nullptr;
      args.num_tokens = M;
      args.topk_ids = ids.view().as<int32_t>();
      args.topk_weights = weights.view().as<float>();
      args.expert_counts = counts.view().as<int32_t>();
      cuda::select_experts(config, args, nullptr);
      const Tensor got_ids = ids.to_host(), got_weights = weights.to_host();
      const Tensor got_counts = counts.to_host();

      std::vector<int32_t> want_counts(E, 0);
      for (int64_t p = 0; p < M * k; ++p) {
        const int32_t want = want_ids.data<int32_t>()[p], got = got_ids.data<int32_t>()[p];
        ++want_counts[want];
        ASSERT_GE(got, 0);
        ASSERT_LT(got, E);
        if (want != got) {
          // Allowed only for a near tie of the two selection scores.
          const float* row = biased.data<float>() + (p / k) * E;
          auto selection = [&](int32_t e) {
            if (config.scoring == ScoringFunc::kSoftmax) return row[e];  // order of the logits
            const float s = 1.0f / (1.0f + std::exp(-row[e]));
            return config.has_correction_bias ? s + correction.data<float>()[e] : s;
          };
          EXPECT_NEAR(selection(want), selection(got), 1e-5)
              << "pair " << p << ": " << want << " vs " << got;
          continue;
        }
        const float w = want_weights.data<float>()[p], g = got_weights.data<float>()[p];
        if (std::isnan(w)) {
          EXPECT_TRUE(std::isnan(g)) << "pair " << p;
        } else {
          EXPECT_NEAR(g, w, 1e-5 * std::max(1.0f, std::fabs(w))) << "pair " << p;
        }
      }
      int64_t counted = 0;
      for (int64_t e = 0; e < E; ++e) counted += got_counts.data<int32_t>()[e];
      EXPECT_EQ(counted, M * k);
    }
  }
}

}  // namespace
}  // namespace moe
