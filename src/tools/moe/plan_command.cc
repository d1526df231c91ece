// `moe plan`: memory, traffic and roofline of a MoE model laid out over devices (DESIGN.md
// layer 6). Options map one to one onto moe::DeploymentSpec and moe::Hardware.
#include <memory>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moe/config.h"
#include "moe/error.h"
#include "moe/hardware.h"
#include "moe/plan.h"
#include "tools/moe/commands.h"
#include "tools/moe/plan_report.h"

namespace moe::cli {

namespace {

// Hardware figures in the units people quote; each replaces the preset's figure when given.
struct HardwareOverrides {
  CLI::Option* memory_gb = nullptr;
  CLI::Option* hbm_tbps = nullptr;
  CLI::Option* mem_gbps = nullptr;
  CLI::Option* tflops = nullptr;
  CLI::Option* gflops = nullptr;
  CLI::Option* fp8_tflops = nullptr;
  CLI::Option* link_gbps = nullptr;
  CLI::Option* net_gbps = nullptr;
  CLI::Option* gpus_per_node = nullptr;
  double memory_gb_value = 0, hbm_tbps_value = 0, mem_gbps_value = 0, tflops_value = 0,
         gflops_value = 0, fp8_tflops_value = 0, link_gbps_value = 0, net_gbps_value = 0;
  int64_t gpus_per_node_value = 0;
};

struct PlanOptions {
  std::string model = std::string(kDefaultPreset);
  std::string hardware = "h100";
  std::string weights = "bf16";
  std::string kv_cache = "bf16";
  std::string dispatch = "bf16";
  DeploymentSpec spec;
  CLI::Option* reserve_gb = nullptr;
  double reserve_gb_value = 0;
  CLI::Option* local_fraction = nullptr;
  double local_fraction_value = 0;
  HardwareOverrides overrides;
  bool json = false;
};

Hardware build_hardware(const PlanOptions& o) {
  const HardwareOverrides& h = o.overrides;
  Hardware hw = hardware_preset(o.hardware);
  if (*h.memory_gb) hw.memory_bytes = static_cast<int64_t>(h.memory_gb_value * 1e9);
  if (*h.hbm_tbps) hw.memory_bytes_per_s = h.hbm_tbps_value * 1e12;
  if (*h.mem_gbps) hw.memory_bytes_per_s = h.mem_gbps_value * 1e9;
  if (*h.tflops) hw.peak_flops_16bit = h.tflops_value * 1e12;
  if (*h.gflops) hw.peak_flops_16bit = h.gflops_value * 1e9;
  if (*h.fp8_tflops) hw.peak_flops_fp8 = h.fp8_tflops_value * 1e12;
  if (*h.link_gbps) hw.link_bytes_per_s = h.link_gbps_value * 1e9;
  if (*h.net_gbps) hw.network_bytes_per_s = h.net_gbps_value * 1e9;
  if (*h.gpus_per_node) hw.devices_per_node = h.gpus_per_node_value;
  // Name the option to give, rather than the field, for a figure no preset holds (the CPU's).
  if (hw.memory_bytes <= 0)
    fail("--hardware {}: give the memory per device with --mem-gb", hw.name);
  if (!(hw.memory_bytes_per_s > 0)) {
    fail("--hardware {}: give the memory bandwidth with --mem-gbps (GB/s) or --hbm-tbps", hw.name);
  }
  if (!(hw.peak_flops_16bit > 0)) {
    fail("--hardware {}: give the peak 16-bit throughput with --gflops or --tflops", hw.name);
  }
  return hw;
}

void run(const PlanOptions& o) {
  const MoeConfig config = resolve_config(o.model);
  const Hardware hardware = build_hardware(o);
  DeploymentSpec spec = o.spec;
  spec.weights = parse_storage_format(o.weights, "--dtype");
  spec.kv_cache = parse_storage_format(o.kv_cache, "--kv-dtype");
  spec.dispatch = parse_storage_format(o.dispatch, "--dispatch-dtype");
  if (*o.reserve_gb) {
    if (!(o.reserve_gb_value >= 0)) fail("--reserve-gb: expected >= 0; got {}", o.reserve_gb_value);
    spec.reserve_bytes = static_cast<int64_t>(o.reserve_gb_value * 1e9);
  }
  if (*o.local_fraction) spec.local_fraction = o.local_fraction_value;
  const Plan plan = plan_deployment(config, hardware, spec);
  if (o.json) {
    fmt::print("{}\n", plan_json(plan).dump(2));
  } else {
    print_plan_table(plan);
  }
}

void add_hardware_options(CLI::App& cmd, HardwareOverrides& h) {
  const std::string group = "Hardware overrides (each replaces the preset's spec-sheet figure)";
  h.memory_gb =
      cmd.add_option("--hbm-gb,--mem-gb", h.memory_gb_value, "Memory per device, GB (1e9 bytes)")
          ->group(group);
  h.hbm_tbps =
      cmd.add_option("--hbm-tbps", h.hbm_tbps_value, "Memory bandwidth, TB/s")->group(group);
  h.mem_gbps = cmd.add_option("--mem-gbps", h.mem_gbps_value, "Memory bandwidth, GB/s (for CPUs)")
                   ->group(group)
                   ->excludes(h.hbm_tbps);
  h.tflops =
      cmd.add_option("--tflops", h.tflops_value, "Peak dense bf16/f16 TFLOP/s")->group(group);
  h.gflops = cmd.add_option("--gflops", h.gflops_value, "Peak dense 16-bit GFLOP/s (for CPUs)")
                 ->group(group)
                 ->excludes(h.tflops);
  h.fp8_tflops = cmd.add_option("--fp8-tflops", h.fp8_tflops_value,
                                "Peak dense fp8 TFLOP/s (0 = no fp8 units)")
                     ->group(group);
  h.link_gbps = cmd.add_option("--link-gbps", h.link_gbps_value,
                               "Link to a device in the same node, GB/s (bytes) per direction")
                    ->group(group);
  h.net_gbps = cmd.add_option("--net-gbps", h.net_gbps_value,
                              "Network to another node, GB/s (bytes) per direction per device; "
                              "400 Gb/s InfiniBand is 50")
                   ->group(group);
  h.gpus_per_node = cmd.add_option("--gpus-per-node", h.gpus_per_node_value,
                                   "Devices per node (8 for the GPU presets)")
                        ->group(group);
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Plan a deployment: weight and KV-cache memory per device, dispatch traffic, flops and the "
      "roofline floor of a prefill and a decode step");
  cmd->add_option("model", o->model, "A preset name or a path to a config.json")
      ->capture_default_str();
  cmd->add_option("--hardware", o->hardware,
                  fmt::format("Device preset: {}", fmt::join(hardware_preset_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--tp", o->spec.tp, "Tensor-parallel size of attention (per DP group)")
      ->capture_default_str();
  cmd->add_option("--dp", o->spec.dp, "Data-parallel groups")->capture_default_str();
  cmd->add_flag("--ep", o->spec.expert_parallel,
                "Expert parallelism: split routed experts over all tp * dp devices (else each "
                "expert is tensor-parallel over them)");
  cmd->add_option("--nodes", o->spec.num_nodes, "Nodes (0 = the fewest that hold tp * dp)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->weights, "Weight format: f32, bf16, f16, fp8, int8, int4")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", o->kv_cache, "KV-cache format")->capture_default_str();
  cmd->add_option("--dispatch-dtype", o->dispatch, "Format of token rows sent to experts")
      ->capture_default_str();
  cmd->add_option("--context", o->spec.context_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--concurrency", o->spec.concurrency, "Sequences in flight, whole deployment")
      ->capture_default_str();
  cmd->add_option("--prefill-tokens", o->spec.prefill_tokens,
                  "Tokens of a prefill step, whole deployment (0 = 8192 per DP group)")
      ->capture_default_str();
  cmd->add_option("--decode-tokens", o->spec.decode_tokens,
                  "Tokens of a decode step, whole deployment (0 = concurrency)")
      ->capture_default_str();
  cmd->add_option("--reserve-fraction", o->spec.reserve_fraction,
                  "Share of device memory kept from weights and KV cache")
      ->capture_default_str();
  o->reserve_gb = cmd->add_option("--reserve-gb", o->reserve_gb_value,
                                  "Memory kept per device, GB (replaces --reserve-fraction)");
  o->local_fraction = cmd->add_option(
      "--local-fraction", o->local_fraction_value,
      "Share of (token, expert) pairs whose expert is on the token's device (default 1/EP)");
  add_hardware_options(*cmd, o->overrides);
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] { run(*o); });
}

}  // namespace moe::cli
