// `moe trace synth`: a seeded synthetic routing trace for a preset or config.json, written as a
// trace file (include/moe/trace.h) that `moe place` and other tools read.
#include <string>

#include <fmt/format.h>

#include "moe/config.h"
#include "moe/trace.h"
#include "tools/moe/commands.h"

namespace moe::cli {

namespace {

struct SynthOptions {
  std::string model = std::string(kDefaultPreset);
  std::string out;
  SyntheticTraceOptions trace;
};

}  // namespace

void add_trace_command(CLI::App& app) {
  CLI::App* trace = app.add_subcommand("trace", "Routing traces: make synthetic ones");
  trace->require_subcommand(1);
  auto o = std::make_shared<SynthOptions>();
  CLI::App* synth = trace->add_subcommand(
      "synth",
      "Write a seeded synthetic trace: Zipf-skewed expert popularity per layer, "
      "correlated co-selection, drift over steps");
  synth->add_option("model", o->model, "A preset name or a path to a config.json")
      ->capture_default_str();
  synth->add_option("--out", o->out, "Trace file to write (safetensors)")->required();
  synth->add_option("--layers", o->trace.num_layers, "MoE layers (0 = all of the model's)")
      ->capture_default_str();
  synth->add_option("--steps", o->trace.num_steps, "Serving steps")->capture_default_str();
  synth->add_option("--tokens", o->trace.tokens_per_step, "Tokens per step")->capture_default_str();
  synth->add_option("--zipf", o->trace.zipf_exponent, "Popularity exponent (0 = uniform)")
      ->capture_default_str();
  synth
      ->add_option("--co-selection", o->trace.co_selection,
                   "Probability that a token's later experts share its first one's cluster")
      ->capture_default_str();
  synth->add_option("--drift", o->trace.drift_per_step, "Popularity rank shift per step")
      ->capture_default_str();
  synth->add_option("--gpus", o->trace.num_gpus, "GPUs the tokens come from (round-robin)")
      ->capture_default_str();
  synth->add_option("--seed", o->trace.seed, "Seed")->capture_default_str();
  synth->callback([o] {
    const MoeConfig config = resolve_config(o->model);
    const RoutingTrace trace = synthesize_trace(config, o->trace);
    write_trace(o->out, trace, config.name);
    int64_t tokens = 0;
    for (const TraceLayer& layer : trace.layers) {
      tokens += static_cast<int64_t>(layer.topk_ids.size()) / trace.top_k;
    }
    fmt::print("wrote {}: {} layers, {} experts, top-{}, {} tokens in {} steps per layer\n", o->out,
               trace.num_layers, trace.num_experts, trace.top_k,
               trace.num_layers > 0 ? tokens / trace.num_layers : 0, o->trace.num_steps);
  });
}

}  // namespace moe::cli
