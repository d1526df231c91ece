// CudaEpLayer under mpirun (one process per GPU) against the single-GPU CUDA layer with the same
// weights and tokens: both data paths (the high-throughput one peer to peer and over NCCL),
// high-throughput batches larger than any before, ranks without tokens, experts without pairs,
// every token to one rank, replicas of experts on both ranks (also with every token on the
// replicated experts), the GPU's replica choice against the CPU path's, overflow of the
// low-latency capacity (an error on every rank, then a normal step), a low-latency step captured
// in a CUDA graph and replayed (one batch, and two micro-batches), two-batch steps with overlap
// against the single-GPU layer, the byte counters by peer and host, the pairs each local slot
// served (counted on the GPU) against the slots the CPU path's rule gives every rank's pairs, and
// a peer that never enters a step (the others fail within the timeout instead of hanging),
// shared experts (DeepSeek-V3-like and Qwen2-MoE-like layers) on each rank's own tokens, also
// captured in a CUDA graph, and the GPUs' own barrier of the benchmark (PeerBarrier).
//
// Equal within bf16 rounding (ep_rows_close.h says why not bitwise).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "kernels/cuda/shared_experts.h"
#include "moe/cuda_ep_layer.h"
#include "moe/ep_layer.h"
#include "moe/error.h"
#include "moe/expert_map.h"
#include "moe/experts.h"
#include "moe/layer.h"
#include "parallel/cuda/cuda_ep_world.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ep_rows_close.h"
#include "parallel/cuda/peer_barrier.h"
#include "parallel/cuda/replica_choice.h"
#include "parallel/cuda/small_ep_config.h"
#include "parallel/dispatch_plan.h"

namespace moe {
namespace {

using testing::DeviceTensor;

using testing::expect_close;

std::vector<int> hosts_of(const Communicator& c) {
  std::vector<int> hosts;
  for (int r = 0; r < c.size(); ++r) hosts.push_back(c.host_of(r));
  return hosts;
}

// The slots the CPU path's rule (parallel::ReplicaChooser) picks for `ids` [P] of `rank`; ids
// outside [0, E) get -1. The rule counts each expert's pairs, which the -1 pairs do not change.
std::vector<int32_t> cpu_slots(const std::vector<int32_t>& ids, const ExpertMap& map,
                               const Communicator& host, int rank) {
  std::vector<int32_t> valid, slots(ids.size(), -1);
  for (int32_t e : ids) {
    if (e >= 0 && e < map.num_experts()) valid.push_back(e);
  }
  const std::vector<int> hosts = hosts_of(host);
  parallel::ReplicaChooser chooser(map, rank, hosts);
  std::vector<int32_t> chosen(valid.size());
  chooser.choose(valid.data(), static_cast<int64_t>(valid.size()), chosen.data());
  for (size_t p = 0, i = 0; p < ids.size(); ++p) {
    if (ids[p] >= 0 && ids[p] < map.num_experts()) slots[p] = chosen[i++];
  }
  return slots;
}

// Rows this rank must send each rank: one per token and serving rank, the slots chosen by the
// CPU path's rule.
std::vector<int64_t> expected_rows(const Tensor& ids, const ExpertMap& map,
                                   const Communicator& host) {
  std::vector<int64_t> rows(static_cast<size_t>(map.num_ranks()), 0);
  const int64_t M = ids.size(0), k = ids.size(1);
  const std::vector<int32_t> slots =
      cpu_slots(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + M * k), map, host,
                host.rank());
  for (int64_t t = 0; t < M; ++t) {
    std::set<int32_t> ranks;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t slot = slots[static_cast<size_t>(t * k + j)];
      if (slot >= 0) ranks.insert(map.rank_of_slot(slot));
    }
    for (int32_t r : ranks) ++rows[static_cast<size_t>(r)];
  }
  return rows;
}

// Pairs each of this rank's slots must serve in a step whose ranks route `ids` [M, k] each: every
// rank's pairs given slots by the CPU path's rule, counted per slot and summed over the ranks (a
// collective), in this rank's local slot order.
std::vector<int64_t> expected_pairs_per_local_slot(const Tensor& ids, const ExpertMap& map,
                                                   Communicator& host) {
  const int64_t S = map.num_slots(), P = ids.size(0) * ids.size(1);
  std::vector<int64_t> mine(static_cast<size_t>(S), 0);
  for (int32_t slot : cpu_slots(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + P),
                                map, host, host.rank())) {
    if (slot >= 0) ++mine[static_cast<size_t>(slot)];
  }
  std::vector<int64_t> every_rank(static_cast<size_t>(S * host.size()));
  host.all_gather(mine.data(), S * static_cast<int64_t>(sizeof(int64_t)), every_rank.data());
  std::vector<int64_t> pairs;
  for (int32_t slot : map.local_slots(host.rank())) {
    int64_t served = 0;
    for (int r = 0; r < host.size(); ++r) served += every_rank[static_cast<size_t>(r * S + slot)];
    pairs.push_back(served);
  }
  return pairs;
}

// E experts over N >= 2 ranks as contiguous() places them, plus: expert 0 also on the last
// rank, expert E-1 also on rank 0 (replicas on two ranks: each rank serves its own pairs), a
// second replica of expert 1 on rank 0 and of expert E-2 on the last rank (pairs alternate
// between two slots of one rank; the other ranks choose between two remote slots). Slots are
// numbered rank by rank with the experts shuffled inside a rank, so slot ids are not expert ids.
ExpertMap replicated_map(int64_t E, int N) {
  const ExpertMap base = ExpertMap::contiguous(E, N);
  std::vector<std::pair<int32_t, int32_t>> placed;  // (rank, expert)
  for (int64_t s = 0; s < E; ++s) placed.emplace_back(base.rank_of_slot(s), base.expert_of_slot(s));
  const auto last = static_cast<int32_t>(N - 1), e = static_cast<int32_t>(E);
  placed.insert(placed.end(), {{last, 0}, {0, e - 1}, {0, 1}, {last, e - 2}});
  std::stable_sort(placed.begin(), placed.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : (a.second * 7) % e < (b.second * 7) % e;
  });
  std::vector<int32_t> experts, ranks;
  for (const auto& [rank, expert] : placed) {
    ranks.push_back(rank);
    experts.push_back(expert);
  }
  return ExpertMap(std::move(experts), std::move(ranks), E, N);
}

// A data path: the dispatcher, and for the high-throughput one whether it goes through NCCL
// although both GPUs reach each other peer to peer (both transports stay tested).
struct PathChoice {
  DispatcherKind dispatcher;
  bool over_nccl;
};

class CudaEp : public ::testing::TestWithParam<PathChoice> {
 protected:
  Communicator& host = testing::host_world();
  int me = host.rank(), N = host.size();
  MoeConfig config = testing::small_ep_config();
  LayerWeights full = synthetic_layer_weights(config, DType::kBF16, 7);
  ExpertMap map = ExpertMap::contiguous(config.routing.num_experts, N);

  CudaEpLayer make_layer(int64_t capacity = 64, bool two_batch = false) {
    CudaEpOptions options;
    options.two_batch_overlap = two_batch;
    options.overlap_free_multiprocessors = two_batch ? 8 : 0;
    options.dispatcher = GetParam().dispatcher;
    options.high_throughput_over_nccl = GetParam().over_nccl;
    options.low_latency_capacity = capacity;
    options.timeout = std::chrono::seconds(10);
    CudaEpLayer layer(config, local_layer_weights(full, map, me), map, host, &testing::nccl_world(),
                      options);
    layer.count_served_pairs(true);
    return layer;
  }

  // One routed step on every rank against fused_experts on this GPU with all the weights.
  void expect_routed_step(CudaEpLayer& layer, const Tensor& hidden, const Tensor& ids) {
    const int64_t M = hidden.size(0), k = config.routing.top_k;
    const Tensor weights = testing::random_normal(DType::kF32, {M, k}, 100 + me, 0.3f);
    const DeviceTensor d_hidden(hidden), d_ids(ids), d_weights(weights);
    const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    layer.forward_routed(d_hidden, d_ids, d_weights, out);
    const DeviceTensor w13(full.w13), w2(full.w2);
    const DeviceTensor want = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    if (M > 0) fused_experts(d_hidden, w13, w2, d_weights, d_ids, want);
    expect_close(out.to_host(), want.to_host(), k, N);
    EXPECT_EQ(layer.last_stats().rows_sent, expected_rows(ids, map, host));
    EXPECT_EQ(layer.last_stats().pairs_per_local_slot,
              expected_pairs_per_local_slot(ids, map, host));
  }
};

TEST_P(CudaEp, RoutedLayerMatchesTheSingleGpuLayer) {
  MoeLayer single(config, full, {Backend::kCuda});
  CudaEpLayer layer = make_layer();
  // Several steps of different sizes: buffers and flags are reused without resets.
  for (int64_t M : {int64_t{37} + 27 * me, int64_t{5}, int64_t{64}}) {
    SCOPED_TRACE(fmt::format("rank {} M {}", me, M));
    const Tensor hidden =
        testing::random_normal(DType::kBF16, {M, config.experts.hidden_size}, M * 10 + me);
    const DeviceTensor d_hidden(hidden);
    const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    layer.forward(d_hidden, out);
    expect_close(out.to_host(), single.forward(hidden), config.routing.top_k, N);
  }
}

// Two micro-batches on two streams, one's transfers overlapping the other's experts (whose
// persistent grids leave SMs free), against the single-GPU layer, interleaved with one-batch
// steps of the same layer: each micro-batch is a step of its own on its own buffers. Sizes
// include an empty second micro-batch (M = 1) and an empty step.
TEST_P(CudaEp, TwoBatchStepMatchesTheSingleGpuLayer) {
  MoeLayer single(config, full, {Backend::kCuda});
  CudaEpLayer layer = make_layer(64, /*two_batch=*/true);
  const int64_t H = config.experts.hidden_size, k = config.routing.top_k;
  for (int64_t M : {int64_t{37} + 27 * me, int64_t{1}, int64_t{0}, int64_t{64}}) {
    SCOPED_TRACE(fmt::format("rank {} M {}", me, M));
    const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, M * 10 + me);
    Tensor ids(DType::kI32, {M, k});
    testing::fill_uniform_int(ids, 40 + M + me, -1,
                              static_cast<int32_t>(config.routing.num_experts - 1));
    const Tensor weights = testing::random_normal(DType::kF32, {M, k}, 60 + M + me, 0.3f);
    const DeviceTensor d_hidden(hidden), d_ids(ids), d_weights(weights);
    const DeviceTensor w13(full.w13), w2(full.w2);
    const DeviceTensor want = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    if (M > 0) fused_experts(d_hidden, w13, w2, d_weights, d_ids, want);
    const DeviceTensor one = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    const DeviceTensor two = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    layer.forward_routed(d_hidden, d_ids, d_weights, one);
    const std::vector<int64_t> one_batch_rows = layer.last_stats().rows_sent;
    EXPECT_EQ(layer.last_stats().pairs_per_local_slot,
              expected_pairs_per_local_slot(ids, map, host));
    layer.forward_routed_two_batch(d_hidden, d_ids, d_weights, two);
    expect_close(one.to_host(), want.to_host(), k, N);
    expect_close(two.to_host(), want.to_host(), k, N);
    // A token's row goes once to each serving rank, whichever micro-batch holds it.
    EXPECT_EQ(layer.last_stats().rows_sent, expected_rows(ids, map, host));
    EXPECT_EQ(layer.last_stats().rows_sent, one_batch_rows);
    // Both micro-batches' pairs, each slot's counted once (one replica per expert here).
    EXPECT_EQ(layer.last_stats().pairs_per_local_slot,
              expected_pairs_per_local_slot(ids, map, host));

    if (M == 0) continue;  // the same M on every rank: all skip the routed step alike
    const DeviceTensor routed = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    layer.forward_two_batch(d_hidden, routed);
    expect_close(routed.to_host(), single.forward(hidden), k, N);
  }
}

// Shared experts run on each rank's own tokens after combine, against the single-GPU layer (which
// runs them after its routed sum): one batch and two micro-batches, routed by the router, with a
// rank without tokens.
TEST_P(CudaEp, SharedExpertsMatchTheSingleGpuLayer) {
  for (const MoeConfig& shared_config :
       {testing::small_ep_deepseek_v3(), testing::small_ep_qwen2_moe()}) {
    config = shared_config;
    full = synthetic_layer_weights(config, DType::kBF16, 11);
    map = ExpertMap::contiguous(config.routing.num_experts, N);
    MoeLayer single(config, full, {Backend::kCuda});
    CudaEpLayer layer = make_layer(64, /*two_batch=*/true);
    const int64_t H = config.experts.hidden_size, k = config.routing.top_k;
    for (int64_t M :
         {int64_t{37} + 27 * me, int64_t{1}, me == 1 ? int64_t{0} : int64_t{20}, int64_t{64}}) {
      SCOPED_TRACE(fmt::format("{}: rank {} M {}", config.name, me, M));
      const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, M * 10 + me);
      const DeviceTensor d_hidden(hidden);
      const DeviceTensor one = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
      const DeviceTensor two = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
      layer.forward(d_hidden, one);
      if (M > 0) {
        EXPECT_GT(layer.last_stats().shared_us, 0.0) << "shared time not recorded";
      }
      layer.forward_two_batch(d_hidden, two);
      if (M == 0) continue;
      const Tensor want = single.forward(hidden);
      expect_close(one.to_host(), want, k, N, /*shared_experts=*/true);
      expect_close(two.to_host(), want, k, N, /*shared_experts=*/true);
    }
  }
}

// Bytes per peer from the row counts (a token row with its ids and weights out, a partial row
// back), what each rank receives being what its peers send it, split by the ranks' hosts.
TEST_P(CudaEp, BytesPerPeerSplitBySameAndCrossHost) {
  CudaEpLayer layer = make_layer(64, /*two_batch=*/true);
  const int64_t M = 29 + 13 * me, H = config.experts.hidden_size, k = config.routing.top_k;
  const int64_t out_bytes = H * 2 + k * 8, back_bytes = H * 2;
  const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, 70 + me);
  const DeviceTensor d_hidden(hidden);
  const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
  for (bool two_batch : {false, true}) {
    SCOPED_TRACE(fmt::format("rank {} two_batch {}", me, two_batch));
    two_batch ? layer.forward_two_batch(d_hidden, out) : layer.forward(d_hidden, out);
    const CudaEpStats& stats = layer.last_stats();
    ASSERT_EQ(stats.bytes_sent.size(), static_cast<size_t>(N));
    ASSERT_EQ(stats.bytes_received.size(), static_cast<size_t>(N));
    TrafficSplit sent, received;
    int64_t rows = 0;
    for (int p = 0; p < N; ++p) {
      const auto i = static_cast<size_t>(p);
      rows += stats.rows_sent[i];
      EXPECT_EQ(stats.bytes_sent[i],
                stats.rows_sent[i] * out_bytes + stats.rows_received[i] * back_bytes);
      EXPECT_EQ(stats.bytes_received[i],
                stats.rows_received[i] * out_bytes + stats.rows_sent[i] * back_bytes);
      int64_t& to = p == me ? sent.self : host.same_host(p, me) ? sent.same_host : sent.cross_host;
      int64_t& from = p == me                 ? received.self
                      : host.same_host(p, me) ? received.same_host
                                              : received.cross_host;
      to += stats.bytes_sent[i];
      from += stats.bytes_received[i];
    }
    // Every token with a routed pair goes somewhere (the router picks k experts).
    EXPECT_GE(rows, M);
    EXPECT_EQ(stats.sent.self, sent.self);
    EXPECT_EQ(stats.sent.same_host, sent.same_host);
    EXPECT_EQ(stats.sent.cross_host, sent.cross_host);
    EXPECT_EQ(stats.received.self, received.self);
    EXPECT_EQ(stats.received.same_host, received.same_host);
    EXPECT_EQ(stats.received.cross_host, received.cross_host);
    EXPECT_EQ(stats.bytes_to_peers, sent.same_host + sent.cross_host);
    // This test's ranks share one host: nothing crosses hosts.
    if (host.same_host(0, N - 1)) {
      EXPECT_EQ(stats.sent.cross_host, 0);
      EXPECT_EQ(stats.received.cross_host, 0);
    }
    // What rank p received from this rank is what this rank sent p.
    std::vector<int64_t> all_received(static_cast<size_t>(N * N));
    host.all_gather(stats.bytes_received.data(), N * static_cast<int64_t>(sizeof(int64_t)),
                    all_received.data());
    for (int p = 0; p < N; ++p) {
      EXPECT_EQ(all_received[static_cast<size_t>(p * N + me)],
                stats.bytes_sent[static_cast<size_t>(p)])
          << "bytes rank " << p << " received from rank " << me;
    }
  }
}

TEST_P(CudaEp, RankWithoutTokens) {
  CudaEpLayer layer = make_layer();
  for (int step = 0; step < 2; ++step) {
    const int64_t M = me == 1 ? 0 : 20;  // rank 1 idles; the others still need its experts
    const Tensor hidden =
        testing::random_normal(DType::kBF16, {M, config.experts.hidden_size}, 3 + me);
    Tensor ids(DType::kI32, {M, config.routing.top_k});
    testing::fill_uniform_int(ids, 11 + me, 0,
                              static_cast<int32_t>(config.routing.num_experts - 1));
    expect_routed_step(layer, hidden, ids);
  }
}

TEST_P(CudaEp, ExpertsWithoutPairsAndUnusedSlots) {
  CudaEpLayer layer = make_layer();
  const Tensor hidden = testing::random_normal(DType::kBF16, {1, config.experts.hidden_size}, me);
  Tensor ids(DType::kI32, {1, config.routing.top_k});
  // Two slots name the same expert of one rank (the row still travels once), one slot is empty.
  ids.data<int32_t>()[0] = 1;
  ids.data<int32_t>()[1] = 1;
  ids.data<int32_t>()[2] = -1;
  ids.data<int32_t>()[3] = static_cast<int32_t>(config.routing.num_experts - 1);
  expect_routed_step(layer, hidden, ids);
}

TEST_P(CudaEp, AllTokensToOneRank) {
  CudaEpLayer layer = make_layer();
  const int64_t M = 48, k = config.routing.top_k;
  const std::span<const int32_t> rank0 = map.local_slots(0);
  const Tensor hidden = testing::random_normal(DType::kBF16, {M, config.experts.hidden_size}, me);
  Tensor ids(DType::kI32, {M, k});
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      ids.data<int32_t>()[t * k + j] = rank0[static_cast<size_t>((t + j) % rank0.size())];
    }
  }
  expect_routed_step(layer, hidden, ids);
}

// The high-throughput path takes any batch: its peer-to-peer buffers grow (collectively) when a
// step has more tokens than any before, and keep their size for smaller steps.
TEST_P(CudaEp, HighThroughputTakesBatchesLargerThanAnyBefore) {
  if (GetParam().dispatcher != DispatcherKind::kHighThroughput) GTEST_SKIP();
  CudaEpLayer layer = make_layer();
  for (int64_t M : {int64_t{3}, int64_t{90} + 11 * me, int64_t{0}, int64_t{7}, int64_t{130}}) {
    SCOPED_TRACE(fmt::format("rank {} M {}", me, M));
    const Tensor hidden =
        testing::random_normal(DType::kBF16, {M, config.experts.hidden_size}, 20 + M + me);
    Tensor ids(DType::kI32, {M, config.routing.top_k});
    testing::fill_uniform_int(ids, 30 + M + me, 0,
                              static_cast<int32_t>(config.routing.num_experts - 1));
    expect_routed_step(layer, hidden, ids);
  }
}

TEST_P(CudaEp, ReplicasOnBothRanks) {
  map = replicated_map(config.routing.num_experts, N);
  ASSERT_TRUE(map.has_replicas());
  MoeLayer single(config, full, {Backend::kCuda});
  CudaEpLayer layer = make_layer(600);  // the most tokens per rank below
  const int64_t H = config.experts.hidden_size, k = config.routing.top_k;
  for (int64_t M : {int64_t{41} + 9 * me, int64_t{3}}) {
    SCOPED_TRACE(fmt::format("rank {} M {} (routed by the router)", me, M));
    const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, M * 10 + me);
    const DeviceTensor d_hidden(hidden);
    const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, hidden.shape());
    layer.forward(d_hidden, out);
    expect_close(out.to_host(), single.forward(hidden), k, N);
  }
  for (int64_t M : {int64_t{0}, int64_t{600}, int64_t{17} + me}) {
    SCOPED_TRACE(fmt::format("rank {} M {} (random routing)", me, M));
    const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, 5 + M + me);
    Tensor ids(DType::kI32, {M, k});
    testing::fill_uniform_int(ids, 21 + me, -1,
                              static_cast<int32_t>(config.routing.num_experts - 1));
    expect_routed_step(layer, hidden, ids);
  }
}

TEST_P(CudaEp, EveryPairOnTheReplicatedExperts) {
  map = replicated_map(config.routing.num_experts, N);
  CudaEpLayer layer = make_layer();
  const int64_t M = 64, k = config.routing.top_k, E = config.routing.num_experts;
  const int32_t hot[] = {0, 1, static_cast<int32_t>(E - 1), static_cast<int32_t>(E - 2)};
  const Tensor hidden = testing::random_normal(DType::kBF16, {M, config.experts.hidden_size}, me);
  Tensor ids(DType::kI32, {M, k});
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t j = 0; j < k; ++j) ids.data<int32_t>()[t * k + j] = hot[(t + j) % 4];
  }
  expect_routed_step(layer, hidden, ids);
}

// The GPU's choice is the CPU path's, slot for slot, on every rank: several chunks of the
// ranking kernel, ids outside [0, E), and the plain lookup when no expert has two candidates.
TEST(CudaEpReplicaChoice, MatchesTheCpuRule) {
  Communicator& host = testing::host_world();
  const int me = host.rank(), N = host.size();
  const auto permuted = [&](int64_t E) {  // one slot per expert, slot ids not expert ids
    std::vector<int32_t> experts, ranks;
    const ExpertMap base = ExpertMap::contiguous(E, N);
    for (int64_t s = 0; s < E; ++s) {
      experts.push_back(static_cast<int32_t>(E - 1 - s));
      ranks.push_back(base.rank_of_slot(s));
    }
    return ExpertMap(std::move(experts), std::move(ranks), E, N);
  };
  const std::vector<std::pair<const char*, ExpertMap>> maps = {
      {"replicated E=16", replicated_map(16, N)},
      {"replicated E=512", replicated_map(512, N)},
      {"permuted E=16", permuted(16)},
  };
  for (const auto& [name, map] : maps) {
    const std::vector<int> hosts = hosts_of(host);
    const parallel::ReplicaCandidates table = parallel::replica_candidates(map, me, hosts);
    const auto upload = [](const std::vector<int32_t>& values) {
      return DeviceTensor(TensorView(const_cast<int32_t*>(values.data()), DType::kI32,
                                     {static_cast<int64_t>(values.size())}));
    };
    const DeviceTensor offsets = upload(table.offsets), candidates = upload(table.slots);
    for (int64_t P : {int64_t{1}, int64_t{511}, int64_t{3001}}) {
      SCOPED_TRACE(fmt::format("rank {} {} pairs {}", me, name, P));
      Tensor ids(DType::kI32, {P});
      testing::fill_uniform_int(ids, static_cast<uint64_t>(P + me), -1,
                                static_cast<int32_t>(map.num_experts()));
      const DeviceTensor d_ids(ids);
      const DeviceTensor slots = DeviceTensor::empty_like(DType::kI32, {P});
      cuda::ep::ReplicaChoiceArgs args;
      args.topk_ids = static_cast<const int32_t*>(d_ids.view().data);
      args.num_pairs = P;
      args.num_experts = map.num_experts();
      args.candidate_offsets = static_cast<const int32_t*>(offsets.view().data);
      args.candidates = static_cast<const int32_t*>(candidates.view().data);
      args.max_candidates = table.max_count();
      args.rank = me;
      args.slot_ids = static_cast<int32_t*>(slots.view().data);
      cuda::ep::choose_replicas(args, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Tensor got = slots.to_host();
      const std::vector<int32_t> want = cpu_slots(
          std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + P), map, host, me);
      for (int64_t p = 0; p < P; ++p) {
        ASSERT_EQ(got.data<int32_t>()[p], want[static_cast<size_t>(p)])
            << "pair " << p << " (expert " << ids.data<int32_t>()[p] << ")";
      }
    }
  }
}

// A layer of `config` (synthetic weights, seed 7) holding this rank's experts of `map`.
CudaEpLayer small_layer(const MoeConfig& config, const ExpertMap& map,
                        const CudaEpOptions& options) {
  Communicator& host = testing::host_world();
  const LayerWeights full = synthetic_layer_weights(config, DType::kBF16, 7);
  return CudaEpLayer(config, local_layer_weights(full, map, host.rank()), map, host, nullptr,
                     options);
}

// The overflow travels in the dispatch counts and, to the ranks that did not see it, in the
// combine flags.
TEST(CudaEpLowLatency, OverflowFailsEveryRankWithTheCountsThenTheNextStepRuns) {
  Communicator& host = testing::host_world();
  const int me = host.rank(), N = host.size();
  const MoeConfig config = testing::small_ep_config();
  const ExpertMap map = ExpertMap::contiguous(config.routing.num_experts, N);
  CudaEpOptions options;
  options.low_latency_capacity = 8;
  CudaEpLayer layer = small_layer(config, map, options);
  const int64_t k = config.routing.top_k, H = config.experts.hidden_size;
  const auto step = [&](int64_t M) {
    const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, me);
    Tensor ids(DType::kI32, {M, k});
    const int32_t last_expert = map.local_slots(N - 1).back();
    for (int64_t i = 0; i < M * k; ++i) ids.data<int32_t>()[i] = last_expert;  // all to rank N-1
    const Tensor weights = testing::random_normal(DType::kF32, {M, k}, me);
    const DeviceTensor d_hidden(hidden), d_ids(ids), d_weights(weights);
    const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, {M, H});
    layer.forward_routed(d_hidden, d_ids, d_weights, out);
  };
  // Rank 0 sends 20 rows to rank N-1; every rank must fail this step, naming the counts.
  try {
    step(me == 0 ? 20 : 2);
    ADD_FAILURE() << "rank " << me << ": no error for 20 rows over a capacity of 8";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("capacity of 8 rows"), std::string::npos) << message;
    if (me == 0 || me == N - 1) {
      EXPECT_NE(message.find(fmt::format("rank 0 needed 20 rows for rank {}", N - 1)),
                std::string::npos)
          << message;
    }
  }
  EXPECT_NO_THROW(step(8));  // within the capacity: the buffers and flags are consistent again
}

TEST(CudaEpLowLatency, CapturedStepReplaysInACudaGraph) {
  Communicator& host = testing::host_world();
  const int me = host.rank(), N = host.size();
  const MoeConfig routed_only = testing::small_ep_config();
  const int64_t E = routed_only.routing.num_experts;
  // With replicas the step also holds the replica choice. The step number each kernel reads
  // lives on the device.
  struct GraphCase {
    ExpertMap map;
    bool two_batch;
    bool shared;  // a gated shared MLP: its cuBLAS GEMMs inside the graph too
  };
  for (const GraphCase& c :
       {GraphCase{ExpertMap::contiguous(E, N), false, false},
        GraphCase{replicated_map(E, N), false, false}, GraphCase{replicated_map(E, N), true, false},
        GraphCase{ExpertMap::contiguous(E, N), false, true},
        GraphCase{replicated_map(E, N), true, true}}) {
    SCOPED_TRACE(fmt::format("rank {}: {} slots, two_batch {}, shared {}", me, c.map.num_slots(),
                             c.two_batch, c.shared));
    MoeConfig config = routed_only;
    if (c.shared) {
      config.experts.shared_intermediate_size = 96;
      config.experts.shared_gate = true;
    }
    const LayerWeights full = synthetic_layer_weights(config, DType::kBF16, 7);
    CudaEpOptions options;
    options.two_batch_overlap = c.two_batch;
    options.overlap_free_multiprocessors = 8;
    CudaEpLayer layer(config, local_layer_weights(full, c.map, me), c.map, host, nullptr, options);
    const int64_t M = 32, k = config.routing.top_k, H = config.experts.hidden_size;
    Tensor ids(DType::kI32, {M, k});
    testing::fill_uniform_int(ids, 5 + me, 0, static_cast<int32_t>(E - 1));
    const Tensor weights = testing::random_normal(DType::kF32, {M, k}, 9 + me, 0.3f);
    const DeviceTensor d_ids(ids), d_weights(weights), w13(full.w13), w2(full.w2);
    DeviceTensor d_hidden(testing::random_normal(DType::kBF16, {M, H}, me));
    const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, {M, H});
    // Sizes every buffer.
    c.two_batch ? layer.forward_routed_two_batch(d_hidden, d_ids, d_weights, out)
                : layer.forward_routed(d_hidden, d_ids, d_weights, out);

    auto stream = static_cast<cudaStream_t>(layer.stream());
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    if (c.two_batch) {
      layer.two_batch_step(d_hidden, d_ids, d_weights, out);  // forks a second stream and joins
    } else {
      layer.dispatch(d_hidden, d_ids, d_weights);
      layer.experts();
      layer.combine(out);
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    // The expected output: the routed experts on this GPU with all the weights, then the shared
    // experts added on the same (legacy default) stream.
    const cuda::SharedExperts shared =
        c.shared ? cuda::SharedExperts(full.shared_w13, full.shared_w2, full.shared_gate)
                 : cuda::SharedExperts();
    cuda::SharedExpertsWorkspace shared_workspace;
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE(fmt::format("rank {} replay {}", me, replay));
      const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, 100 * replay + me);
      ASSERT_EQ(cudaMemcpyAsync(d_hidden.view().data, hidden.data<void>(), hidden.nbytes(),
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      layer.finish_step();
      const DeviceTensor want = DeviceTensor::empty_like(DType::kBF16, {M, H});
      fused_experts(d_hidden, w13, w2, d_weights, d_ids, want);
      if (c.shared)
        shared.run(d_hidden.view().data, M, want.view().data, shared_workspace, nullptr);
      expect_close(out.to_host(), want.to_host(), k, N, c.shared);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST(CudaEpLowLatency, PeerThatSkipsAStepFailsTheOthersWithinTheTimeout) {
  Communicator& host = testing::host_world();
  const int me = host.rank(), N = host.size();
  const MoeConfig config = testing::small_ep_config();
  CudaEpOptions options;
  options.timeout = std::chrono::milliseconds(500);
  CudaEpLayer layer =
      small_layer(config, ExpertMap::contiguous(config.routing.num_experts, N), options);
  if (me == N - 1) return;  // stalls: never enters the step (its layer still leaves collectively)
  const int64_t M = 4, k = config.routing.top_k, H = config.experts.hidden_size;
  Tensor ids(DType::kI32, {M, k});
  testing::fill_uniform_int(ids, me, 0, static_cast<int32_t>(config.routing.num_experts - 1));
  const DeviceTensor d_hidden(testing::random_normal(DType::kBF16, {M, H}, me)), d_ids(ids);
  const DeviceTensor d_weights(testing::random_normal(DType::kF32, {M, k}, me));
  const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, {M, H});
  const auto start = std::chrono::steady_clock::now();
  try {
    layer.forward_routed(d_hidden, d_ids, d_weights, out);
    ADD_FAILURE() << "rank " << me << ": no error although rank " << N - 1 << " never answered";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(fmt::format("timed out waiting for rank {} in dispatch", N - 1)),
              std::string::npos)
        << message;
  }
  // Dispatch and combine each wait at most the timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // The layer stays failed: a peer is in an unknown step.
  EXPECT_THROW(layer.finish_step(), Error);
}

// The GPUs' own barrier (the benchmark's start line, parallel/cuda/peer_barrier.h): a rank that
// arrives late holds the others back on their GPUs, and one that never arrives is reported after
// the timeout, by rank.
TEST(CudaEpPeerBarrier, WaitsForTheLastRankAndNamesOneThatNeverCame) {
  Communicator& host = testing::host_world();
  const int me = host.rank(), N = host.size();
  cuda::ep::PeerBarrier barrier(host, /*timeout_ns=*/300'000'000);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaEvent_t before = nullptr, after = nullptr;
  ASSERT_EQ(cudaEventCreate(&before), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&after), cudaSuccess);
  host.barrier();
  if (me == 0) cuda::ep::hold_stream(50'000, stream);  // rank 0 arrives 50 ms late
  ASSERT_EQ(cudaEventRecord(before, stream), cudaSuccess);
  barrier.arrive_and_wait(stream);
  ASSERT_EQ(cudaEventRecord(after, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, before, after), cudaSuccess);
  if (me != 0) {
    EXPECT_GT(ms, 25.0f) << "rank " << me << " left the barrier before rank 0 came";
  }
  EXPECT_NO_THROW(barrier.throw_if_timed_out());

  if (me != N - 1) barrier.arrive_and_wait(stream);  // rank N - 1 never comes to this one
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  if (me != N - 1) {
    try {
      barrier.throw_if_timed_out();
      ADD_FAILURE() << "rank " << me << ": no error although rank " << N - 1 << " never came";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(fmt::format("for rank {} in a barrier", N - 1)), std::string::npos)
          << message;
    }
  }
  cudaEventDestroy(before);
  cudaEventDestroy(after);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Paths, CudaEp,
                         ::testing::Values(PathChoice{DispatcherKind::kLowLatency, false},
                                           PathChoice{DispatcherKind::kHighThroughput, false},
                                           PathChoice{DispatcherKind::kHighThroughput, true}),
                         [](const auto& info) {
                           return std::string(dispatcher_name(info.param.dispatcher)) +
                                  (info.param.over_nccl ? "_nccl" : "");
                         });

}  // namespace
}  // namespace moe
