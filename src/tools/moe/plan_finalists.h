// Which plans `moe tune` times a second time. In a sweep of every plan, a plan's median depends by
// several percent on the plans around it: slow plans between the fast ones leave the board headroom
// under its power limit, and the clock follows the recent draw. On an H100 the gap between
// `tma/128` and `tma_eager/128` at Qwen3-30B-A3B's 8192 tokens read from 1% one way to 6% the
// other in sweeps of two turn orders, and 1% with the two alone (docs/perf.md, fifty-second
// session). So the plans close to the sweep's best are timed again in a final round, alone in
// turns, and the tune picks from that round.
#pragma once

#include <cstddef>
#include <vector>

namespace moe::cli {

// The share of the sweep's best median within which a plan goes to the final round: the largest
// gap that sweeps were seen to put between two plans the final round found level.
inline constexpr double kFinalistMargin = 0.10;

// Indices of the plans whose median is at most (1 + margin) times the lowest, in index order.
// Medians of 0 or less (plans not timed) never count. Fewer than two finalists means no final
// round is needed: the result is then empty.
std::vector<size_t> plan_finalists(const std::vector<double>& medians_us, double margin);

}  // namespace moe::cli
