#include "tools/moe/ep_run.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "moe/error.h"
#include "tools/moe/batch_report.h"
#include "tools/moe/ep_report.h"
#include "tools/moe/ep_sample.h"
#include "tools/moe/ep_weights.h"
#include "tools/moe/routing_ties.h"

namespace moe::cli {

namespace {

class EpRunner {
 public:
  EpRunner(const EpRunOptions& o, Communicator& comm) : o_(o), comm_(comm) {}

  void run() {
    load();
    nlohmann::json batches = nlohmann::json::array();
    bool all_good = true;
    if (comm_.rank() == 0 && !o_.json) print_header();
    for (int64_t tokens : o_.tokens) {
      const auto [summaries, check] = measure(tokens);
      all_good = all_good && check.differing_elements == 0 &&
                 check.max_rel_error <= check.error_bound && check.routing_mismatches == 0;
      if (comm_.rank() != 0) continue;
      if (o_.json) {
        batches.push_back(ep_batch_json(tokens, summaries, check));
      } else {
        print_ep_batch(tokens, summaries, check);
      }
    }
    if (comm_.rank() != 0) return;
    if (o_.json) {
      nlohmann::json result = ep_setup_json(config_, comm_, o_.ep, *map_);
      result["weights"] = weights_source_;
      result["dtype"] = dtype_name(dtype_);
      result["threads_per_rank"] = threads_;
      result["cpu_isa"] = cpu_isa_name(isa_);
      result["batches"] = batches;
      fmt::print("{}\n", result.dump(2));
    }
    if (!all_good) {
      fail(
          "moe run --ep: the sampled tokens differ from the single-process layer or exceed the "
          "error bound");
    }
  }

 private:
  void load() {
    dtype_ = parse_dtype(o_.dtype);
    if (dtype_ != DType::kF32 && dtype_ != DType::kBF16 && dtype_ != DType::kF16) {
      fail("--dtype: expected f32, bf16 or f16; got {}", o_.dtype);
    }
    const EpCpuSetup cpu = setup_ep_cpu(o_.threads, o_.repeats, o_.cpu_isa);
    isa_ = cpu.isa;
    threads_ = cpu.threads;
    // Rank 0 checks samples of every rank's tokens, so it also holds the whole layer.
    const bool checks = comm_.rank() == 0 && o_.check_tokens > 0;
    EpLayerWeights loaded = load_ep_layer_weights(o_, dtype_, comm_.size(), comm_.rank(), checks);
    config_ = std::move(loaded.config);
    weights_source_ = std::move(loaded.source);
    map_.emplace(std::move(loaded.map));
    local_ = std::move(loaded.local);
    if (checks) {
      single_.emplace(config_, loaded.whole,
                      LayerOptions{Backend::kCpu, threads_, o_.block_m, isa_});
      reference_.emplace(config_, std::move(loaded.whole),
                         LayerOptions{Backend::kReference, threads_, 0});
    }
  }

  void print_header() const {
    fmt::print("moe run --ep: {} (one MoE layer, {}) over {} ranks on {} host{} ({})\n",
               config_.name, weights_source_, comm_.size(), comm_.num_hosts(),
               comm_.num_hosts() > 1 ? "s" : "", comm_.name());
    fmt::print("  shape      H={} I={} E={} k={}\n", config_.experts.hidden_size,
               config_.experts.intermediate_size, config_.routing.num_experts,
               config_.routing.top_k);
    print_ep_setup(o_.ep, *map_);
    fmt::print("  weights    {}, {:.3f} GB of expert weights on rank 0; threads per rank: {}\n",
               dtype_name(dtype_),
               static_cast<double>(local_.w13.nbytes() + local_.w2.nbytes()) * 1e-9, threads_);
    fmt::print("  cpu isa    {} (this cpu: {})\n", cpu_isa_name(isa_), cpu_feature_names());
  }

  std::pair<std::vector<EpRankSummary>, EpCheck> measure(int64_t tokens) {
    const int64_t H = config_.experts.hidden_size;
    EpOptions options = ep_options(o_.ep, tokens, threads_, o_.block_m);
    options.cpu_isa = isa_;
    EpMoeLayer layer(config_, local_, *map_, comm_, options);
    const Tensor hidden = ep_hidden(tokens, H, dtype_, o_.seed, comm_.rank());
    Tensor out(dtype_, {tokens, H});
    layer.forward(hidden, out);  // warm-up: sizes every buffer
    std::vector<EpStepStats> runs;
    for (int r = 0; r < o_.repeats; ++r) {
      layer.forward(hidden, out);
      runs.push_back(layer.last_stats());
    }
    std::sort(runs.begin(), runs.end(),
              [](const EpStepStats& a, const EpStepStats& b) { return a.total_us < b.total_us; });
    const std::vector<EpRankSummary> summaries =
        gather_summaries(comm_, summarize(runs[runs.size() / 2], comm_));
    return {summaries, check(hidden, out)};
  }

  // Samples of every rank's tokens on rank 0, against the single-process layer and the reference.
  EpCheck check(const Tensor& hidden, const Tensor& out) {
    EpCheck result;
    result.error_bound = run_error_bound(dtype_, isa_);
    const std::vector<int64_t> tokens = sampled_tokens(hidden.size(0), o_.check_tokens);
    if (tokens.empty()) return result;
    const Tensor inputs = gather_rows_on_rank0(comm_, pick_rows(hidden, tokens));
    const Tensor outputs = gather_rows_on_rank0(comm_, pick_rows(out, tokens));
    if (comm_.rank() != 0) return result;
    result.checked_tokens = inputs.size(0);
    const Tensor single = single_->forward(inputs);
    for (int64_t i = 0; i < single.numel(); ++i) {
      const size_t b = dtype_size(dtype_);
      result.differing_elements +=
          std::memcmp(single.data<char>() + i * b, outputs.data<char>() + i * b, b) != 0;
    }
    const ReferenceOutput want =
        reference_output(*reference_, Tensor::copy_of(inputs, DType::kF32),
                         single_->last_topk_ids(), single_->last_topk_weights());
    result.max_rel_error = max_rel_error(outputs, want.expected);
    result.routing_mismatches = want.misrouted;
    result.routed_at_ties = want.routed_at_ties;
    return result;
  }

  const EpRunOptions& o_;
  Communicator& comm_;
  MoeConfig config_;
  DType dtype_ = DType::kBF16;
  CpuIsa isa_ = CpuIsa::kAuto;
  int threads_ = 1;
  std::string weights_source_;
  std::optional<ExpertMap> map_;
  LayerWeights local_;
  std::optional<MoeLayer> single_, reference_;
};

}  // namespace

void run_ep(const EpRunOptions& options) {
  check_cpu_ep_settings(options.ep);
  run_as_mpi_rank(options.ep, [&](Communicator& comm) { EpRunner(options, comm).run(); });
}

}  // namespace moe::cli
