#include "tools/moe/ep_bench.h"

#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "tools/moe/ep_bench_passes.h"
#include "tools/moe/ep_bench_report.h"
#include "tools/moe/ep_report.h"
#include "tools/moe/ep_sample.h"
#include "tools/moe/ep_weights.h"
#include "tools/moe/ep_workload.h"

namespace moe::cli {

namespace {

class EpBencher {
 public:
  EpBencher(const EpBenchOptions& o, Communicator& comm) : o_(o), comm_(comm) {}

  void run() {
    load();
    if (comm_.rank() == 0 && !o_.json) print_header();
    nlohmann::json groups = nlohmann::json::array();
    for (Workload& w : ep_bench_workloads(o_, config_, comm_.rank(), comm_.size())) {
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
      result["device"] = "cpu";
      result["dtype"] = dtype_name(dtype_);
      result["threads_per_rank"] = threads_;
      result["cpu_isa"] = cpu_isa_name(isa_);
      result["routing"] = ep_bench_routing_json(o_);
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

  // A warm-up pass over the steps (it sizes every buffer), then --repeats timed passes; the
  // counters come from the first timed pass.
  EpBenchGroup measure(Workload& w) {
    const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
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
    for (RankStep& st : w.steps) step(st);
    std::vector<EpStepStats> timed;
    for (int p = 0; p < o_.repeats; ++p) {
      for (RankStep& st : w.steps) timed.push_back(step(st));
    }
    const std::vector<EpStepStats> counted(timed.begin(), timed.begin() + w.steps.size());
    return reduce_ep_bench(comm_, w, counted, timed);
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
    fmt::print("  routing    {}\n", ep_bench_routing_line(o_, comm_.size()));
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
  check_cpu_ep_settings(options.ep);
  run_as_mpi_rank(options.ep, [&](Communicator& comm) { EpBencher(options, comm).run(); });
}

}  // namespace moe::cli
