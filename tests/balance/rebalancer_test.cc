// Runtime rebalancing end to end: skewed batches through real layers, a new EPLB placement every
// few steps; the outputs stay bitwise the same and the busiest GPU gets lighter.
#include "moe/rebalancer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "moe/config.h"
#include "moe/error.h"

namespace moe {
namespace {

// Tokens that lean toward the router rows of experts 0 and 1: those two take most pairs.
Tensor skewed_hidden(const LayerWeights& weights, int64_t tokens, int64_t hidden_size,
                     uint64_t seed) {
  Tensor hidden(DType::kF32, {tokens, hidden_size});
  const float* router = weights.router.data<float>();
  uint64_t state = seed;
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t hot = t % 2;
    for (int64_t h = 0; h < hidden_size; ++h) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float noise = static_cast<float>(state >> 40) * 0x1.0p-24f - 0.5f;
      hidden.data<float>()[t * hidden_size + h] = 40.0f * router[hot * hidden_size + h] + noise;
    }
  }
  return hidden;
}

double max_over_mean_gpu_load(const MoeLayer& layer, int64_t num_gpus) {
  const TensorView slots = layer.last_slot_counts();
  const int64_t per_gpu = slots.numel() / num_gpus;
  std::vector<double> load(static_cast<size_t>(num_gpus), 0.0);
  for (int64_t s = 0; s < slots.numel(); ++s) load[s / per_gpu] += slots.as<int32_t>()[s];
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / num_gpus;
  return *std::max_element(load.begin(), load.end()) / mean;
}

TEST(Rebalancer, MovesLoadOffTheBusiestGpuWithoutChangingOutputs) {
  MoeConfig config = preset_config("qwen3-30b-a3b");
  config.experts.hidden_size = 32;
  config.experts.intermediate_size = 16;
  config.routing.num_experts = 16;
  config.routing.top_k = 2;
  const LayerWeights weights = synthetic_layer_weights(config, DType::kF32, 4);
  MoeLayer plain(config, weights);
  MoeLayer balanced(config, weights);

  EplbConfig eplb;
  eplb.num_replicas = 24;  // 8 redundant slots over 4 GPUs
  eplb.num_gpus = 4;
  Rebalancer rebalancer(1, 16, eplb, /*period_steps=*/2, /*window_steps=*/4);
  rebalancer.attach(0, balanced);

  double skew_before = 0, skew_after = 0;
  for (int step = 0; step < 6; ++step) {
    const Tensor hidden = skewed_hidden(weights, 64, 32, 100 + step);
    const Tensor expected = plain.forward(hidden);
    const Tensor got = balanced.forward(hidden);
    ASSERT_EQ(std::memcmp(expected.data<void>(), got.data<void>(), got.nbytes()), 0)
        << "step " << step;
    if (step == 0) skew_before = max_over_mean_gpu_load(balanced, 4);
    skew_after = max_over_mean_gpu_load(balanced, 4);
    rebalancer.record(0, balanced);
    if (rebalancer.end_step()) rebalancer.attach(0, balanced);
  }
  EXPECT_EQ(rebalancer.rebalances(), 3);
  EXPECT_GT(skew_before, 1.5) << "the test's routing is not skewed enough to mean anything";
  EXPECT_LT(skew_after, skew_before * 0.8) << "before " << skew_before << ", after " << skew_after;
}

TEST(Rebalancer, RejectsBadSizes) {
  EplbConfig eplb;
  eplb.num_replicas = 8;
  eplb.num_gpus = 2;
  EXPECT_THROW(Rebalancer(1, 8, eplb, 0, 4), Error);
  EXPECT_THROW(Rebalancer(0, 8, eplb, 1, 4), Error);
}

}  // namespace
}  // namespace moe
