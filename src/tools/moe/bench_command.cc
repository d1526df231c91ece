// `moe bench`: the experts of one MoE layer timed over a sweep of token counts, each figure
// printed next to its floor (weight bytes over measured bandwidth, flops over measured peak).
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/backend.h"
#include "moe/config.h"
#include "moe/error.h"
#include "tools/moe/commands.h"

#ifdef MOE_WITH_CUDA
#include "tools/moe/cuda_bench.h"
#endif

namespace moe::cli {
namespace {

struct BenchOptions {
  std::string preset = std::string(kDefaultPreset);
  std::string device = "cuda";
  std::vector<int64_t> tokens = {1, 4, 16, 64, 256, 1024, 4096, 16384};
  int repeats = 20;
  bool sweep = false;
  bool json = false;
  std::string output;  // JSON report written here too
  uint64_t seed = 0;
};

#ifdef MOE_WITH_CUDA
void write_text(const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) fail("--output: cannot open '{}' for writing", path);
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !written) fail("--output: cannot write '{}'", path);
}

void bench_cuda(const BenchOptions& o) {
  const MoeConfig config = resolve_config(o.preset);
  const CudaCeilings ceilings = measure_cuda_ceilings();
  CudaBenchOptions options;
  options.tokens = o.tokens;
  options.repeats = o.repeats;
  options.sweep = o.sweep;
  options.seed = o.seed;
  const std::vector<CudaBenchRow> rows = run_cuda_bench(config, options, ceilings);

  {
    nlohmann::json report = {{"preset", o.preset},
                             {"device", ceilings.device_name},
                             {"copy_bytes_per_s", ceilings.copy_bytes_per_s},
                             {"bf16_flops_per_s", ceilings.bf16_flops_per_s},
                             {"rows", nlohmann::json::array()}};
    for (const CudaBenchRow& r : rows) {
      report["rows"].push_back({{"tokens", r.tokens},
                                {"plan", r.plan},
                                {"default", r.is_default},
                                {"median_us", r.median_us},
                                {"min_us", r.min_us},
                                {"floor_us", r.floor_us},
                                {"align_us", r.align_us},
                                {"gemm1_us", r.gemm1_us},
                                {"gemm2_us", r.gemm2_us},
                                {"sum_us", r.sum_us},
                                {"distinct_experts", r.distinct_experts},
                                {"weight_bytes", r.weight_bytes},
                                {"flops", r.flops},
                                {"workspace_bytes", r.workspace_bytes}});
    }
    if (!o.output.empty()) write_text(o.output, report.dump(2) + "\n");
    if (o.json) {
      std::printf("%s\n", report.dump(2).c_str());
      return;
    }
  }
  fmt::print(
      "moe bench: {} (H {}, I {}, E {}, k {}) bf16 on {}\n"
      "ceilings measured in this run: copy {:.2f} TB/s (read + write), bf16 GEMM {:.0f} TFLOP/s\n"
      "times: median of CUDA-graph replays over 8 rotating routings; stages from one un-captured "
      "call\n\n",
      o.preset, config.experts.hidden_size, config.experts.intermediate_size,
      config.routing.num_experts, config.routing.top_k, ceilings.device_name,
      ceilings.copy_bytes_per_s / 1e12, ceilings.bf16_flops_per_s / 1e12);
  fmt::print("{:>6} {:>10} {:>10} {:>9} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8}\n",
             "tokens", "plan", "us", "floor us", "floor %", "TFLOP/s", "TB/s", "align", "gemm1",
             "gemm2", "sum", "experts", "work MB");
  for (const CudaBenchRow& r : rows) {
    fmt::print(
        "{:>6} {:>10} {:>10.1f} {:>9.1f} {:>7.0f}% {:>8.1f} {:>7.2f} {:>7.1f} {:>7.1f} {:>7.1f} "
        "{:>7.1f} {:>7.1f} {:>8.0f}\n",
        r.tokens, r.plan + (r.is_default ? "*" : " "), r.median_us, r.floor_us,
        100.0 * r.floor_us / r.median_us, r.flops / r.median_us / 1e6,
        r.weight_bytes / r.median_us / 1e6, r.align_us, r.gemm1_us, r.gemm2_us, r.sum_us,
        r.distinct_experts, r.workspace_bytes / 1e6);
  }
  fmt::print(
      "\n* the built-in default plan (tuned tables in configs/cuda take precedence: moe tune); "
      "TB/s counts the distinct experts' weights only\n");
}
#endif

void run(const BenchOptions& o) {
  if (o.device == "cuda") {
#ifdef MOE_WITH_CUDA
    bench_cuda(o);
    return;
#else
    fail("--device cuda: this build has no CUDA backend (configure with MOE_WITH_CUDA=ON)");
#endif
  }
  fail("--device: expected cuda; got '{}'", o.device);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time the experts of one layer over a sweep of token counts, next to the floor");
  cmd->add_option("--preset", options->preset, "Preset name or config.json path")
      ->capture_default_str();
  cmd->add_option("--device", options->device, "Where to run: cuda")->capture_default_str();
  cmd->add_option("--tokens", options->tokens, "Token counts to sweep, comma separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--repeats", options->repeats, "Timed replays per routing set")
      ->capture_default_str();
  cmd->add_flag("--sweep", options->sweep, "Also time every kernel plan that can run each size");
  cmd->add_option("--seed", options->seed, "Seed of weights, inputs and routings")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print a JSON report instead of the table");
  cmd->add_option("--output", options->output, "Also write the JSON report to this file");
  cmd->callback([options] { run(*options); });
}

}  // namespace moe::cli
