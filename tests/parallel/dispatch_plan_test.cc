// The source side of dispatch on random routings: every pair in exactly one record, one row per
// token and destination, records grouped by destination and slot, the combine index a
// permutation, and replicas chosen on the own rank first, then the own host, evenly otherwise.
#include "parallel/dispatch_plan.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

namespace moe::parallel {
namespace {

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Distinct experts per token, like a router's top-k.
Routing random_routing(int64_t tokens, int64_t k, int64_t num_experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Routing r;
  std::vector<int32_t> experts(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      r.ids.push_back(experts[static_cast<size_t>(j)]);
      r.weights.push_back(static_cast<float>(rng() % 1000) / 1000.0f);
    }
  }
  return r;
}

void check_plan(const ExpertMap& map, int rank, const Routing& routing, int64_t first_token,
                int64_t tokens, int64_t k, const DispatchPlan& plan, const std::string& what) {
  SCOPED_TRACE(what);
  const int N = map.num_ranks();
  const int64_t P = tokens * k;
  ASSERT_EQ(plan.num_pairs, P);
  ASSERT_EQ(plan.pair_offsets.back(), P);
  // The combine index is a permutation, and each pair's record describes it.
  std::vector<bool> seen(static_cast<size_t>(P), false);
  for (int64_t p = 0; p < P; ++p) {
    const int32_t index = plan.combine_index[p];
    ASSERT_TRUE(index >= 0 && index < P && !seen[index]) << "pair " << p;
    seen[index] = true;
    const PairRecord& r = plan.records[index];
    EXPECT_EQ(r.token, first_token + p / k);
    EXPECT_EQ(r.j, p % k);
    EXPECT_EQ(r.source_rank, rank);
    EXPECT_EQ(r.weight, routing.weights[p]);
    EXPECT_EQ(r.slot, plan.slots[p]);
    EXPECT_EQ(map.expert_of_slot(r.slot), routing.ids[p]) << "pair " << p << " on a wrong expert";
  }
  for (int d = 0; d < N; ++d) {
    // Records of d: slots held by d, ordered by (local index, token, j).
    for (int64_t i = plan.pair_offsets[d]; i < plan.pair_offsets[d + 1]; ++i) {
      const PairRecord& r = plan.records[i];
      EXPECT_EQ(map.rank_of_slot(r.slot), d);
      if (i > plan.pair_offsets[d]) {
        const PairRecord& q = plan.records[i - 1];
        EXPECT_LE(std::tuple(map.local_index(q.slot), q.token, q.j),
                  std::tuple(map.local_index(r.slot), r.token, r.j));
      }
      ASSERT_LT(r.row, plan.rows_to(d));
      EXPECT_EQ(plan.row_tokens[plan.row_offsets[d] + r.row], r.token) << "record " << i;
    }
    // Rows of d: exactly the tokens with a pair there, once each, ascending.
    std::set<int32_t> wanted;
    for (int64_t p = 0; p < P; ++p) {
      if (map.rank_of_slot(plan.slots[p]) == d)
        wanted.insert(static_cast<int32_t>(first_token + p / k));
    }
    const std::vector<int32_t> rows(plan.row_tokens.begin() + plan.row_offsets[d],
                                    plan.row_tokens.begin() + plan.row_offsets[d + 1]);
    EXPECT_EQ(rows, std::vector<int32_t>(wanted.begin(), wanted.end())) << "rows to " << d;
  }
}

TEST(DispatchPlan, PropertiesOnRandomRoutings) {
  for (int N = 1; N <= 4; ++N) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      const int64_t E = 8 + static_cast<int64_t>(seed), k = 1 + static_cast<int64_t>(seed % 4);
      const int64_t tokens = static_cast<int64_t>(seed * 7 % 23);
      const ExpertMap map = ExpertMap::contiguous(E, N);
      const std::vector<int> hosts(static_cast<size_t>(N), 0);
      const Routing routing = random_routing(tokens, k, E, seed);
      for (int rank = 0; rank < N; ++rank) {
        ReplicaChooser chooser(map, rank, hosts);
        DispatchPlan plan;
        // Twice through the same plan: its buffers are reused.
        for (int64_t first : {int64_t{0}, int64_t{100}}) {
          plan_dispatch(map, chooser, rank, routing.ids.data(), routing.weights.data(), first,
                        tokens, k, plan);
          check_plan(map, rank, routing, first, tokens, k, plan,
                     "N=" + std::to_string(N) + " seed=" + std::to_string(seed) +
                         " rank=" + std::to_string(rank));
        }
      }
    }
  }
}

TEST(DispatchPlan, ReplicasOnTheOwnRankThenHostThenSpreadEvenly) {
  // 4 ranks on 2 hosts ({0, 1}, {2, 3}). Expert 0: slots on ranks 0 and 3. Expert 1: slots on
  // ranks 2 and 3 (both on host 1). Experts 2, 3: one slot each.
  const ExpertMap map({0, 2, 1, 0, 1, 3}, {0, 1, 2, 3, 3, 2}, 4, 4);
  const std::vector<int> hosts = {0, 0, 1, 1};
  Routing routing;
  for (int t = 0; t < 12; ++t) {
    routing.ids.insert(routing.ids.end(), {0, 1});
    routing.weights.insert(routing.weights.end(), {0.5f, 0.5f});
  }
  const auto slots_of = [&](int rank) {
    ReplicaChooser chooser(map, rank, hosts);
    DispatchPlan plan;
    plan_dispatch(map, chooser, rank, routing.ids.data(), routing.weights.data(), 0, 12, 2, plan);
    check_plan(map, rank, routing, 0, 12, 2, plan, "rank " + std::to_string(rank));
    return plan.slots;
  };
  // Rank 0 holds expert 0 (slot 0): all its expert-0 pairs stay. Expert 1 is only on host 1:
  // its pairs alternate between slots 2 and 4.
  std::vector<int32_t> slots = slots_of(0);
  int to_slot2 = 0;
  for (int t = 0; t < 12; ++t) {
    EXPECT_EQ(slots[2 * t], 0);
    to_slot2 += slots[2 * t + 1] == 2;
  }
  EXPECT_EQ(to_slot2, 6);
  // Rank 1 holds no replica of expert 0, but rank 0 on its host does (slot 0).
  slots = slots_of(1);
  for (int t = 0; t < 12; ++t) EXPECT_EQ(slots[2 * t], 0) << "expert 0 stays on host 0";
  // Rank 2 holds expert 1 (slot 2); expert 0 lives on its host at rank 3 (slot 3).
  slots = slots_of(2);
  for (int t = 0; t < 12; ++t) {
    EXPECT_EQ(slots[2 * t], 3);
    EXPECT_EQ(slots[2 * t + 1], 2);
  }
}

}  // namespace
}  // namespace moe::parallel
