// EpMoeLayer::forward_routed on threads: given the ids and weights forward() chose, it gives
// forward()'s output bit for bit (f32, N = 1..4 ranks, contiguous and replicated experts, ranks
// with no tokens), also when handed the layer's own last_topk_ids/weights views; bad ids and
// shapes throw before any communication and leave the layer usable.
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "moe/error.h"
#include "parallel/ep_case.h"
#include "parallel/rank_threads.h"

namespace moe {
namespace {

using testing::EpCase;
using testing::EpCaseData;

// This rank's rows of step `step` of the case.
Tensor rank_rows(const EpCase& c, const EpCaseData& data, size_t step, int rank) {
  const int64_t M = c.steps[step][static_cast<size_t>(rank)], H = data.config.experts.hidden_size;
  Tensor mine(c.dtype, {M, H});
  if (M > 0) {
    std::memcpy(mine.data<char>(),
                data.hidden[step].data<char>() +
                    data.first_row[step][rank] * H * static_cast<int64_t>(dtype_size(c.dtype)),
                mine.nbytes());
  }
  return mine;
}

// A tensor of its own holding the bytes of `view`.
Tensor same_bits(const TensorView& view) {
  Tensor copy(view.dtype, view.shape);
  if (copy.nbytes() > 0) std::memcpy(copy.data<char>(), view.data, copy.nbytes());
  return copy;
}

// Elements of a and b (same shape, f32) whose bits differ.
int64_t differing_elements(const Tensor& a, const Tensor& b) {
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    differ += std::memcmp(a.data<float>() + i, b.data<float>() + i, sizeof(float)) != 0;
  }
  return differ;
}

// On every rank: forward, then forward_routed on copies of its ids and weights, then on the
// layer's own views of them; all three outputs must be the same bits.
void expect_routed_equals_forward(const EpCase& c) {
  SCOPED_TRACE(c.describe());
  const EpCaseData data = testing::prepare_ep_case(c);
  std::vector<int64_t> differ(static_cast<size_t>(c.num_ranks), 0);
  const std::vector<std::string> errors = testing::run_rank_threads(
      c.num_ranks,
      [&](Communicator& comm) {
        const int r = comm.rank();
        EpOptions options = c.options;
        options.num_threads = 1;
        EpMoeLayer layer(data.config, local_layer_weights(data.full, *data.map, r), *data.map, comm,
                         options);
        for (size_t s = 0; s < c.steps.size(); ++s) {
          const Tensor mine = rank_rows(c, data, s, r);
          const Tensor routed_out = layer.forward(mine);
          const Tensor ids = same_bits(layer.last_topk_ids());
          const Tensor weights = same_bits(layer.last_topk_weights());
          Tensor given(mine.dtype(), mine.shape());
          layer.forward_routed(mine, ids, weights, given);
          EXPECT_EQ(layer.last_stats().route_us, 0.0);
          Tensor own_views(mine.dtype(), mine.shape());
          layer.forward_routed(mine, layer.last_topk_ids(), layer.last_topk_weights(), own_views);
          differ[static_cast<size_t>(r)] +=
              differing_elements(routed_out, given) + differing_elements(routed_out, own_views);
        }
      },
      {.ranks_per_host = c.ranks_per_host});
  ASSERT_TRUE(testing::all_ranks_succeeded(errors));
  for (int r = 0; r < c.num_ranks; ++r) {
    EXPECT_EQ(differ[static_cast<size_t>(r)], 0) << "rank " << r << ": elements that differ";
  }
}

TEST(EpForwardRouted, EqualsForwardBitwiseOnOneToFourRanks) {
  for (const char* family : {"qwen3", "deepseek", "gpt-oss"}) {
    for (int N = 1; N <= 4; ++N) {
      EpCase c;
      c.family = family;
      c.num_ranks = N;
      c.steps = {std::vector<int64_t>(static_cast<size_t>(N), 6), {}};
      for (int r = 0; r < N; ++r) c.steps[1].push_back(r == 0 ? 0 : 2 * r + 1);
      c.seed = static_cast<uint64_t>(10 + N);
      expect_routed_equals_forward(c);
    }
  }
}

TEST(EpForwardRouted, EqualsForwardWithReplicasAndBothDispatchers) {
  for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
    EpCase c;
    c.num_experts = 6;
    c.num_ranks = 2;
    // Experts 0 and 1 on both ranks.
    const std::vector<int32_t> phy2log = {0, 1, 2, 3, 4, 0, 1, 5};
    c.map = ExpertMap::from_phy2log(phy2log, 6, 2);
    c.steps = {{9, 4}, {1, 0}};
    c.options.dispatcher = kind;
    c.options.low_latency_capacity = 16;
    c.options.two_batch_overlap = kind == DispatcherKind::kLowLatency;
    expect_routed_equals_forward(c);
  }
}

// Every rank passes the same bad input, so all throw before communicating; the next step then
// runs as if the bad one never came.
TEST(EpForwardRouted, RejectsBadRoutingBeforeCommunicating) {
  EpCase c;
  c.num_ranks = 2;
  c.steps = {{3, 3}};
  const EpCaseData data = testing::prepare_ep_case(c);
  const int64_t E = data.config.routing.num_experts, k = data.config.routing.top_k;
  const std::vector<std::string> errors = testing::run_rank_threads(2, [&](Communicator& comm) {
    const int r = comm.rank();
    EpOptions options;
    options.num_threads = 1;
    EpMoeLayer layer(data.config, local_layer_weights(data.full, *data.map, r), *data.map, comm,
                     options);
    const Tensor mine = rank_rows(c, data, 0, r);
    const Tensor expected = layer.forward(mine);
    Tensor ids = same_bits(layer.last_topk_ids());
    const Tensor weights = same_bits(layer.last_topk_weights());
    Tensor out(mine.dtype(), mine.shape());
    for (int32_t bad : {static_cast<int32_t>(E), int32_t{-1}}) {
      const int32_t kept = ids.data<int32_t>()[k + 1];
      ids.data<int32_t>()[k + 1] = bad;
      testing::expect_error(
          [&] { layer.forward_routed(mine, ids, weights, out); },
          {"topk_ids", fmt::format("[0, {})", E), fmt::format("got {} at token 1, slot 1", bad)});
      ids.data<int32_t>()[k + 1] = kept;
    }
    const Tensor short_weights(DType::kF32, {mine.size(0), k - 1});
    testing::expect_error([&] { layer.forward_routed(mine, ids, short_weights, out); },
                          {"topk_weights"});
    const Tensor wrong_dtype(DType::kF32, {mine.size(0), k});
    testing::expect_error([&] { layer.forward_routed(mine, wrong_dtype, weights, out); },
                          {"topk_ids"});
    layer.forward_routed(mine, ids, weights, out);
    EXPECT_EQ(differing_elements(expected, out), 0) << "rank " << r;
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(errors));
}

}  // namespace
}  // namespace moe
