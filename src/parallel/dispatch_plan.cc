#include "parallel/dispatch_plan.h"

#include <algorithm>

namespace moe::parallel {

ReplicaCandidates replica_candidates(const ExpertMap& map, int rank,
                                     std::span<const int> host_of_rank) {
  ReplicaCandidates c;
  c.offsets.push_back(0);
  for (int64_t e = 0; e < map.num_experts(); ++e) {
    const std::span<const int32_t> replicas = map.replicas(e);
    const auto add_where = [&](auto wanted) {
      for (int32_t slot : replicas) {
        if (wanted(map.rank_of_slot(slot))) c.slots.push_back(slot);
      }
      return static_cast<int32_t>(c.slots.size()) > c.offsets.back();
    };
    const int host = host_of_rank[static_cast<size_t>(rank)];
    if (!add_where([&](int r) { return r == rank; }) &&
        !add_where([&](int r) { return host_of_rank[static_cast<size_t>(r)] == host; })) {
      add_where([](int) { return true; });
    }
    c.offsets.push_back(static_cast<int32_t>(c.slots.size()));
  }
  return c;
}

int32_t ReplicaCandidates::max_count() const {
  int32_t most = 0;
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    most = std::max(most, offsets[e + 1] - offsets[e]);
  return most;
}

ReplicaChooser::ReplicaChooser(const ExpertMap& map, int rank, std::span<const int> host_of_rank)
    : rank_(rank),
      candidates_(replica_candidates(map, rank, host_of_rank)),
      next_(static_cast<size_t>(map.num_experts()), 0) {}

void ReplicaChooser::choose(const int32_t* topk_ids, int64_t num_pairs, int32_t* slots) {
  std::fill(next_.begin(), next_.end(), 0);
  for (int64_t p = 0; p < num_pairs; ++p) {
    const int32_t e = topk_ids[p];
    const int32_t first = candidates_.offsets[e], count = candidates_.offsets[e + 1] - first;
    const int32_t n = next_[e]++;
    slots[p] = candidates_.slots[first + (count == 1 ? 0 : (n + rank_) % count)];
  }
}

void plan_dispatch(const ExpertMap& map, ReplicaChooser& chooser, int rank, const int32_t* topk_ids,
                   const float* topk_weights, int64_t first_token, int64_t num_tokens,
                   int64_t top_k, DispatchPlan& plan) {
  const int N = map.num_ranks();
  const int64_t S = map.num_slots(), P = num_tokens * top_k;
  plan.num_ranks = N;
  plan.num_pairs = P;
  if (static_cast<int64_t>(plan.slot_position.size()) != S) {
    plan.slot_position.resize(static_cast<size_t>(S));
    int32_t position = 0;
    for (int r = 0; r < N; ++r) {
      for (int32_t slot : map.local_slots(r))
        plan.slot_position[static_cast<size_t>(slot)] = position++;
    }
  }
  plan.slots.resize(static_cast<size_t>(P));
  plan.pair_row.resize(static_cast<size_t>(P));
  plan.records.resize(static_cast<size_t>(P));
  plan.combine_index.resize(static_cast<size_t>(P));
  chooser.choose(topk_ids, P, plan.slots.data());
  const auto dest_of = [&](int64_t p) {
    return map.rank_of_slot(plan.slots[static_cast<size_t>(p)]);
  };

  // Rows: a token travels once to each distinct destination of its pairs. Pair p reuses the row
  // of the first earlier pair of its token with the same destination (top_k is small).
  plan.row_offsets.assign(static_cast<size_t>(N + 1), 0);
  const auto first_same_destination = [&](int64_t t, int64_t j) {
    const int32_t d = dest_of(t * top_k + j);
    int64_t earlier = 0;
    while (dest_of(t * top_k + earlier) != d) ++earlier;
    return earlier;
  };
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      if (first_same_destination(t, j) == j) ++plan.row_offsets[dest_of(t * top_k + j) + 1];
    }
  }
  for (int d = 0; d < N; ++d) plan.row_offsets[d + 1] += plan.row_offsets[d];
  plan.row_tokens.resize(static_cast<size_t>(plan.row_offsets[N]));
  std::vector<int64_t>& row_cursor = plan.row_cursor;
  row_cursor.assign(plan.row_offsets.begin(), plan.row_offsets.end() - 1);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t p = t * top_k + j, earlier = first_same_destination(t, j);
      const int32_t d = dest_of(p);
      if (earlier == j) {
        const int64_t row = row_cursor[d]++;
        plan.row_tokens[static_cast<size_t>(row)] = static_cast<int32_t>(first_token + t);
        plan.pair_row[static_cast<size_t>(p)] = static_cast<int32_t>(row - plan.row_offsets[d]);
      } else {
        plan.pair_row[static_cast<size_t>(p)] =
            plan.pair_row[static_cast<size_t>(t * top_k + earlier)];
      }
    }
  }

  // Records: a stable counting sort of the pairs by the slot's place in rank-by-rank order, which
  // groups them by destination, then by the slot's local index there, then by pair.
  plan.key_offsets.assign(static_cast<size_t>(S + 1), 0);
  for (int64_t p = 0; p < P; ++p) {
    ++plan.key_offsets[plan.slot_position[static_cast<size_t>(plan.slots[static_cast<size_t>(p)])] +
                       1];
  }
  for (int64_t key = 0; key < S; ++key) plan.key_offsets[key + 1] += plan.key_offsets[key];
  plan.pair_offsets.assign(static_cast<size_t>(N + 1), 0);
  for (int d = 0, key = 0; d < N; ++d) {
    key += static_cast<int>(map.local_slots(d).size());
    plan.pair_offsets[d + 1] = plan.key_offsets[key];
  }
  for (int64_t p = 0; p < P; ++p) {
    const int32_t slot = plan.slots[static_cast<size_t>(p)];
    const int64_t index = plan.key_offsets[plan.slot_position[static_cast<size_t>(slot)]]++;
    plan.records[static_cast<size_t>(index)] =
        PairRecord{static_cast<int32_t>(first_token + p / top_k),
                   static_cast<int32_t>(p % top_k),
                   rank,
                   slot,
                   plan.pair_row[static_cast<size_t>(p)],
                   topk_weights[p]};
    plan.combine_index[static_cast<size_t>(p)] = static_cast<int32_t>(index);
  }
}

}  // namespace moe::parallel
