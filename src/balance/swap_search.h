// The local search of optimize_placement for one layer. The slots of the start placement become
// items that carry their expert and their pairs (pair p stays with item slot_of_pair[p]); the
// search swaps the positions of two items on different GPUs while a swap lowers the dispatch rows
// (cross-node first, then same-node) and keeps the load bound. Within the search the model is
// exact for the fixed pair assignment: when every expert has one slot, the rows it reports saved
// are exactly what the traffic model will measure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "balance/trace_layer.h"

namespace moe::balance {

// The search packs its row counts into 32-bit halves of one integer: layers of more pairs are
// refused at the API edge.
constexpr int64_t kMaxSearchPairsPerLayer = int64_t{1} << 28;

struct SwapSearchResult {
  std::vector<int32_t> phy2log;  // [num_slots]: the expert of each slot after the swaps
  int64_t num_swaps = 0;
  int64_t cross_node_rows_saved = 0;
  int64_t same_node_rows_saved = 0;
};

// load_cap: a swap may raise a GPU's load only up to load_cap pairs (a GPU above it may only
// shrink). max_sweeps bounds the passes over the items; the search also stops after a pass that
// swapped nothing.
SwapSearchResult search_swaps(const LayerProblem& layer, std::span<const int32_t> slot_of_pair,
                              double load_cap, int64_t max_sweeps);

}  // namespace moe::balance
