// `moe info`: parameter and byte counts of a preset or config.json.
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/config.h"
#include "moe/params.h"
#include "tools/moe/commands.h"

namespace moe::cli {

namespace {

struct InfoOptions {
  std::string model = std::string(kDefaultPreset);
  bool json = false;
};

std::string billions(int64_t params) { return fmt::format("{:.2f}B", params * 1e-9); }
std::string gigabytes(int64_t bytes) { return fmt::format("{:.2f} GB", bytes * 1e-9); }

void print_table(const MoeConfig& c, const ParamCounts& p) {
  const int64_t moe_layers = c.num_moe_layers();
  fmt::print("{} ({})\n", c.name, c.model_type);
  fmt::print("  layers {} ({} MoE), H={} I={} E={} k={}", c.num_layers, moe_layers,
             c.experts.hidden_size, c.experts.intermediate_size, c.routing.num_experts,
             c.routing.top_k);
  if (c.experts.shared_intermediate_size > 0) {
    fmt::print(" shared I={}", c.experts.shared_intermediate_size);
  }
  fmt::print("\n\n{:<28} {:>16} {:>10} {:>12} {:>12}\n", "parameters", "count", "", "bf16", "fp8");
  const auto row = [](const char* name, int64_t count) {
    fmt::print("{:<28} {:>16} {:>10} {:>12} {:>12}\n", name, count, billions(count),
               gigabytes(param_bytes(count, 16)), gigabytes(param_bytes(count, 8)));
  };
  row("total", p.total);
  row("active per token", p.active_per_token);
  row("routed experts, all layers", p.routed_experts_total);
  row("one routed expert", p.per_expert);
  row("one MoE layer (FFN)", p.moe_layer);
  row("attention, per layer", p.attention_per_layer);
  row("embeddings and head", p.embedding);
  fmt::print("\nrouted experts hold {:.1f}% of all parameters; a token uses {:.1f}% of them\n",
             100.0 * p.expert_share(),
             100.0 * static_cast<double>(p.active_per_token) / static_cast<double>(p.total));
}

nlohmann::json counts_json(const MoeConfig& c, const ParamCounts& p) {
  return {{"model", c.name},
          {"model_type", c.model_type},
          {"num_layers", c.num_layers},
          {"num_moe_layers", c.num_moe_layers()},
          {"total_params", p.total},
          {"active_params", p.active_per_token},
          {"embedding_params", p.embedding},
          {"attention_params_per_layer", p.attention_per_layer},
          {"router_params_per_layer", p.router_per_layer},
          {"params_per_expert", p.per_expert},
          {"routed_expert_params", p.routed_experts_total},
          {"shared_expert_params_per_layer", p.shared_experts_per_layer},
          {"moe_layer_params", p.moe_layer},
          {"dense_layer_params", p.dense_layer},
          {"expert_share", p.expert_share()},
          {"bytes",
           {{"bf16",
             {{"total", param_bytes(p.total, 16)},
              {"active", param_bytes(p.active_per_token, 16)},
              {"per_expert", param_bytes(p.per_expert, 16)}}},
            {"fp8",
             {{"total", param_bytes(p.total, 8)},
              {"active", param_bytes(p.active_per_token, 8)},
              {"per_expert", param_bytes(p.per_expert, 8)}}}}}};
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "info", "Parameter and byte counts (total, active per token, per layer, per expert)");
  cmd->add_option("model", options->model, "A preset name or a path to a config.json")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print one JSON object");
  cmd->callback([options] {
    const MoeConfig config = resolve_config(options->model);
    const ParamCounts counts = count_params(config);
    if (options->json) {
      fmt::print("{}\n", counts_json(config, counts).dump(2));
    } else {
      print_table(config, counts);
    }
  });
}

}  // namespace moe::cli
