// `moe bench`: the experts of one layer of a preset, swept over token counts. On the CPU
// (default) also over weight dtypes and instruction-set paths; with --device cuda over the GPU
// kernel plans (cuda_bench.h). Each figure is the median time of the experts half of the layer
// (align, gemm1 + act, gemm2 + weight, sum; routing excluded) over calls that each get a new
// top-k routing (uniform random, or balanced with --routing) and the next of several copies of
// the layer's weights, so weights stream from memory as in a model of many layers. Next to it: the
// floor from this run's own streaming-read bandwidth and the path's own peak, and the fraction of
// the floor reached. With --ep, one layer end to end over MPI ranks (CPU, or one GPU each with
// --device cuda) on a routing trace instead (ep_bench.h).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "tools/moe/commands.h"
#include "tools/moe/ep_bench.h"
#include "tools/moe/ep_options.h"
#include "tools/moe/experts_sweep.h"

#ifdef MOE_WITH_CUDA
#include "tools/moe/cuda_bench.h"
#endif

namespace moe::cli {

namespace {

struct BenchOptions {
  std::string preset = std::string(kDefaultPreset);
  std::string config_path;
  std::vector<int64_t> tokens = {1, 4, 16, 64, 256, 1024, 4096};
  std::vector<std::string> dtypes = {"bf16"};
  std::vector<std::string> isas;  // empty: every path this machine supports
  int threads = 0;
  int copies = 4;
  int repeats = 5;
  double budget_s = 20;
  double max_call_s = 0;  // > 0: skip a path's remaining sizes once a call took longer
  int64_t block_m = 0;
  int64_t bandwidth_mb = 1024;
  uint64_t seed = 0;
  std::string routing = "uniform";  // or "balanced" (experts_sweep.h)
  bool json = false;
  bool csv = false;
  bool interleave = false;
  // --device cuda
  std::string device = "cpu";
  bool tokens_given = false;
  bool repeats_given = false;
  bool sweep = false;
  bool timeline = false;
  bool final_round = false;
  std::vector<std::string> plans;
  std::string output;
  // --ep
  EpSettings ep;
  std::string trace_path;
  int64_t trace_layer = 0;
  double zipf = 1.0;
  int64_t steps = 4;
};

// The options of the GPU experts' sweep alone, refused by the CPU sweep and by --ep.
void refuse_cuda_sweep_options(const BenchOptions& o) {
  if (o.sweep || o.final_round || o.timeline || !o.plans.empty() || !o.output.empty()) {
    fail("--sweep, --final-round, --timeline, --plans and --output belong to --device cuda");
  }
}

// The --ep mode: one layer end to end over MPI ranks, CPU or GPU, on a routing trace (ep_bench.h).
// What neither device takes is refused here, before any MPI work; what one device does not take,
// by that device's bench.
void bench_ep_command(const BenchOptions& o) {
  if (o.csv) fail("--csv: moe bench --ep prints a table or --json");
  refuse_cuda_sweep_options(o);
  if (o.routing != "uniform") {
    fail("--routing: --ep routes by a trace (--trace, or the synthetic one of --zipf); got {}",
         o.routing);
  }
  if (o.dtypes.size() != 1) {
    fail("--dtypes: expected one dtype with --ep; got {}", o.dtypes.size());
  }
  if (o.isas.size() > 1) fail("--isa: expected at most one path with --ep; got {}", o.isas.size());
  if (!o.trace_path.empty() && o.tokens_given) {
    fail("--tokens: with --trace the tokens of each step come from the trace '{}'", o.trace_path);
  }
  EpBenchOptions ep;
  ep.preset = o.preset;
  ep.config_path = o.config_path;
  ep.dtype = o.dtypes.front();
  ep.tokens = o.tokens_given ? o.tokens : std::vector<int64_t>{16, 128};
  ep.threads = o.threads;
  ep.seed = o.seed;
  ep.repeats = o.repeats;
  ep.block_m = o.block_m;
  ep.cpu_isa = o.isas.empty() ? CpuIsa::kAuto : parse_cpu_isa(o.isas.front());
  ep.json = o.json;
  ep.trace_path = o.trace_path;
  ep.trace_layer = o.trace_layer;
  ep.zipf = o.zipf;
  ep.steps = o.steps;
  ep.ep = o.ep;
  if (o.device == "cuda") {
    bench_ep_cuda(ep);
  } else {
    bench_ep(ep);
  }
}

// The GPU sweep, with its own defaults where the CPU's were not overridden: tokens up to 16384
// and 20 replays per routing set.
void bench_cuda(const BenchOptions& o) {
#ifdef MOE_WITH_CUDA
  if (o.csv) fail("--csv: the cuda benchmark prints a table or --json");
  CudaBenchCommand command;
  command.preset = o.config_path.empty() ? o.preset : o.config_path;
  command.tokens =
      o.tokens_given ? o.tokens : std::vector<int64_t>{1, 4, 16, 64, 256, 1024, 4096, 16384};
  if (o.repeats_given) command.repeats = o.repeats;
  command.sweep = o.sweep;
  command.plans = o.plans;
  command.json = o.json;
  command.output = o.output;
  command.seed = o.seed;
  command.balanced = o.routing == "balanced";
  command.timeline = o.timeline;
  command.final_round = o.final_round;
  run_cuda_bench_command(command);
#else
  fail("--device cuda: this build has no CUDA backend (configure with MOE_WITH_CUDA=ON)");
#endif
}

struct Result {
  std::string dtype;
  std::string isa;
  double peak_tflops = 0;
  SweepPoint point;
  double ratio_to_first = 0;  // --interleave: median per-round time over the first path's; else 0
};

std::vector<CpuIsa> chosen_paths(const std::vector<std::string>& names) {
  if (names.empty()) return supported_cpu_isas();
  std::vector<CpuIsa> paths;
  for (const std::string& name : names) {
    const CpuIsa isa = parse_cpu_isa(name);
    if (isa == CpuIsa::kAuto) {
      paths.push_back(resolve_cpu_isa());
    } else {
      // Checked before any weight is built: the error names what this machine lacks.
      paths.push_back(resolve_cpu_isa(isa));
    }
  }
  return paths;
}

void print_header(bool interleave) {
  fmt::print(
      "{:>6} {:>10} {:>6} | {:>10} {:>9} {:>7} {:>5} | {:>8} {:>8} | {:>7} {:>16} | {:>3}{}\n",
      "dtype", "isa", "tokens", "ms/layer", "floor_ms", "floor", "bound", "GB/s", "TFLOP/s",
      "experts", "rows min/mean/max", "n", interleave ? " | vs first" : "");
}

void print_row(const Result& r) {
  const SweepPoint& p = r.point;
  fmt::print(
      "{:>6} {:>10} {:>6} | {:>10.3f} {:>9.3f} {:>6.0f}% {:>5} | {:>8.1f} {:>8.3f} | {:>7} "
      "{:>16} | {:>3}{}\n",
      r.dtype, r.isa, p.tokens, p.ms, p.floor_ms, 100 * p.fraction(),
      p.bandwidth_bound ? "bytes" : "flops", p.bytes / (p.ms * 1e-3) * 1e-9,
      p.flops / (p.ms * 1e-3) * 1e-12, p.experts_touched,
      fmt::format("{}/{:.1f}/{}", p.rows_min, p.rows_mean, p.rows_max), p.repeats,
      r.ratio_to_first > 0 ? fmt::format(" | {:>8.3f}", r.ratio_to_first) : "");
}

void print_csv(const std::vector<Result>& results, double bandwidth, int threads) {
  fmt::print(
      "dtype,isa,threads,tokens,ms,floor_ms,floor_fraction,bound,bandwidth_gb_s,peak_tflops,"
      "gb_per_s,tflops,experts_touched,rows_min,rows_mean,rows_max,repeats,ratio_to_first\n");
  for (const Result& r : results) {
    const SweepPoint& p = r.point;
    fmt::print(
        "{},{},{},{},{:.4f},{:.4f},{:.4f},{},{:.2f},{:.4f},{:.2f},{:.4f},{},{},{:.2f},{},{},{}\n",
        r.dtype, r.isa, threads, p.tokens, p.ms, p.floor_ms, p.fraction(),
        p.bandwidth_bound ? "bytes" : "flops", bandwidth, r.peak_tflops,
        p.bytes / (p.ms * 1e-3) * 1e-9, p.flops / (p.ms * 1e-3) * 1e-12, p.experts_touched,
        p.rows_min, p.rows_mean, p.rows_max, p.repeats,
        r.ratio_to_first > 0 ? fmt::format("{:.4f}", r.ratio_to_first) : "");
  }
}

nlohmann::json results_json(const MoeConfig& config, const std::vector<Result>& results,
                            double bandwidth, int threads, const BenchOptions& o) {
  nlohmann::json points = nlohmann::json::array();
  for (const Result& r : results) {
    const SweepPoint& p = r.point;
    points.push_back(
        {{"dtype", r.dtype},
         {"isa", r.isa},
         {"peak_tflops", r.peak_tflops},
         {"tokens", p.tokens},
         {"ms", p.ms},
         {"floor_ms", p.floor_ms},
         {"floor_fraction", p.fraction()},
         {"bound", p.bandwidth_bound ? "bytes" : "flops"},
         {"bytes", p.bytes},
         {"flops", p.flops},
         {"experts_touched", p.experts_touched},
         {"rows_per_expert", {{"min", p.rows_min}, {"mean", p.rows_mean}, {"max", p.rows_max}}},
         {"repeats", p.repeats},
         {"ratio_to_first",
          r.ratio_to_first > 0 ? nlohmann::json(r.ratio_to_first) : nlohmann::json()}});
  }
  return {{"model", config.name},
          {"hidden_size", config.experts.hidden_size},
          {"intermediate_size", config.experts.intermediate_size},
          {"num_experts", config.routing.num_experts},
          {"top_k", config.routing.top_k},
          {"threads", threads},
          {"copies", o.copies},
          {"routing", o.routing},
          {"cpu_features", cpu_feature_names()},
          {"bandwidth_gb_s", bandwidth},
          {"results", points}};
}

void bench(const BenchOptions& o) {
  if (o.interleave && (o.ep.enabled || o.device == "cuda")) {
    fail("--interleave: times CPU paths in turn; not with --ep or --device cuda");
  }
  if (o.ep.enabled) return bench_ep_command(o);
  if (o.device == "cuda") return bench_cuda(o);
  refuse_cuda_sweep_options(o);
  const MoeConfig config =
      o.config_path.empty() ? preset_config(o.preset) : load_hf_config(o.config_path);
  if (o.threads < 0) fail("--threads: expected >= 0 (0 = all cores); got {}", o.threads);
  if (o.copies < 1) fail("--copies: expected >= 1; got {}", o.copies);
  if (o.repeats < 1) fail("--repeats: expected >= 1; got {}", o.repeats);
  if (o.bandwidth_mb < 1) fail("--bandwidth-mb: expected >= 1; got {}", o.bandwidth_mb);
  for (int64_t tokens : o.tokens) {
    if (tokens < 0) fail("--tokens: expected counts >= 0; got {}", tokens);
  }
  std::vector<DType> dtypes;
  for (const std::string& name : o.dtypes) {
    const DType dtype = parse_dtype(name);
    if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
      fail("--dtypes: expected f32, bf16 or f16; got {}", name);
    }
    dtypes.push_back(dtype);
  }
  const std::vector<CpuIsa> paths = chosen_paths(o.isas);
  if (o.interleave && paths.size() < 2) {
    fail("--interleave: expected at least two paths to time in turn (--isa a,b); got {}",
         paths.size());
  }
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  omp_set_num_threads(threads);
  const bool table = !o.json && !o.csv;

  const double bandwidth = measure_read_bandwidth(threads, o.bandwidth_mb << 20, 5);
  if (table) {
    fmt::print("moe bench: {} experts (H={} I={} E={} k={}), {} threads, {} weight copies\n",
               config.name, config.experts.hidden_size, config.experts.intermediate_size,
               config.routing.num_experts, config.routing.top_k, threads, o.copies);
    fmt::print("  cpu      {}\n", cpu_feature_names());
    fmt::print("  memory   {:.1f} GB/s streaming read ({} MiB, {} threads, best of 5)\n", bandwidth,
               o.bandwidth_mb, threads);
  }

  // Paths timed together: all of them call by call with --interleave, else one at a time.
  std::vector<std::vector<CpuIsa>> groups;
  if (o.interleave) {
    groups.push_back(paths);
  } else {
    for (CpuIsa isa : paths) groups.push_back({isa});
  }
  std::vector<Result> results;
  for (DType dtype : dtypes) {
    LayerWeights weights = synthetic_layer_weights(config, dtype, o.seed);
    for (const std::vector<CpuIsa>& group : groups) {
      std::vector<std::vector<MoeLayer>> copies(group.size());
      std::vector<double> peaks;
      for (size_t v = 0; v < group.size(); ++v) {
        peaks.push_back(measure_peak_flops(group[v], dtype, threads));
        for (int c = 0; c < o.copies; ++c) {
          copies[v].emplace_back(config, weights,
                                 LayerOptions{Backend::kCpu, threads, o.block_m, group[v]});
        }
        if (table) {
          fmt::print("{}{} weights, {} path: peak {:.3f} TFLOP/s on {} threads\n",
                     v == 0 ? "\n" : "", dtype_name(dtype), cpu_isa_name(group[v]),
                     peaks.back() * 1e-12, threads);
        }
      }
      if (table) print_header(o.interleave);
      std::vector<std::vector<MoeLayer>*> variants;
      for (std::vector<MoeLayer>& c : copies) variants.push_back(&c);
      double slowest_ms = 0;
      for (int64_t tokens : o.tokens) {
        if (o.max_call_s > 0 && slowest_ms > o.max_call_s * 1e3) {
          if (table) {
            fmt::print("{:>6} {:>10} {:>6} | skipped: an earlier batch took {:.1f} s per call\n",
                       dtype_name(dtype), cpu_isa_name(group.front()), tokens, slowest_ms * 1e-3);
          }
          continue;
        }
        SweepSettings s;
        s.tokens = tokens;
        s.repeats = o.repeats;
        s.budget_s = o.budget_s;
        s.seed = o.seed + static_cast<uint64_t>(tokens) * 7919;
        s.balanced = o.routing == "balanced";
        s.hidden_dtype = dtype;
        s.bandwidth_gb_s = bandwidth;
        const std::vector<InterleavedPoint> points = measure_interleaved(variants, peaks, s);
        for (size_t v = 0; v < group.size(); ++v) {
          Result r{std::string(dtype_name(dtype)), std::string(cpu_isa_name(group[v])),
                   peaks[v] * 1e-12, points[v].point,
                   o.interleave ? points[v].ratio_to_first : 0.0};
          if (table) print_row(r);
          slowest_ms = std::max(slowest_ms, r.point.ms);
          results.push_back(std::move(r));
        }
      }
    }
  }
  if (o.json) fmt::print("{}\n", results_json(config, results, bandwidth, threads, o).dump(2));
  if (o.csv) print_csv(results, bandwidth, threads);
  if (table) {
    fmt::print(
        "\nms/layer: median of the experts half (align, gemm1+act, gemm2+weight, sum; routing "
        "excluded),\n  a new {} top-{} routing and the next weight copy on every call. "
        "floor = max(bytes of the\n  distinct experts touched / bandwidth, flops / peak of the "
        "path), both measured above.\n",
        o.routing, config.routing.top_k);
  }
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time the experts of one layer over token counts (CPU: weight dtypes and instruction-set "
      "paths; CUDA: kernel plans), next to the floor from this machine's measured bandwidth and "
      "peak; with --ep, one layer end to end over MPI ranks (CPU, or one GPU each with --device "
      "cuda) on a routing trace");
  cmd->add_option("--preset", options->preset, "Built-in model preset")
      ->capture_default_str()
      ->check(CLI::IsMember(preset_names()));
  cmd->add_option("--config", options->config_path,
                  "A Hugging Face config.json to take the layer's shape from (overrides --preset)");
  CLI::Option* tokens = cmd->add_option("--tokens", options->tokens,
                                        "Batch sizes, comma separated (--ep: tokens per rank "
                                        "and step, default 16,128)")
                            ->delimiter(',')
                            ->capture_default_str();
  cmd->add_option("--dtypes", options->dtypes, "Weight (and hidden) dtypes: f32, bf16, f16")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--isa", options->isas,
                  "Paths to run (plain, avx2, avx512, avx512bf16, amx, auto); default: every path "
                  "this machine supports")
      ->delimiter(',');
  cmd->add_option("--threads", options->threads, "Worker threads (0 = all cores)")
      ->capture_default_str();
  cmd->add_option("--copies", options->copies,
                  "Copies of the layer's weights called in turn, so weights come from memory")
      ->capture_default_str();
  CLI::Option* repeats =
      cmd->add_option("--repeats", options->repeats,
                      "Timed calls per point (cuda: replays per routing set; --ep: passes over "
                      "the trace's steps); the median is reported")
          ->capture_default_str();
  cmd->add_option("--budget", options->budget_s,
                  "Seconds per point after which no further call starts (at least one runs)")
      ->capture_default_str();
  cmd->add_option("--max-call-s", options->max_call_s,
                  "Skip a path's remaining (larger) token counts once one call took longer than "
                  "this many seconds (0 = never)")
      ->capture_default_str();
  cmd->add_option("--block-m", options->block_m,
                  "Rows of one expert per pass over its weights (0 = the backend's choice)")
      ->capture_default_str();
  cmd->add_option("--bandwidth-mb", options->bandwidth_mb,
                  "MiB read by the bandwidth measurement (well above the last-level cache)")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed of the weights, inputs and routings")
      ->capture_default_str();
  cmd->add_option("--routing", options->routing,
                  "uniform: k distinct random experts per token; balanced: pair p to expert "
                  "(first + p) mod E, every expert the same number of pairs (no padding spread)")
      ->capture_default_str()
      ->check(CLI::IsMember({"uniform", "balanced"}));
  CLI::Option* json = cmd->add_flag("--json", options->json, "Print one JSON object");
  cmd->add_flag("--csv", options->csv, "Print CSV, one line per point")->excludes(json);
  cmd->add_flag("--interleave", options->interleave,
                "CPU: time the --isa paths call by call in turn (one routing per round for all, "
                "the order rotated each round) and print each one's median per-round time over "
                "the first path's: comparisons that drift on a shared host cannot blur");
  cmd->add_option("--device", options->device,
                  "cpu, or cuda: the GPU kernels as CUDA-graph replays (tokens 1 to 16384); with "
                  "--ep, CudaEpLayer on one GPU per rank")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--sweep", options->sweep, "cuda: also time every kernel plan that can run");
  cmd->add_flag("--final-round", options->final_round,
                "cuda: after each size's round, time the plans within 10% of its best again, "
                "alone in turns, as moe tune does (column 'final us')");
  cmd->add_flag("--timeline", options->timeline,
                "cuda: also print when the GEMMs' thread blocks of the tma plans started and "
                "ended in the last replay (min / median / max)");
  cmd->add_option("--plans", options->plans,
                  "cuda: also time these plans at every size, comma separated (tma/128,wgmma/64; "
                  "names as the table prints them)")
      ->delimiter(',');
  cmd->add_option("--output", options->output, "cuda: also write the JSON report to this file");
  add_ep_options(cmd, options->ep);
  CLI::Option* ep = cmd->get_option("--ep");
  cmd->add_option("--trace", options->trace_path,
                  "--ep: replay this routing trace (`moe trace`; each step one EP step, token t "
                  "of a step on rank t % N) instead of a synthetic one per --tokens")
      ->needs(ep);
  cmd->add_option("--trace-layer", options->trace_layer, "--ep: the layer of --trace to replay")
      ->capture_default_str()
      ->needs(ep);
  cmd->add_option("--zipf", options->zipf,
                  "--ep: expert popularity exponent of the synthetic trace (0 = uniform)")
      ->capture_default_str()
      ->needs(ep);
  cmd->add_option("--steps", options->steps, "--ep: steps of the synthetic trace (one pass)")
      ->capture_default_str()
      ->needs(ep);
  cmd->callback([options, tokens, repeats] {
    options->tokens_given = tokens->count() > 0;
    options->repeats_given = repeats->count() > 0;
    bench(*options);
  });
}

}  // namespace moe::cli
