// The source side of dispatch, as pure functions of the routing: which slot serves each pair, which
// token rows go to which rank, the records that travel with them, and where each pair's result
// will land when combine brings it back. Both dispatchers share it; tests/parallel checks its
// properties (every pair in exactly one record, one row per token and destination, records
// grouped by slot, the combine index a permutation).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "moe/expert_map.h"

namespace moe::parallel {

// The metadata of one (token, expert) pair on the wire.
struct PairRecord {
  int32_t token;        // the token's index in its source rank's batch
  int32_t j;            // its slot among the token's top-k
  int32_t source_rank;  // where the token lives, and where the result goes back
  int32_t slot;         // the global expert slot that serves it (held by the destination)
  int32_t row;          // the token's row among the rows the source sends this destination
  float weight;         // the router weight
};
static_assert(sizeof(PairRecord) == 24);

// The slots that may serve pairs of `rank` for each expert (the rule in moe/ep_layer.h): the
// expert's replicas on `rank` if it has any there, else those on the rank's host, else all of
// them; ascending. Among `count` candidates, the expert's n-th pair of a call (in pair order) takes
// candidate (n + rank) mod count. The GPU path (parallel/cuda/replica_choice.h) applies the same
// rule to the same table on the device.
struct ReplicaCandidates {
  std::vector<int32_t> offsets;  // [E + 1] into slots
  std::vector<int32_t> slots;    // the candidates of expert e: [offsets[e], offsets[e + 1])
  int32_t max_count() const;     // the most candidates of one expert (1: nothing to choose)
};
ReplicaCandidates replica_candidates(const ExpertMap& map, int rank,
                                     std::span<const int> host_of_rank);

// The slot for each pair of one rank's tokens (the rule above). Candidates per expert are computed
// once; choose() allocates nothing.
class ReplicaChooser {
 public:
  ReplicaChooser(const ExpertMap& map, int rank, std::span<const int> host_of_rank);
  // topk_ids [num_pairs] logical ids in range; slots [num_pairs].
  void choose(const int32_t* topk_ids, int64_t num_pairs, int32_t* slots);

 private:
  int rank_;
  ReplicaCandidates candidates_;
  std::vector<int32_t> next_;  // [E]: pairs of the expert seen in this call
};

// One rank's dispatch of tokens [first_token, first_token + num_tokens) of its batch.
struct DispatchPlan {
  int num_ranks = 0;
  int64_t num_pairs = 0;
  std::vector<int32_t> slots;          // [num_pairs]: the slot serving pair p (local pair index)
  std::vector<int64_t> row_offsets;    // [N + 1]: rows to rank d are [row_offsets[d], ...[d + 1])
  std::vector<int32_t> row_tokens;     // [rows]: the token (batch index) of each row, ascending
                                       // within a destination
  std::vector<int64_t> pair_offsets;   // [N + 1]: records to rank d, likewise
  std::vector<PairRecord> records;     // [num_pairs]: grouped by destination, then by the slot's
                                       // local index there, then by pair
  std::vector<int32_t> combine_index;  // [num_pairs]: pair p's record, i.e. its result's row
                                       // when combine returns results in record order

  int64_t rows_to(int d) const { return row_offsets[d + 1] - row_offsets[d]; }
  int64_t pairs_to(int d) const { return pair_offsets[d + 1] - pair_offsets[d]; }

  // Scratch of plan_dispatch.
  std::vector<int32_t> slot_position;  // [S]: the slot's place when slots are listed rank by rank
  std::vector<int64_t> key_offsets;    // [S + 1]
  std::vector<int64_t> row_cursor;     // [N]
  std::vector<int32_t> pair_row;       // [num_pairs]: the row pair p travels in
};

// Plans the dispatch of num_tokens tokens with top_k pairs each. topk_ids and topk_weights
// [num_tokens, top_k] are the micro-batch's own rows; first_token is added to record.token. The
// plan's vectors are reused (no allocation once they have grown).
void plan_dispatch(const ExpertMap& map, ReplicaChooser& chooser, int rank, const int32_t* topk_ids,
                   const float* topk_weights, int64_t first_token, int64_t num_tokens,
                   int64_t top_k, DispatchPlan& plan);

}  // namespace moe::parallel
