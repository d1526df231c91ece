// Which plan `moe tune` writes for a token count when the built-in default is close to the best.
// Plans that close trade places from run to run: on an H100, DeepSeek-V3's `tma_dynamic/64` led
// the tune's final round at 2048 tokens by 0.02-0.2% over the default, `tma_dynamic/128`, and ran
// 2.3% behind it in `moe bench` processes of their own; Qwen3-30B-A3B's `tiny/1`, the table's plan
// at 16 tokens, ran 0.8-0.9% ahead of the default in two processes, then 0.5% ahead in one and 1.7%
// behind in the next (docs/perf.md, sixty-sixth and sixty-seventh sessions). A lead of a percent or
// less is a coin toss the next tune may flip; the default is the plan every untuned GPU runs, so
// the table keeps it unless another plan beats it by more.
#pragma once

namespace moe::cli {

// How much slower than the best plan, as a share of the best's time in the same round, the
// built-in default may run and keep its place in the table.
inline constexpr double kDefaultTieMargin = 0.01;

// Whether the table takes the built-in default, given its figure over the best plan's, both from
// the same round (the tune's final round, or both from the sweep): at most 1 + margin.
bool table_keeps_default(double default_over_best, double margin);

}  // namespace moe::cli
