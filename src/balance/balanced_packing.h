// Balanced packing: weighted items into bins that each take the same number of items.
#pragma once

#include <cstdint>
#include <span>

namespace moe::balance {

// Items go in descending weight (the lower index first on equal weights), each into the lightest
// bin that still has room (the lowest bin on equal weights); position is the item's arrival order
// in its bin. With one item per bin, item i goes to bin i without sorting, as the reference does.
// Sizes: weight, bin and position [num_items], num_items a multiple of num_bins >= 1. Inputs are
// trusted (validated at the API edge).
void balanced_packing(std::span<const double> weight, int64_t num_bins, std::span<int32_t> bin,
                      std::span<int32_t> position);

}  // namespace moe::balance
