// The order in which `moe bench --device cuda` and `moe tune` replay the plans of one size, round
// by round. A plan's time may depend on what ran just before it (the clock under the board's power
// limit follows the recent draw), and a cyclic order gives every plan the same predecessor in
// nearly every round, so any such effect lands on the same plan every time. The rounds follow a
// Williams design instead: over a full cycle of rounds every plan comes right after every other
// plan equally often and takes every place in a round equally often.
#pragma once

#include <cstddef>
#include <vector>

namespace moe::cli {

// Rounds in one full cycle of turn_order for `plans` plans: `plans` when even, twice that when
// odd (the second half the first half reversed), 1 for a single plan.
size_t turn_order_cycle(size_t plans);

// The plans' indices in the order round `round` replays them (round wraps around the cycle).
std::vector<size_t> turn_order(size_t plans, size_t round);

}  // namespace moe::cli
