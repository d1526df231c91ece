// The deployment planner: what a MoE model laid out over devices needs of each device (weight
// and KV-cache memory), what one prefill and one decode step move and compute, and the roofline
// floor of each step with its bottleneck. A model from arithmetic, not a measurement: figures
// assume uniform routing and perfect overlap; docs/plan.md states every assumption.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "moe/config.h"
#include "moe/hardware.h"

namespace moe {

// A layout over devices and the load it must serve.
//
// The layout follows vLLM: attention (and the embeddings, dense FFNs and shared experts) is
// tensor-parallel over `tp` devices inside each of `dp` data-parallel groups, and replicated
// across groups. With expert_parallel, the routed experts are split whole over all tp * dp
// devices (EP = tp * dp); without it, every routed expert is tensor-parallel over all of them.
struct DeploymentSpec {
  int64_t tp = 1;
  int64_t dp = 1;
  bool expert_parallel = false;
  int64_t num_nodes = 0;  // 0 = the fewest nodes of equal size that hold tp * dp devices
  // Format of the projection matrices (attention, experts, dense FFNs). Embeddings, norms and the
  // router stay in bf16 under fp8/int8/int4, as quantized checkpoints keep them.
  StorageFormat weights = StorageFormat::kBF16;
  StorageFormat kv_cache = StorageFormat::kBF16;
  // Token rows sent to the experts; results come back in bf16 whatever this is.
  StorageFormat dispatch = StorageFormat::kBF16;
  int64_t context_len = 4096;     // tokens per sequence (prompt and output), the worst case
  int64_t concurrency = 1;        // sequences in flight over the whole deployment
  int64_t prefill_tokens = 0;     // per prefill step over the deployment; 0 = 8192 per DP group
  int64_t decode_tokens = 0;      // per decode step over the deployment; 0 = concurrency
  double reserve_fraction = 0.1;  // of each device's memory, for activations and allocator slack
  std::optional<int64_t> reserve_bytes;  // replaces reserve_fraction
  // Share of (token, expert) pairs whose expert sits on the token's own device; 1/EP (a uniform
  // random placement) unless a placement says otherwise. Unused without expert parallelism.
  std::optional<double> local_fraction;
};

// Weight bytes resident on one device, by part of the model (the busiest device where a part
// splits unevenly).
struct WeightBytes {
  int64_t attention = 0;       // projections of all layers
  int64_t embedding = 0;       // input table and output head, vocabulary split tp-ways
  int64_t dense_ffn = 0;       // FFNs of the dense layers
  int64_t shared_experts = 0;  // with attention's layout, as vLLM builds them: a TP MLP
  int64_t routed_experts = 0;
  int64_t router = 0;  // replicated on every device
  int64_t norms = 0;   // replicated on every device
  int64_t total() const {
    return attention + embedding + dense_ffn + shared_experts + routed_experts + router + norms;
  }
};

enum class Fit : uint8_t {
  kFits,
  kKvCacheTooSmall,  // the weights fit, the requested context * concurrency does not
  kWeightsTooLarge,  // the weights alone exceed a device's memory less the reserve
};
std::string_view fit_name(Fit fit);  // "fits", "kv_cache_too_small", "weights_too_large"

struct MemoryPlan {
  int64_t model_weight_bytes = 0;             // the whole checkpoint in the chosen formats
  int64_t active_weight_bytes_per_token = 0;  // the whole model, routed experts counted k times
  WeightBytes resident;                       // per device
  // One token's weights that lie on one device, on average over the devices of its group.
  double active_weight_bytes_per_token_per_device = 0;
  int64_t capacity_bytes = 0;  // per device
  int64_t reserve_bytes = 0;
  int64_t kv_budget_bytes = 0;  // capacity - reserve - resident weights; < 0 when they do not fit
  int64_t kv_bytes_per_token = 0;          // per device
  int64_t kv_tokens_per_group = 0;         // cached tokens the devices of one DP group hold
  int64_t requested_tokens_per_group = 0;  // context_len * the busiest group's sequences
  int64_t max_concurrency = 0;             // sequences of context_len the deployment holds
  Fit fit = Fit::kFits;
  std::string reason;  // why it does not fit and what to change; empty when it fits
};

// Token rows moved between devices in one direction (dispatch or combine), for one MoE layer of
// one step, summed over the deployment.
struct ExpertTraffic {
  double upper_bound_bytes = 0;  // T * k * H * b: every pair's row leaves its device
  double expected_bytes = 0;     // upper bound * (1 - local_fraction)
  double same_node_bytes = 0;    // the part of expected_bytes over NVLink
  double cross_node_bytes = 0;   // the part over the network
  // Expected bytes when a token goes once to each remote device holding any of its experts (as
  // DeepEP sends it), for a uniform placement.
  double one_copy_per_device_bytes = 0;
};

struct StepFlops {  // one device, one step, all layers
  double attention_projections = 0;
  double dense_ffn = 0;
  double shared_experts = 0;
  double routed_experts = 0;
  double router = 0;
  double lm_head = 0;  // decode only: prefill's logits (last position of a prompt) are negligible
  double matrices() const {
    return attention_projections + dense_ffn + shared_experts + routed_experts + router + lm_head;
  }
  // Attention scores and values over the cached context, kept apart: it grows with context,
  // not with weights.
  double attention_context = 0;
};

enum class Bottleneck : uint8_t { kMemory, kCompute, kDispatch, kCollectives };
std::string_view bottleneck_name(Bottleneck bottleneck);  // "memory", "compute", ...

// One prefill or decode step of the whole model.
struct StagePlan {
  std::string_view stage;  // "prefill" or "decode"
  int64_t tokens = 0;      // T, over the deployment
  int64_t tokens_per_group = 0;
  double mean_rows_per_expert = 0;  // T * k / E
  // Expected distinct experts that T tokens touch in one layer, each token picking k of E
  // uniformly: E * (1 - (1 - k/E)^T); and how many of them lie on one device.
  double distinct_experts_per_layer = 0;
  double distinct_experts_per_device = 0;
  ExpertTraffic dispatch;  // per MoE layer; zero without expert parallelism
  ExpertTraffic combine;
  // Per device, one step, all layers:
  StepFlops flops;
  double weight_read_bytes = 0;  // every resident weight the step uses, experts only if touched
  double kv_cache_bytes = 0;     // read (decode: the whole context) and written
  double dispatch_bytes = 0;     // sent by one device, dispatch and combine
  double collective_bytes = 0;   // sent by one device in tensor-parallel all-reduces
  // Roofline: each term alone at the device's peak; with perfect overlap the step takes the
  // largest, the bottleneck.
  double memory_s = 0;
  double compute_s = 0;
  double dispatch_s = 0;
  double collectives_s = 0;
  double bound_s = 0;
  Bottleneck bottleneck = Bottleneck::kMemory;
};

struct Plan {
  std::string model;
  Hardware hardware;
  DeploymentSpec spec;  // with the defaults filled in
  int64_t num_devices = 0;
  int64_t num_nodes = 0;
  int64_t devices_per_node = 0;    // used by this layout
  int64_t ep = 1;                  // expert-parallel size; 1 when off
  int64_t experts_per_device = 0;  // routed experts (whole, or a 1/(tp*dp) slice without EP)
  double local_fraction = 1;       // of (token, expert) pairs
  double same_node_fraction = 0;   // remote pairs over NVLink, as a share of all pairs
  double cross_node_fraction = 0;  // remote pairs over the network
  MemoryPlan memory;
  StagePlan prefill;
  StagePlan decode;
};

// Throws moe::Error naming the argument on a bad config, hardware or spec: tp not dividing the
// attention heads, no devices, EP larger than the number of experts, a link the layout uses at
// rate 0, an impossible reserve or local fraction.
Plan plan_deployment(const MoeConfig& config, const Hardware& hardware, const DeploymentSpec& spec);

}  // namespace moe
