// Dispatch and combine bytes: the seed's bound T * k * H * b, the expected share that leaves its
// device (1 - 1/EP for a uniform placement, or a given local fraction) split by link, and the
// mean rows per expert T * k / E (Qwen3-30B-A3B: 8 of 128 experts, so M / 16).
#include <cmath>

#include <gtest/gtest.h>

#include "plan/plan_case.h"
#include "plan/terms.h"

namespace moe {
namespace {

DeploymentSpec decode_of(int64_t tokens, int64_t dp, bool expert_parallel) {
  DeploymentSpec spec = layout(1, dp, expert_parallel);
  spec.concurrency = tokens;
  spec.decode_tokens = tokens;
  return spec;
}

TEST(PlanTraffic, MeanRowsPerExpertIsTokensOver16ForQwen3) {
  for (int64_t tokens : {1, 16, 64, 4096}) {
    const Plan plan = plan_of("qwen3-30b-a3b", "h200", decode_of(tokens, 1, false));
    EXPECT_DOUBLE_EQ(plan.decode.mean_rows_per_expert, static_cast<double>(tokens) / 16) << tokens;
  }
}

TEST(PlanTraffic, ExpectedDistinctExperts) {
  EXPECT_DOUBLE_EQ(planning::expected_distinct_experts(128, 8, 0), 0);
  EXPECT_DOUBLE_EQ(planning::expected_distinct_experts(128, 8, 1), 8);  // one token: its k
  EXPECT_DOUBLE_EQ(planning::expected_distinct_experts(128, 8, 2), 128 * (1 - 0.9375 * 0.9375));
  EXPECT_NEAR(planning::expected_distinct_experts(128, 8, 1e6), 128, 1e-9);
  EXPECT_DOUBLE_EQ(planning::expected_distinct_experts(8, 8, 3), 8);  // k = E: all, always
}

// Qwen3 on 8 devices of one node, 64 tokens: 64 * 8 * 2048 * 2 = 2,097,152 bytes each way; 1/8
// of the pairs stay local, the other 7/8 go over NVLink.
TEST(PlanTraffic, OneNodeSendsSevenEighthsOverNvlink) {
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", decode_of(64, 8, true));
  const ExpertTraffic& d = plan.decode.dispatch;
  EXPECT_DOUBLE_EQ(plan.local_fraction, 1.0 / 8);
  EXPECT_DOUBLE_EQ(d.upper_bound_bytes, 2'097'152);
  EXPECT_DOUBLE_EQ(d.expected_bytes, 2'097'152 * 7.0 / 8);
  EXPECT_DOUBLE_EQ(d.same_node_bytes, d.expected_bytes);
  EXPECT_EQ(d.cross_node_bytes, 0);
  EXPECT_DOUBLE_EQ(plan.decode.combine.upper_bound_bytes, d.upper_bound_bytes);  // bf16 back
  // Per device per layer and direction: an eighth of the expected bytes, over 450 GB/s.
  const double layer_s = 2'097'152 * 7.0 / 8 / 8 / 450e9;
  EXPECT_NEAR(plan.decode.dispatch_s, 48 * 2 * layer_s, 1e-15);
}

// Two nodes of 8: of 16 devices, 1 is the token's own, 7 share its node, 8 are across.
TEST(PlanTraffic, TwoNodesSplitRemotePairsByDevices) {
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", decode_of(64, 16, true));
  EXPECT_EQ(plan.num_nodes, 2);
  EXPECT_DOUBLE_EQ(plan.local_fraction, 1.0 / 16);
  EXPECT_DOUBLE_EQ(plan.same_node_fraction, 7.0 / 16);
  EXPECT_DOUBLE_EQ(plan.cross_node_fraction, 8.0 / 16);
  const ExpertTraffic& d = plan.decode.dispatch;
  EXPECT_DOUBLE_EQ(d.cross_node_bytes, d.upper_bound_bytes / 2);
  // The network (50 GB/s) is the slower path of the two.
  EXPECT_NEAR(plan.decode.dispatch_s, 48 * 2 * (d.cross_node_bytes / 16 / 50e9), 1e-15);
}

TEST(PlanTraffic, LocalFractionFromAPlacement) {
  DeploymentSpec spec = decode_of(64, 16, true);
  spec.local_fraction = 0.5;
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  const ExpertTraffic& d = plan.decode.dispatch;
  EXPECT_DOUBLE_EQ(d.expected_bytes, d.upper_bound_bytes / 2);
  EXPECT_DOUBLE_EQ(d.same_node_bytes, d.upper_bound_bytes / 2 * 7 / 15);
  EXPECT_DOUBLE_EQ(d.cross_node_bytes, d.upper_bound_bytes / 2 * 8 / 15);
}

TEST(PlanTraffic, Fp8DispatchHalvesTheRowsButCombineStaysBf16) {
  DeploymentSpec spec = decode_of(64, 8, true);
  spec.dispatch = StorageFormat::kFP8;
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  EXPECT_DOUBLE_EQ(plan.decode.dispatch.upper_bound_bytes, 1'048'576);
  EXPECT_DOUBLE_EQ(plan.decode.combine.upper_bound_bytes, 2'097'152);
}

// A token goes once to each remote device holding any of its experts. With 16 of 128 experts
// per device, a device holds none of a token's 8 with probability C(112, 8) / C(128, 8).
TEST(PlanTraffic, OneCopyPerDeviceByHand) {
  double none = 1;
  for (int i = 0; i < 8; ++i) none *= (112.0 - i) / (128.0 - i);
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", decode_of(64, 8, true));
  const ExpertTraffic& d = plan.decode.dispatch;
  EXPECT_NEAR(d.one_copy_per_device_bytes, 64 * 2048 * 2 * 7 * (1 - none), 1e-6);
  EXPECT_LT(d.one_copy_per_device_bytes, d.expected_bytes);
}

// Without EP nothing is dispatched: every device holds a slice of every expert, and the partial
// sums of the whole step's tokens all-reduce over the 8 devices instead.
TEST(PlanTraffic, WithoutExpertParallelismExpertsAllReduce) {
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", decode_of(64, 8, false));
  EXPECT_EQ(plan.decode.dispatch.upper_bound_bytes, 0);
  EXPECT_EQ(plan.decode.dispatch_s, 0);
  const double payload = 64 * 2048 * 2;
  EXPECT_DOUBLE_EQ(plan.decode.collective_bytes, 48 * 2 * 7.0 / 8 * payload);
  EXPECT_DOUBLE_EQ(plan.decode.collectives_s, plan.decode.collective_bytes / 450e9);
}

// tp 2 inside each of 4 groups: one all-reduce of the group's tokens after attention and one
// after the MoE block, per layer.
TEST(PlanTraffic, TensorParallelAllReducesTheGroupsTokens) {
  DeploymentSpec spec = layout(2, 4, true);
  spec.concurrency = 64;
  const Plan plan = plan_of("qwen3-30b-a3b", "h200", spec);
  const double group_payload = 16 * 2048 * 2;  // 64 tokens over 4 groups
  EXPECT_DOUBLE_EQ(plan.decode.collective_bytes, 2 * 48 * (2 * 1.0 / 2 * group_payload));
}

}  // namespace
}  // namespace moe
