// Greedy balanced packing (longest-processing-time first, with a cap on items per bin) that puts
// the replicas of one expert on distinct bins whenever the expert has at most one per bin.
//
// Ties: the reference sorts items with torch's default sort, which is not stable, so the order it
// gives equal weights depends on the sort implementation torch was built with. We fix it: the
// lower expert first, one expert's replicas one after another. Among equally light bins the
// lowest wins, as Python's min() picks the first.
//
// Spreading: the reference takes the lightest bin even when it already holds a replica of the
// item's expert. Two replicas on one GPU serve that GPU's share of the expert no better than one
// replica would, and cost it a second copy of the weights, so a bin that holds the expert is
// passed over while another bin has room. Passing over is not enough on its own: bins can fill
// unevenly (equal loads fill them one after another), leaving a later expert fewer open bins than
// replicas. So after each expert the packer checks that the experts still to come can spread (the
// condition of Gale and Ryser, below); when they could not, it packs that expert into the bins
// with the most free slots instead, which always keeps them able to (a bipartite Havel-Hakimi
// step). A packing in which the reference spreads every expert and no two experts' replicas weigh
// the same comes out unchanged (the README example is one): every check then passes, since the
// reference's own packing completes each state.
#include "balance/balanced_packing.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <vector>

namespace moe::balance {
namespace {

// An entry of the heap of open bins. A bin's entry is stale once the bin changed (its version
// moved on): changed bins get a fresh entry instead of an update in place.
struct OpenBin {
  double weight;
  int32_t bin;
  int32_t version;
};

// The heap's top is the lightest open bin, then the lowest bin id.
struct ComesLater {
  bool operator()(const OpenBin& a, const OpenBin& b) const {
    if (a.weight != b.weight) return a.weight > b.weight;
    return a.bin > b.bin;
  }
};

class Packer {
 public:
  Packer(std::span<const double> weight, std::span<const int32_t> expert, int64_t num_bins,
         std::span<int32_t> bin, std::span<int32_t> position)
      : weight_(weight),
        bin_(bin),
        position_(position),
        num_bins_(static_cast<int32_t>(num_bins)),
        items_per_bin_(static_cast<int32_t>(static_cast<int64_t>(weight.size()) / num_bins)),
        first_item_(weight.size() + 1, 0),
        items_(weight.size()),
        bin_weight_(static_cast<size_t>(num_bins), 0.0),
        bin_filled_(static_cast<size_t>(num_bins), 0),
        bin_version_(static_cast<size_t>(num_bins), 0),
        bin_expert_(static_cast<size_t>(num_bins), -1),
        bins_with_free_(static_cast<size_t>(items_per_bin_) + 1, 0),
        pending_with_count_(static_cast<size_t>(num_bins) + 1, 0) {
    // Each expert's items in index order (replica rank order): a counting sort.
    for (const int32_t e : expert) ++first_item_[static_cast<size_t>(e) + 1];
    std::partial_sum(first_item_.begin(), first_item_.end(), first_item_.begin());
    std::vector<size_t> next(first_item_.begin(), first_item_.end() - 1);
    for (size_t i = 0; i < expert.size(); ++i) {
      items_[next[static_cast<size_t>(expert[i])]++] = static_cast<int32_t>(i);
    }
    for (int32_t b = 0; b < num_bins_; ++b) lightest_.push({0.0, b, 0});
    bins_with_free_[static_cast<size_t>(items_per_bin_)] = num_bins_;
  }

  void pack() {
    struct Expert {
      double replica_weight;
      int32_t id;
    };
    std::vector<Expert> order;  // experts that have items, heaviest replica first
    for (size_t e = 0; e + 1 < first_item_.size(); ++e) {
      const int32_t count = num_items_of(static_cast<int32_t>(e));
      if (count == 0) continue;
      order.push_back(
          {weight_[static_cast<size_t>(items_[first_item_[e]])], static_cast<int32_t>(e)});
      if (must_spread(count)) {
        ++pending_with_count_[static_cast<size_t>(count)];
        ++num_pending_;
        largest_pending_count_ = std::max(largest_pending_count_, count);
      }
    }
    std::sort(order.begin(), order.end(), [](const Expert& a, const Expert& b) {
      if (a.replica_weight != b.replica_weight) return a.replica_weight > b.replica_weight;
      return a.id < b.id;
    });

    for (const Expert& next : order) {
      const int32_t e = next.id;
      if (must_spread(num_items_of(e))) {
        --pending_with_count_[static_cast<size_t>(num_items_of(e))];
        --num_pending_;
        while (largest_pending_count_ > 0 &&
               pending_with_count_[static_cast<size_t>(largest_pending_count_)] == 0) {
          --largest_pending_count_;
        }
      }
      for (const int32_t item : items_of(e)) place(item, e, lightest_open_bin(e));
      if (!pending_can_spread()) {
        undo();
        for (const int32_t item : items_of(e)) place(item, e, most_free_bin(e));
      }
      changed_.clear();
    }
  }

 private:
  // A bin's state before the expert in hand changed it.
  struct Saved {
    int32_t bin;
    double weight;
    int32_t filled;
    int32_t expert;
  };

  int32_t num_items_of(int32_t e) const {
    return static_cast<int32_t>(first_item_[static_cast<size_t>(e) + 1] -
                                first_item_[static_cast<size_t>(e)]);
  }
  std::span<const int32_t> items_of(int32_t e) const {
    return std::span<const int32_t>(items_).subspan(first_item_[static_cast<size_t>(e)],
                                                    static_cast<size_t>(num_items_of(e)));
  }
  // One replica per bin is possible for up to num_bins replicas; a single one is trivially spread.
  bool must_spread(int32_t count) const { return count >= 2 && count <= num_bins_; }
  // Experts are packed one at a time, so a bin holds the expert in hand iff it was the last
  // expert placed there.
  bool holds(int32_t b, int32_t e) const { return bin_expert_[static_cast<size_t>(b)] == e; }
  int32_t free_slots(int32_t b) const {
    return items_per_bin_ - bin_filled_[static_cast<size_t>(b)];
  }

  // The lightest open bin that does not hold expert e, or the lightest open bin if all hold it.
  // The chosen bin leaves the heap (placing into it pushes its new entry); the bins passed over go
  // back unchanged.
  int32_t lightest_open_bin(int32_t e) {
    passed_.clear();
    while (!lightest_.empty()) {
      const OpenBin top = lightest_.top();
      lightest_.pop();
      if (top.version != bin_version_[static_cast<size_t>(top.bin)]) continue;  // stale
      if (!holds(top.bin, e)) {
        for (const OpenBin& entry : passed_) lightest_.push(entry);
        return top.bin;
      }
      passed_.push_back(top);
    }
    for (size_t i = 1; i < passed_.size(); ++i) lightest_.push(passed_[i]);
    return passed_.front().bin;
  }

  // The open bin with the most free slots, then the lightest, then the lowest id. An expert that
  // must spread never gets a bin that holds it; another one prefers a bin that does not.
  int32_t most_free_bin(int32_t e) const {
    const bool spread = must_spread(num_items_of(e));
    int32_t best = -1;
    auto better = [&](int32_t a, int32_t b) {
      if (free_slots(a) != free_slots(b)) return free_slots(a) > free_slots(b);
      if (holds(a, e) != holds(b, e)) return !holds(a, e);
      return bin_weight_[static_cast<size_t>(a)] < bin_weight_[static_cast<size_t>(b)];
    };
    for (int32_t b = 0; b < num_bins_; ++b) {
      if (free_slots(b) == 0 || (spread && holds(b, e))) continue;
      if (best == -1 || better(b, best)) best = b;
    }
    return best;
  }

  void place(int32_t item, int32_t e, int32_t b) {
    const size_t bi = static_cast<size_t>(b);
    if (!holds(b, e)) changed_.push_back({b, bin_weight_[bi], bin_filled_[bi], bin_expert_[bi]});
    --bins_with_free_[static_cast<size_t>(free_slots(b))];
    bin_[static_cast<size_t>(item)] = b;
    position_[static_cast<size_t>(item)] = bin_filled_[bi]++;
    bin_weight_[bi] += weight_[static_cast<size_t>(item)];
    bin_expert_[bi] = e;
    ++bins_with_free_[static_cast<size_t>(free_slots(b))];
    refresh(b);
  }

  void undo() {
    for (const Saved& s : changed_) {
      const size_t bi = static_cast<size_t>(s.bin);
      --bins_with_free_[static_cast<size_t>(free_slots(s.bin))];
      bin_weight_[bi] = s.weight;
      bin_filled_[bi] = s.filled;
      bin_expert_[bi] = s.expert;
      ++bins_with_free_[static_cast<size_t>(free_slots(s.bin))];
      refresh(s.bin);
    }
    changed_.clear();
  }

  // A changed bin's old heap entry goes stale; an open bin gets a current one.
  void refresh(int32_t b) {
    const int32_t version = ++bin_version_[static_cast<size_t>(b)];
    if (free_slots(b) > 0) lightest_.push({bin_weight_[static_cast<size_t>(b)], b, version});
  }

  // Whether every expert still to pack that must spread (count c in 2..num_bins) can get c
  // distinct open bins. A bipartite max-flow argument (experts to bins, one replica per pair, a
  // bin's free slots as its capacity; replicas of other experts fill what is left) gives the
  // condition of Gale and Ryser: for every k, the k largest counts sum to at most the sum over
  // bins of min(free slots, k). Past k = items_per_bin the right side is every free slot left,
  // which no sum of counts exceeds.
  bool pending_can_spread() const {
    if (num_pending_ == 0) return true;
    int64_t counts = 0;  // the k largest counts
    int64_t room = 0;    // sum over bins of min(free slots, k)
    int64_t bins_with_at_least_k = num_bins_ - bins_with_free_[0];
    int32_t count = largest_pending_count_;
    int64_t left_at_count = pending_with_count_[static_cast<size_t>(count)];
    for (int32_t k = 1; k <= items_per_bin_; ++k) {
      while (left_at_count == 0 && count > 2) left_at_count = pending_with_count_[--count];
      if (left_at_count == 0) return true;  // the sum of counts stops growing; room does not
      counts += count;
      --left_at_count;
      room += bins_with_at_least_k;
      if (counts > room) return false;
      bins_with_at_least_k -= bins_with_free_[static_cast<size_t>(k)];
    }
    return true;
  }

  std::span<const double> weight_;
  std::span<int32_t> bin_;
  std::span<int32_t> position_;
  int32_t num_bins_;
  int32_t items_per_bin_;
  std::vector<size_t> first_item_;    // [num_items + 1] offsets into items_ by expert id
  std::vector<int32_t> items_;        // [num_items] item ids grouped by expert, index order inside
  std::vector<double> bin_weight_;    // [num_bins]
  std::vector<int32_t> bin_filled_;   // [num_bins] items so far
  std::vector<int32_t> bin_version_;  // [num_bins] changes so far, to spot stale heap entries
  std::vector<int32_t> bin_expert_;   // [num_bins] the last expert placed there, -1 before any
  std::vector<int32_t> bins_with_free_;      // [items_per_bin + 1] bins by free slots (0: full)
  std::vector<int64_t> pending_with_count_;  // [num_bins + 1] experts still to pack that must
                                             // spread, by replica count
  int64_t num_pending_ = 0;                  // their number
  int32_t largest_pending_count_ = 0;        // the largest of their counts
  std::priority_queue<OpenBin, std::vector<OpenBin>, ComesLater> lightest_;
  std::vector<OpenBin> passed_;  // heap entries popped while looking for a bin
  std::vector<Saved> changed_;   // bins the expert in hand changed, as they were before
};

}  // namespace

void balanced_packing(std::span<const double> weight, std::span<const int32_t> expert,
                      int64_t num_bins, std::span<int32_t> bin, std::span<int32_t> position) {
  const size_t num_items = weight.size();
  if (static_cast<int64_t>(num_items) == num_bins) {
    for (size_t i = 0; i < num_items; ++i) {
      bin[i] = static_cast<int32_t>(i);
      position[i] = 0;
    }
    return;
  }
  Packer(weight, expert, num_bins, bin, position).pack();
}

}  // namespace moe::balance
