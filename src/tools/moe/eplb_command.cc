// `moe eplb`: DeepSeek-style expert-parallel load balancing from a routing trace or a loads file.
// Prints each GPU's load before (contiguous slots) and after EPLB, and writes the placement as
// JSON (phy2log, log2phy, logcnt per layer).
#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/eplb.h"
#include "moe/error.h"
#include "moe/trace.h"
#include "tools/moe/commands.h"

namespace moe::cli {

namespace {

struct EplbOptions {
  std::string trace_path;
  std::string loads_path;
  std::string out_path;
  EplbConfig config;
  bool json = false;
};

struct Loads {
  int64_t num_layers = 0;
  int64_t num_experts = 0;
  std::vector<double> values;  // [num_layers, num_experts]
};

Loads loads_from_trace(const std::string& path) {
  const RoutingTrace trace = read_trace(path);
  Loads loads{trace.num_layers, trace.num_experts, {}};
  loads.values.assign(static_cast<size_t>(trace.num_layers * trace.num_experts), 0.0);
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    for (int32_t e : trace.layers[static_cast<size_t>(l)].topk_ids) {
      loads.values[static_cast<size_t>(l * trace.num_experts + e)] += 1;
    }
  }
  return loads;
}

Loads loads_from_json(const std::string& path) {
  std::ifstream file(path);
  if (!file) fail("--loads: cannot open '{}'", path);
  nlohmann::json json;
  try {
    file >> json;
  } catch (const nlohmann::json::exception& e) {
    fail("--loads: '{}' is not valid JSON: {}", path, e.what());
  }
  if (!json.is_object() || !json.contains("loads") || !json["loads"].is_array() ||
      json["loads"].empty()) {
    fail("--loads: '{}' must hold {{\"loads\": [[...], ...]}}, one row per layer", path);
  }
  Loads loads;
  for (const nlohmann::json& row : json["loads"]) {
    if (!row.is_array() || row.empty()) fail("--loads: '{}': every layer must be a list", path);
    if (loads.num_experts == 0) loads.num_experts = static_cast<int64_t>(row.size());
    if (static_cast<int64_t>(row.size()) != loads.num_experts) {
      fail("--loads: '{}': layer {} has {} experts, layer 0 has {}", path, loads.num_layers,
           row.size(), loads.num_experts);
    }
    for (const nlohmann::json& value : row) {
      if (!value.is_number())
        fail("--loads: '{}': loads must be numbers; got {}", path, value.dump());
      loads.values.push_back(value.get<double>());
    }
    ++loads.num_layers;
  }
  return loads;
}

nlohmann::json placement_json(const ExpertPlacement& p) {
  nlohmann::json phy2log = nlohmann::json::array(), log2phy = nlohmann::json::array(),
                 logcnt = nlohmann::json::array();
  for (int64_t l = 0; l < p.num_layers; ++l) {
    const auto row = [&](const std::vector<int32_t>& table, int64_t width) {
      return std::vector<int32_t>(table.begin() + l * width, table.begin() + (l + 1) * width);
    };
    phy2log.push_back(row(p.phy2log, p.num_replicas));
    logcnt.push_back(row(p.logcnt, p.num_logical_experts));
    nlohmann::json experts = nlohmann::json::array();
    for (int64_t e = 0; e < p.num_logical_experts; ++e) {
      const auto first = p.log2phy.begin() + (l * p.num_logical_experts + e) * p.max_replicas;
      experts.push_back(std::vector<int32_t>(first, first + p.max_replicas));
    }
    log2phy.push_back(experts);
  }
  return {{"num_layers", p.num_layers},
          {"num_logical_experts", p.num_logical_experts},
          {"num_replicas", p.num_replicas},
          {"num_gpus", p.num_gpus},
          {"num_nodes", p.num_nodes},
          {"phy2log", phy2log},
          {"log2phy", log2phy},
          {"logcnt", logcnt}};
}

struct Balance {
  double worst_max_over_mean = 0;  // the worst layer's max / mean GPU load
  double mean_balancedness = 0;    // mean over layers of mean / max
};

Balance balance_of(const GpuLoad& load) {
  Balance b;
  for (int64_t l = 0; l < load.num_layers; ++l) {
    const double max = load.max[static_cast<size_t>(l)], mean = load.mean[static_cast<size_t>(l)];
    b.worst_max_over_mean = std::max(b.worst_max_over_mean, mean > 0 ? max / mean : 1.0);
    b.mean_balancedness += (max > 0 ? mean / max : 1.0) / static_cast<double>(load.num_layers);
  }
  return b;
}

void run_eplb(const EplbOptions& o) {
  if (o.trace_path.empty() == o.loads_path.empty()) {
    fail("moe eplb: give exactly one of --trace FILE and --loads FILE.json");
  }
  const Loads loads =
      o.trace_path.empty() ? loads_from_json(o.loads_path) : loads_from_trace(o.trace_path);
  const std::span<const double> weight(loads.values);
  const ExpertPlacement before =
      contiguous_placement(loads.num_layers, loads.num_experts, o.config.num_replicas,
                           o.config.num_gpus, o.config.num_nodes);
  const ExpertPlacement after =
      rebalance_experts(weight, loads.num_layers, loads.num_experts, o.config);
  const Balance b = balance_of(gpu_load(before, weight));
  const Balance a = balance_of(gpu_load(after, weight));

  const nlohmann::json placement = placement_json(after);
  if (!o.out_path.empty()) {
    std::ofstream out(o.out_path);
    out << placement.dump() << "\n";
    if (!out) fail("--out: cannot write '{}'", o.out_path);
  }
  if (o.json) {
    nlohmann::json result = placement;
    result["policy"] = policy_name(eplb_policy(o.config));
    result["before"] = {{"max_over_mean", b.worst_max_over_mean},
                        {"balancedness", b.mean_balancedness}};
    result["after"] = {{"max_over_mean", a.worst_max_over_mean},
                       {"balancedness", a.mean_balancedness}};
    fmt::print("{}\n", result.dump());
    return;
  }
  fmt::print("moe eplb: {} layers, {} experts -> {} slots on {} GPUs in {} nodes, {} policy\n\n",
             loads.num_layers, loads.num_experts, o.config.num_replicas, o.config.num_gpus,
             o.config.num_nodes, policy_name(eplb_policy(o.config)));
  fmt::print("{:<22} {:>22} {:>26}\n", "", "worst layer max/mean", "balancedness (mean/max)");
  fmt::print("{:<22} {:>22.3f} {:>26.3f}\n", "contiguous slots", b.worst_max_over_mean,
             b.mean_balancedness);
  fmt::print("{:<22} {:>22.3f} {:>26.3f}\n", "EPLB", a.worst_max_over_mean, a.mean_balancedness);
  if (!o.out_path.empty()) fmt::print("\nplacement written to {}\n", o.out_path);
}

}  // namespace

void add_eplb_command(CLI::App& app) {
  auto o = std::make_shared<EplbOptions>();
  o->config.num_replicas = 0;
  CLI::App* cmd = app.add_subcommand(
      "eplb",
      "Expert-parallel load balancing: replicate hot experts and pack the replicas onto "
      "GPUs (DeepSeek's EPLB); prints per-GPU load before and after");
  cmd->add_option("--trace", o->trace_path, "Routing trace to take the loads from");
  cmd->add_option("--loads", o->loads_path, "JSON file {\"loads\": [[...], ...]}, a row per layer");
  cmd->add_option("--slots", o->config.num_replicas, "Physical expert slots over all GPUs")
      ->required();
  cmd->add_option("--groups", o->config.num_groups, "Expert groups")->capture_default_str();
  cmd->add_option("--nodes", o->config.num_nodes, "Nodes")->capture_default_str();
  cmd->add_option("--gpus", o->config.num_gpus, "GPUs over all nodes")->required();
  cmd->add_option("--out", o->out_path, "Write the placement (phy2log, log2phy, logcnt) as JSON");
  cmd->add_flag("--json", o->json, "Print the placement and the load summary as JSON");
  cmd->callback([o] { run_eplb(*o); });
}

}  // namespace moe::cli
