// `moe tune`: times every kernel plan of the CUDA experts at each token count (the sweep of
// `moe bench --sweep`), keeps the fastest per count (the built-in default where it is within
// kDefaultTieMargin of the fastest), and writes them as the plan table of this GPU and shape
// (ops/cuda_plan_table.h). Prints, per count, the fastest plan next to the built-in default, so
// the default's cost without tuning stays visible.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "moe/config.h"
#include "moe/error.h"
#include "tools/moe/commands.h"

#ifdef MOE_WITH_CUDA
#include <filesystem>
#include <fstream>

#include "ops/cuda_plan_choice.h"
#include "ops/cuda_plan_table.h"
#include "tools/moe/cuda_bench.h"
#include "tools/moe/plan_finalists.h"
#include "tools/moe/tune_pick.h"
#endif

namespace moe::cli {
namespace {

struct TuneOptions {
  std::string preset = std::string(kDefaultPreset);
  // Dense enough that the closest-M lookup lands near a timed size wherever a call falls: with
  // only powers of four, a call of 640 tokens took the 1024-token plan on an H200, 9-11% slower
  // than the best there (docs/cuda.md, "The tables in the repo").
  std::vector<int64_t> tokens = {1,    2,    4,    8,    16,   24,   32,   48,  64,
                                 96,   128,  192,  256,  384,  512,  640,  768, 896,
                                 1024, 1536, 2048, 3072, 4096, 8192, 16384};
  std::string output = "configs/cuda";
  int repeats = 20;
  uint64_t seed = 0;
  bool json = false;
  bool merge = false;  // keep the existing table's entries at the sizes not tuned now
};

#ifdef MOE_WITH_CUDA
// The bar for running untuned: the built-in default at most 10% slower than the tuned
// plan at every size.
constexpr double kDefaultSlowdownBound = 1.10;

// A plan's figure: its final-round median where it was in one, else its sweep median.
double figure_us(const CudaBenchRow& row) {
  return row.final_us > 0 ? row.final_us : row.median_us;
}

// A plan of the size's final round ranks before every plan that was not in it (the round exists
// only when two or more plans came within the margin), then the lower figure first.
bool ranks_before(const CudaBenchRow& a, const CudaBenchRow& b) {
  if ((a.final_us > 0) != (b.final_us > 0)) return a.final_us > 0;
  return figure_us(a) < figure_us(b);
}

// The fastest and the built-in plan at one token count. The default is compared with the best in
// the same round: both final, or (the default left out of the final round) both from the sweep.
struct TunedSize {
  const CudaBenchRow* best = nullptr;
  const CudaBenchRow* built_in = nullptr;
  double slowdown() const {
    return built_in->final_us > 0 ? built_in->final_us / best->final_us
                                  : built_in->median_us / best->median_us;
  }
  // The plan the table takes: the default unless the best beats it by more than the tie margin.
  const CudaBenchRow& written() const {
    return table_keeps_default(slowdown(), kDefaultTieMargin) ? *built_in : *best;
  }
  bool default_kept_over_faster() const { return &written() == built_in && best != built_in; }
};

std::vector<TunedSize> pick_best(const std::vector<CudaBenchRow>& rows,
                                 const std::vector<int64_t>& tokens) {
  std::vector<TunedSize> sizes;
  for (const int64_t count : tokens) {
    TunedSize size;
    for (const CudaBenchRow& row : rows) {
      if (row.tokens != count || !row.cannot_run.empty()) continue;
      if (size.best == nullptr || ranks_before(row, *size.best)) size.best = &row;
      if (row.is_default) size.built_in = &row;
    }
    if (size.best == nullptr || size.built_in == nullptr) {
      fail("tune: the sweep timed no plan at {} tokens (internal error)", count);
    }
    sizes.push_back(size);
  }
  return sizes;
}

void write_table(const std::filesystem::path& path, const std::string& text) {
  std::error_code error;
  std::filesystem::create_directories(path.parent_path(), error);
  if (error) {
    fail("--output: cannot create folder '{}': {}", path.parent_path().string(), error.message());
  }
  std::ofstream file(path, std::ios::binary);
  file << text;
  file.close();
  if (!file) fail("--output: cannot write '{}'", path.string());
}

// The table already at `path` (--merge), read before any timing so that a file that does not
// parse fails the tune at once; none there is an empty table.
cuda_plans::PlanTable existing_table(const std::filesystem::path& path) {
  std::error_code error;
  const bool there = std::filesystem::exists(path, error);
  if (error) fail("--merge: cannot look for '{}': {}", path.string(), error.message());
  return there ? cuda_plans::read_table_file(path) : cuda_plans::PlanTable{};
}

void tune_cuda(const TuneOptions& o) {
  const MoeConfig config = resolve_config(o.preset);
  const int64_t E = config.routing.num_experts, k = config.routing.top_k;
  const int64_t H = config.experts.hidden_size, I = config.experts.intermediate_size;
  const CudaCeilings ceilings = measure_cuda_ceilings();
  const std::filesystem::path path = std::filesystem::path(o.output) /
                                     cuda_plans::table_file_name(ceilings.device_name, E, H, I, k);
  cuda_plans::PlanTable table = o.merge ? existing_table(path) : cuda_plans::PlanTable{};
  const size_t kept = std::count_if(table.begin(), table.end(), [&](const auto& entry) {
    return std::find(o.tokens.begin(), o.tokens.end(), entry.first) == o.tokens.end();
  });
  CudaBenchOptions options;
  options.tokens = o.tokens;
  options.repeats = o.repeats;
  options.sweep = true;
  options.seed = o.seed;
  options.finalist_margin = kFinalistMargin;
  options.progress_label = "moe tune";
  const std::vector<CudaBenchRow> rows = run_cuda_bench(config, options, ceilings);
  const std::vector<TunedSize> sizes = pick_best(rows, o.tokens);

  for (const TunedSize& size : sizes) {
    table[size.best->tokens] = cuda_plans::parse_plan_name(size.written().plan);
  }
  write_table(path, cuda_plans::format_table(table));

  std::vector<int64_t> slow_sizes;
  for (const TunedSize& size : sizes) {
    if (size.slowdown() > kDefaultSlowdownBound) slow_sizes.push_back(size.best->tokens);
  }
  if (o.json) {
    nlohmann::json report = {{"preset", o.preset},
                             {"device", ceilings.device_name},
                             {"file", path.string()},
                             {"entries_kept", kept},
                             {"default_within_bound", slow_sizes.empty()},
                             {"rows", nlohmann::json::array()}};
    for (const TunedSize& size : sizes) {
      report["rows"].push_back({{"tokens", size.best->tokens},
                                {"table_plan", size.written().plan},
                                {"best_plan", size.best->plan},
                                {"best_us", figure_us(*size.best)},
                                {"default_plan", size.built_in->plan},
                                {"default_us", figure_us(*size.built_in)},
                                {"best_sweep_us", size.best->median_us},
                                {"default_sweep_us", size.built_in->median_us},
                                {"default_over_best", size.slowdown()},
                                {"floor_us", size.best->floor_us}});
    }
    std::printf("%s\n", report.dump(2).c_str());
    return;
  }

  fmt::print(
      "moe tune: {} (E {}, H {}, I {}, k {}) bf16 on {}\n"
      "every plan timed as CUDA-graph replays over 8 rotating routings, the plans of a size in "
      "turns; then those within {:.0f}% of the best timed again, alone in turns; best = lowest "
      "median of that final round (us: final round where the plan was in it, else the first); "
      "the table takes the default where it is within {:.0f}% of the best\n\n",
      o.preset, E, H, I, k, ceilings.device_name, 100.0 * kFinalistMargin,
      100.0 * kDefaultTieMargin);
  fmt::print("{:>6} {:>10} {:>9} {:>10} {:>9} {:>13} {:>9}\n", "tokens", "best", "us", "default",
             "us", "default/best", "floor us");
  for (const TunedSize& size : sizes) {
    fmt::print("{:>6} {:>10} {:>9.1f} {:>10} {:>9.1f} {:>13.3f} {:>9.1f}{}{}\n", size.best->tokens,
               size.best->plan, figure_us(*size.best), size.built_in->plan,
               figure_us(*size.built_in), size.slowdown(), size.best->floor_us,
               size.slowdown() > kDefaultSlowdownBound ? "  > bound" : "",
               size.default_kept_over_faster() ? "  default kept" : "");
  }
  fmt::print("\nwrote {} ({} token counts{})\n", path.string(), table.size(),
             o.merge ? fmt::format(", {} of them kept from the table that was there", kept) : "");
  if (slow_sizes.empty()) {
    fmt::print("the built-in default is within {:.0f}% of the tuned plan at every size\n",
               100.0 * (kDefaultSlowdownBound - 1.0));
  } else {
    fmt::print("the built-in default is more than {:.0f}% slower than the tuned plan at {}\n",
               100.0 * (kDefaultSlowdownBound - 1.0), fmt::join(slow_sizes, ", "));
  }
  fmt::print(
      "use it now with {}={}, or rebuild to compile the tables of configs/cuda into the library\n",
      cuda_plans::kTuningDirVariable, o.output);
}
#endif

void run(TuneOptions o) {
#ifdef MOE_WITH_CUDA
  if (o.tokens.empty()) fail("--tokens: expected at least one token count; got none");
  for (const int64_t count : o.tokens) {
    if (count < 1) fail("--tokens: expected positive token counts; got {}", count);
  }
  if (o.repeats < 1) fail("--repeats: expected at least 1; got {}", o.repeats);
  std::sort(o.tokens.begin(), o.tokens.end());
  o.tokens.erase(std::unique(o.tokens.begin(), o.tokens.end()), o.tokens.end());
  tune_cuda(o);
#else
  fail(
      "tune: this build has no CUDA backend (configure with MOE_WITH_CUDA=ON on a machine with "
      "nvcc), and tuning picks CUDA kernels");
#endif
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto options = std::make_shared<TuneOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Time every CUDA kernel plan per token count and write the fastest as this GPU's plan "
      "table");
  cmd->footer(
      "Writes <output>/E=<E>,H=<H>,I=<I>,k=<k>,device_name=<GPU>.json: for each token count M, the "
      "fastest grouped-GEMM kernel and block_m (every plan timed in turns, then those within 10% "
      "of the best timed again, alone in turns, and the fastest of that round kept, or the "
      "built-in default where it is within 1% of that). fused_experts on that GPU and shape then "
      "runs the plan of the closest M. Tables in configs/cuda are compiled into the library at the "
      "next build; MOE_CUDA_TUNING_DIR=<folder> makes a folder's tables take effect without one. "
      "Prints, per M, the fastest and the built-in default plan with their times and the "
      "default/best ratio (the default should stay within 10%). Needs a CUDA GPU.");
  cmd->add_option("--preset", options->preset, "Preset name or config.json path")
      ->capture_default_str();
  cmd->add_option("--tokens", options->tokens, "Token counts to tune, comma separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--output", options->output, "Folder the table is written to")
      ->capture_default_str();
  cmd->add_option("--repeats", options->repeats, "Timed replays per routing set")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed of weights, inputs and routings")
      ->capture_default_str();
  cmd->add_flag("--json", options->json, "Print a JSON report instead of the table");
  cmd->add_flag("--merge", options->merge,
                "Keep the entries of the table already in --output at the token counts not tuned "
                "now (a tune in several runs, or one more size); without it the file is replaced");
  cmd->callback([options] { run(*options); });
}

}  // namespace moe::cli
