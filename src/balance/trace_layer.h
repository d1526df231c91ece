// One layer of a trace-based placement problem as the traffic model and the swap search see it,
// and the two pieces of the traffic model they share: which slot serves each pair, and the
// bytes and loads that follow. Inputs are trusted: the public functions validate them first.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moe/placement.h"

namespace moe::balance {

struct LayerProblem {
  std::span<const int32_t> phy2log;     // [num_slots]: the logical expert in each slot
  std::span<const int32_t> topk_ids;    // [num_tokens, top_k]
  std::span<const int32_t> source_gpu;  // [num_tokens]
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t num_gpus = 0;
  int64_t num_nodes = 0;
  // Lookups instead of divisions in the inner loops: slot s is on GPU s / slots_per_gpu, and GPU g
  // on node g / gpus_per_node.
  std::vector<int32_t> gpu_of_slot_table;  // [num_slots]
  std::vector<int32_t> node_of_gpu_table;  // [num_gpus]

  int64_t num_tokens() const { return static_cast<int64_t>(source_gpu.size()); }
  int64_t num_pairs() const { return static_cast<int64_t>(topk_ids.size()); }
  int64_t num_slots() const { return static_cast<int64_t>(phy2log.size()); }
  int32_t gpu_of_slot(int64_t slot) const { return gpu_of_slot_table[static_cast<size_t>(slot)]; }
  int32_t node_of_gpu(int64_t gpu) const { return node_of_gpu_table[static_cast<size_t>(gpu)]; }
};

// Layer `layer` of a validated trace and placement.
LayerProblem layer_problem(const RoutingTrace& trace, const ExpertPlacement& placement,
                           const Topology& topology, int64_t layer);

// The slot that serves each pair, by the replica rule of include/moe/placement.h.
std::vector<int32_t> choose_slots(const LayerProblem& layer);  // [num_pairs]

// The layer's traffic when pair p is served by slot_of_pair[p]; writes each GPU's load (pairs)
// to gpu_load [num_gpus].
LayerTraffic layer_traffic(const LayerProblem& layer, std::span<const int32_t> slot_of_pair,
                           const Topology& topology, int64_t row_bytes,
                           std::span<int64_t> gpu_load);

// A report of num_layers layers of num_gpus GPUs with nothing recorded yet.
TrafficReport empty_traffic_report(int64_t num_layers, int64_t num_gpus);

// Layer `layer`'s row of report.gpu_load [num_gpus], for layer_traffic to fill.
std::span<int64_t> layer_gpu_load(TrafficReport& report, int64_t layer);

// Stores layer `layer`'s traffic in the report and adds it to the totals.
void record_layer(TrafficReport& report, int64_t layer, const LayerTraffic& traffic);

}  // namespace moe::balance
