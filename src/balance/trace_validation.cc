// Argument checks of include/moe/placement.h.
#include "balance/trace_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "balance/eplb_validation.h"
#include "balance/swap_search.h"
#include "moe/error.h"

namespace moe::balance {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

void check_count(int64_t value, int64_t largest, const char* name) {
  if (value < 1 || value > largest) fail("{}: expected 1..{}; got {}", name, largest, value);
}

void check_bandwidth(double gbps, const char* name) {
  if (!std::isfinite(gbps) || gbps <= 0) {
    fail("{}: expected a finite bandwidth > 0 GB/s; got {}", name, gbps);
  }
}

void check_layer(const TraceLayer& layer, int64_t index, int64_t num_experts, int64_t top_k,
                 int64_t num_gpus, std::vector<int64_t>& last_token_of_expert) {
  const int64_t num_ids = static_cast<int64_t>(layer.topk_ids.size());
  if (num_ids % top_k != 0) {
    fail(
        "trace.layers[{}].topk_ids: expected [num_tokens, top_k = {}] entries, a multiple of {}; "
        "got {}",
        index, top_k, top_k, num_ids);
  }
  const int64_t num_tokens = num_ids / top_k;
  if (static_cast<int64_t>(layer.source_gpu.size()) != num_tokens) {
    fail(
        "trace.layers[{}].source_gpu: expected one GPU per token ({}); got {} (see "
        "assign_sources_round_robin)",
        index, num_tokens, layer.source_gpu.size());
  }
  // A stamp per expert (the last token that picked it) finds repeats in O(1) per id.
  std::fill(last_token_of_expert.begin(), last_token_of_expert.end(), -1);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t source = layer.source_gpu[static_cast<size_t>(t)];
    if (source < 0 || source >= num_gpus) {
      fail("trace.layers[{}].source_gpu: expected GPU ids in [0, {}); got {} for token {}", index,
           num_gpus, source, t);
    }
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t expert = layer.topk_ids[static_cast<size_t>(t * top_k + j)];
      if (expert < 0 || expert >= num_experts) {
        fail(
            "trace.layers[{}].topk_ids: expected expert ids in [0, {}); got {} for token {}, "
            "choice {}",
            index, num_experts, expert, t, j);
      }
      int64_t& last = last_token_of_expert[static_cast<size_t>(expert)];
      if (last == t) {
        fail(
            "trace.layers[{}].topk_ids: expected distinct experts per token; token {} picks "
            "expert {} twice",
            index, t, expert);
      }
      last = t;
    }
  }
}

}  // namespace

void check_topology(const Topology& topology) {
  check_count(topology.num_nodes, kMaxInt32, "topology.num_nodes");
  check_count(topology.gpus_per_node, kMaxInt32 / topology.num_nodes, "topology.gpus_per_node");
  check_bandwidth(topology.intra_node_gbps, "topology.intra_node_gbps");
  check_bandwidth(topology.inter_node_gbps, "topology.inter_node_gbps");
}

void check_trace(const RoutingTrace& trace, int64_t num_gpus) {
  check_count(trace.num_layers, kMaxInt32, "trace.num_layers");
  check_count(trace.num_experts, kMaxInt32, "trace.num_experts");
  check_count(trace.top_k, trace.num_experts, "trace.top_k");
  if (static_cast<int64_t>(trace.layers.size()) != trace.num_layers) {
    fail("trace.layers: expected num_layers = {} layers; got {}", trace.num_layers,
         trace.layers.size());
  }
  std::vector<int64_t> last_token_of_expert(static_cast<size_t>(trace.num_experts));
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    check_layer(trace.layers[static_cast<size_t>(l)], l, trace.num_experts, trace.top_k, num_gpus,
                last_token_of_expert);
  }
}

void check_traffic_inputs(const RoutingTrace& trace, const ExpertPlacement& placement,
                          const Topology& topology, const ActivationRow& row) {
  check_topology(topology);
  check_placement(placement, "placement");
  if (placement.num_gpus != topology.num_gpus()) {
    fail(
        "placement.num_gpus: expected topology's num_nodes * gpus_per_node = {} * {} = {}; got "
        "{}",
        topology.num_nodes, topology.gpus_per_node, topology.num_gpus(), placement.num_gpus);
  }
  if (placement.num_nodes != topology.num_nodes) {
    fail(
        "placement.num_nodes: expected topology.num_nodes = {}; got {} (build the placement "
        "with the topology's node count)",
        topology.num_nodes, placement.num_nodes);
  }
  check_trace(trace, topology.num_gpus());
  if (placement.num_layers != trace.num_layers) {
    fail("placement.num_layers: expected trace.num_layers = {}; got {}", trace.num_layers,
         placement.num_layers);
  }
  if (placement.num_logical_experts != trace.num_experts) {
    fail("placement.num_logical_experts: expected trace.num_experts = {}; got {}",
         trace.num_experts, placement.num_logical_experts);
  }
  check_count(row.hidden_size, kMaxInt64, "row.hidden_size");
  check_count(row.bytes_per_value, kMaxInt64 / row.hidden_size, "row.bytes_per_value");
  int64_t num_pairs = 0;
  for (const TraceLayer& layer : trace.layers) {
    num_pairs += static_cast<int64_t>(layer.topk_ids.size());
  }
  if (num_pairs > kMaxInt64 / row.bytes()) {
    fail(
        "row: {} pairs of {} bytes overflow a 64-bit byte count; expected a smaller hidden_size "
        "or trace",
        num_pairs, row.bytes());
  }
}

void check_search(const PlacementSearch& search, const RoutingTrace& trace) {
  if (!std::isfinite(search.load_bound) || search.load_bound < 1) {
    fail(
        "search.load_bound: expected a finite factor >= 1 of the mean GPU load (e.g. 1.10); "
        "got {}",
        search.load_bound);
  }
  check_count(search.max_sweeps, kMaxInt64, "search.max_sweeps");
  check_count(search.max_rounds, kMaxInt64, "search.max_rounds");
  for (size_t l = 0; l < trace.layers.size(); ++l) {
    const int64_t num_pairs = static_cast<int64_t>(trace.layers[l].topk_ids.size());
    if (num_pairs > kMaxSearchPairsPerLayer) {
      fail(
          "trace.layers[{}].topk_ids: optimize_placement takes at most {} pairs per layer; got "
          "{} (sample fewer tokens)",
          l, kMaxSearchPairsPerLayer, num_pairs);
    }
  }
}

}  // namespace moe::balance
