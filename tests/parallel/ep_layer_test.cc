// Expert parallelism on threads: for N = 1..4 ranks the EP layer's output equals the single-process
// layer's bit for bit, for every routing family, both dispatchers, with and without two-batch
// overlap, ranks with no tokens, experts with no pairs, E not divisible by N, every token routed to
// one rank and experts replicated on two ranks; low-latency overflow fails every rank with the
// counts; the traffic counters add up across ranks and count results in cache3's dtype.
#include <numeric>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "moe/eplb.h"
#include "moe/error.h"
#include "parallel/ep_case.h"
#include "parallel/rank_threads.h"

namespace moe {
namespace {

using testing::EpCase;
using testing::run_ep_case;

// Tokens per rank for N ranks: rank 1 has none when N > 1, the others a few.
std::vector<int64_t> tokens_for(int N, int64_t scale) {
  std::vector<int64_t> tokens;
  for (int r = 0; r < N; ++r) tokens.push_back(r == 1 ? 0 : scale + 3 * r);
  return tokens;
}

TEST(EpLayer, EveryFamilyEqualsTheSingleProcessLayerBitwise) {
  for (const char* family : {"qwen3", "qwen2", "deepseek", "llama4", "gpt-oss"}) {
    for (int N = 1; N <= 4; ++N) {
      for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
        EpCase c;
        c.family = family;
        c.num_ranks = N;
        c.steps = {tokens_for(N, 5), tokens_for(N, 1)};
        c.options.dispatcher = kind;
        c.options.low_latency_capacity = 16;
        c.seed = static_cast<uint64_t>(N);
        run_ep_case(c);
      }
    }
  }
}

// bf16 results travel in bf16 (cache3's dtype), f16 results in f32: both dispatchers, with and
// without two-batch overlap.
TEST(EpLayer, LowPrecisionIsBitwiseToo) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (const char* family : {"qwen3", "deepseek"}) {
      for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
        for (bool overlap : {false, true}) {
          EpCase c;
          c.family = family;
          c.dtype = dtype;
          c.num_ranks = 3;
          c.steps = {{9, 4, 0}, {2, 5, 1}};
          c.options.dispatcher = kind;
          c.options.low_latency_capacity = 16;
          c.options.two_batch_overlap = overlap;
          run_ep_case(c);
        }
      }
    }
  }
}

// A bf16 layer whose hidden size the tile kernel takes: on the amx path both layers route through
// the router's bf16 tiles (kernels/cpu/layer_router.h), elsewhere through its f32 panels.
TEST(EpLayer, Bf16RouterOfATileSizeIsBitwiseToo) {
  for (const char* family : {"qwen3", "deepseek", "gpt-oss"}) {
    EpCase c;
    c.family = family;
    c.hidden_size = 64;
    c.dtype = DType::kBF16;
    c.num_ranks = 3;
    c.steps = {{19, 4, 0}, {1, 33, 2}};
    run_ep_case(c);
  }
}

TEST(EpLayer, ExpertsNotDivisibleByRanks) {
  for (int N : {2, 3, 4}) {
    for (int64_t E : {int64_t{9}, int64_t{13}}) {
      EpCase c;
      c.num_experts = E;
      c.num_ranks = N;
      c.steps = {tokens_for(N, 11)};
      run_ep_case(c);
    }
  }
}

TEST(EpLayer, TwoBatchOverlapGivesTheSameOutput) {
  for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
    for (int N : {1, 2, 4}) {
      EpCase c;
      c.family = "qwen2";
      c.num_ranks = N;
      c.steps = {tokens_for(N, 7), std::vector<int64_t>(static_cast<size_t>(N), 1),
                 std::vector<int64_t>(static_cast<size_t>(N), 0)};
      c.options.dispatcher = kind;
      c.options.two_batch_overlap = true;
      run_ep_case(c);
    }
  }
}

TEST(EpLayer, ExpertsWithoutPairsAndRanksWithoutWork) {
  // One token in the whole group: at most k = 4 of 12 experts get a pair.
  EpCase c;
  c.num_ranks = 4;
  c.steps = {{0, 0, 1, 0}};
  const testing::EpRun run = run_ep_case(c);
  int64_t idle_slots = 0, pairs = 0;
  for (const EpStepStats& s : run.stats[0]) {
    for (int32_t n : s.pairs_per_local_slot) {
      idle_slots += n == 0;
      pairs += n;
    }
  }
  EXPECT_EQ(pairs, 4);
  EXPECT_EQ(idle_slots, 8);
}

TEST(EpLayer, EveryTokenRoutedToOneRank) {
  // gpt-oss routes on logits plus a router bias: a large bias on rank 0's four experts makes
  // every token pick exactly those.
  for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
    EpCase c;
    c.family = "gpt-oss";
    c.num_ranks = 3;
    c.steps = {{6, 9, 2}};
    c.options.dispatcher = kind;
    c.edit_weights = [](LayerWeights& w) {
      for (int e = 0; e < 4; ++e) w.router_bias.data<float>()[e] = 100.0f;
    };
    const testing::EpRun run = run_ep_case(c);
    const std::vector<EpStepStats>& stats = run.stats[0];
    EXPECT_EQ(stats[0].pairs_received, 17 * 4);
    EXPECT_EQ(stats[1].pairs_received, 0);
    EXPECT_EQ(stats[2].pairs_received, 0);
    // Four pairs per token on one rank: one row per token; rank 0's own never travel.
    EXPECT_EQ(stats[1].rows_sent, 9);
    EXPECT_EQ(stats[0].rows_sent, 0);
    EXPECT_EQ(stats[0].local_pairs, 6 * 4);
  }
}

TEST(EpLayer, ReplicasOnTwoRanksShareTheLoad) {
  // 10 experts in 12 slots over 3 ranks: experts 0 and 5 have a replica on two ranks each.
  const std::vector<int32_t> slot_experts = {0, 1, 2, 3, 5, 4, 5, 6, 0, 7, 8, 9};
  const std::vector<int32_t> slot_ranks = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
  for (bool overlap : {false, true}) {
    EpCase c;
    c.num_experts = 10;
    c.num_ranks = 3;
    c.steps = {{40, 40, 40}};
    c.options.two_batch_overlap = overlap;
    c.map = ExpertMap(slot_experts, slot_ranks, 10, 3);
    const testing::EpRun run = run_ep_case(c);
    const std::vector<EpStepStats>& stats = run.stats[0];
    // Expert 0: slot 0 on rank 0 (local index 0) and slot 8 on rank 2 (local index 0). Rank 1
    // has neither, so its pairs of expert 0 split between them; ranks 0 and 2 keep theirs.
    EXPECT_GT(stats[0].pairs_per_local_slot[0], 0);
    EXPECT_GT(stats[2].pairs_per_local_slot[0], 0);
    // Expert 5: slots 4 and 6, both on rank 1.
    EXPECT_GT(stats[1].pairs_per_local_slot[0], 0);
    EXPECT_GT(stats[1].pairs_per_local_slot[2], 0);
  }
}

TEST(EpLayer, EplbPlacementWithRedundantExperts) {
  // EPLB's own placement for skewed loads: 12 experts in 16 slots on 4 ranks.
  std::vector<double> loads(12);
  for (size_t e = 0; e < loads.size(); ++e) loads[e] = 1000.0 / static_cast<double>(1 + e);
  EplbConfig eplb;
  eplb.num_replicas = 16;
  eplb.num_gpus = 4;
  const ExpertPlacement placement = rebalance_experts(std::span<const double>(loads), 1, 12, eplb);
  for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
    EpCase c;
    c.family = "deepseek";
    c.num_ranks = 4;
    c.steps = {{30, 0, 12, 25}};
    c.options.dispatcher = kind;
    c.options.low_latency_capacity = 30;
    c.map = ExpertMap::from_phy2log(placement.phy2log, 12, 4);
    ASSERT_TRUE(c.map->has_replicas());
    run_ep_case(c);
  }
}

TEST(EpLayer, LowLatencyOverflowFailsEveryRankWithTheCounts) {
  EpCase c;
  c.num_ranks = 3;
  c.steps = {{10, 1, 2}};
  c.options.dispatcher = DispatcherKind::kLowLatency;
  c.options.low_latency_capacity = 4;
  const testing::EpRun run = run_ep_case(c, /*expect_errors=*/true);
  for (int r = 0; r < 3; ++r) {
    const std::string& e = run.errors[static_cast<size_t>(r)];
    EXPECT_NE(e.find("low-latency dispatch overflow: capacity 4 token rows per peer"),
              std::string::npos)
        << "rank " << r << ": " << e;
    EXPECT_NE(e.find("rank 0 has "), std::string::npos) << e;
    EXPECT_EQ(e.find("rank 1 has"), std::string::npos) << e;
  }
  EXPECT_EQ(run.errors[0], run.errors[1]);
  EXPECT_EQ(run.errors[0], run.errors[2]);
}

TEST(EpLayer, AfterAnOverflowTheNextStepWorks) {
  EpCase c;
  c.num_ranks = 3;
  c.steps = {{2, 3, 1}};
  c.options.dispatcher = DispatcherKind::kLowLatency;
  c.options.low_latency_capacity = 4;
  const testing::EpCaseData data = testing::prepare_ep_case(c);
  std::vector<testing::EpRankResult> results(3);
  const auto errors = testing::run_rank_threads(3, [&](Communicator& comm) {
    const int me = comm.rank();
    EpOptions options = c.options;
    options.num_threads = 1;
    EpMoeLayer layer(data.config, local_layer_weights(data.full, *data.map, me), *data.map, comm,
                     options);
    // Zero logits route every token to experts 0-3 (ties go to the lower id), all on rank 0:
    // rank 2 sends it a row for each of its 17 tokens.
    const Tensor too_many = Tensor::zeros(DType::kF32, {me == 2 ? 17 : 1, 40});
    testing::expect_error([&] { layer.forward(too_many); },
                          {"overflow", "rank 2 has 17 rows for rank 0"});
    testing::run_ep_rank(c, data, comm, results[static_cast<size_t>(me)]);
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(errors));
  for (const testing::EpRankResult& r : results) EXPECT_EQ(r.mismatches, 0) << r.first_mismatch;
}

TEST(EpLayer, TrafficCountersAddUpAcrossRanks) {
  // Token rows travel in the hidden dtype; results in cache3's: bf16 for a bf16 layer, else f32.
  for (auto [dtype, result_bytes] :
       {std::pair{DType::kF32, 4}, {DType::kBF16, 2}, {DType::kF16, 4}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    EpCase c;
    c.dtype = dtype;
    c.num_ranks = 4;
    c.ranks_per_host = 2;
    c.steps = {{12, 0, 7, 20}};
    const testing::EpRun run = run_ep_case(c);
    const std::vector<EpStepStats>& stats = run.stats[0];
    const int64_t H = 40, k = 4, row_bytes = H * static_cast<int64_t>(dtype_size(dtype));
    int64_t rows_in = 0;
    for (int p = 0; p < 4; ++p) {
      const EpStepStats& s = stats[static_cast<size_t>(p)];
      for (int q = 0; q < 4; ++q) {
        // What p sent q is what q received from p, in both phases.
        EXPECT_EQ(s.dispatch_bytes_sent[q], stats[q].dispatch_bytes_received[p]) << p << "->" << q;
        EXPECT_EQ(s.combine_bytes_sent[q], stats[q].combine_bytes_received[p]) << p << "->" << q;
      }
      // Combine returns one result row per pair served by another rank; a rank's own stay put.
      const int64_t combined = std::accumulate(s.combine_bytes_received.begin(),
                                               s.combine_bytes_received.end(), int64_t{0});
      EXPECT_EQ(combined, (s.num_pairs - s.local_pairs) * H * result_bytes);
      EXPECT_EQ(s.combine_bytes_sent[p], 0);
      EXPECT_EQ(s.dispatch_bytes_sent[p], 0);
      EXPECT_EQ(s.upper_bound_bytes, s.num_pairs * row_bytes);
      const TrafficSplit& rows = s.row_payload;
      EXPECT_EQ(rows.same_host + rows.cross_host, s.rows_sent * row_bytes);
      EXPECT_LE(rows.self + rows.same_host + rows.cross_host, s.upper_bound_bytes);
      const TrafficSplit& d = s.dispatch_sent;
      EXPECT_EQ(
          d.self + d.same_host + d.cross_host,
          std::accumulate(s.dispatch_bytes_sent.begin(), s.dispatch_bytes_sent.end(), int64_t{0}));
      EXPECT_EQ(d.self, 0);
      EXPECT_EQ(d.same_host, s.dispatch_bytes_sent[p ^ 1]);
      rows_in += s.rows_sent;
      EXPECT_EQ(s.pairs_received, std::accumulate(s.pairs_per_local_slot.begin(),
                                                  s.pairs_per_local_slot.end(), int64_t{0}));
    }
    EXPECT_EQ(stats[0].num_pairs, 12 * k);
    EXPECT_GT(rows_in, 0);
    EXPECT_GT(stats[0].row_payload.cross_host, 0);
  }
}

TEST(EpLayer, RejectsALayoutThatDoesNotFit) {
  const MoeConfig config = testing::small_ep_config("qwen3");
  const LayerWeights full = synthetic_layer_weights(config, DType::kF32, 1);
  const auto errors = testing::run_rank_threads(2, [&](Communicator& comm) {
    const ExpertMap three = ExpertMap::contiguous(12, 3);
    testing::expect_error([&] { EpMoeLayer(config, full, three, comm); },
                          {"communicator's 2 ranks", "got 3"});
    const ExpertMap two = ExpertMap::contiguous(12, 2);
    testing::expect_error([&] { EpMoeLayer(config, full, two, comm); }, {"w13", "[6, 48, 40]"});
    EpOptions ll;
    ll.dispatcher = DispatcherKind::kLowLatency;
    ll.low_latency_capacity = 0;
    testing::expect_error(
        [&] { EpMoeLayer(config, local_layer_weights(full, two, comm.rank()), two, comm, ll); },
        {"capacity", "got 0"});
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(errors));
}

}  // namespace
}  // namespace moe
