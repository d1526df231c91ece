// search_swaps: best-partner swaps of slot items, each candidate's gain read from tables kept up
// to date after every swap.
//
// A token t from GPU s sends one row to each distinct GPU among its items' GPUs; a row to GPU g
// costs w(s, g) = (cross-node rows, same-node rows) = (1, 0) off the node, (0, 1) on the node,
// (0, 0) on s itself. With n_t(g) the number of t's items on g:
//   u_t(i)     = w(s, g(i)) if n_t(g(i)) == 1, else 0: the row saved when item i leaves g(i)
//   add_t(g)   = w(s, g) if n_t(g) == 0, else 0: the row paid when one of t's items arrives on g
// Swapping items a (on GPU ga) and b (on gb) changes only the tokens that hold a or b. A token
// holding just a loses u_t(a) and pays add_t(gb); one holding both keeps both GPUs as they were.
// So, summing over the tokens that hold each item,
//   leave[i]        = -sum_t u_t(i)
//   arrive[i][g]    =  sum_t add_t(g)
//   together[i][j]  = -sum over tokens holding both of (u_t(i) + u_t(j))
//   delta(a, b)     = leave[a] + arrive[a][gb] + leave[b] + arrive[b][ga] - together[a][b]
// is the exact change of the layer's rows. leave, arrive and u_t of every pair are kept; a swap
// changes n_t only for the tokens holding a or b and only at ga and gb, so it updates O(k) entries
// per such token. together[a][*] is summed afresh, from the kept u_t, whenever a looks for a
// partner: O(k) per token of a, streaming, which costs less than keeping a dense table current.
//
// Sweeps visit the items in order; each item swaps with the partner of the most negative delta
// that keeps the load bound (cross-node rows compare first; ties go to the lower item). Every
// swap lowers the rows strictly, so the search ends.
#include "balance/swap_search.h"

#include <algorithm>
#include <compare>
#include <cstdlib>

namespace moe::balance {
namespace {

// Dispatch rows as one integer, cross_node * 2^32 + same_node: sums stay sums, and integer order
// is the order the search minimizes (cross-node rows first) as long as every same-node count
// stays within +-2^31, which kMaxSearchPairsPerLayer guarantees (no entry or delta exceeds 6 rows
// per pair). One integer per entry halves the memory the updates touch.
class Rows {
 public:
  constexpr Rows() = default;
  constexpr Rows(int64_t cross_node, int64_t same_node)
      : key_(cross_node * kCrossNodeUnit + same_node) {}

  int64_t cross_node() const { return (key_ + kCrossNodeUnit / 2) >> 32; }
  int64_t same_node() const { return key_ - cross_node() * kCrossNodeUnit; }

  auto operator<=>(const Rows&) const = default;
  Rows operator+(Rows other) const { return from_key(key_ + other.key_); }
  Rows operator-(Rows other) const { return from_key(key_ - other.key_); }
  Rows& operator+=(Rows other) { return *this = *this + other; }
  Rows& operator-=(Rows other) { return *this = *this - other; }

 private:
  static constexpr int64_t kCrossNodeUnit = int64_t{1} << 32;
  static Rows from_key(int64_t key) {
    Rows rows;
    rows.key_ = key;
    return rows;
  }
  int64_t key_ = 0;
};

struct Partner {
  int32_t item = -1;  // -1: no swap lowers the rows within the bound
  Rows delta;
};

class SwapSearch {
 public:
  SwapSearch(const LayerProblem& layer, std::span<const int32_t> slot_of_pair, double load_cap)
      : layer_(layer),
        item_of_pair_(slot_of_pair),
        num_items_(layer.num_slots()),
        num_gpus_(layer.num_gpus),
        top_k_(layer.top_k),
        load_cap_(load_cap) {
    place_items();
    index_pairs_of_items();
    build_tables();
  }

  // One pass over the items; returns the number of swaps made.
  int64_t sweep() {
    int64_t num_swaps = 0;
    for (int32_t a = 0; a < num_items_; ++a) {
      const Partner partner = best_partner(a);
      if (partner.item < 0) continue;
      saved_ -= partner.delta;
      swap(a, partner.item);
      ++num_swaps;
    }
    return num_swaps;
  }

  SwapSearchResult result(int64_t num_swaps) const {
    SwapSearchResult result;
    result.phy2log.resize(static_cast<size_t>(num_items_));
    for (int64_t i = 0; i < num_items_; ++i) {
      result.phy2log[static_cast<size_t>(slot_[static_cast<size_t>(i)])] = layer_.phy2log[i];
    }
    result.num_swaps = num_swaps;
    result.cross_node_rows_saved = saved_.cross_node();
    result.same_node_rows_saved = saved_.same_node();
    return result;
  }

 private:
  Rows row_cost(int64_t source, int64_t gpu) const {
    if (gpu == source) return {};
    if (layer_.node_of_gpu(gpu) == layer_.node_of_gpu(source)) {
      return {0, 1};
    }
    return {1, 0};
  }

  void place_items() {
    slot_.resize(static_cast<size_t>(num_items_));
    gpu_.resize(static_cast<size_t>(num_items_));
    for (int64_t i = 0; i < num_items_; ++i) {
      slot_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      gpu_[static_cast<size_t>(i)] = layer_.gpu_of_slot(i);
    }
    item_load_.assign(static_cast<size_t>(num_items_), 0);
    for (const int32_t item : item_of_pair_) ++item_load_[static_cast<size_t>(item)];
    gpu_load_.assign(static_cast<size_t>(num_gpus_), 0);
    for (int64_t i = 0; i < num_items_; ++i) {
      gpu_load_[static_cast<size_t>(gpu_[static_cast<size_t>(i)])] +=
          item_load_[static_cast<size_t>(i)];
    }
  }

  // pairs_of_item_[first_pair_[i] .. first_pair_[i + 1]): item i's pairs, ascending; an item holds
  // at most one pair of a token, so these are also its tokens.
  void index_pairs_of_items() {
    first_pair_.assign(static_cast<size_t>(num_items_ + 1), 0);
    for (const int32_t item : item_of_pair_) ++first_pair_[static_cast<size_t>(item + 1)];
    for (int64_t i = 0; i < num_items_; ++i) {
      first_pair_[static_cast<size_t>(i + 1)] += first_pair_[static_cast<size_t>(i)];
    }
    pairs_of_item_.resize(item_of_pair_.size());
    std::vector<int64_t> next(first_pair_.begin(), first_pair_.end() - 1);
    for (size_t p = 0; p < item_of_pair_.size(); ++p) {
      pairs_of_item_[static_cast<size_t>(next[static_cast<size_t>(item_of_pair_[p])]++)] =
          static_cast<int32_t>(p);
    }
    swap_of_token_.assign(static_cast<size_t>(layer_.num_tokens()), -1);
  }

  void build_tables() {
    leave_.assign(static_cast<size_t>(num_items_), Rows{});
    arrive_.assign(static_cast<size_t>(num_items_ * num_gpus_), Rows{});
    saving_of_pair_.resize(item_of_pair_.size());
    together_.assign(static_cast<size_t>(num_items_), Rows{});

    // arrive[i][g] starts as the cost of a row from each of i's tokens to g, counted through the
    // tokens per source GPU and node; the GPUs a token already reaches are taken off below.
    std::vector<int64_t> tokens_from_gpu(static_cast<size_t>(num_gpus_));
    std::vector<int64_t> tokens_from_node(static_cast<size_t>(layer_.num_nodes));
    for (int64_t i = 0; i < num_items_; ++i) {
      std::fill(tokens_from_gpu.begin(), tokens_from_gpu.end(), 0);
      std::fill(tokens_from_node.begin(), tokens_from_node.end(), 0);
      for (const int32_t p : pairs_of(i)) {
        const int64_t source = layer_.source_gpu[static_cast<size_t>(p / top_k_)];
        ++tokens_from_gpu[static_cast<size_t>(source)];
        ++tokens_from_node[static_cast<size_t>(layer_.node_of_gpu(source))];
      }
      const int64_t num_tokens = item_load_[static_cast<size_t>(i)];
      Rows* arrive = &arrive_[static_cast<size_t>(i * num_gpus_)];
      for (int64_t g = 0; g < num_gpus_; ++g) {
        const int64_t on_node = tokens_from_node[static_cast<size_t>(layer_.node_of_gpu(g))];
        arrive[g] = {num_tokens - on_node, on_node - tokens_from_gpu[static_cast<size_t>(g)]};
      }
    }
    for (int64_t t = 0; t < layer_.num_tokens(); ++t) {
      const int32_t* items = item_of_pair_.data() + t * top_k_;
      const int64_t source = layer_.source_gpu[static_cast<size_t>(t)];
      for (int64_t j = 0; j < top_k_; ++j) {
        const int32_t gpu = gpu_[static_cast<size_t>(items[j])];
        int64_t on_gpu = 0;
        bool first_on_gpu = true;
        for (int64_t m = 0; m < top_k_; ++m) {
          const bool same = gpu_[static_cast<size_t>(items[m])] == gpu;
          on_gpu += same;
          first_on_gpu &= !(same && m < j);
        }
        const Rows saving = on_gpu == 1 ? row_cost(source, gpu) : Rows{};
        saving_of_pair_[static_cast<size_t>(t * top_k_ + j)] = saving;
        leave_[static_cast<size_t>(items[j])] -= saving;
        if (!first_on_gpu) continue;
        for (int64_t m = 0; m < top_k_; ++m) {
          arrive_[static_cast<size_t>(items[m] * num_gpus_ + gpu)] -= row_cost(source, gpu);
        }
      }
    }
  }

  std::span<const int32_t> pairs_of(int64_t item) const {
    const int64_t begin = first_pair_[static_cast<size_t>(item)];
    const int64_t end = first_pair_[static_cast<size_t>(item + 1)];
    return std::span<const int32_t>(pairs_of_item_)
        .subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
  }

  // The partner of the most negative feasible delta.
  Partner best_partner(int32_t a) {
    // together[a][*] into together_, from the savings of a's tokens.
    for (const int32_t p : pairs_of(a)) {
      const int64_t first = p / top_k_ * top_k_;
      const Rows saving_a = saving_of_pair_[static_cast<size_t>(p)];
      for (int64_t q = first; q < first + top_k_; ++q) {
        together_[static_cast<size_t>(item_of_pair_[static_cast<size_t>(q)])] -=
            saving_a + saving_of_pair_[static_cast<size_t>(q)];
      }
    }
    together_[static_cast<size_t>(a)] = Rows{};  // never a partner of itself

    const int32_t ga = gpu_[static_cast<size_t>(a)];
    const int32_t expert = layer_.phy2log[static_cast<size_t>(a)];
    const Rows leave_a = leave_[static_cast<size_t>(a)];
    const Rows* arrive_a = &arrive_[static_cast<size_t>(a * num_gpus_)];
    Partner best;
    for (int32_t b = 0; b < num_items_; ++b) {
      const int32_t gb = gpu_[static_cast<size_t>(b)];
      // Two replicas of one expert trade places without changing the placement.
      if (gb == ga || layer_.phy2log[static_cast<size_t>(b)] == expert) continue;
      const Rows delta = leave_a + arrive_a[gb] + leave_[static_cast<size_t>(b)] +
                         arrive_[static_cast<size_t>(b * num_gpus_ + ga)] -
                         together_[static_cast<size_t>(b)];
      if (delta < best.delta && keeps_load_bound(a, b)) best = {b, delta};
    }
    std::fill(together_.begin(), together_.end(), Rows{});
    return best;
  }

  // The GPU that grows must stay within the cap; the other one shrinks.
  bool keeps_load_bound(int32_t a, int32_t b) const {
    const int64_t growth = item_load_[static_cast<size_t>(b)] - item_load_[static_cast<size_t>(a)];
    if (growth == 0) return true;
    const int32_t grower = growth > 0 ? gpu_[static_cast<size_t>(a)] : gpu_[static_cast<size_t>(b)];
    const int64_t new_load = gpu_load_[static_cast<size_t>(grower)] + std::abs(growth);
    return static_cast<double>(new_load) <= load_cap_;
  }

  void swap(int32_t a, int32_t b) {
    ++num_swaps_made_;
    const int32_t ga = gpu_[static_cast<size_t>(a)];
    const int32_t gb = gpu_[static_cast<size_t>(b)];
    for (const int32_t item : {a, b}) {
      for (const int32_t p : pairs_of(item)) {
        const int64_t t = p / top_k_;
        if (swap_of_token_[static_cast<size_t>(t)] == num_swaps_made_) continue;
        swap_of_token_[static_cast<size_t>(t)] = num_swaps_made_;
        update_token(t, a, b, ga, gb);
      }
    }
    std::swap(gpu_[static_cast<size_t>(a)], gpu_[static_cast<size_t>(b)]);
    std::swap(slot_[static_cast<size_t>(a)], slot_[static_cast<size_t>(b)]);
    const int64_t moved = item_load_[static_cast<size_t>(a)] - item_load_[static_cast<size_t>(b)];
    gpu_load_[static_cast<size_t>(ga)] -= moved;
    gpu_load_[static_cast<size_t>(gb)] += moved;
  }

  // Token t's entries for a moving from ga to gb and b from gb to ga (gpu_ still holds the
  // positions before). Only n_t(ga) and n_t(gb) change, so only the items on those GPUs (before or
  // after) change their saving, and arrive changes only at ga and gb.
  void update_token(int64_t t, int32_t a, int32_t b, int32_t ga, int32_t gb) {
    const int64_t first = t * top_k_;
    const int32_t* items = item_of_pair_.data() + first;
    const int64_t source = layer_.source_gpu[static_cast<size_t>(t)];
    int64_t before_on_a = 0, before_on_b = 0, holds_a = 0, holds_b = 0;
    for (int64_t j = 0; j < top_k_; ++j) {
      const int32_t gpu = gpu_[static_cast<size_t>(items[j])];
      before_on_a += gpu == ga;
      before_on_b += gpu == gb;
      holds_a += items[j] == a;
      holds_b += items[j] == b;
    }
    const int64_t after_on_a = before_on_a - holds_a + holds_b;
    const int64_t after_on_b = before_on_b - holds_b + holds_a;

    const Rows cost_a = row_cost(source, ga);
    const Rows cost_b = row_cost(source, gb);
    for (int64_t j = 0; j < top_k_; ++j) {
      const int32_t item = items[j];
      const int32_t before = gpu_[static_cast<size_t>(item)];
      if (before != ga && before != gb) continue;
      const int32_t after = item == a ? gb : item == b ? ga : before;
      const int64_t after_count = after == ga ? after_on_a : after_on_b;
      const Rows saving = after_count == 1 ? (after == ga ? cost_a : cost_b) : Rows{};
      Rows& kept = saving_of_pair_[static_cast<size_t>(first + j)];
      leave_[static_cast<size_t>(item)] -= saving - kept;
      kept = saving;
    }

    // Usually neither changes: the token still reaches (or still misses) both GPUs.
    const Rows arrive_a =
        (after_on_a == 0 ? cost_a : Rows{}) - (before_on_a == 0 ? cost_a : Rows{});
    const Rows arrive_b =
        (after_on_b == 0 ? cost_b : Rows{}) - (before_on_b == 0 ? cost_b : Rows{});
    if (arrive_a != Rows{}) {
      for (int64_t j = 0; j < top_k_; ++j) {
        arrive_[static_cast<size_t>(items[j] * num_gpus_ + ga)] += arrive_a;
      }
    }
    if (arrive_b != Rows{}) {
      for (int64_t j = 0; j < top_k_; ++j) {
        arrive_[static_cast<size_t>(items[j] * num_gpus_ + gb)] += arrive_b;
      }
    }
  }

  const LayerProblem& layer_;
  std::span<const int32_t> item_of_pair_;  // [num_pairs]: items are the start slots
  int64_t num_items_, num_gpus_, top_k_;
  double load_cap_;

  std::vector<int32_t> slot_;           // [num_items]: where each item is now
  std::vector<int32_t> gpu_;            // [num_items]
  std::vector<int64_t> item_load_;      // [num_items]: pairs
  std::vector<int64_t> gpu_load_;       // [num_gpus]: pairs
  std::vector<int64_t> first_pair_;     // [num_items + 1]
  std::vector<int32_t> pairs_of_item_;  // [num_pairs]
  std::vector<Rows> saving_of_pair_;    // [num_pairs]: u_t of the pair's item
  std::vector<Rows> leave_;             // [num_items]
  std::vector<Rows> arrive_;            // [num_items, num_gpus]
  std::vector<Rows> together_;          // [num_items]: one row of together, zero between uses
  Rows saved_;

  // swap() visits each token once, marked with the swap's number.
  int64_t num_swaps_made_ = 0;
  std::vector<int64_t> swap_of_token_;  // [num_tokens]
};

}  // namespace

SwapSearchResult search_swaps(const LayerProblem& layer, std::span<const int32_t> slot_of_pair,
                              double load_cap, int64_t max_sweeps) {
  SwapSearch search(layer, slot_of_pair, load_cap);
  int64_t num_swaps = 0;
  for (int64_t sweep = 0; sweep < max_sweeps; ++sweep) {
    const int64_t made = search.sweep();
    num_swaps += made;
    if (made == 0) break;
  }
  return search.result(num_swaps);
}

}  // namespace moe::balance
