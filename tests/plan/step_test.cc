// One step on one device: flops by hand from the parameter counts, bytes read, and roofline
// times as those bytes and flops over the device's peaks.
#include <gtest/gtest.h>

#include "plan/plan_case.h"

namespace moe {
namespace {

constexpr double kQwen3Layers = 48;
constexpr double kQwen3AttentionParams = 18'874'368;
constexpr double kQwen3ExpertParams = 4'718'592;
constexpr double kQwen3RouterParams = 262'144;
constexpr double kQwen3VocabTimesHidden = 151'936.0 * 2'048;

DeploymentSpec one_sequence(int64_t context) {
  DeploymentSpec spec;
  spec.context_len = context;
  return spec;
}

// A decode token runs every projection once: 2 flops per active parameter, except the input
// embedding (a lookup) and the norms (not matrix products).
TEST(PlanStep, DecodeFlopsOfOneTokenByHand) {
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", one_sequence(4096));
  const StepFlops& f = plan.decode.flops;
  EXPECT_EQ(plan.decode.tokens, 1);
  EXPECT_DOUBLE_EQ(f.attention_projections, 2 * kQwen3AttentionParams * kQwen3Layers);
  EXPECT_DOUBLE_EQ(f.routed_experts, 2 * kQwen3ExpertParams * 8 * kQwen3Layers);
  EXPECT_DOUBLE_EQ(f.router, 2 * kQwen3RouterParams * kQwen3Layers);
  EXPECT_DOUBLE_EQ(f.lm_head, 2 * kQwen3VocabTimesHidden);
  EXPECT_EQ(f.dense_ffn, 0);
  EXPECT_EQ(f.shared_experts, 0);
  EXPECT_DOUBLE_EQ(f.matrices(), 2.0 * (3'353'032'704 - 311'164'928 - 210'944));
  // Scores and values: 2 * 32 heads * (128 + 128) per cached position, per layer.
  EXPECT_DOUBLE_EQ(f.attention_context, 2 * 32 * 256 * 4096.0 * kQwen3Layers);
}

// Prefill: the prompt's queries attend half the context on average; no logits are counted.
TEST(PlanStep, PrefillFlopsScaleWithTokens) {
  DeploymentSpec spec = one_sequence(8192);
  spec.prefill_tokens = 8192;
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  const StepFlops& f = plan.prefill.flops;
  EXPECT_DOUBLE_EQ(f.routed_experts, 2 * kQwen3ExpertParams * 8 * kQwen3Layers * 8192);
  EXPECT_EQ(f.lm_head, 0);
  EXPECT_DOUBLE_EQ(f.attention_context, 2 * 32 * 256 * 4096.0 * kQwen3Layers * 8192);
}

// MLA decodes absorbed: 128 heads score over the 576-wide latent and rope key and sum the
// 512-wide latent. Prefill runs un-absorbed: 192-wide keys, 128-wide values.
TEST(PlanStep, MlaAttentionOverContext) {
  DeploymentSpec spec = one_sequence(1000);
  spec.prefill_tokens = 10;
  const Plan plan = plan_of("deepseek-v3", "b200", spec);
  EXPECT_DOUBLE_EQ(plan.decode.flops.attention_context, 2 * 128 * (576 + 512) * 1000.0 * 61);
  EXPECT_DOUBLE_EQ(plan.prefill.flops.attention_context, 2 * 128 * (192 + 128) * 500.0 * 61 * 10);
}

// One token on one device reads every weight but the input table and the experts it did not
// pick (8 of 128 per layer), plus the whole KV cache of its sequence.
TEST(PlanStep, DecodeReadsPickedExpertsAndTheCache) {
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", one_sequence(4096));
  const WeightBytes& w = plan.memory.resident;
  const double head = 2 * kQwen3VocabTimesHidden;
  const double expected = static_cast<double>(w.total() - w.routed_experts - w.embedding) + head +
                          static_cast<double>(w.routed_experts) * 8 / 128;
  EXPECT_NEAR(plan.decode.weight_read_bytes, expected, 1e-3);
  EXPECT_DOUBLE_EQ(plan.decode.kv_cache_bytes, (4096.0 + 1) * 98'304);
  EXPECT_DOUBLE_EQ(plan.decode.memory_s,
                   (plan.decode.weight_read_bytes + plan.decode.kv_cache_bytes) / 4.8e12);
  EXPECT_EQ(plan.decode.bottleneck, Bottleneck::kMemory);
  EXPECT_DOUBLE_EQ(plan.decode.bound_s, plan.decode.memory_s);
}

TEST(PlanStep, LargePrefillIsComputeBound) {
  DeploymentSpec spec = one_sequence(8192);
  spec.prefill_tokens = 8192;
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  EXPECT_DOUBLE_EQ(plan.prefill.compute_s,
                   (plan.prefill.flops.matrices() + plan.prefill.flops.attention_context) / 989e12);
  EXPECT_EQ(plan.prefill.bottleneck, Bottleneck::kCompute);
  EXPECT_DOUBLE_EQ(plan.prefill.distinct_experts_per_layer, 128);
}

// fp8 weights run at the fp8 peak where the device has one; the A100 falls back to bf16.
TEST(PlanStep, Fp8WeightsUseFp8UnitsWhereThereAreAny) {
  DeploymentSpec spec = one_sequence(1);
  spec.weights = StorageFormat::kFP8;
  spec.prefill_tokens = 4096;
  const Plan h100 = plan_of("qwen3-30b-a3b", "h100", spec);
  const Plan a100 = plan_of("qwen3-30b-a3b", "a100", spec);
  const StepFlops& f = h100.prefill.flops;
  EXPECT_DOUBLE_EQ(h100.prefill.compute_s, f.matrices() / 1979e12 + f.attention_context / 989e12);
  EXPECT_DOUBLE_EQ(a100.prefill.compute_s, (f.matrices() + f.attention_context) / 312e12);
}

// With EP every device computes T * k / EP pairs of whole experts; without it, every pair's
// 1/(tp * dp) slice. The flops per device agree.
TEST(PlanStep, ExpertFlopsPerDeviceDoNotDependOnTheSplit) {
  DeploymentSpec ep = layout(1, 8, true);
  ep.concurrency = 64;
  DeploymentSpec sliced = layout(1, 8, false);
  sliced.concurrency = 64;
  const double a = plan_of("qwen3-30b-a3b", "h200", ep).decode.flops.routed_experts;
  const double b = plan_of("qwen3-30b-a3b", "h200", sliced).decode.flops.routed_experts;
  EXPECT_DOUBLE_EQ(a, 2 * kQwen3ExpertParams * 64 * 8 / 8 * kQwen3Layers);
  EXPECT_DOUBLE_EQ(a, b);
}

TEST(PlanStep, DefaultsFillTheStepSizes) {
  DeploymentSpec spec = layout(1, 4, true);
  spec.concurrency = 100;
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  EXPECT_EQ(plan.spec.prefill_tokens, 4 * 8192);
  EXPECT_EQ(plan.spec.decode_tokens, 100);
  EXPECT_EQ(plan.decode.tokens_per_group, 25);
}

}  // namespace
}  // namespace moe
