// run_ep_cuda with GPU expert parallelism (built when MOE_WITH_CUDA_EP is on;
// ep_cuda_unavailable.cc otherwise). Each rank takes the GPU of its index among its host's
// ranks (as the GPU tests and moe_bench_cuda_ep do), holds its slots' weights as the CPU --ep run
// loads them, and runs CudaEpLayer on its synthetic tokens; rank 0 rebuilds every rank's batch,
// runs it through the single-GPU CUDA layer with the whole weights and compares the samples.
#include <cuda_runtime_api.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "kernels/cuda/check.h"
#include "moe/cuda_ep_layer.h"
#include "moe/error.h"
#include "moe/nccl_communicator.h"
#include "tools/moe/batch_report.h"
#include "tools/moe/ep_cuda_setup.h"
#include "tools/moe/ep_report.h"
#include "tools/moe/ep_report_cuda.h"
#include "tools/moe/ep_run.h"
#include "tools/moe/ep_sample.h"
#include "tools/moe/ep_weights.h"
#include "tools/moe/routing_ties.h"

namespace moe::cli {

namespace {

using cuda::check;

// Refuses, by name and before any GPU work, what the CPU --ep run takes and the GPU layer cannot,
// and values out of range (`moe run` checked the counts before dispatching here).
void check_gpu_options(const EpRunOptions& o) {
  if (o.dtype != "bf16") {
    fail("--dtype: --ep --device cuda runs bf16 weights and hidden states; got {}", o.dtype);
  }
  if (o.cpu_isa != CpuIsa::kAuto) {
    fail("--cpu-isa: --ep --device cuda runs no CPU kernels to choose a path for; got {}",
         cpu_isa_name(o.cpu_isa));
  }
  check_gpu_ep_settings(o.ep);
  if (o.threads < 0) fail("--threads: expected >= 0 (0 = all cores); got {}", o.threads);
}

class CudaEpRunner {
 public:
  CudaEpRunner(const EpRunOptions& o, Communicator& host) : o_(o), host_(host) {}

  void run() {
    check_gpu_options(o_);
    load();
    nlohmann::json batches = nlohmann::json::array();
    bool all_good = true;
    if (host_.rank() == 0 && !o_.json) print_header();
    for (int64_t tokens : o_.tokens) {
      const auto [summaries, check] = measure(tokens);
      all_good = all_good && check.passed();
      if (host_.rank() != 0) continue;
      if (o_.json) {
        batches.push_back(cuda_ep_batch_json(tokens, summaries, check));
      } else {
        print_cuda_ep_batch(tokens, summaries, check);
      }
    }
    if (host_.rank() != 0) return;
    if (o_.json) {
      nlohmann::json result = ep_setup_json(config_, host_, o_.ep, *map_);
      result["communicator"] = fmt::format("{} + {}", host_.name(), nccl_->name());
      result["weights"] = weights_source_;
      result["device"] = "cuda";
      result["dtype"] = "bf16";
      result["batches"] = batches;
      fmt::print("{}\n", result.dump(2));
    }
    if (!all_good) {
      fail(
          "moe run --ep --device cuda: the sampled tokens exceed the bf16 bound against the "
          "single-GPU layer, or the error bound against the float64 reference");
    }
  }

 private:
  void load() {
    const int threads = o_.threads > 0 ? o_.threads : omp_get_max_threads();
    omp_set_num_threads(threads);
    gpu_ = take_gpu_of_this_rank(host_);
    // Rank 0 checks samples of every rank's tokens, so it also holds the whole layer.
    const bool checks = host_.rank() == 0 && o_.check_tokens > 0;
    EpLayerWeights loaded =
        load_ep_layer_weights(o_, DType::kBF16, host_.size(), host_.rank(), checks);
    config_ = std::move(loaded.config);
    weights_source_ = std::move(loaded.source);
    map_.emplace(std::move(loaded.map));
    local_ = std::move(loaded.local);
    nccl_ = make_nccl_communicator(host_, {.device = gpu_});
    if (checks) {
      single_.emplace(config_, loaded.whole, LayerOptions{Backend::kCuda, threads, 0});
      reference_.emplace(config_, std::move(loaded.whole),
                         LayerOptions{Backend::kReference, threads, 0});
    }
  }

  void print_header() const {
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, gpu_), "cudaGetDeviceProperties");
    fmt::print(
        "moe run --ep --device cuda: {} (one MoE layer, {}) over {} GPUs on {} host{} ({} + {})\n",
        config_.name, weights_source_, host_.size(), host_.num_hosts(),
        host_.num_hosts() > 1 ? "s" : "", host_.name(), nccl_->name());
    print_ep_gpu_shape(config_);
    print_ep_setup(o_.ep, *map_);
    fmt::print("  weights    bf16, {:.3f} GB of expert weights on rank 0\n",
               static_cast<double>(local_.w13.nbytes() + local_.w2.nbytes()) * 1e-9);
    fmt::print("  gpu        rank 0: device {} ({}); each rank the GPU of its index on its host\n",
               gpu_, properties.name);
    fmt::print(
        "  check      sampled tokens against the single-GPU CUDA layer within bf16 rounding, not "
        "bitwise ((k + N + {}) * 2^-8 of each token's largest output, docs/parallel-cuda.md), and "
        "against the float64 reference\n",
        config_.experts.shared_intermediate_size > 0 ? 2 : 1);
  }

  std::pair<std::vector<CudaEpRankSummary>, CudaEpCheck> measure(int64_t tokens) {
    const int64_t H = config_.experts.hidden_size;
    CudaEpLayer layer(config_, local_, *map_, host_, nccl_.get(),
                      cuda_ep_options(o_.ep, tokens, o_.block_m));
    const DeviceTensor d_hidden(ep_hidden(tokens, H, DType::kBF16, o_.seed, host_.rank()));
    const DeviceTensor d_out(DType::kBF16, {tokens, H});
    const auto step = [&] {
      if (o_.ep.overlap) {
        layer.forward_two_batch(d_hidden.view(), d_out.view());
      } else {
        layer.forward(d_hidden.view(), d_out.view());
      }
    };
    // The warm-up sizes every buffer and counts the pairs each local slot serves; every step
    // routes the same tokens, so the timed ones, which leave the counting kernel out, report them.
    layer.count_served_pairs(true);
    step();
    const std::vector<int64_t> served = layer.last_stats().pairs_per_local_slot;
    layer.count_served_pairs(false);
    std::vector<CudaEpRankSummary> runs;
    for (int r = 0; r < o_.repeats; ++r) {
      step();
      CudaEpStats stats = layer.last_stats();
      stats.pairs_per_local_slot = served;
      runs.push_back(summarize(stats, config_.routing.top_k, H, host_.rank(), o_.ep.overlap));
    }
    std::sort(runs.begin(), runs.end(),
              [](const auto& a, const auto& b) { return a.total_us < b.total_us; });
    Tensor out(DType::kBF16, {tokens, H});
    check(cudaMemcpy(out.data<void>(), d_out.view().data, out.nbytes(), cudaMemcpyDeviceToHost),
          "cudaMemcpy (out)");
    return {gather_summaries(host_, runs[runs.size() / 2]), check_samples(tokens, out)};
  }

  // Samples of every rank's tokens on rank 0, against the single-GPU layer on that rank's whole
  // batch (the batch size the EP layer routed, so both route through the same GEMM shape) and
  // against the float64 reference.
  CudaEpCheck check_samples(int64_t tokens, const Tensor& out) {
    CudaEpCheck result;
    result.error_bound = run_error_bound(DType::kBF16, CpuIsa::kAuto);
    const std::vector<int64_t> sample = sampled_tokens(tokens, o_.check_tokens);
    if (sample.empty()) return result;
    const Tensor outputs = gather_rows_on_rank0(host_, pick_rows(out, sample));
    if (host_.rank() != 0) return result;
    const int N = host_.size();
    const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
    const auto n = static_cast<int64_t>(sample.size());
    Tensor inputs(DType::kBF16, {N * n, H}), want(DType::kBF16, {N * n, H});
    Tensor ids(DType::kI32, {N * n, k}), weights(DType::kF32, {N * n, k});
    for (int r = 0; r < N; ++r) {
      const Tensor hidden = ep_hidden(tokens, H, DType::kBF16, o_.seed, r);
      const Tensor single = single_->forward(hidden);
      const auto put = [&](Tensor& all, const Tensor& rows) {
        std::copy_n(rows.data<char>(), rows.nbytes(), all.data<char>() + r * rows.nbytes());
      };
      put(inputs, pick_rows(hidden, sample));
      put(want, pick_rows(single, sample));
      put(ids, pick_rows(single_->last_topk_ids(), sample));
      put(weights, pick_rows(single_->last_topk_weights(), sample));
    }
    compare_within_bf16_rounding(outputs, want, k, N, config_.experts.shared_intermediate_size > 0,
                                 result);
    const ReferenceOutput expected =
        reference_output(*reference_, Tensor::copy_of(inputs, DType::kF32), ids, weights);
    result.max_rel_error = max_rel_error(outputs, expected.expected);
    result.routing_mismatches = expected.misrouted;
    result.routed_at_ties = expected.routed_at_ties;
    return result;
  }

  const EpRunOptions& o_;
  Communicator& host_;
  int gpu_ = 0;
  std::unique_ptr<Communicator> nccl_;
  MoeConfig config_;
  std::string weights_source_;
  std::optional<ExpertMap> map_;
  LayerWeights local_;
  std::optional<MoeLayer> single_, reference_;
};

}  // namespace

void run_ep_cuda(const EpRunOptions& options) {
  run_as_mpi_rank(options.ep, [&](Communicator& host) { CudaEpRunner(options, host).run(); });
}

}  // namespace moe::cli
