// Device counts of a layout, and the checks that the model and the hardware allow it.
#include "moe/error.h"
#include "plan/terms.h"

namespace moe::planning {
namespace {

// Far beyond any deployment, and small enough that device products stay exact in double.
constexpr int64_t kMaxDevices = int64_t{1} << 20;

void check_attention_split(const AttentionConfig& attention, int64_t tp) {
  if (attention.num_heads % tp != 0) {
    fail("tp: expected a divisor of num_attention_heads ({}); got {}", attention.num_heads, tp);
  }
  // vLLM splits kv heads over tp, or replicates each over tp / kv_heads devices.
  const int64_t kv_heads = attention.num_kv_heads;
  if (attention.kind == AttentionKind::kGqa && kv_heads % tp != 0 && tp % kv_heads != 0) {
    fail("tp: expected a divisor or a multiple of num_key_value_heads ({}); got {}", kv_heads, tp);
  }
}

// The fewest nodes of equal size holding `devices`, or the user's count checked.
int64_t node_count(const Hardware& hardware, const DeploymentSpec& spec, int64_t devices) {
  const int64_t per_node = hardware.devices_per_node;
  if (spec.num_nodes < 0) fail("num_nodes: expected >= 0 (0 = fewest); got {}", spec.num_nodes);
  if (spec.num_nodes > 0) {
    if (devices % spec.num_nodes != 0 || devices / spec.num_nodes > per_node) {
      fail(
          "num_nodes: expected a divisor of tp * dp = {} leaving at most {} devices per node "
          "(hardware \"{}\"); got {}",
          devices, per_node, hardware.name, spec.num_nodes);
    }
    return spec.num_nodes;
  }
  int64_t nodes = (devices + per_node - 1) / per_node;
  while (devices % nodes != 0) ++nodes;
  return nodes;
}

}  // namespace

Layout resolve_layout(const MoeConfig& config, const Hardware& hardware,
                      const DeploymentSpec& spec) {
  validate(config);
  validate(hardware);
  if (spec.tp < 1) fail("tp: expected >= 1 device; got {}", spec.tp);
  if (spec.dp < 1) fail("dp: expected >= 1 group; got {}", spec.dp);
  Layout layout;
  layout.tp = spec.tp;
  layout.dp = spec.dp;
  if (__builtin_mul_overflow(spec.tp, spec.dp, &layout.num_devices) ||
      layout.num_devices > kMaxDevices) {
    fail("tp * dp: expected at most {} devices; got tp {} and dp {}", kMaxDevices, spec.tp,
         spec.dp);
  }
  check_attention_split(config.attention, spec.tp);

  const int64_t num_experts = config.routing.num_experts;
  if (spec.expert_parallel) {
    layout.ep = layout.num_devices;
    if (layout.ep > num_experts) {
      fail("ep (tp * dp = {}): expected at most num_experts ({}); lower tp or dp", layout.ep,
           num_experts);
    }
  } else {
    layout.expert_shards = layout.num_devices;
    if (layout.expert_shards > config.experts.intermediate_size) {
      fail(
          "tp * dp ({}): without expert parallelism each expert is split that many ways; "
          "expected at most moe_intermediate_size ({}); turn expert parallelism on",
          layout.expert_shards, config.experts.intermediate_size);
    }
  }

  layout.num_nodes = node_count(hardware, spec, layout.num_devices);
  layout.devices_per_node = layout.num_devices / layout.num_nodes;
  if (layout.devices_per_node > 1 && !(hardware.link_bytes_per_s > 0)) {
    fail("hardware \"{}\": link_bytes_per_s: expected > 0 for {} devices per node; got {}",
         hardware.name, layout.devices_per_node, hardware.link_bytes_per_s);
  }
  if (layout.num_nodes > 1 && !(hardware.network_bytes_per_s > 0)) {
    fail("hardware \"{}\": network_bytes_per_s: expected > 0 for {} nodes; got {}", hardware.name,
         layout.num_nodes, hardware.network_bytes_per_s);
  }
  return layout;
}

}  // namespace moe::planning
