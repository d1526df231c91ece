// `moe place`: expert placement from a routing trace and a topology. Starts from the contiguous
// placement (or EPLB's, from the trace's loads), searches swaps that cut cross-node bytes within
// a load bound, and prints bytes per domain and load skew before and after.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/dtype.h"
#include "moe/eplb.h"
#include "moe/error.h"
#include "moe/placement.h"
#include "moe/trace.h"
#include "tools/moe/commands.h"

namespace moe::cli {

namespace {

struct PlaceOptions {
  std::string trace_path;
  int64_t num_nodes = 2;
  int64_t gpus_per_node = 8;
  int64_t num_replicas = 0;  // 0 = one slot per expert
  bool eplb = false;
  int64_t hidden_size = 0;
  std::string dtype = "bf16";
  double intra_node_gbps = 450;
  double inter_node_gbps = 50;
  double load_bound = 1.10;
  bool json = false;
};

// Per-layer loads of the trace, for EPLB.
std::vector<int64_t> trace_loads(const RoutingTrace& trace) {
  std::vector<int64_t> loads(static_cast<size_t>(trace.num_layers * trace.num_experts), 0);
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    for (int32_t e : trace.layers[static_cast<size_t>(l)].topk_ids) {
      ++loads[static_cast<size_t>(l * trace.num_experts + e)];
    }
  }
  return loads;
}

nlohmann::json report_json(const TrafficReport& r) {
  return {{"dispatch_bytes",
           {{"same_gpu", r.dispatch.same_gpu},
            {"same_node", r.dispatch.same_node},
            {"cross_node", r.dispatch.cross_node}}},
          {"upper_bound_bytes", r.upper_bound_bytes},
          {"dispatch_combine_seconds", r.dispatch_combine_seconds()},
          {"max_skew", r.max_skew}};
}

void print_report(const char* name, const TrafficReport& r) {
  const auto gb = [](int64_t bytes) { return static_cast<double>(bytes) * 1e-9; };
  fmt::print("{:<8} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>10.3f} {:>8.3f}\n", name,
             gb(r.dispatch.same_gpu), gb(r.dispatch.same_node), gb(r.dispatch.cross_node),
             gb(r.upper_bound_bytes), r.dispatch_combine_seconds() * 1e3, r.max_skew);
}

void place(const PlaceOptions& o) {
  RoutingTrace trace = read_trace(o.trace_path);
  Topology topology;
  topology.num_nodes = o.num_nodes;
  topology.gpus_per_node = o.gpus_per_node;
  topology.intra_node_gbps = o.intra_node_gbps;
  topology.inter_node_gbps = o.inter_node_gbps;
  for (const TraceLayer& layer : trace.layers) {
    if (layer.source_gpu.empty()) {
      assign_sources_round_robin(trace, topology.num_gpus());
      break;
    }
  }
  if (o.hidden_size < 1)
    fail("--hidden: expected the model's hidden size >= 1; got {}", o.hidden_size);
  ActivationRow row;
  row.hidden_size = o.hidden_size;
  row.bytes_per_value = static_cast<int64_t>(dtype_size(parse_dtype(o.dtype)));

  const int64_t replicas = o.num_replicas > 0 ? o.num_replicas : trace.num_experts;
  ExpertPlacement start;
  if (o.eplb) {
    EplbConfig eplb;
    eplb.num_replicas = replicas;
    eplb.num_nodes = topology.num_nodes;
    eplb.num_gpus = topology.num_gpus();
    const std::vector<int64_t> loads = trace_loads(trace);
    start = rebalance_experts(std::span<const int64_t>(loads), trace.num_layers, trace.num_experts,
                              eplb);
  } else {
    start = contiguous_placement(trace.num_layers, trace.num_experts, replicas, topology.num_gpus(),
                                 topology.num_nodes);
  }
  PlacementSearch search;
  search.load_bound = o.load_bound;
  const PlacementResult result = optimize_placement(trace, start, topology, row, search);

  if (o.json) {
    const nlohmann::json out = {{"trace", o.trace_path},
                                {"num_layers", trace.num_layers},
                                {"num_experts", trace.num_experts},
                                {"num_gpus", topology.num_gpus()},
                                {"num_nodes", topology.num_nodes},
                                {"num_replicas", replicas},
                                {"start", o.eplb ? "eplb" : "contiguous"},
                                {"load_bound", o.load_bound},
                                {"swaps", result.num_swaps},
                                {"before", report_json(result.before)},
                                {"after", report_json(result.after)}};
    fmt::print("{}\n", out.dump(2));
    return;
  }
  fmt::print(
      "moe place: {} layers, {} experts, {} slots on {} nodes x {} GPUs; start {}; load "
      "bound {:.2f} x mean\n\n",
      trace.num_layers, trace.num_experts, replicas, topology.num_nodes, topology.gpus_per_node,
      o.eplb ? "EPLB" : "contiguous", o.load_bound);
  fmt::print("{:<8} {:>12} {:>12} {:>12} {:>12} {:>10} {:>8}\n", "", "same GPU", "same node",
             "cross node", "T*k*H*b", "disp+comb", "max");
  fmt::print("{:<8} {:>12} {:>12} {:>12} {:>12} {:>10} {:>8}\n", "", "GB", "GB", "GB", "GB", "ms",
             "skew");
  print_report("before", result.before);
  print_report("after", result.after);
  fmt::print("\n{} slot swaps; dispatch bytes summed over layers (combine sends the same back)\n",
             result.num_swaps);
}

}  // namespace

void add_place_command(CLI::App& app) {
  auto o = std::make_shared<PlaceOptions>();
  CLI::App* cmd = app.add_subcommand(
      "place",
      "Place experts on GPUs from a routing trace to cut cross-node traffic within a "
      "load bound; report bytes per domain and load skew before and after");
  cmd->add_option("--trace", o->trace_path, "Routing trace (moe trace synth, moe run --trace)")
      ->required();
  cmd->add_option("--nodes", o->num_nodes, "Nodes")->capture_default_str();
  cmd->add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node")->capture_default_str();
  cmd->add_option("--replicas", o->num_replicas, "Physical expert slots (0 = one per expert)")
      ->capture_default_str();
  cmd->add_flag("--eplb", o->eplb, "Start from EPLB's placement for the trace's loads");
  cmd->add_option("--hidden", o->hidden_size, "Hidden size H of a dispatched row")->required();
  cmd->add_option("--dtype", o->dtype, "Dispatched activation dtype")->capture_default_str();
  cmd->add_option("--intra-gbps", o->intra_node_gbps, "Same-node GB/s per GPU and direction")
      ->capture_default_str();
  cmd->add_option("--inter-gbps", o->inter_node_gbps, "Cross-node GB/s per GPU and direction")
      ->capture_default_str();
  cmd->add_option("--bound", o->load_bound, "Largest GPU load allowed, times the mean")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] { place(*o); });
}

}  // namespace moe::cli
