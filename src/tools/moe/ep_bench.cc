#include "tools/moe/ep_bench.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/trace.h"
#include "tools/moe/ep_bench_report.h"
#include "tools/moe/ep_report.h"
#include "tools/moe/ep_sample.h"
#include "tools/moe/ep_weights.h"

namespace moe::cli {

namespace {

// One rank's part of one EP step.
struct RankStep {
  int64_t tokens = 0;
  std::vector<int32_t> ids;    // [tokens, k]
  std::vector<float> weights;  // [tokens, k]: 1/k each
};

// A trace layer as EP steps, this rank's share of each.
struct Workload {
  int64_t tokens_per_rank = -1;  // -1: a trace file's steps
  int64_t num_tokens = 0;        // every rank's, over all steps
  int64_t max_rank_tokens = 0;   // the most tokens any rank holds in one step
  std::vector<RankStep> steps;
};

// Token t of a step (counted from its first token) goes to rank t % N. A trace's source_gpu is
// not used: a trace recorded on another number of GPUs would name ranks this job lacks.
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

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// `timed` is whole passes of `steps_per_pass` steps. The counters of the first pass summed step
// by step (every pass routes alike), and each stage's time per pass: the median over the passes
// of its sum over the pass's steps.
EpStepStats pass_totals(const std::vector<EpStepStats>& timed, size_t steps_per_pass) {
  const std::vector<EpStepStats> pass(timed.begin(), timed.begin() + steps_per_pass);
  EpStepStats sum = pass.front();
  const auto add = [](auto& into, const auto& from) {
    for (size_t i = 0; i < into.size(); ++i) into[i] += from[i];
  };
  const auto add_split = [](TrafficSplit& into, const TrafficSplit& from) {
    into.self += from.self;
    into.same_host += from.same_host;
    into.cross_host += from.cross_host;
  };
  for (size_t s = 1; s < pass.size(); ++s) {
    const EpStepStats& st = pass[s];
    sum.num_tokens += st.num_tokens;
    sum.num_pairs += st.num_pairs;
    sum.rows_sent += st.rows_sent;
    sum.local_pairs += st.local_pairs;
    sum.pairs_received += st.pairs_received;
    sum.upper_bound_bytes += st.upper_bound_bytes;
    add(sum.dispatch_bytes_sent, st.dispatch_bytes_sent);
    add(sum.dispatch_bytes_received, st.dispatch_bytes_received);
    add(sum.combine_bytes_sent, st.combine_bytes_sent);
    add(sum.combine_bytes_received, st.combine_bytes_received);
    add(sum.pairs_per_local_slot, st.pairs_per_local_slot);
    add_split(sum.dispatch_sent, st.dispatch_sent);
    add_split(sum.combine_sent, st.combine_sent);
    add_split(sum.row_payload, st.row_payload);
  }
  for (double EpStepStats::*stage :
       {&EpStepStats::route_us, &EpStepStats::dispatch_us, &EpStepStats::experts_us,
        &EpStepStats::shared_us, &EpStepStats::combine_us, &EpStepStats::sum_us,
        &EpStepStats::total_us}) {
    std::vector<double> per_pass(timed.size() / steps_per_pass, 0.0);
    for (size_t i = 0; i < timed.size(); ++i) per_pass[i / steps_per_pass] += timed[i].*stage;
    sum.*stage = median(std::move(per_pass));
  }
  return sum;
}

class EpBencher {
 public:
  EpBencher(const EpBenchOptions& o, Communicator& comm) : o_(o), comm_(comm) {}

  void run() {
    load();
    if (comm_.rank() == 0 && !o_.json) print_header();
    nlohmann::json groups = nlohmann::json::array();
    for (Workload& w : workloads()) {
      const EpBenchGroup group = measure(w);
      if (comm_.rank() != 0) continue;
      if (o_.json) {
        groups.push_back(ep_bench_group_json(group));
      } else {
        print_ep_bench_group(group);
      }
    }
    if (comm_.rank() != 0) return;
    if (o_.json) {
      nlohmann::json result = ep_setup_json(config_, comm_, o_.ep, *map_);
      result["dtype"] = dtype_name(dtype_);
      result["threads_per_rank"] = threads_;
      result["cpu_isa"] = cpu_isa_name(isa_);
      result["routing"] = routing_json();
      result["groups"] = groups;
      fmt::print("{}\n", result.dump(2));
    }
  }

 private:
  void load() {
    dtype_ = parse_dtype(o_.dtype);
    if (dtype_ != DType::kF32 && dtype_ != DType::kBF16 && dtype_ != DType::kF16) {
      fail("--dtypes: expected one of f32, bf16 or f16 with --ep; got {}", o_.dtype);
    }
    const EpCpuSetup cpu = setup_ep_cpu(o_.threads, o_.repeats, o_.cpu_isa);
    isa_ = cpu.isa;
    threads_ = cpu.threads;
    EpRunOptions weights;
    weights.preset = o_.preset;
    weights.config_path = o_.config_path;
    weights.seed = o_.seed;
    weights.ep = o_.ep;
    EpLayerWeights loaded =
        load_ep_layer_weights(weights, dtype_, comm_.size(), comm_.rank(), false);
    config_ = std::move(loaded.config);
    weights_source_ = std::move(loaded.source);
    map_.emplace(std::move(loaded.map));
    local_ = std::move(loaded.local);
  }

  // The trace file's layer, or one synthetic trace per token count.
  std::vector<Workload> workloads() const {
    const int64_t k = config_.routing.top_k;
    const int N = comm_.size();
    std::vector<Workload> result;
    if (!o_.trace_path.empty()) {
      const RoutingTrace trace = read_trace(o_.trace_path);
      if (trace.num_experts != config_.routing.num_experts || trace.top_k != k) {
        fail("--trace: '{}' routes over {} experts, top-{}; the model has {} experts, top-{}",
             o_.trace_path, trace.num_experts, trace.top_k, config_.routing.num_experts, k);
      }
      if (o_.trace_layer < 0 || o_.trace_layer >= trace.num_layers) {
        fail("--trace-layer: expected a layer in [0, {}) of '{}'; got {}", trace.num_layers,
             o_.trace_path, o_.trace_layer);
      }
      result.push_back(rank_workload(trace.layers[o_.trace_layer], k, comm_.rank(), N));
      return result;
    }
    if (o_.steps < 1) fail("--steps: expected >= 1; got {}", o_.steps);
    if (o_.zipf < 0) fail("--zipf: expected an exponent >= 0 (0 = uniform); got {}", o_.zipf);
    for (int64_t tokens : o_.tokens) {
      if (tokens < 1) fail("--tokens: expected counts >= 1 per rank with --ep; got {}", tokens);
      SyntheticTraceOptions synth;
      synth.num_layers = 1;
      synth.num_steps = o_.steps;
      synth.tokens_per_step = tokens * N;
      synth.zipf_exponent = o_.zipf;
      synth.num_gpus = N;
      synth.seed = o_.seed;
      result.push_back(
          rank_workload(synthesize_trace(config_, synth).layers[0], k, comm_.rank(), N));
      result.back().tokens_per_rank = tokens;
    }
    return result;
  }

  EpBenchGroup measure(Workload& w) {
    const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
    if (w.steps.empty())
      fail("--trace: '{}' has no steps in layer {}", o_.trace_path, o_.trace_layer);
    EpOptions options = ep_options(o_.ep, w.max_rank_tokens, threads_, o_.block_m);
    options.cpu_isa = isa_;
    EpMoeLayer layer(config_, local_, *map_, comm_, options);
    const Tensor hidden = ep_hidden(w.max_rank_tokens, H, dtype_, o_.seed, comm_.rank());
    Tensor out(dtype_, {w.max_rank_tokens, H});
    const auto step = [&](RankStep& st) {
      layer.forward_routed(TensorView(hidden.data<void>(), dtype_, {st.tokens, H}),
                           TensorView(st.ids.data(), DType::kI32, {st.tokens, k}),
                           TensorView(st.weights.data(), DType::kF32, {st.tokens, k}),
                           TensorView(out.data<void>(), dtype_, {st.tokens, H}));
      return layer.last_stats();
    };
    for (RankStep& st : w.steps) step(st);  // warm-up: sizes every buffer
    std::vector<EpStepStats> timed;
    for (int p = 0; p < o_.repeats; ++p) {
      for (RankStep& st : w.steps) timed.push_back(step(st));
    }

    EpBenchGroup group;
    group.tokens_per_rank = w.tokens_per_rank;
    group.num_steps = static_cast<int64_t>(w.steps.size());
    group.num_tokens = w.num_tokens;
    group.passes = o_.repeats;
    group.ranks = gather_summaries(comm_, summarize(pass_totals(timed, w.steps.size())));
    std::vector<double> totals;
    for (const EpStepStats& st : timed) totals.push_back(st.total_us);
    const std::vector<std::vector<double>> every_rank = all_gather_values(comm_, totals);
    group.slowest_step_us.assign(totals.size(), 0.0);
    for (const std::vector<double>& rank_totals : every_rank) {
      for (size_t i = 0; i < totals.size(); ++i) {
        group.slowest_step_us[i] = std::max(group.slowest_step_us[i], rank_totals[i]);
      }
    }
    return group;
  }

  nlohmann::json routing_json() const {
    nlohmann::json routing = {{"router_weights", "uniform 1/k"}, {"token_to_rank", "t % N"}};
    if (!o_.trace_path.empty()) {
      routing["trace"] = o_.trace_path;
      routing["trace_layer"] = o_.trace_layer;
    } else {
      routing["synthetic"] = {{"zipf", o_.zipf}, {"steps", o_.steps}, {"seed", o_.seed}};
    }
    return routing;
  }

  void print_header() const {
    fmt::print("moe bench --ep: {} (one MoE layer, {}) over {} ranks on {} host{} ({})\n",
               config_.name, weights_source_, comm_.size(), comm_.num_hosts(),
               comm_.num_hosts() > 1 ? "s" : "", comm_.name());
    fmt::print("  shape      H={} I={} E={} k={}, {} weights, {} threads per rank, {} path\n",
               config_.experts.hidden_size, config_.experts.intermediate_size,
               config_.routing.num_experts, config_.routing.top_k, dtype_name(dtype_), threads_,
               cpu_isa_name(isa_));
    print_ep_setup(o_.ep, *map_);
    fmt::print("  routing    {}; token t of a step on rank t % {}; router weights 1/k\n",
               o_.trace_path.empty()
                   ? fmt::format("synthetic trace, zipf {}, seed {}", o_.zipf, o_.seed)
                   : fmt::format("layer {} of {}", o_.trace_layer, o_.trace_path),
               comm_.size());
  }

  const EpBenchOptions& o_;
  Communicator& comm_;
  MoeConfig config_;
  DType dtype_ = DType::kBF16;
  CpuIsa isa_ = CpuIsa::kAuto;
  int threads_ = 1;
  std::string weights_source_;
  std::optional<ExpertMap> map_;
  LayerWeights local_;
};

}  // namespace

void bench_ep(const EpBenchOptions& options) {
  run_as_mpi_rank(options.ep, [&](Communicator& comm) { EpBencher(options, comm).run(); });
}

}  // namespace moe::cli
