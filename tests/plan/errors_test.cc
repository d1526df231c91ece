// Bad layouts and loads fail with a moe::Error naming the argument, what was expected and what
// was given.
#include <gtest/gtest.h>

#include "plan/plan_case.h"

namespace moe {
namespace {

// The error of planning `model` on `hardware` with `spec`; "" and a failure if none.
std::string plan_error(std::string_view model, const Hardware& hardware,
                       const DeploymentSpec& spec) {
  return error_of([&] { plan_deployment(preset_config(model), hardware, spec); });
}

std::string plan_error(std::string_view model, const DeploymentSpec& spec) {
  return plan_error(model, hardware_preset("h200"), spec);
}

void expect_mentions(const std::string& message, std::initializer_list<std::string_view> parts) {
  for (std::string_view part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "\"" << part << "\" not in: " << message;
  }
}

TEST(PlanErrors, TensorParallelMustDivideTheHeads) {
  expect_mentions(plan_error("qwen3-30b-a3b", layout(3, 1, false)),
                  {"tp", "num_attention_heads (32)", "got 3"});
  // 4 kv heads and tp 16: each kv head is replicated on 4 devices, as vLLM does.
  EXPECT_NO_THROW(plan_of("qwen3-30b-a3b", "h200", layout(16, 1, true)));
}

TEST(PlanErrors, NoDevices) {
  expect_mentions(plan_error("qwen3-30b-a3b", layout(0, 1, false)), {"tp", ">= 1", "got 0"});
  expect_mentions(plan_error("qwen3-30b-a3b", layout(1, 0, false)), {"dp", ">= 1", "got 0"});
  Hardware hardware = hardware_preset("h200");
  hardware.devices_per_node = 0;
  expect_mentions(plan_error("qwen3-30b-a3b", hardware, DeploymentSpec{}),
                  {"devices_per_node", "got 0"});
}

TEST(PlanErrors, ExpertParallelBeyondTheExperts) {
  expect_mentions(plan_error("deepseek-v3", layout(1, 512, true)),
                  {"ep", "512", "num_experts (256)"});
  expect_mentions(plan_error("mixtral-8x7b", layout(1, 16, true)), {"ep", "num_experts (8)"});
}

TEST(PlanErrors, NodesMustSplitTheDevicesEvenly) {
  DeploymentSpec spec = layout(1, 8, true);
  spec.num_nodes = 3;
  expect_mentions(plan_error("qwen3-30b-a3b", spec), {"num_nodes", "got 3"});
  spec.num_nodes = 2;
  EXPECT_EQ(plan_of("qwen3-30b-a3b", "h200", spec).devices_per_node, 4);
}

TEST(PlanErrors, LinksTheLayoutUsesNeedARate) {
  Hardware hardware = hardware_preset("h200");
  hardware.network_bytes_per_s = 0;
  expect_mentions(plan_error("qwen3-30b-a3b", hardware, layout(1, 16, true)),
                  {"network_bytes_per_s", "2 nodes"});
  EXPECT_NO_THROW(plan_deployment(preset_config("qwen3-30b-a3b"), hardware, layout(1, 8, true)));
}

TEST(PlanErrors, ImpossibleLoads) {
  DeploymentSpec spec;
  spec.context_len = 0;
  expect_mentions(plan_error("qwen3-30b-a3b", spec), {"context_len", "got 0"});
  spec = DeploymentSpec{};
  spec.concurrency = -1;
  expect_mentions(plan_error("qwen3-30b-a3b", spec), {"concurrency", "got -1"});
  spec = DeploymentSpec{};
  spec.reserve_fraction = 1;
  expect_mentions(plan_error("qwen3-30b-a3b", spec), {"reserve_fraction", "got 1"});
  spec = DeploymentSpec{};
  spec.reserve_bytes = 200'000'000'000;
  expect_mentions(plan_error("qwen3-30b-a3b", spec), {"reserve_bytes", "got 200000000000"});
  spec = layout(1, 8, true);
  spec.local_fraction = 1.5;
  expect_mentions(plan_error("qwen3-30b-a3b", spec), {"local_fraction", "got 1.5"});
}

TEST(PlanErrors, CpuWithoutFigures) {
  expect_mentions(plan_error("qwen3-30b-a3b", hardware_preset("cpu"), DeploymentSpec{}),
                  {"hardware \"cpu\"", "memory_bytes"});
}

}  // namespace
}  // namespace moe
