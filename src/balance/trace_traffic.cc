// The traffic model of include/moe/placement.h: the bytes dispatch sends per link domain, the
// busiest GPU's share of them, and each GPU's load, for one layer and summed over a trace.
#include <algorithm>
#include <vector>

#include "balance/trace_layer.h"
#include "balance/trace_validation.h"
#include "moe/placement.h"

namespace moe::balance {

LayerProblem layer_problem(const RoutingTrace& trace, const ExpertPlacement& placement,
                           const Topology& topology, int64_t layer) {
  const TraceLayer& routing = trace.layers[static_cast<size_t>(layer)];
  LayerProblem problem;
  problem.phy2log = std::span<const int32_t>(placement.phy2log)
                        .subspan(static_cast<size_t>(layer * placement.num_replicas),
                                 static_cast<size_t>(placement.num_replicas));
  problem.topk_ids = routing.topk_ids;
  problem.source_gpu = routing.source_gpu;
  problem.num_experts = trace.num_experts;
  problem.top_k = trace.top_k;
  problem.num_gpus = topology.num_gpus();
  problem.num_nodes = topology.num_nodes;
  problem.gpu_of_slot_table.resize(static_cast<size_t>(placement.num_replicas));
  for (int64_t s = 0; s < placement.num_replicas; ++s) {
    problem.gpu_of_slot_table[static_cast<size_t>(s)] =
        static_cast<int32_t>(s / placement.slots_per_gpu());
  }
  problem.node_of_gpu_table.resize(static_cast<size_t>(problem.num_gpus));
  for (int64_t g = 0; g < problem.num_gpus; ++g) {
    problem.node_of_gpu_table[static_cast<size_t>(g)] =
        static_cast<int32_t>(g / topology.gpus_per_node);
  }
  return problem;
}

LayerTraffic layer_traffic(const LayerProblem& layer, std::span<const int32_t> slot_of_pair,
                           const Topology& topology, int64_t row_bytes,
                           std::span<int64_t> gpu_load) {
  const int64_t num_gpus = layer.num_gpus;
  const int64_t top_k = layer.top_k;
  // Rows each GPU sends and receives in each domain: the busiest GPU sets the domain's time.
  std::vector<int64_t> same_node_sent(static_cast<size_t>(num_gpus), 0);
  std::vector<int64_t> same_node_received(static_cast<size_t>(num_gpus), 0);
  std::vector<int64_t> cross_node_sent(static_cast<size_t>(num_gpus), 0);
  std::vector<int64_t> cross_node_received(static_cast<size_t>(num_gpus), 0);
  std::fill(gpu_load.begin(), gpu_load.end(), 0);
  DomainBytes rows;                   // counted in rows here, in bytes once scaled below
  std::vector<int64_t> destinations;  // distinct GPUs of one token, at most top_k
  destinations.reserve(static_cast<size_t>(top_k));
  for (int64_t t = 0; t < layer.num_tokens(); ++t) {
    const int64_t source = layer.source_gpu[static_cast<size_t>(t)];
    destinations.clear();
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t gpu = layer.gpu_of_slot(slot_of_pair[static_cast<size_t>(t * top_k + j)]);
      ++gpu_load[static_cast<size_t>(gpu)];
      if (std::find(destinations.begin(), destinations.end(), gpu) == destinations.end()) {
        destinations.push_back(gpu);
      }
    }
    for (const int64_t gpu : destinations) {
      if (gpu == source) {
        ++rows.same_gpu;
      } else if (layer.node_of_gpu(gpu) == layer.node_of_gpu(source)) {
        ++rows.same_node;
        ++same_node_sent[static_cast<size_t>(source)];
        ++same_node_received[static_cast<size_t>(gpu)];
      } else {
        ++rows.cross_node;
        ++cross_node_sent[static_cast<size_t>(source)];
        ++cross_node_received[static_cast<size_t>(gpu)];
      }
    }
  }

  auto busiest = [](const std::vector<int64_t>& sent, const std::vector<int64_t>& received) {
    return std::max(*std::max_element(sent.begin(), sent.end()),
                    *std::max_element(received.begin(), received.end()));
  };
  const double bytes = static_cast<double>(row_bytes);
  LayerTraffic traffic;
  traffic.dispatch = {.same_gpu = rows.same_gpu * row_bytes,
                      .same_node = rows.same_node * row_bytes,
                      .cross_node = rows.cross_node * row_bytes};
  traffic.upper_bound_bytes = layer.num_pairs() * row_bytes;
  traffic.same_node_seconds = static_cast<double>(busiest(same_node_sent, same_node_received)) *
                              bytes / (topology.intra_node_gbps * 1e9);
  traffic.cross_node_seconds = static_cast<double>(busiest(cross_node_sent, cross_node_received)) *
                               bytes / (topology.inter_node_gbps * 1e9);
  traffic.dispatch_seconds = std::max(traffic.same_node_seconds, traffic.cross_node_seconds);
  traffic.max_gpu_load = *std::max_element(gpu_load.begin(), gpu_load.end());
  traffic.mean_gpu_load = static_cast<double>(layer.num_pairs()) / static_cast<double>(num_gpus);
  return traffic;
}

TrafficReport empty_traffic_report(int64_t num_layers, int64_t num_gpus) {
  TrafficReport report;
  report.num_layers = num_layers;
  report.num_gpus = num_gpus;
  report.layers.resize(static_cast<size_t>(num_layers));
  report.gpu_load.resize(static_cast<size_t>(num_layers * num_gpus));
  return report;
}

std::span<int64_t> layer_gpu_load(TrafficReport& report, int64_t layer) {
  return std::span<int64_t>(report.gpu_load)
      .subspan(static_cast<size_t>(layer * report.num_gpus), static_cast<size_t>(report.num_gpus));
}

void record_layer(TrafficReport& report, int64_t layer, const LayerTraffic& traffic) {
  report.layers[static_cast<size_t>(layer)] = traffic;
  report.dispatch.same_gpu += traffic.dispatch.same_gpu;
  report.dispatch.same_node += traffic.dispatch.same_node;
  report.dispatch.cross_node += traffic.dispatch.cross_node;
  report.upper_bound_bytes += traffic.upper_bound_bytes;
  report.dispatch_seconds += traffic.dispatch_seconds;
  report.max_skew = std::max(report.max_skew, traffic.skew());
}

}  // namespace moe::balance

namespace moe {

TrafficReport trace_traffic(const RoutingTrace& trace, const ExpertPlacement& placement,
                            const Topology& topology, const ActivationRow& row) {
  balance::check_traffic_inputs(trace, placement, topology, row);
  TrafficReport report = balance::empty_traffic_report(trace.num_layers, topology.num_gpus());
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    const balance::LayerProblem layer = balance::layer_problem(trace, placement, topology, l);
    const std::vector<int32_t> slot_of_pair = balance::choose_slots(layer);
    balance::record_layer(report, l,
                          balance::layer_traffic(layer, slot_of_pair, topology, row.bytes(),
                                                 balance::layer_gpu_load(report, l)));
  }
  return report;
}

}  // namespace moe
