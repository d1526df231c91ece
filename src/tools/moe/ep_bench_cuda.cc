// bench_ep_cuda with GPU expert parallelism (built when MOE_WITH_CUDA_EP is on;
// ep_cuda_unavailable.cc otherwise): `moe bench --ep` (ep_bench.h) on CudaEpLayer, one GPU per
// rank. Each rank draws its slots' bf16 weights on its GPU (CudaEpLayer::synthetic: the trace
// sets the routing, so weight values change no count or time), uploads every step's ids and
// weights once, and runs forward_routed per step (forward_routed_two_batch with --overlap): a
// warm-up pass that also counts the pairs each slot serves (count_served_pairs), whose counters
// the report gives, then --repeats passes timed by the layer's CUDA events, without counting. The
// GPU layer's stats are put in the CPU layer's form (EpStepStats), so both benches share one
// reduction and one report. A config's shared experts (DeepSeek-V3's) run on each rank's own
// tokens after combine, as in the CPU layer, and are timed apart.
#include <cuda_runtime_api.h>

#include <memory>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/cuda/check.h"
#include "moe/cuda_ep_layer.h"
#include "moe/error.h"
#include "moe/nccl_communicator.h"
#include "parallel/traffic.h"
#include "tools/moe/ep_bench.h"
#include "tools/moe/ep_bench_passes.h"
#include "tools/moe/ep_bench_report.h"
#include "tools/moe/ep_cuda_setup.h"
#include "tools/moe/ep_report.h"
#include "tools/moe/ep_sample.h"
#include "tools/moe/ep_workload.h"

namespace moe::cli {

namespace {

using cuda::check;

void check_gpu_bench_options(const EpBenchOptions& o) {
  if (o.dtype != "bf16") {
    fail("--dtypes: moe bench --ep --device cuda runs bf16 weights and hidden states; got {}",
         o.dtype);
  }
  if (o.cpu_isa != CpuIsa::kAuto) {
    fail("--isa: moe bench --ep --device cuda runs no CPU kernels to choose a path for; got {}",
         cpu_isa_name(o.cpu_isa));
  }
  if (o.threads != 0) {
    fail("--threads: moe bench --ep --device cuda runs no CPU kernels to give threads; got {}",
         o.threads);
  }
  if (o.repeats < 1) fail("--repeats: expected >= 1; got {}", o.repeats);
  check_gpu_ep_settings(o.ep);
}

// One step's CudaEpStats in the CPU layer's form (moe/ep_layer.h). The GPU's bytes per peer split
// by stage as CudaEpStats counts them: a token row out with its k slot ids and weights
// (H * 2 + k * 8 bytes) in dispatch, a partial row back (H * 2) in combine; its own index is the
// copy within the GPU. Not counted by the GPU layer, left 0 here: pairs served in place, and a sum
// apart from combine (mark_not_measured says so in the report).
EpStepStats in_cpu_form(const CudaEpStats& s, int64_t H, int64_t k, const Communicator& comm) {
  EpStepStats st;
  st.num_tokens = s.num_tokens;
  st.num_pairs = s.num_tokens * k;
  st.upper_bound_bytes = s.num_tokens * k * H * 2;
  const parallel::RowBytes dispatch{H * 2 + k * 8, 0}, combine{0, H * 2};
  st.dispatch_bytes_sent = parallel::bytes_to_each(s.rows_sent, s.rows_received, dispatch);
  st.dispatch_bytes_received = parallel::bytes_to_each(s.rows_received, s.rows_sent, dispatch);
  st.combine_bytes_sent = parallel::bytes_to_each(s.rows_sent, s.rows_received, combine);
  st.combine_bytes_received = parallel::bytes_to_each(s.rows_received, s.rows_sent, combine);
  st.dispatch_sent = parallel::split_by_domain(st.dispatch_bytes_sent, comm);
  st.combine_sent = parallel::split_by_domain(st.combine_bytes_sent, comm);
  std::vector<int64_t> row_payload(s.rows_sent.size());
  for (size_t p = 0; p < s.rows_sent.size(); ++p) {
    row_payload[p] = s.rows_sent[p] * H * 2;
    if (static_cast<int>(p) != comm.rank()) st.rows_sent += s.rows_sent[p];
  }
  st.row_payload = parallel::split_by_domain(row_payload, comm);
  st.pairs_per_local_slot.assign(s.pairs_per_local_slot.begin(), s.pairs_per_local_slot.end());
  st.pairs_received =
      std::accumulate(s.pairs_per_local_slot.begin(), s.pairs_per_local_slot.end(), int64_t{0});
  st.dispatch_us = s.dispatch_us;
  st.experts_us = s.experts_us;
  st.combine_us = s.combine_us;
  st.shared_us = s.shared_us;
  st.total_us = s.total_us;
  return st;
}

// What the GPU layer does not measure: pairs served in place (its own rows take the same path),
// a sum apart from combine (combine adds the partial rows), and with two-batch overlap the stages
// of a step (they overlap; only the step is timed).
void mark_not_measured(EpBenchGroup& group, bool two_batch) {
  for (EpRankSummary& r : group.ranks) {
    r.local_pairs = kNotMeasured;
    r.sum_us = kNotMeasured;
    if (two_batch) r.dispatch_us = r.experts_us = r.combine_us = r.shared_us = kNotMeasured;
  }
}

// The first `rows` rows of a [*, H] tensor on the GPU.
TensorView first_rows(const DeviceTensor& t, int64_t rows) {
  const TensorView all = t.view();
  return TensorView(all.data, all.dtype, {rows, all.size(1)}, Device::kCuda);
}

// One step's routing on this rank's GPU.
struct DeviceStep {
  int64_t tokens;
  DeviceTensor ids, weights;  // [tokens, k] int32, f32
};

class CudaEpBencher {
 public:
  CudaEpBencher(const EpBenchOptions& o, Communicator& host) : o_(o), host_(host) {}

  void run() {
    load();
    if (host_.rank() == 0 && !o_.json) print_header();
    nlohmann::json groups = nlohmann::json::array();
    for (const Workload& w : ep_bench_workloads(o_, config_, host_.rank(), host_.size())) {
      const EpBenchGroup group = measure(w);
      if (host_.rank() != 0) continue;
      if (o_.json) {
        groups.push_back(ep_bench_group_json(group));
      } else {
        print_ep_bench_group(group);
      }
    }
    if (host_.rank() != 0) return;
    if (o_.json) {
      nlohmann::json result = ep_setup_json(config_, host_, o_.ep, *map_);
      result["communicator"] = fmt::format("{} + {}", host_.name(), nccl_->name());
      result["device"] = "cuda";
      result["gpu"] = gpu_name();
      result["dtype"] = "bf16";
      result["weights"] = "synthetic, drawn on the GPU";
      result["routing"] = ep_bench_routing_json(o_);
      result["groups"] = groups;
      fmt::print("{}\n", result.dump(2));
    }
  }

 private:
  void load() {
    gpu_ = take_gpu_of_this_rank(host_);
    config_ = o_.config_path.empty() ? preset_config(o_.preset) : load_hf_config(o_.config_path);
    map_.emplace(ep_expert_map(o_.ep, config_.routing.num_experts, host_.size()));
    nccl_ = make_nccl_communicator(host_, {.device = gpu_});
  }

  std::string gpu_name() const {
    cudaDeviceProp properties{};
    check(cudaGetDeviceProperties(&properties, gpu_), "cudaGetDeviceProperties");
    return properties.name;
  }

  void print_header() const {
    fmt::print(
        "moe bench --ep --device cuda: {} (one MoE layer, bf16 weights drawn on the GPU) over {} "
        "GPUs on {} host{} ({} + {})\n",
        config_.name, host_.size(), host_.num_hosts(), host_.num_hosts() > 1 ? "s" : "",
        host_.name(), nccl_->name());
    print_ep_gpu_shape(config_);
    print_ep_setup(o_.ep, *map_);
    fmt::print("  gpu        rank 0: device {} ({}); each rank the GPU of its index on its host\n",
               gpu_, gpu_name());
    fmt::print("  routing    {}\n", ep_bench_routing_line(o_, host_.size()));
    fmt::print(
        "  timing     CUDA events around dispatch, experts, combine and shared experts of each "
        "step{}; loads and bytes from the warm-up pass, where the GPUs count the pairs each slot "
        "serves\n",
        o_.ep.overlap ? " (two-batch: the whole step only)" : "");
  }

  EpBenchGroup measure(const Workload& w) {
    const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
    CudaEpLayer layer =
        CudaEpLayer::synthetic(config_, *map_, host_, nccl_.get(),
                               cuda_ep_options(o_.ep, w.max_rank_tokens, o_.block_m), o_.seed);
    const DeviceTensor hidden(ep_hidden(w.max_rank_tokens, H, DType::kBF16, o_.seed, host_.rank()));
    const DeviceTensor out(DType::kBF16, {w.max_rank_tokens, H});
    std::vector<DeviceStep> steps;
    for (const RankStep& st : w.steps) {
      steps.push_back({st.tokens,
                       DeviceTensor(TensorView(const_cast<int32_t*>(st.ids.data()), DType::kI32,
                                               {st.tokens, k})),
                       DeviceTensor(TensorView(const_cast<float*>(st.weights.data()), DType::kF32,
                                               {st.tokens, k}))});
    }
    const auto step = [&](const DeviceStep& st) {
      const TensorView h = first_rows(hidden, st.tokens), o = first_rows(out, st.tokens);
      if (o_.ep.overlap) {
        layer.forward_routed_two_batch(h, st.ids.view(), st.weights.view(), o);
      } else {
        layer.forward_routed(h, st.ids.view(), st.weights.view(), o);
      }
      return in_cpu_form(layer.last_stats(), H, k, host_);
    };
    layer.count_served_pairs(true);
    std::vector<EpStepStats> counted;
    for (const DeviceStep& st : steps) counted.push_back(step(st));
    layer.count_served_pairs(false);
    std::vector<EpStepStats> timed;
    for (int p = 0; p < o_.repeats; ++p) {
      for (const DeviceStep& st : steps) timed.push_back(step(st));
    }
    EpBenchGroup group = reduce_ep_bench(host_, w, counted, timed);
    mark_not_measured(group, o_.ep.overlap);
    return group;
  }

  const EpBenchOptions& o_;
  Communicator& host_;
  int gpu_ = 0;
  std::unique_ptr<Communicator> nccl_;
  MoeConfig config_;
  std::optional<ExpertMap> map_;
};

}  // namespace

void bench_ep_cuda(const EpBenchOptions& options) {
  check_gpu_bench_options(options);
  run_as_mpi_rank(options.ep, [&](Communicator& host) { CudaEpBencher(options, host).run(); });
}

}  // namespace moe::cli
