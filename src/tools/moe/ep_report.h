// What `moe run --ep` (and `moe bench --ep`) report: each rank's step counters, gathered on rank 0,
// printed as a table (or JSON) next to the seeds' upper bound T*k*H*b on the dispatched payload.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/communicator.h"
#include "moe/config.h"
#include "moe/ep_layer.h"
#include "moe/expert_map.h"
#include "tools/moe/ep_options.h"

namespace moe::cli {

// A counter or time a layer does not measure (the GPU layer's pairs served in place, its sum apart
// from combine, the stages of its two-batch steps): "-" in tables, null in JSON.
inline constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();
bool measured(double value);

// One rank's counters of one step, in a form that travels as doubles. Bytes to `self` are a copy
// within the rank's device (the GPU layer's own rows); the CPU layer serves its own in place.
struct EpRankSummary {
  double tokens = 0, pairs = 0, local_pairs = 0, rows_sent = 0, pairs_received = 0;
  double upper_bound_bytes = 0;
  double dispatch_self = 0, dispatch_same_host = 0, dispatch_cross_host = 0;
  double combine_self = 0, combine_same_host = 0, combine_cross_host = 0;
  double received_self = 0, received_same_host = 0, received_cross_host = 0;  // both stages
  double rows_self = 0, rows_same_host = 0, rows_cross_host = 0;              // token-row payload
  double min_slot_pairs = 0, max_slot_pairs = 0, num_slots = 0;
  double route_us = 0, dispatch_us = 0, experts_us = 0, shared_us = 0, combine_us = 0, sum_us = 0,
         total_us = 0;
  std::vector<double> dispatch_sent, combine_sent;  // [N] bytes per peer

  // Bytes this rank sent to other ranks in dispatch and combine, over the time of those stages;
  // kNotMeasured where those times are.
  double link_gb_per_s() const;
};

// `comm` splits the bytes received by where they come from.
EpRankSummary summarize(const EpStepStats& stats, const Communicator& comm);

// The pairs a rank's local slots served, summed and at their least and most (all 0 for none).
struct SlotLoad {
  double total = 0, min = 0, max = 0;
};
template <typename Count>
SlotLoad slot_load(const std::vector<Count>& pairs_per_slot) {
  SlotLoad load;
  if (pairs_per_slot.empty()) return load;
  load.min = load.max = static_cast<double>(pairs_per_slot.front());
  for (const Count pairs : pairs_per_slot) {
    load.total += static_cast<double>(pairs);
    load.min = std::min(load.min, static_cast<double>(pairs));
    load.max = std::max(load.max, static_cast<double>(pairs));
  }
  return load;
}

// Every rank's `mine` (of one length on every rank), on every rank, in rank order (a collective).
std::vector<std::vector<double>> all_gather_values(Communicator& comm,
                                                   const std::vector<double>& mine);

// Every rank's summary, on every rank (a collective).
std::vector<EpRankSummary> gather_summaries(Communicator& comm, const EpRankSummary& mine);

// The sampled tokens' agreement with the single-process layer and the float64 reference.
struct EpCheck {
  int64_t checked_tokens = 0;
  int64_t differing_elements = 0;  // vs the single-process cpu layer: 0 = bitwise equal
  // Tokens whose experts differ from the reference's beyond a tie of logits, and at one
  // (tools/moe/routing_ties.h: checked on the layer's own routing).
  int64_t routing_mismatches = 0;
  int64_t routed_at_ties = 0;
  double max_rel_error = 0;  // vs the float64 reference
  double error_bound = 0;
};

// What every --ep command's JSON starts with: the model, the ranks and hosts, the communicator,
// the dispatcher, two-batch overlap, the placement and its slots, H and k.
nlohmann::json ep_setup_json(const MoeConfig& config, const Communicator& comm,
                             const EpSettings& settings, const ExpertMap& map);

// The header lines every --ep command prints for the same settings: dispatch and placement.
void print_ep_setup(const EpSettings& settings, const ExpertMap& map);

// The GPU --ep commands' shape line: H, I, E, k and the shared experts, which every rank runs on
// its own tokens.
void print_ep_gpu_shape(const MoeConfig& config);

// One rank's summary as the JSON object `moe run --ep` and `moe bench --ep` print per rank.
nlohmann::json ep_rank_json(const EpRankSummary& rank);

void print_ep_batch(int64_t tokens_per_rank, const std::vector<EpRankSummary>& ranks,
                    const EpCheck& check);
nlohmann::json ep_batch_json(int64_t tokens_per_rank, const std::vector<EpRankSummary>& ranks,
                             const EpCheck& check);

}  // namespace moe::cli
