// CudaEpLayer at the full sizes of Qwen3-30B-A3B (H 2048, I 768, 128 experts, top-8) and
// DeepSeek-V3 (H 7168, I 2048, 256 experts, top-8) against fused_experts on one GPU with every
// expert, on a skewed routing (half of every token's pairs on 8 hot experts, all on rank 0 when
// the experts lie in order), once with the experts in order and once on the placement EPLB
// (moe/eplb.h) makes from that routing's loads, with replicas; every data path, one-batch steps
// and two-batch steps. The EPLB placement must also serve the pairs more evenly over the ranks
// than the contiguous one, as counted on the GPUs.
//
// Opt-in, as the multi-GPU check runs it (scripts/ep-gpu-check): every GPU holds the whole layer
// for its reference (1.2 GB for Qwen3-30B-A3B, 23 GB for DeepSeek-V3), which the suite's usual
// two-GPU run does not need. Skipped unless MOE_EP_FULL_SHAPES is set.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "moe/cuda_ep_layer.h"
#include "moe/eplb.h"
#include "moe/expert_map.h"
#include "moe/experts.h"
#include "moe/layer.h"
#include "parallel/cuda/cuda_ep_world.h"
#include "parallel/cuda/ep_rows_close.h"

namespace moe {
namespace {

using testing::DeviceTensor;

constexpr int32_t kHotExperts = 8;

// [M, k] distinct experts per token: the first k/2 from experts [0, kHotExperts) in turn, the
// rest drawn from the others. A pure function of (M, k, E, seed), so every rank can rebuild any
// rank's routing.
Tensor skewed_ids(int64_t M, int64_t k, int64_t E, uint64_t seed) {
  Tensor ids(DType::kI32, {M, k});
  int32_t* out = ids.data<int32_t>();
  std::mt19937_64 draw(seed);  // its output (not a distribution's) is the same everywhere
  for (int64_t t = 0; t < M; ++t) {
    std::set<int32_t> taken;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e = static_cast<int32_t>((t + j) % kHotExperts);
      if (j >= k / 2) {
        do {
          e = static_cast<int32_t>(kHotExperts + draw() % static_cast<uint64_t>(E - kHotExperts));
        } while (taken.count(e) != 0);
      }
      taken.insert(e);
      out[t * k + j] = e;
    }
  }
  return ids;
}

int64_t tokens_of_rank(int rank, int step) { return step == 0 ? 1 + rank : 384 + 37 * rank; }
uint64_t routing_seed(int rank, int step) { return 1000 * static_cast<uint64_t>(step) + rank; }

// EPLB's placement for the loads of every rank's routings of every step, with two spare slots
// per rank for replicas.
ExpertMap eplb_map(const MoeConfig& config, int N) {
  const int64_t E = config.routing.num_experts, k = config.routing.top_k;
  std::vector<int64_t> loads(static_cast<size_t>(E), 0);
  for (int step = 0; step < 2; ++step) {
    for (int r = 0; r < N; ++r) {
      const Tensor ids = skewed_ids(tokens_of_rank(r, step), k, E, routing_seed(r, step));
      for (int64_t p = 0; p < ids.numel(); ++p)
        ++loads[static_cast<size_t>(ids.data<int32_t>()[p])];
    }
  }
  EplbConfig eplb;
  eplb.num_replicas = E + 2 * N;
  eplb.num_groups = std::max<int64_t>(config.routing.num_groups, 1);
  eplb.num_gpus = N;
  const ExpertPlacement placement = rebalance_experts(std::span<const int64_t>(loads), 1, E, eplb);
  return ExpertMap::from_phy2log(placement.phy2log, E, N);
}

// Every expert's w13 [E, 2I, H] and w2 [E, H, I] on this GPU, as synthetic_layer_weights draws
// them, drawn and copied expert by expert so that the host never holds the whole layer.
std::pair<DeviceTensor, DeviceTensor> every_expert_on_gpu(const MoeConfig& config, uint64_t seed) {
  const int64_t H = config.experts.hidden_size, I = config.experts.intermediate_size;
  const int64_t E = config.routing.num_experts;
  DeviceTensor w13 = DeviceTensor::empty_like(DType::kBF16, {E, 2 * I, H});
  DeviceTensor w2 = DeviceTensor::empty_like(DType::kBF16, {E, H, I});
  for (int32_t e = 0; e < E; ++e) {
    const int32_t one[] = {e};
    const LayerWeights w = synthetic_layer_weights(config, DType::kBF16, seed, one);
    const size_t w13_bytes = w.w13.nbytes(), w2_bytes = w.w2.nbytes();
    EXPECT_EQ(cudaMemcpy(static_cast<char*>(w13.view().data) + e * w13_bytes, w.w13.data<char>(),
                         w13_bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemcpy(static_cast<char*>(w2.view().data) + e * w2_bytes, w.w2.data<char>(),
                         w2_bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  return {std::move(w13), std::move(w2)};
}

// The largest rank's pairs over the mean: this rank's served pairs (counted on its GPU) gathered
// from every rank.
double max_over_mean_load(Communicator& host, int64_t mine) {
  std::vector<int64_t> every(static_cast<size_t>(host.size()));
  host.all_gather(&mine, sizeof mine, every.data());
  const double total = static_cast<double>(std::accumulate(every.begin(), every.end(), int64_t{0}));
  const double most = static_cast<double>(*std::max_element(every.begin(), every.end()));
  return total > 0 ? most * static_cast<double>(every.size()) / total : 1.0;
}

class CudaEpFullShape : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaEpFullShape, SkewedRoutingMatchesTheSingleGpuLayerInOrderAndOnEplb) {
  if (std::getenv("MOE_EP_FULL_SHAPES") == nullptr) {
    GTEST_SKIP() << "full-size layers: set MOE_EP_FULL_SHAPES=1 (scripts/ep-gpu-check does)";
  }
  Communicator& host = testing::host_world();
  const int me = host.rank(), N = host.size();
  // Routed experts only: the shared ones (DeepSeek-V3's) run on each rank's own tokens after
  // combine, which cuda_ep_test.cc checks, and fused_experts has none.
  MoeConfig config = preset_config(GetParam());
  config.experts.shared_intermediate_size = 0;
  const int64_t H = config.experts.hidden_size, E = config.routing.num_experts;
  const int64_t k = config.routing.top_k;
  constexpr uint64_t kSeed = 17;
  const auto [w13, w2] = every_expert_on_gpu(config, kSeed);

  struct Step {
    int64_t M = 0;
    DeviceTensor hidden, ids, weights;
    Tensor want;  // the single-GPU layer's output, on the host
  };
  std::vector<Step> steps;
  for (int step = 0; step < 2; ++step) {
    const int64_t M = tokens_of_rank(me, step);
    const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, 50 + step * 10 + me);
    const Tensor weights = testing::random_normal(DType::kF32, {M, k}, 70 + step * 10 + me, 0.3f);
    const DeviceTensor want = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    Step s{M, DeviceTensor(hidden), DeviceTensor(skewed_ids(M, k, E, routing_seed(me, step))),
           DeviceTensor(weights), Tensor()};
    fused_experts(s.hidden, w13, w2, s.weights, s.ids, want);
    s.want = want.to_host();
    steps.push_back(std::move(s));
  }

  const int64_t most_tokens = tokens_of_rank(N - 1, 1);
  const ExpertMap maps[] = {ExpertMap::contiguous(E, N), eplb_map(config, N)};
  ASSERT_TRUE(maps[1].has_replicas()) << "EPLB gave the hot experts no replicas";
  double load[2] = {};
  for (int m = 0; m < 2; ++m) {
    const ExpertMap& map = maps[m];
    const LayerWeights local =
        synthetic_layer_weights(config, DType::kBF16, kSeed, map.local_experts(me));
    for (const auto& [dispatcher, over_nccl] : {std::pair{DispatcherKind::kLowLatency, false},
                                                std::pair{DispatcherKind::kHighThroughput, false},
                                                std::pair{DispatcherKind::kHighThroughput, true}}) {
      CudaEpOptions options;
      options.dispatcher = dispatcher;
      options.high_throughput_over_nccl = over_nccl;
      options.low_latency_capacity = most_tokens;
      options.two_batch_overlap = true;
      options.overlap_free_multiprocessors = 8;
      options.timeout = std::chrono::seconds(60);
      CudaEpLayer layer(config, local, map, host, &testing::nccl_world(), options);
      layer.count_served_pairs(true);
      int64_t served = 0;
      for (const Step& s : steps) {
        SCOPED_TRACE(fmt::format("{}, {} map, {}{}, rank {}, M {}", config.name,
                                 m == 0 ? "contiguous" : "EPLB", dispatcher_name(dispatcher),
                                 over_nccl ? " over NCCL" : "", me, s.M));
        const DeviceTensor one = DeviceTensor::empty_like(DType::kBF16, {s.M, H});
        const DeviceTensor two = DeviceTensor::empty_like(DType::kBF16, {s.M, H});
        layer.forward_routed(s.hidden, s.ids, s.weights, one);
        const std::vector<int64_t>& pairs = layer.last_stats().pairs_per_local_slot;
        served += std::accumulate(pairs.begin(), pairs.end(), int64_t{0});
        layer.forward_routed_two_batch(s.hidden, s.ids, s.weights, two);
        testing::expect_close(one.to_host(), s.want, k, N);
        testing::expect_close(two.to_host(), s.want, k, N);
      }
      load[m] = max_over_mean_load(host, served);
    }
  }
  if (me == 0) {
    std::printf("%s on %d GPUs: max/mean pairs served per rank %.3f in order, %.3f on EPLB\n",
                config.name.c_str(), N, load[0], load[1]);
  }
  EXPECT_LT(load[1], load[0]) << "the EPLB placement served the pairs no more evenly";
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaEpFullShape,
                         ::testing::Values("qwen3-30b-a3b", "deepseek-v3"), [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace moe
