// Balanced packing: weighted items into bins that each take the same number of items, the items
// of one expert (its replicas) on distinct bins where possible.
#pragma once

#include <cstdint>
#include <span>

namespace moe::balance {

// Experts go in descending weight of their items (the lower expert id first on equal weights),
// the items of one expert one after another in index order. Each item goes into the lightest bin
// that still has room (the lowest bin on equal weights), passing over bins that already hold an
// item of its expert while another bin with room does not. Where an expert packed that way would
// leave the experts still to come no way to put their items on distinct bins, its items go instead
// to the bins with the most free slots (then the lightest, then the lowest). So every expert with
// at most num_bins items ends on distinct bins. Position is the item's arrival order in its bin.
// With one item per bin, item i goes to bin i, as the reference does.
// Sizes: weight, expert, bin and position [num_items], num_items a multiple of num_bins >= 1,
// expert ids in [0, num_items), the items of one expert of equal weight (replicas split their
// expert's load evenly). Inputs are trusted (validated at the API edge).
void balanced_packing(std::span<const double> weight, std::span<const int32_t> expert,
                      int64_t num_bins, std::span<int32_t> bin, std::span<int32_t> position);

}  // namespace moe::balance
