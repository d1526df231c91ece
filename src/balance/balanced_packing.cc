// Greedy balanced packing (longest-processing-time first, with a cap on items per bin).
//
// Ties: the reference sorts with torch's default sort, which is not stable, so the order it gives
// equal weights depends on the sort implementation torch was built with. A stable sort (the lower
// index first) makes every machine agree. No tie between different experts arises in the
// reference's README example, so its published output is reproduced either way. Among equally
// light bins the lowest wins, as Python's min() picks the first.
#include "balance/balanced_packing.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <utility>
#include <vector>

namespace moe::balance {
namespace {

struct OpenBin {
  double weight;
  int32_t bin;
};

// The heap's top is the lightest open bin, then the lowest bin id.
struct ComesLater {
  bool operator()(const OpenBin& a, const OpenBin& b) const {
    if (a.weight != b.weight) return a.weight > b.weight;
    return a.bin > b.bin;
  }
};

}  // namespace

void balanced_packing(std::span<const double> weight, int64_t num_bins, std::span<int32_t> bin,
                      std::span<int32_t> position) {
  const size_t num_items = weight.size();
  const int32_t items_per_bin = static_cast<int32_t>(static_cast<int64_t>(num_items) / num_bins);
  if (items_per_bin == 1) {
    for (size_t i = 0; i < num_items; ++i) {
      bin[i] = static_cast<int32_t>(i);
      position[i] = 0;
    }
    return;
  }

  std::vector<int32_t> order(num_items);  // [num_items] item ids, heaviest first
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&weight](int32_t a, int32_t b) { return weight[a] > weight[b]; });

  std::vector<OpenBin> open(static_cast<size_t>(num_bins));
  for (int64_t b = 0; b < num_bins; ++b)
    open[static_cast<size_t>(b)] = {0.0, static_cast<int32_t>(b)};
  std::vector<int32_t> filled(static_cast<size_t>(num_bins), 0);  // [num_bins] items so far
  std::priority_queue<OpenBin, std::vector<OpenBin>, ComesLater> lightest(ComesLater{},
                                                                          std::move(open));
  for (const int32_t item : order) {
    OpenBin target = lightest.top();
    lightest.pop();
    bin[item] = target.bin;
    position[item] = filled[target.bin]++;
    target.weight += weight[item];
    if (filled[target.bin] < items_per_bin) lightest.push(target);
  }
}

}  // namespace moe::balance
