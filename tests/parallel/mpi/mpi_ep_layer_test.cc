// Expert parallelism between MPI processes: each rank's output equals its rows of the
// single-process layer's output bit for bit (every rank computes the whole single-process batch
// itself to compare). Run with mpirun -np N for N = 1..4: the cases adapt to N.
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "moe/eplb.h"
#include "moe/error.h"
#include "parallel/ep_case.h"
#include "parallel/mpi/mpi_world.h"

namespace moe {
namespace {

using testing::EpCase;
using testing::mpi_world;

// Runs the case on this rank and checks its output; returns its stats.
testing::EpRankResult run_here(const EpCase& c) {
  SCOPED_TRACE(c.describe() + " rank " + std::to_string(mpi_world().rank()));
  const testing::EpCaseData data = testing::prepare_ep_case(c);
  testing::EpRankResult result;
  testing::run_ep_rank(c, data, mpi_world(), result);
  EXPECT_EQ(result.mismatches, 0) << result.mismatches
                                  << " elements differ; first: " << result.first_mismatch;
  return result;
}

// Tokens per rank: rank 1 has none, the others a few.
std::vector<int64_t> tokens_for(int N, int64_t scale) {
  std::vector<int64_t> tokens;
  for (int r = 0; r < N; ++r) tokens.push_back(r == 1 ? 0 : scale + 3 * r);
  return tokens;
}

TEST(MpiEpLayer, EveryFamilyAndDispatcherEqualsTheSingleProcessLayer) {
  const int N = mpi_world().size();
  for (const char* family : {"qwen3", "qwen2", "deepseek", "llama4", "gpt-oss"}) {
    for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
      for (bool overlap : {false, true}) {
        EpCase c;
        c.family = family;
        c.num_ranks = N;
        c.steps = {tokens_for(N, 6), tokens_for(N, 1)};
        c.options.dispatcher = kind;
        c.options.two_batch_overlap = overlap;
        c.options.low_latency_capacity = 16;
        run_here(c);
      }
    }
  }
}

TEST(MpiEpLayer, Bf16AndExpertsNotDivisibleByRanks) {
  const int N = mpi_world().size();
  EpCase c;
  c.dtype = DType::kBF16;
  c.num_experts = 13;
  c.num_ranks = N;
  c.steps = {tokens_for(N, 20)};
  run_here(c);
}

TEST(MpiEpLayer, EveryTokenRoutedToRankZero) {
  const int N = mpi_world().size();
  EpCase c;
  c.family = "gpt-oss";
  c.num_experts = 4 * N;
  c.num_ranks = N;
  c.steps = {std::vector<int64_t>(static_cast<size_t>(N), 7)};
  c.edit_weights = [](LayerWeights& w) {
    for (int e = 0; e < 4; ++e) w.router_bias.data<float>()[e] = 100.0f;
  };
  const testing::EpRankResult result = run_here(c);
  EXPECT_EQ(result.stats[0].pairs_received, mpi_world().rank() == 0 ? N * 7 * 4 : 0);
}

TEST(MpiEpLayer, EplbReplicas) {
  // Skewed loads: EPLB gives the hot experts replicas, on other ranks when N > 1.
  const int N = mpi_world().size();
  std::vector<double> loads(12);
  for (size_t e = 0; e < loads.size(); ++e) loads[e] = 1000.0 / static_cast<double>(1 + e);
  EplbConfig eplb;
  eplb.num_replicas = (12 + N - 1) / N * N + N;  // N redundant slots at least
  eplb.num_gpus = N;
  const ExpertPlacement placement = rebalance_experts(std::span<const double>(loads), 1, 12, eplb);
  for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
    EpCase c;
    c.family = "deepseek";
    c.num_ranks = N;
    c.steps = {tokens_for(N, 25)};
    c.options.dispatcher = kind;
    c.options.low_latency_capacity = 40;
    c.map = ExpertMap::from_phy2log(placement.phy2log, 12, N);
    run_here(c);
  }
}

TEST(MpiEpLayer, LowLatencyOverflowFailsEveryRankAndTheNextStepWorks) {
  const int N = mpi_world().size();
  if (N < 2) GTEST_SKIP() << "a rank's rows for itself never travel, so one rank cannot overflow";
  // gpt-oss with a large router bias on rank 1's four experts: every token goes to rank 1.
  EpCase c;
  c.family = "gpt-oss";
  c.num_experts = 4 * N;
  c.num_ranks = N;
  c.steps = {std::vector<int64_t>(static_cast<size_t>(N), 3)};
  c.options.dispatcher = DispatcherKind::kLowLatency;
  c.options.low_latency_capacity = 4;
  c.edit_weights = [](LayerWeights& w) {
    for (int e = 4; e < 8; ++e) w.router_bias.data<float>()[e] = 100.0f;
  };
  const testing::EpCaseData data = testing::prepare_ep_case(c);
  const int me = mpi_world().rank();
  EpOptions options = c.options;
  options.num_threads = 1;
  EpMoeLayer layer(data.config, local_layer_weights(data.full, *data.map, me), *data.map,
                   mpi_world(), options);
  // Rank 0 sends rank 1 a row for each of its 9 tokens: over the capacity of 4.
  const Tensor too_many = testing::random_normal(DType::kF32, {me == 0 ? 9 : 1, 40}, 3);
  testing::expect_error([&] { layer.forward(too_many); },
                        {"low-latency dispatch overflow: capacity 4 token rows per peer",
                         "rank 0 has 9 rows for rank 1"});
  // The communicator is intact: the same layer serves the next step.
  testing::EpRankResult result;
  testing::run_ep_rank(c, data, mpi_world(), result);
  EXPECT_EQ(result.mismatches, 0) << result.first_mismatch;
}

}  // namespace
}  // namespace moe
