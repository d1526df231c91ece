#include "tools/moe/ep_workload.h"

#include <algorithm>

#include <fmt/format.h>

#include "moe/error.h"
#include "moe/trace.h"

namespace moe::cli {

namespace {

Workload rank_workload(const TraceLayer& layer, int64_t k, int rank, int num_ranks) {
  const int64_t num_tokens = static_cast<int64_t>(layer.topk_ids.size()) / k;
  const std::vector<int64_t> offsets =
      layer.step_offsets.empty() ? std::vector<int64_t>{0, num_tokens} : layer.step_offsets;
  Workload w;
  w.num_tokens = num_tokens;
  for (size_t s = 0; s + 1 < offsets.size(); ++s) {
    const int64_t first = offsets[s], count = offsets[s + 1] - offsets[s];
    w.max_rank_tokens = std::max(w.max_rank_tokens, (count + num_ranks - 1) / num_ranks);
    RankStep step;
    for (int64_t t = rank; t < count; t += num_ranks) {
      const auto id = layer.topk_ids.begin() + (first + t) * k;
      step.ids.insert(step.ids.end(), id, id + k);
      ++step.tokens;
    }
    step.weights.assign(step.ids.size(), 1.0f / static_cast<float>(k));
    w.steps.push_back(std::move(step));
  }
  return w;
}

}  // namespace

std::vector<Workload> ep_bench_workloads(const EpBenchOptions& o, const MoeConfig& config, int rank,
                                         int num_ranks) {
  const int64_t k = config.routing.top_k;
  std::vector<Workload> result;
  if (!o.trace_path.empty()) {
    const RoutingTrace trace = read_trace(o.trace_path);
    if (trace.num_experts != config.routing.num_experts || trace.top_k != k) {
      fail("--trace: '{}' routes over {} experts, top-{}; the model has {} experts, top-{}",
           o.trace_path, trace.num_experts, trace.top_k, config.routing.num_experts, k);
    }
    if (o.trace_layer < 0 || o.trace_layer >= trace.num_layers) {
      fail("--trace-layer: expected a layer in [0, {}) of '{}'; got {}", trace.num_layers,
           o.trace_path, o.trace_layer);
    }
    result.push_back(rank_workload(trace.layers[o.trace_layer], k, rank, num_ranks));
    if (result.back().steps.empty()) {
      fail("--trace: '{}' has no steps in layer {}", o.trace_path, o.trace_layer);
    }
    return result;
  }
  if (o.steps < 1) fail("--steps: expected >= 1; got {}", o.steps);
  if (o.zipf < 0) fail("--zipf: expected an exponent >= 0 (0 = uniform); got {}", o.zipf);
  for (int64_t tokens : o.tokens) {
    if (tokens < 1) fail("--tokens: expected counts >= 1 per rank with --ep; got {}", tokens);
    SyntheticTraceOptions synth;
    synth.num_layers = 1;
    synth.num_steps = o.steps;
    synth.tokens_per_step = tokens * num_ranks;
    synth.zipf_exponent = o.zipf;
    synth.num_gpus = num_ranks;
    synth.seed = o.seed;
    result.push_back(rank_workload(synthesize_trace(config, synth).layers[0], k, rank, num_ranks));
    result.back().tokens_per_rank = tokens;
  }
  return result;
}

std::string ep_bench_routing_line(const EpBenchOptions& o, int num_ranks) {
  return fmt::format("{}; token t of a step on rank t % {}; router weights 1/k",
                     o.trace_path.empty()
                         ? fmt::format("synthetic trace, zipf {}, seed {}", o.zipf, o.seed)
                         : fmt::format("layer {} of {}", o.trace_layer, o.trace_path),
                     num_ranks);
}

nlohmann::json ep_bench_routing_json(const EpBenchOptions& o) {
  nlohmann::json routing = {{"router_weights", "uniform 1/k"}, {"token_to_rank", "t % N"}};
  if (!o.trace_path.empty()) {
    routing["trace"] = o.trace_path;
    routing["trace_layer"] = o.trace_layer;
  } else {
    routing["synthetic"] = {{"zipf", o.zipf}, {"steps", o.steps}, {"seed", o.seed}};
  }
  return routing;
}

}  // namespace moe::cli
