// `moe run`: the main job. Builds one MoE layer of a preset or config.json with deterministic
// synthetic weights (or one layer of a Hugging Face checkpoint with its real weights), runs a
// decode-sized and a prefill-sized batch, checks a sample of tokens against the reference backend
// and reports per-stage times, throughput and the error.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/checkpoint.h"
#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "moe/trace.h"
#include "tools/moe/batch_report.h"
#include "tools/moe/commands.h"
#include "tools/moe/ep_options.h"
#include "tools/moe/ep_run.h"
#include "tools/moe/routing_ties.h"

namespace moe::cli {

namespace {

struct RunOptions {
  std::string preset = std::string(kDefaultPreset);
  std::string config_path;
  std::string checkpoint;  // when set, the config and the layer's weights come from it
  int64_t layer = 0;
  bool layer_given = false;  // otherwise the checkpoint's first MoE layer
  std::string dtype = "bf16";
  std::string backend = "cpu";
  std::string device = "cpu";  // cuda: the layer runs on the GPU (backend cuda)
  std::string cpu_isa = "auto";
  std::vector<int64_t> tokens = {1, 64, 1024};
  int threads = 0;
  uint64_t seed = 0;
  int repeats = 5;
  int64_t check_tokens = 8;
  int64_t block_m = 0;
  std::string trace_path;
  bool json = false;
  EpSettings ep;
};

// The counts are checked here, for both the single-process and the --ep runs, before anything
// is built: a bad one would otherwise stop the run only after seconds of setting up weights (a
// bad --tokens, --repeats), or not at all (a negative --check-tokens checked nothing and said so
// as "-2 sampled tokens").
void check_counts(const RunOptions& o) {
  for (const int64_t tokens : o.tokens) {
    if (tokens < 0) fail("--tokens: expected counts >= 0; got {}", tokens);
  }
  if (o.repeats < 1) fail("--repeats: expected >= 1; got {}", o.repeats);
  if (o.check_tokens < 0) {
    fail("--check-tokens: expected >= 0 (0 = none); got {}", o.check_tokens);
  }
}

// The backend the options name: --device cuda is --backend cuda, and takes no other backend.
std::string chosen_backend(const RunOptions& o) {
  if (o.device != "cuda") return o.backend;
  if (o.backend != "cpu" && o.backend != "cuda") {
    fail("--device cuda runs the cuda backend; got --backend {}", o.backend);
  }
  return "cuda";
}

std::string routing_summary(const RoutingConfig& r) {
  std::string text = fmt::format("{} top-{}", scoring_name(r.scoring), r.top_k);
  if (r.num_groups > 1) text += fmt::format(", {} of {} groups", r.topk_groups, r.num_groups);
  if (r.renormalize) text += ", renormalized";
  if (r.has_correction_bias) text += ", correction bias";
  if (r.has_router_bias) text += ", router bias";
  if (r.routed_scaling_factor != 1.0f) text += fmt::format(", scale {}", r.routed_scaling_factor);
  if (r.apply_weight_on_input) text += ", weight on input";
  return text;
}

nlohmann::json stages_json(const StageTimes& t) {
  return {{"route", t.route_us}, {"align", t.align_us},   {"gemm1", t.gemm1_us}, {"act", t.act_us},
          {"gemm2", t.gemm2_us}, {"shared", t.shared_us}, {"sum", t.sum_us}};
}

nlohmann::json batch_json(const BatchReport& b, double bound) {
  const double seconds = b.total_us * 1e-6;
  return {{"tokens", b.tokens},
          {"total_us", b.total_us},
          {"stages_us", stages_json(b.stages)},
          {"repeats", b.repeats},
          {"tokens_per_s", seconds > 0 ? b.tokens / seconds : 0.0},
          {"weight_bytes", b.weight_bytes},
          {"weight_gb_per_s", seconds > 0 ? b.weight_bytes / seconds * 1e-9 : 0.0},
          {"flops", b.flops},
          {"gflop_per_s", seconds > 0 ? b.flops / seconds * 1e-9 : 0.0},
          {"experts_touched", b.experts_touched},
          {"rows_per_expert", {{"min", b.rows_min}, {"mean", b.rows_mean}, {"max", b.rows_max}}},
          {"checked_tokens", b.checked_tokens},
          {"routing_mismatches", b.routing_mismatches},
          {"routed_at_ties", b.routed_at_ties},
          {"max_rel_error", b.max_rel_error},
          {"error_bound", bound},
          {"within_bound", b.max_rel_error <= bound}};
}

void print_header(const MoeConfig& c, const std::string& weights_source, DType dtype, int threads,
                  const LayerWeights& w, double setup_s, const MoeLayer& layer) {
  fmt::print("moe run: {} (one MoE layer, {})\n", c.name, weights_source);
  fmt::print("  shape    H={} I={} E={} k={}", c.experts.hidden_size, c.experts.intermediate_size,
             c.routing.num_experts, c.routing.top_k);
  if (c.experts.shared_intermediate_size > 0) {
    fmt::print(" shared I={}{}", c.experts.shared_intermediate_size,
               c.experts.shared_gate ? " (gated)" : "");
  }
  fmt::print("\n  routing  {}; activation {}\n", routing_summary(c.routing),
             activation_name(c.experts.activation));
  fmt::print("  weights  {} {:.2f} GB per layer (built in {:.1f} s); hidden {}; {} threads\n",
             dtype_name(w.w13.dtype()), static_cast<double>(w.nbytes()) * 1e-9, setup_s,
             dtype_name(dtype), threads);
  if (layer.options().backend != Backend::kReference) {
    fmt::print("  cpu isa  {} (this cpu: {})\n", cpu_isa_name(layer.cpu_isa()),
               cpu_feature_names());
  }
  fmt::print(
      "\n{:>6} {:>9} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} | {:>9} {:>7} {:>8} | "
      "{:>14} | {:>9}\n",
      "tokens", "total_ms", "route", "align", "gemm1", "act", "gemm2", "shared", "sum", "tokens/s",
      "GB/s", "GFLOP/s", "rows/expert", "rel_error");
  fmt::print("{:>6} {:>9} | {:^63} | {:>9} {:>7} {:>8} | {:>14} | {:>9}\n", "", "",
             "stage times, ms", "", "weights", "", "min/mean/max", "vs ref");
}

void print_batch(const BatchReport& b) {
  const auto ms = [](double us) { return us * 1e-3; };
  const double seconds = b.total_us * 1e-6;
  const StageTimes& t = b.stages;
  const std::string note = routing_note(b.routing_mismatches, b.routed_at_ties);
  fmt::print(
      "{:>6} {:>9.3f} | {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} | "
      "{:>9.0f} {:>7.2f} {:>8.1f} | {:>14} | {:>9.2e}{}\n",
      b.tokens, ms(b.total_us), ms(t.route_us), ms(t.align_us), ms(t.gemm1_us), ms(t.act_us),
      ms(t.gemm2_us), ms(t.shared_us), ms(t.sum_us), b.tokens / seconds,
      b.weight_bytes / seconds * 1e-9, b.flops / seconds * 1e-9,
      fmt::format("{}/{:.1f}/{}", b.rows_min, b.rows_mean, b.rows_max), b.max_rel_error,
      note.empty() ? "" : fmt::format(" ({})", note));
}

void run(const RunOptions& o) {
  const std::string backend = chosen_backend(o);
  std::optional<Checkpoint> checkpoint;
  if (!o.checkpoint.empty()) checkpoint.emplace(Checkpoint::open(o.checkpoint));
  const MoeConfig config = checkpoint              ? checkpoint->config()
                           : o.config_path.empty() ? preset_config(o.preset)
                                                   : load_hf_config(o.config_path);
  const int64_t layer_index = o.layer_given ? o.layer : config.first_moe_layer();
  const std::string weights_source =
      checkpoint ? fmt::format("layer {} of {}", layer_index, o.checkpoint) : "synthetic weights";
  const DType dtype = parse_dtype(o.dtype);
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    fail("--dtype: expected f32, bf16 or f16; got {}", o.dtype);
  }
  if (o.threads < 0) fail("--threads: expected >= 0 (0 = all cores); got {}", o.threads);
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  omp_set_num_threads(threads);
  // A path this machine cannot run is refused before the weights are built.
  const CpuIsa isa = parse_cpu_isa(o.cpu_isa);
  if (parse_backend(backend) != Backend::kReference) resolve_cpu_isa(isa);

  const auto setup_start = std::chrono::steady_clock::now();
  LayerWeights weights = checkpoint ? load_moe_layer(*checkpoint, layer_index, dtype)
                                    : synthetic_layer_weights(config, dtype, o.seed);
  LayerOptions options;
  options.backend = parse_backend(backend);
  options.num_threads = threads;
  options.block_m = o.block_m;
  options.cpu_isa = isa;
  MoeLayer layer(config, weights, options);
  const double bound = run_error_bound(dtype, layer.cpu_isa());
  MoeLayer reference(config, weights, LayerOptions{Backend::kReference, threads, 0});
  const double setup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();

  // With --trace, each batch is one step of a one-layer trace.
  RoutingTrace trace;
  trace.num_layers = 1;
  trace.num_experts = config.routing.num_experts;
  trace.top_k = config.routing.top_k;
  trace.layers.resize(1);
  trace.layers[0].step_offsets.push_back(0);

  nlohmann::json batches = nlohmann::json::array();
  bool all_within = true;
  int64_t misrouted = 0;
  if (!o.json) print_header(config, weights_source, dtype, threads, weights, setup_s, layer);
  for (int64_t tokens : o.tokens) {
    BatchSettings settings;
    settings.tokens = tokens;
    settings.dtype = dtype;
    settings.seed = o.seed + static_cast<uint64_t>(tokens);
    settings.repeats = o.repeats;
    settings.check_tokens = o.check_tokens;
    const BatchReport report = measure_batch(layer, reference, settings);
    const TensorView ids = layer.last_topk_ids();
    trace.layers[0].topk_ids.insert(trace.layers[0].topk_ids.end(), ids.as<int32_t>(),
                                    ids.as<int32_t>() + ids.numel());
    trace.layers[0].step_offsets.push_back(trace.layers[0].step_offsets.back() + tokens);
    all_within = all_within && report.max_rel_error <= bound;
    misrouted += report.routing_mismatches;
    if (o.json) {
      batches.push_back(batch_json(report, bound));
    } else {
      print_batch(report);
    }
  }
  if (o.json) {
    const nlohmann::json result = {{"model", config.name},
                                   {"weights", weights_source},
                                   {"hidden_size", config.experts.hidden_size},
                                   {"intermediate_size", config.experts.intermediate_size},
                                   {"num_experts", config.routing.num_experts},
                                   {"top_k", config.routing.top_k},
                                   {"dtype", dtype_name(dtype)},
                                   {"backend", backend},
                                   {"cpu_isa", cpu_isa_name(layer.cpu_isa())},
                                   {"threads", threads},
                                   {"seed", o.seed},
                                   {"weight_bytes_per_layer", weights.nbytes()},
                                   {"batches", batches}};
    fmt::print("{}\n", result.dump(2));
  } else {
    fmt::print(
        "\nerror: max |out - ref| / max |ref| over {} sampled tokens per batch against "
        "the float64 reference; bound {:.0e} for {} output: {}\n",
        o.check_tokens, bound, dtype_name(dtype), all_within ? "all within" : "EXCEEDED");
    if (misrouted > 0) {
      fmt::print(
          "routing: {} sampled tokens got other experts than the reference's, beyond a tie "
          "of their logits\n",
          misrouted);
    }
  }
  if (!o.trace_path.empty()) write_trace(o.trace_path, trace, config.name);
  if (!all_within) fail("moe run: the error against the reference exceeds the {} bound", o.dtype);
  if (misrouted > 0) {
    fail("moe run: {} sampled tokens were routed to other experts than the reference's", misrouted);
  }
}

// The --ep mode: the same options, run as one rank of an MPI job, on CPUs or one GPU per rank.
void run_expert_parallel(const RunOptions& o, bool layer_given) {
  const std::string backend = chosen_backend(o);
  if (backend != "cpu" && backend != "cuda") {
    fail("--ep: expected the cpu or cuda backend; got --backend {}", backend);
  }
  if (!o.trace_path.empty()) fail("--ep: --trace is not supported with --ep");
  EpRunOptions ep;
  ep.preset = o.preset;
  ep.config_path = o.config_path;
  ep.checkpoint = o.checkpoint;
  ep.layer = layer_given ? o.layer : -1;
  ep.dtype = o.dtype;
  ep.tokens = o.tokens;
  ep.threads = o.threads;
  ep.seed = o.seed;
  ep.repeats = o.repeats;
  ep.check_tokens = o.check_tokens;
  ep.block_m = o.block_m;
  ep.cpu_isa = parse_cpu_isa(o.cpu_isa);
  ep.json = o.json;
  ep.ep = o.ep;
  if (backend == "cuda") {
    run_ep_cuda(ep);
  } else {
    run_ep(ep);
  }
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run one MoE layer (synthetic weights, or a checkpoint's) on decode and prefill "
      "batches, check it against the reference and report per-stage times and throughput");
  cmd->add_option("--preset", options->preset, "Built-in model preset")
      ->capture_default_str()
      ->check(CLI::IsMember(preset_names()));
  CLI::Option* config = cmd->add_option(
      "--config", options->config_path,
      "A Hugging Face config.json to take the layer's shape from (overrides --preset)");
  CLI::Option* checkpoint =
      cmd->add_option("--checkpoint", options->checkpoint,
                      "A Hugging Face checkpoint folder: run one of its layers with its real "
                      "weights (overrides --preset)")
          ->excludes(config);
  CLI::Option* layer = cmd->add_option("--layer", options->layer,
                                       "Decoder layer of --checkpoint (default: the first MoE "
                                       "layer)")
                           ->needs(checkpoint);
  cmd->add_option("--dtype", options->dtype, "Weights and hidden states: f32, bf16 or f16")
      ->capture_default_str();
  cmd->add_option("--tokens", options->tokens,
                  "Batch sizes to run, comma separated (per rank with --ep)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "Worker threads (0 = all cores)")
      ->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed of the synthetic weights and inputs")
      ->capture_default_str();
  cmd->add_option("--repeats", options->repeats, "Timed runs per batch; the median is reported")
      ->capture_default_str();
  cmd->add_option("--check-tokens", options->check_tokens,
                  "Tokens per batch checked against the float64 reference (0 = none)")
      ->capture_default_str();
  cmd->add_option("--backend", options->backend,
                  "Experts backend: cpu, reference or cuda (same as --device cuda)")
      ->capture_default_str();
  cmd->add_option("--device", options->device,
                  "cpu, or cuda: the GPU (bf16; with --ep one GPU per rank, docs/parallel-cuda.md)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--block-m", options->block_m,
                  "Rows of one expert per pass over its weights (0 = the backend's choice)")
      ->capture_default_str();
  cmd->add_option("--cpu-isa", options->cpu_isa,
                  "CPU path: auto (MOE_CPU_ISA, else the fastest), plain, avx2, avx512, "
                  "avx512bf16 or amx")
      ->capture_default_str();
  cmd->add_option("--trace", options->trace_path,
                  "Write the routing of every batch to this trace file (one step per batch)");
  cmd->add_flag("--json", options->json, "Print one JSON object instead of the table");
  add_ep_options(cmd, options->ep);
  cmd->callback([options, layer] {
    options->layer_given = layer->count() > 0;
    check_counts(*options);
    if (options->ep.enabled) {
      run_expert_parallel(*options, options->layer_given);
    } else {
      run(*options);
    }
  });
}

}  // namespace moe::cli
