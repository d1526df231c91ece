// Where (token, expert) pairs go under expert parallelism, and the bytes dispatch and combine
// move for them. The seed's bound T * k * H * b counts one row per pair; pairs whose expert is on
// the token's own device move nothing, and the rest split between NVLink and the network in
// proportion to the devices on each.
#include <cmath>

#include "moe/error.h"
#include "plan/terms.h"

namespace moe::planning {
namespace {

// Probability that none of a token's k distinct experts, drawn uniformly from E, is among the
// `held` experts of one device: C(E - held, k) / C(E, k).
double probability_none_held(double num_experts, double held, int64_t top_k) {
  double p = 1;
  for (int64_t i = 0; i < top_k; ++i) {
    const double remaining = num_experts - held - static_cast<double>(i);
    if (remaining <= 0) return 0;
    p *= remaining / (num_experts - static_cast<double>(i));
  }
  return p;
}

}  // namespace

PairFractions pair_fractions(const Layout& layout, std::optional<double> local_fraction) {
  if (local_fraction && !(*local_fraction >= 0 && *local_fraction <= 1)) {
    fail("local_fraction: expected a share in [0, 1]; got {}", *local_fraction);
  }
  const double ep = static_cast<double>(layout.ep);
  if (layout.ep == 1) return PairFractions{};
  PairFractions fractions;
  fractions.local = local_fraction.value_or(1 / ep);
  // EP spans every device, so a node holds devices_per_node of the EP group.
  const double same_node_peers = static_cast<double>(layout.devices_per_node - 1);
  const double remote = 1 - fractions.local;
  fractions.same_node = remote * same_node_peers / (ep - 1);
  fractions.cross_node = remote * (ep - 1 - same_node_peers) / (ep - 1);
  return fractions;
}

double expected_distinct_experts(int64_t num_experts, int64_t top_k, double tokens) {
  const double e = static_cast<double>(num_experts);
  return e * (1 - std::pow(1 - static_cast<double>(top_k) / e, tokens));
}

ExpertTraffic expert_traffic(const MoeConfig& config, const Layout& layout, int64_t tokens,
                             StorageFormat format, const PairFractions& fractions) {
  ExpertTraffic traffic;
  if (layout.ep == 1) return traffic;  // experts are sharded, not placed: nothing to dispatch
  const int64_t top_k = config.routing.top_k;
  const double row_bytes = static_cast<double>(config.experts.hidden_size) *
                           static_cast<double>(storage_bits(format)) / 8;
  const double t = static_cast<double>(tokens);
  traffic.upper_bound_bytes = t * static_cast<double>(top_k) * row_bytes;
  traffic.expected_bytes = traffic.upper_bound_bytes * (1 - fractions.local);
  traffic.same_node_bytes = traffic.upper_bound_bytes * fractions.same_node;
  traffic.cross_node_bytes = traffic.upper_bound_bytes * fractions.cross_node;
  const double num_experts = static_cast<double>(config.routing.num_experts);
  const double ep = static_cast<double>(layout.ep);
  const double remote_devices_per_token =
      (ep - 1) * (1 - probability_none_held(num_experts, num_experts / ep, top_k));
  traffic.one_copy_per_device_bytes = t * row_bytes * remote_devices_per_token;
  return traffic;
}

}  // namespace moe::planning
