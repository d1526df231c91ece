// plan_deployment: checks the request once, fills in its defaults, and assembles the memory plan
// and the two step plans from the terms in the other files of this folder.
#include "moe/plan.h"

#include "moe/error.h"
#include "plan/terms.h"

namespace moe {
namespace {

// vLLM's default token budget of one scheduler step (max_num_batched_tokens) with chunked
// prefill: the prefill batch of each DP group.
constexpr int64_t kPrefillTokensPerGroup = 8192;

void check_load(const DeploymentSpec& spec) {
  if (spec.context_len < 1) fail("context_len: expected >= 1 token; got {}", spec.context_len);
  if (spec.concurrency < 1) fail("concurrency: expected >= 1 sequence; got {}", spec.concurrency);
  if (spec.prefill_tokens < 0) {
    fail("prefill_tokens: expected >= 0 (0 = {} per DP group); got {}", kPrefillTokensPerGroup,
         spec.prefill_tokens);
  }
  if (spec.decode_tokens < 0) {
    fail("decode_tokens: expected >= 0 (0 = concurrency); got {}", spec.decode_tokens);
  }
}

}  // namespace

std::string_view fit_name(Fit fit) {
  switch (fit) {
    case Fit::kFits:
      return "fits";
    case Fit::kKvCacheTooSmall:
      return "kv_cache_too_small";
    case Fit::kWeightsTooLarge:
      return "weights_too_large";
  }
  fail("fit: unsupported value {}", static_cast<int>(fit));
}

std::string_view bottleneck_name(Bottleneck bottleneck) {
  switch (bottleneck) {
    case Bottleneck::kMemory:
      return "memory";
    case Bottleneck::kCompute:
      return "compute";
    case Bottleneck::kDispatch:
      return "dispatch";
    case Bottleneck::kCollectives:
      return "collectives";
  }
  fail("bottleneck: unsupported value {}", static_cast<int>(bottleneck));
}

Plan plan_deployment(const MoeConfig& config, const Hardware& hardware,
                     const DeploymentSpec& spec) {
  check_load(spec);
  const planning::Layout layout = planning::resolve_layout(config, hardware, spec);

  Plan plan;
  plan.model = config.name;
  plan.hardware = hardware;
  plan.spec = spec;
  if (plan.spec.prefill_tokens == 0) plan.spec.prefill_tokens = kPrefillTokensPerGroup * layout.dp;
  if (plan.spec.decode_tokens == 0) plan.spec.decode_tokens = spec.concurrency;
  plan.num_devices = layout.num_devices;
  plan.num_nodes = layout.num_nodes;
  plan.devices_per_node = layout.devices_per_node;
  plan.ep = layout.ep;
  plan.experts_per_device = planning::device_params(config, layout).experts_per_device;

  const planning::PairFractions fractions = planning::pair_fractions(layout, spec.local_fraction);
  plan.local_fraction = fractions.local;
  plan.same_node_fraction = fractions.same_node;
  plan.cross_node_fraction = fractions.cross_node;

  plan.memory = planning::plan_memory(config, hardware, plan.spec, layout);
  plan.prefill = planning::plan_stage(/*decode=*/false, plan.spec.prefill_tokens, config, hardware,
                                      plan.spec, layout, fractions);
  plan.decode = planning::plan_stage(/*decode=*/true, plan.spec.decode_tokens, config, hardware,
                                     plan.spec, layout, fractions);
  return plan;
}

}  // namespace moe
