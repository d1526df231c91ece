// One prefill or decode step of the whole model on the busiest device: the flops it computes,
// the bytes it reads from memory and sends over links, and the roofline time of each at the
// device's peak. Routing is taken as uniform: every device gets T * k / EP pairs.
#include <algorithm>
#include <array>
#include <utility>

#include "plan/terms.h"

namespace moe::planning {
namespace {

// Activations between layers (all-reduce payloads, combined expert outputs) travel in bf16.
constexpr double kActivationBytes = 2;

double seconds(double bytes, double bytes_per_s) { return bytes > 0 ? bytes / bytes_per_s : 0; }

// Bytes one device sends in a ring all-reduce of `payload` bytes over `devices` devices.
double all_reduce_bytes(int64_t devices, double payload) {
  const double n = static_cast<double>(devices);
  return devices > 1 ? 2 * (n - 1) / n * payload : 0;
}

// A group of consecutive devices stays on NVLink while it fits in a node.
double group_rate(const Hardware& hardware, const Layout& layout, int64_t devices) {
  return devices <= layout.devices_per_node ? hardware.link_bytes_per_s
                                            : hardware.network_bytes_per_s;
}

// Time of one direction of one MoE layer for one device: its NVLink and network sends overlap.
double direction_seconds(const ExpertTraffic& traffic, const Hardware& hardware,
                         const Layout& layout) {
  const double devices = static_cast<double>(layout.num_devices);
  return std::max(seconds(traffic.same_node_bytes / devices, hardware.link_bytes_per_s),
                  seconds(traffic.cross_node_bytes / devices, hardware.network_bytes_per_s));
}

StepFlops step_flops(const MoeConfig& config, const DeviceParams& params, const Layout& layout,
                     double tokens, double tokens_per_group, double context, bool decode) {
  const double num_layers = static_cast<double>(config.num_layers);
  const double num_moe = static_cast<double>(config.num_moe_layers());
  const double pairs_per_device =
      tokens * static_cast<double>(config.routing.top_k) / static_cast<double>(layout.ep);
  // A matrix of P parameters costs 2 * P flops per row it multiplies.
  const auto matmul = [&](int64_t parameters, double rows, double layers) {
    return 2 * static_cast<double>(parameters) * rows * layers;
  };
  StepFlops flops;
  flops.attention_projections = matmul(params.attention_per_layer, tokens_per_group, num_layers);
  flops.dense_ffn = matmul(params.dense_ffn_per_layer, tokens_per_group, num_layers - num_moe);
  flops.shared_experts = matmul(params.shared_experts_per_layer, tokens_per_group, num_moe);
  flops.router = matmul(params.router_per_layer, tokens_per_group, num_moe);
  flops.routed_experts = matmul(params.expert_slice, pairs_per_device, num_moe);
  flops.lm_head = decode ? matmul(params.head, tokens_per_group, 1) : 0;
  // A prompt's query at position p attends p positions: context / 2 on average.
  const double attended = decode ? context : context / 2;
  flops.attention_context =
      attention_context_flops(config, layout.tp, attended, decode) * tokens_per_group * num_layers;
  return flops;
}

}  // namespace

StagePlan plan_stage(bool decode, int64_t tokens, const MoeConfig& config, const Hardware& hardware,
                     const DeploymentSpec& spec, const Layout& layout,
                     const PairFractions& fractions) {
  const DeviceParams params = device_params(config, layout);
  const WeightBytes resident = resident_weight_bytes(config, params, spec.weights);
  const int64_t num_experts = config.routing.num_experts;
  const int64_t top_k = config.routing.top_k;
  const double num_moe = static_cast<double>(config.num_moe_layers());
  const double t = static_cast<double>(tokens);
  const double context = static_cast<double>(spec.context_len);

  StagePlan s;
  s.stage = decode ? "decode" : "prefill";
  s.tokens = tokens;
  s.tokens_per_group = (tokens + layout.dp - 1) / layout.dp;
  const double t_group = static_cast<double>(s.tokens_per_group);
  s.mean_rows_per_expert = t * static_cast<double>(top_k) / static_cast<double>(num_experts);
  s.distinct_experts_per_layer = expected_distinct_experts(num_experts, top_k, t);
  const double touched_share = s.distinct_experts_per_layer / static_cast<double>(num_experts);
  s.distinct_experts_per_device = static_cast<double>(params.experts_per_device) * touched_share;

  s.flops = step_flops(config, params, layout, t, t_group, context, decode);

  // Every resident weight but the experts no token picked and the input table (a lookup reads
  // T rows of it); decode reads the output head once per step.
  const int64_t head_bytes = resident.embedding / (config.tie_word_embeddings ? 1 : 2);
  s.weight_read_bytes = static_cast<double>(resident.total() - resident.routed_experts -
                                            resident.embedding + (decode ? head_bytes : 0)) +
                        static_cast<double>(resident.routed_experts) * touched_share;
  const double kv_per_token =
      static_cast<double>(kv_bytes_per_token(config, layout.tp, spec.kv_cache));
  const double sequences = static_cast<double>(
      std::min(s.tokens_per_group, (spec.concurrency + layout.dp - 1) / layout.dp));
  // Decode reads each sequence's whole cache; both stages write the step's own tokens.
  s.kv_cache_bytes = ((decode ? sequences * context : 0) + t_group) * kv_per_token;

  s.dispatch = expert_traffic(config, layout, tokens, spec.dispatch, fractions);
  s.combine = expert_traffic(config, layout, tokens, StorageFormat::kBF16, fractions);
  s.dispatch_bytes = num_moe * (s.dispatch.expected_bytes + s.combine.expected_bytes) /
                     static_cast<double>(layout.num_devices);
  s.dispatch_s = num_moe * (direction_seconds(s.dispatch, hardware, layout) +
                            direction_seconds(s.combine, hardware, layout));

  // One all-reduce over the tp group after attention and after each dense FFN or MoE block;
  // without EP the MoE block's partial sums reduce over all devices, for the whole step's tokens.
  const double num_layers = static_cast<double>(config.num_layers);
  const double group_payload =
      t_group * static_cast<double>(config.experts.hidden_size) * kActivationBytes;
  const bool sharded_experts = layout.expert_shards > 1;
  const double tp_reductions =
      num_layers + (num_layers - num_moe) + (sharded_experts ? 0 : num_moe);
  const double tp_bytes = tp_reductions * all_reduce_bytes(layout.tp, group_payload);
  const double step_payload =
      t * static_cast<double>(config.experts.hidden_size) * kActivationBytes;
  const double moe_bytes =
      sharded_experts ? num_moe * all_reduce_bytes(layout.expert_shards, step_payload) : 0;
  s.collective_bytes = tp_bytes + moe_bytes;
  s.collectives_s = seconds(tp_bytes, group_rate(hardware, layout, layout.tp)) +
                    seconds(moe_bytes, group_rate(hardware, layout, layout.expert_shards));

  const bool fp8_units = spec.weights == StorageFormat::kFP8 && hardware.peak_flops_fp8 > 0;
  const double matrix_peak = fp8_units ? hardware.peak_flops_fp8 : hardware.peak_flops_16bit;
  s.compute_s =
      s.flops.matrices() / matrix_peak + s.flops.attention_context / hardware.peak_flops_16bit;
  s.memory_s = (s.weight_read_bytes + s.kv_cache_bytes) / hardware.memory_bytes_per_s;

  const std::array<std::pair<Bottleneck, double>, 4> terms = {{
      {Bottleneck::kMemory, s.memory_s},
      {Bottleneck::kCompute, s.compute_s},
      {Bottleneck::kDispatch, s.dispatch_s},
      {Bottleneck::kCollectives, s.collectives_s},
  }};
  const auto* largest = std::max_element(
      terms.begin(), terms.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  s.bottleneck = largest->first;
  s.bound_s = largest->second;
  return s;
}

}  // namespace moe::planning
