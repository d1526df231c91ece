// The terms plan_deployment adds up, one concern per source file, declared here so that tests
// can check each term alone.
#pragma once

#include <cstdint>
#include <optional>

#include "moe/config.h"
#include "moe/hardware.h"
#include "moe/plan.h"

namespace moe::planning {

// layout.cc: the device counts a DeploymentSpec implies, checked against model and hardware.
struct Layout {
  int64_t tp = 1;
  int64_t dp = 1;
  int64_t num_devices = 1;    // tp * dp
  int64_t ep = 1;             // tp * dp with expert parallelism, else 1
  int64_t expert_shards = 1;  // ways each routed expert is split: tp * dp without EP, else 1
  int64_t num_nodes = 1;
  int64_t devices_per_node = 1;
};
Layout resolve_layout(const MoeConfig& config, const Hardware& hardware,
                      const DeploymentSpec& spec);

// device_params.cc: parameters one device holds, part by part, with vLLM's sharding. Sizes that
// do not divide evenly round up: the busiest device.
struct DeviceParams {
  int64_t attention_per_layer = 0;
  int64_t embedding = 0;  // input table and untied output head
  int64_t head = 0;       // the output projection a decode step reads (the table when tied)
  int64_t dense_ffn_per_layer = 0;
  int64_t shared_experts_per_layer = 0;
  int64_t router_per_layer = 0;
  int64_t norms = 0;         // all layers
  int64_t expert_slice = 0;  // of one routed expert: all of it with EP, 1/(tp*dp) without
  int64_t experts_per_device = 0;
};
DeviceParams device_params(const MoeConfig& config, const Layout& layout);

// memory.cc
// Bytes of `params` values in `format`; throws moe::Error if they overflow int64.
int64_t format_bytes(int64_t params, StorageFormat format);
WeightBytes resident_weight_bytes(const MoeConfig& config, const DeviceParams& params,
                                  StorageFormat weights);
MemoryPlan plan_memory(const MoeConfig& config, const Hardware& hardware,
                       const DeploymentSpec& spec, const Layout& layout);

// attention.cc: the attention terms that grow with context, per device.
// Cached bytes per token: GQA keeps K and V of the device's kv heads (a kv head is replicated
// when tp exceeds the kv heads); MLA keeps the latent and the rope key, replicated over tp.
int64_t kv_bytes_per_token(const MoeConfig& config, int64_t tp, StorageFormat format);
// Score and value flops of one query token in one layer attending `context` cached positions.
// Decode runs MLA absorbed (queries against the latent), prefill un-absorbed, as vLLM does.
double attention_context_flops(const MoeConfig& config, int64_t tp, double context, bool decode);

// traffic.cc
struct PairFractions {  // shares of all (token, expert) pairs; they sum to 1
  double local = 1;
  double same_node = 0;
  double cross_node = 0;
};
PairFractions pair_fractions(const Layout& layout, std::optional<double> local_fraction);
// E * (1 - (1 - k/E)^tokens): distinct experts that tokens each picking k of E uniformly touch.
double expected_distinct_experts(int64_t num_experts, int64_t top_k, double tokens);
ExpertTraffic expert_traffic(const MoeConfig& config, const Layout& layout, int64_t tokens,
                             StorageFormat format, const PairFractions& fractions);

// step.cc: a prefill step, or a decode step when `decode`.
StagePlan plan_stage(bool decode, int64_t tokens, const MoeConfig& config, const Hardware& hardware,
                     const DeploymentSpec& spec, const Layout& layout,
                     const PairFractions& fractions);

}  // namespace moe::planning
