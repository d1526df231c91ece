// Memory per device: resident weights against hand-computed bytes and count_params, KV bytes
// per token by hand for GQA and MLA, the EP and TP splits, and the fit verdict with its reason.
// Qwen3-30B-A3B figures are those of tests/core/params_test.cc: 30,532,122,624 parameters, of
// which 28,991,029,248 in routed experts, 18,874,368 attention parameters per layer.
#include <gtest/gtest.h>

#include "moe/params.h"
#include "plan/plan_case.h"

namespace moe {
namespace {

constexpr int64_t kQwen3Params = 30'532'122'624;
constexpr int64_t kQwen3RoutedParams = 28'991'029'248;

TEST(PlanMemory, Qwen3Bf16WeightsAreTheSeeds61GB) {
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", DeploymentSpec{});
  EXPECT_EQ(plan.memory.model_weight_bytes, 2 * kQwen3Params);  // 61,064,245,248
  EXPECT_EQ(plan.memory.resident.total(), 61'064'245'248);
  EXPECT_NEAR(plan.memory.model_weight_bytes * 1e-9, 61.06, 0.005);          // decimal GB
  EXPECT_NEAR(plan.memory.model_weight_bytes / 1073741824.0, 56.87, 0.005);  // GiB
  EXPECT_EQ(plan.memory.resident.routed_experts, 2 * kQwen3RoutedParams);
  EXPECT_EQ(plan.memory.active_weight_bytes_per_token, 2 * int64_t{3'353'032'704});
}

// On one device every part is whole, so the parts add up to count_params for every preset.
TEST(PlanMemory, OneDeviceHoldsEveryParameter) {
  for (const std::string& name : preset_names()) {
    const ParamCounts counts = count_params(preset_config(name));
    const Plan plan = plan_of(name, "b200", DeploymentSpec{});
    EXPECT_EQ(plan.memory.resident.total(), 2 * counts.total) << name;
    EXPECT_EQ(plan.memory.model_weight_bytes, 2 * counts.total) << name;
    EXPECT_EQ(plan.memory.active_weight_bytes_per_token, 2 * counts.active_per_token) << name;
    EXPECT_DOUBLE_EQ(plan.memory.active_weight_bytes_per_token_per_device,
                     2.0 * static_cast<double>(counts.active_per_token))
        << name;
  }
}

// Quantized formats apply to projection matrices; embeddings (622,329,856), norms (210,944) and
// router (48 * 262,144) stay bf16: 635,123,712 parameters at 2 bytes.
TEST(PlanMemory, QuantizedFormatsKeepEmbeddingsNormsAndRouterInBf16) {
  constexpr int64_t kSide = 635'123'712;
  DeploymentSpec spec;
  spec.weights = StorageFormat::kFP8;
  EXPECT_EQ(plan_of("qwen3-30b-a3b", "h200", spec).memory.model_weight_bytes,
            (kQwen3Params - kSide) + 2 * kSide);  // 31,167,246,336
  spec.weights = StorageFormat::kInt4;
  EXPECT_EQ(plan_of("qwen3-30b-a3b", "h200", spec).memory.model_weight_bytes,
            (kQwen3Params - kSide) / 2 + 2 * kSide);  // 16,218,746,880
  spec.weights = StorageFormat::kF32;                 // a float format applies to everything
  EXPECT_EQ(plan_of("qwen3-30b-a3b", "h200", spec).memory.model_weight_bytes, 4 * kQwen3Params);
}

// GQA: 2 (K and V) * layers * kv heads * head_dim * bytes, the kv heads split over tp down to
// one per device. MLA: layers * (kv_lora_rank + qk_rope_head_dim) * bytes, whatever tp.
TEST(PlanMemory, KvBytesPerTokenByHand) {
  const auto kv = [](std::string_view model, int64_t tp, StorageFormat format) {
    DeploymentSpec spec = layout(tp, 1, false);
    spec.kv_cache = format;
    return plan_of(model, "h200", spec).memory.kv_bytes_per_token;
  };
  EXPECT_EQ(kv("qwen3-30b-a3b", 1, StorageFormat::kBF16), 2 * 48 * 4 * 128 * 2);  // 98,304
  EXPECT_EQ(kv("qwen3-30b-a3b", 2, StorageFormat::kBF16), 2 * 48 * 2 * 128 * 2);
  EXPECT_EQ(kv("qwen3-30b-a3b", 4, StorageFormat::kBF16), 2 * 48 * 1 * 128 * 2);
  EXPECT_EQ(kv("qwen3-30b-a3b", 8, StorageFormat::kBF16), 2 * 48 * 1 * 128 * 2);  // replicated
  EXPECT_EQ(kv("qwen3-30b-a3b", 1, StorageFormat::kFP8), 2 * 48 * 4 * 128);
  EXPECT_EQ(kv("deepseek-v3", 1, StorageFormat::kBF16), 61 * (512 + 64) * 2);  // 70,272
  EXPECT_EQ(kv("deepseek-v3", 8, StorageFormat::kBF16), 70'272);
  EXPECT_EQ(kv("deepseek-v3", 1, StorageFormat::kFP8), 61 * (512 + 64));
}

TEST(PlanMemory, ExpertParallelSplitsRoutedExpertsWhole) {
  const Plan one = plan_of("qwen3-30b-a3b", "h200", DeploymentSpec{});
  const Plan ep8 = plan_of("qwen3-30b-a3b", "h200", layout(1, 8, true));
  EXPECT_EQ(ep8.ep, 8);
  EXPECT_EQ(ep8.experts_per_device, 16);
  EXPECT_EQ(ep8.memory.resident.routed_experts * 8, one.memory.resident.routed_experts);
  EXPECT_EQ(ep8.memory.resident.routed_experts, 7'247'757'312);
  // Attention and embeddings are replicated across DP groups.
  EXPECT_EQ(ep8.memory.resident.attention, one.memory.resident.attention);
  EXPECT_EQ(ep8.memory.resident.embedding, one.memory.resident.embedding);

  // DeepSeek-V3: 256 experts over 8 devices, shared experts replicated like attention.
  const Plan ds_one = plan_of("deepseek-v3", "h200", DeploymentSpec{});
  const Plan ds_ep8 = plan_of("deepseek-v3", "h200", layout(1, 8, true));
  EXPECT_EQ(ds_ep8.experts_per_device, 32);
  EXPECT_EQ(ds_ep8.memory.resident.routed_experts * 8, ds_one.memory.resident.routed_experts);
  EXPECT_EQ(ds_ep8.memory.resident.shared_experts, ds_one.memory.resident.shared_experts);
}

TEST(PlanMemory, WithoutExpertParallelEveryExpertIsSliced) {
  const Plan one = plan_of("qwen3-30b-a3b", "h200", DeploymentSpec{});
  const Plan sliced = plan_of("qwen3-30b-a3b", "h200", layout(1, 8, false));
  EXPECT_EQ(sliced.ep, 1);
  EXPECT_EQ(sliced.experts_per_device, 128);
  EXPECT_EQ(sliced.memory.resident.routed_experts * 8, one.memory.resident.routed_experts);
}

TEST(PlanMemory, TensorParallelSplitsAttentionAndVocabulary) {
  const Plan tp2 = plan_of("qwen3-30b-a3b", "h200", layout(2, 4, true));
  EXPECT_EQ(tp2.memory.resident.attention, 48 * (18'874'368 / 2) * 2);
  EXPECT_EQ(tp2.memory.resident.embedding, 2 * (151'936 / 2) * 2'048 * 2);
  EXPECT_EQ(tp2.experts_per_device, 16);  // EP is still tp * dp = 8
}

// Mixtral's 8 experts over 3 devices: the busiest device holds 3.
TEST(PlanMemory, UnevenExpertSplitCountsTheBusiestDevice) {
  const Plan plan = plan_of("mixtral-8x7b", "h200", layout(1, 3, true));
  EXPECT_EQ(plan.experts_per_device, 3);
  const Plan one = plan_of("mixtral-8x7b", "h200", DeploymentSpec{});
  EXPECT_EQ(plan.memory.resident.routed_experts * 8, one.memory.resident.routed_experts * 3);
}

TEST(PlanMemory, DeepSeekV3Bf16DoesNotFitOneH100) {
  const Plan plan = plan_of("deepseek-v3", "h100", DeploymentSpec{});
  EXPECT_EQ(plan.memory.fit, Fit::kWeightsTooLarge);
  EXPECT_LT(plan.memory.kv_budget_bytes, 0);
  EXPECT_EQ(plan.memory.kv_tokens_per_group, 0);
  EXPECT_EQ(plan.memory.max_concurrency, 0);
  EXPECT_NE(plan.memory.reason.find("weights need 1342.1 GB"), std::string::npos)
      << plan.memory.reason;
  EXPECT_NE(plan.memory.reason.find("routed experts"), std::string::npos) << plan.memory.reason;
}

// One H100: 80e9 - 8e9 reserve - 61,064,245,248 of weights = 10,935,754,752 bytes, which hold
// 111,244 tokens of 98,304 bytes: three sequences of 32,768, not 64.
TEST(PlanMemory, KvCacheTooSmallSaysHowMuchFits) {
  DeploymentSpec spec;
  spec.context_len = 32'768;
  spec.concurrency = 64;
  const Plan plan = plan_of("qwen3-30b-a3b", "h100", spec);
  EXPECT_EQ(plan.memory.reserve_bytes, 8'000'000'000);
  EXPECT_EQ(plan.memory.kv_budget_bytes, 10'935'754'752);
  EXPECT_EQ(plan.memory.kv_tokens_per_group, 111'244);
  EXPECT_EQ(plan.memory.requested_tokens_per_group, 32'768 * 64);
  EXPECT_EQ(plan.memory.max_concurrency, 3);
  EXPECT_EQ(plan.memory.fit, Fit::kKvCacheTooSmall);
  EXPECT_NE(plan.memory.reason.find("KV cache"), std::string::npos) << plan.memory.reason;
  EXPECT_NE(plan.memory.reason.find("3 sequences"), std::string::npos) << plan.memory.reason;
}

TEST(PlanMemory, SequencesSpreadOverDataParallelGroups) {
  DeploymentSpec spec = layout(1, 8, true);
  spec.context_len = 8'192;
  spec.concurrency = 65;  // the busiest group serves 9
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  EXPECT_EQ(plan.memory.requested_tokens_per_group, 8'192 * 9);
  EXPECT_EQ(plan.memory.fit, Fit::kFits);
  EXPECT_TRUE(plan.memory.reason.empty());
  EXPECT_EQ(plan.memory.max_concurrency, 8 * (plan.memory.kv_tokens_per_group / 8'192));
}

TEST(PlanMemory, ReserveBytesReplaceTheFraction) {
  DeploymentSpec spec;
  spec.reserve_bytes = 5'000'000'000;
  EXPECT_EQ(plan_of("qwen3-30b-a3b", "h200", spec).memory.reserve_bytes, 5'000'000'000);
  spec.reserve_bytes.reset();
  spec.reserve_fraction = 0;
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  EXPECT_EQ(plan.memory.kv_budget_bytes, 141'000'000'000 - 61'064'245'248);
}

}  // namespace
}  // namespace moe
