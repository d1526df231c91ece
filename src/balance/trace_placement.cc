// optimize_placement: per layer, rounds of the swap search (balance/swap_search.h), each kept only
// when the exact traffic model confirms it. Within a round the pairs of a replicated expert stay
// with the replica the rule gave them at the start of the round; after the swaps the rule may
// hand them to other replicas, which can cost rows or move a pair of load. So every round is
// re-measured with the rule and kept only if it lowers the rows and keeps the bound; the next
// round starts from the rule's new choice. Without replicas the search's model is the exact one,
// and one round is all there is.
#include <algorithm>
#include <span>
#include <tuple>
#include <vector>

#include "balance/swap_search.h"
#include "balance/trace_layer.h"
#include "balance/trace_validation.h"
#include "moe/placement.h"

namespace moe {
namespace {

// What a layer minimizes: cross-node bytes first, then same-node bytes.
std::tuple<int64_t, int64_t> rows_key(const LayerTraffic& traffic) {
  return {traffic.dispatch.cross_node, traffic.dispatch.same_node};
}

struct LayerOutcome {
  LayerTraffic before;
  LayerTraffic after;
  int64_t num_swaps = 0;  // kept
};

// Rewrites one layer of `phy2log` ([num_slots]) and writes the GPU loads before and after.
LayerOutcome optimize_layer(balance::LayerProblem layer, std::span<int32_t> phy2log,
                            const Topology& topology, int64_t row_bytes,
                            const PlacementSearch& search, std::span<int64_t> load_before,
                            std::span<int64_t> load_after) {
  std::vector<int32_t> current(phy2log.begin(), phy2log.end());
  layer.phy2log = current;
  std::vector<int32_t> slot_of_pair = balance::choose_slots(layer);
  LayerOutcome outcome;
  outcome.before = balance::layer_traffic(layer, slot_of_pair, topology, row_bytes, load_before);
  outcome.after = outcome.before;
  std::copy(load_before.begin(), load_before.end(), load_after.begin());
  const double load_cap = search.load_bound * outcome.before.mean_gpu_load;
  const double allowed_max = std::max(load_cap, static_cast<double>(outcome.before.max_gpu_load));
  const bool has_replicas = layer.num_slots() > layer.num_experts;

  std::vector<int64_t> candidate_load(load_after.size());
  for (int64_t round = 0; round < search.max_rounds; ++round) {
    balance::SwapSearchResult found =
        balance::search_swaps(layer, slot_of_pair, load_cap, search.max_sweeps);
    if (found.num_swaps == 0) break;
    balance::LayerProblem candidate = layer;
    candidate.phy2log = found.phy2log;
    std::vector<int32_t> candidate_slots = balance::choose_slots(candidate);
    const LayerTraffic candidate_traffic =
        balance::layer_traffic(candidate, candidate_slots, topology, row_bytes, candidate_load);
    if (rows_key(candidate_traffic) >= rows_key(outcome.after) ||
        static_cast<double>(candidate_traffic.max_gpu_load) > allowed_max) {
      break;
    }
    current = std::move(found.phy2log);
    layer.phy2log = current;
    slot_of_pair = std::move(candidate_slots);
    outcome.after = candidate_traffic;
    std::copy(candidate_load.begin(), candidate_load.end(), load_after.begin());
    outcome.num_swaps += found.num_swaps;
    if (!has_replicas) break;
  }
  std::copy(current.begin(), current.end(), phy2log.begin());
  return outcome;
}

}  // namespace

PlacementResult optimize_placement(const RoutingTrace& trace, const ExpertPlacement& start,
                                   const Topology& topology, const ActivationRow& row,
                                   const PlacementSearch& search) {
  balance::check_traffic_inputs(trace, start, topology, row);
  balance::check_search(search, trace);
  PlacementResult result;
  result.before = balance::empty_traffic_report(trace.num_layers, topology.num_gpus());
  result.after = balance::empty_traffic_report(trace.num_layers, topology.num_gpus());
  std::vector<int32_t> phy2log = start.phy2log;
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    const LayerOutcome outcome = optimize_layer(
        balance::layer_problem(trace, start, topology, l),
        std::span<int32_t>(phy2log).subspan(static_cast<size_t>(l * start.num_replicas),
                                            static_cast<size_t>(start.num_replicas)),
        topology, row.bytes(), search, balance::layer_gpu_load(result.before, l),
        balance::layer_gpu_load(result.after, l));
    balance::record_layer(result.before, l, outcome.before);
    balance::record_layer(result.after, l, outcome.after);
    result.num_swaps += outcome.num_swaps;
  }
  result.placement = placement_from_phy2log(phy2log, start.num_layers, start.num_logical_experts,
                                            start.num_gpus, start.num_nodes);
  return result;
}

}  // namespace moe
