// Properties of the work split: every row of every expert meets every weight pair exactly once,
// chunks respect the rows per pass, every thread gets a share of every expert in decode (a
// prefill chunk may go to one thread whole), and an expert holding half the pairs is cut finely
// enough that no item holds more than a small part of the total work.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/work_split.h"

namespace moe::testing {
namespace {

struct SplitCase {
  std::vector<int32_t> rows_per_expert;
  cpu::WorkCosts costs;
  int num_threads = 2;
};

double item_cost(const cpu::WorkCosts& costs, const cpu::ExpertRows& chunk,
                 const cpu::WorkItem& item) {
  return (item.pair_end - item.pair_begin) *
         (costs.pair_bytes * costs.flops_per_byte + chunk.num_rows * costs.pair_flops_per_row);
}

void check_split(const SplitCase& c) {
  // Row ids 0, 1, ... numbered expert by expert.
  std::vector<int32_t> ids, expert_of_id;
  std::vector<cpu::ExpertRows> groups;
  for (size_t e = 0; e < c.rows_per_expert.size(); ++e) {
    for (int32_t r = 0; r < c.rows_per_expert[e]; ++r) {
      ids.push_back(static_cast<int32_t>(ids.size()));
      expert_of_id.push_back(static_cast<int32_t>(e));
    }
  }
  int32_t offset = 0;
  for (size_t e = 0; e < c.rows_per_expert.size(); ++e) {
    if (c.rows_per_expert[e] > 0) {
      groups.push_back({static_cast<int32_t>(e), c.rows_per_expert[e], ids.data() + offset});
    }
    offset += c.rows_per_expert[e];
  }
  std::vector<cpu::ExpertRows> chunks;
  std::vector<cpu::WorkItem> items;
  cpu::split_work(groups.data(), static_cast<int64_t>(groups.size()), c.costs, c.num_threads,
                  chunks, items);

  // Each (row, pair) is covered once, by an item of the row's expert.
  const int64_t P = c.costs.num_pairs;
  std::vector<int> covered(ids.size() * static_cast<size_t>(P), 0);
  std::vector<int64_t> items_per_chunk(chunks.size(), 0);
  double total = 0, largest = 0;
  for (const cpu::WorkItem& item : items) {
    ASSERT_GE(item.chunk, 0);
    ASSERT_LT(item.chunk, static_cast<int32_t>(chunks.size()));
    ASSERT_LE(0, item.pair_begin);
    ASSERT_LT(item.pair_begin, item.pair_end);
    ASSERT_LE(item.pair_end, P);
    const cpu::ExpertRows& chunk = chunks[item.chunk];
    ++items_per_chunk[item.chunk];
    for (int32_t r = 0; r < chunk.num_rows; ++r) {
      const int32_t id = chunk.ids[r];
      ASSERT_EQ(chunk.expert, expert_of_id[id]) << "row " << id;
      for (int32_t p = item.pair_begin; p < item.pair_end; ++p) ++covered[id * P + p];
    }
    const double cost = item_cost(c.costs, chunk, item);
    total += cost;
    largest = std::max(largest, cost);
  }
  for (size_t i = 0; i < covered.size(); ++i) {
    ASSERT_EQ(covered[i], 1) << "row " << i / P << " pair " << i % P;
  }
  const int64_t multiple = c.costs.row_multiple;
  const int64_t cap = (c.costs.rows_per_pass + multiple - 1) / multiple * multiple;
  for (size_t ch = 0; ch < chunks.size(); ++ch) {
    EXPECT_LE(chunks[ch].num_rows, cap);
    const bool last_of_expert =
        ch + 1 == chunks.size() || chunks[ch + 1].expert != chunks[ch].expert;
    if (!last_of_expert) {
      EXPECT_EQ(chunks[ch].num_rows % multiple, 0) << "chunk " << ch;
    }
    // Decode: every thread gets a share of every chunk. Prefill (four chunks per thread or more):
    // a chunk of more than one row block may go to one thread whole.
    const bool prefill = chunks.size() >= 4 * static_cast<size_t>(c.num_threads);
    if (!prefill || chunks[ch].num_rows <= multiple) {
      EXPECT_GE(items_per_chunk[ch], std::min<int64_t>(c.num_threads, P)) << "chunk " << ch;
    }
  }
  // No item carries more than a quarter of one thread's fair share, unless the chunk could not
  // be cut finer (one pair per item).
  for (const cpu::WorkItem& item : items) {
    const double cost = item_cost(c.costs, chunks[item.chunk], item);
    if (item.pair_end - item.pair_begin > 1) {
      EXPECT_LE(cost, 0.5 * total / c.num_threads) << "items of chunk " << item.chunk;
    }
  }
}

cpu::WorkCosts qwen_like_costs(int64_t num_pairs, int64_t rows_per_pass, int64_t row_multiple) {
  cpu::WorkCosts costs;
  costs.num_pairs = num_pairs;
  costs.pair_bytes = 2.0 * 32 * 2048 * 2;
  costs.pair_flops_per_row = 2.0 * 32 * 2048;
  costs.flops_per_byte = 8;
  costs.rows_per_pass = rows_per_pass;
  costs.row_multiple = row_multiple;
  return costs;
}

TEST(WorkSplit, DecodeSplitsEveryExpertAcrossThreads) {
  SplitCase c;
  c.rows_per_expert = std::vector<int32_t>(128, 0);
  for (int e : {3, 17, 40, 41, 77, 90, 101, 127}) c.rows_per_expert[e] = 1;
  for (int threads : {1, 2, 3, 16}) {
    c.num_threads = threads;
    c.costs = qwen_like_costs(48, 256, 6);
    check_split(c);
  }
}

TEST(WorkSplit, PrefillGivesEachChunkToOneThread) {
  // 4096 tokens of a 128-expert top-8 model: one chunk of 256 rows per expert, each cheap enough
  // to be one item, so each thread gathers the rows of its own chunks only.
  SplitCase c;
  c.rows_per_expert = std::vector<int32_t>(128, 256);
  c.costs = qwen_like_costs(48, 256, 32);
  check_split(c);
  std::vector<int32_t> ids(128 * 256);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<cpu::ExpertRows> groups;
  for (int32_t e = 0; e < 128; ++e) groups.push_back({e, 256, ids.data() + e * 256});
  std::vector<cpu::ExpertRows> chunks;
  std::vector<cpu::WorkItem> items;
  cpu::split_work(groups.data(), 128, c.costs, 2, chunks, items);
  ASSERT_EQ(chunks.size(), 128u);
  ASSERT_EQ(items.size(), 128u);
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(items[i].chunk, static_cast<int32_t>(i));
    EXPECT_EQ(items[i].pair_end - items[i].pair_begin, 48);
  }
}

TEST(WorkSplit, SkewedRoutingIsCutByCost) {
  // One expert holds half the pairs of a 512-token top-8 batch.
  SplitCase c;
  c.rows_per_expert = std::vector<int32_t>(128, 16);
  c.rows_per_expert[5] = 2048;
  c.costs = qwen_like_costs(64, 256, 32);
  check_split(c);
  c.num_threads = 16;
  check_split(c);
}

TEST(WorkSplit, RandomRoutings) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 50; ++trial) {
    SplitCase c;
    const int E = 1 + static_cast<int>(rng() % 40);
    c.rows_per_expert.resize(E);
    for (int32_t& rows : c.rows_per_expert)
      rows = static_cast<int32_t>(rng() % 3 == 0 ? 0 : rng() % 300);
    c.num_threads = 1 + static_cast<int>(rng() % 8);
    c.costs = qwen_like_costs(1 + rng() % 70, 1 + rng() % 300, trial % 2 ? 1 : 16);
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_split(c);
  }
}

TEST(WorkSplit, NoRowsNoItems) {
  std::vector<cpu::ExpertRows> chunks(3), none;
  std::vector<cpu::WorkItem> items(5);
  cpu::split_work(none.data(), 0, qwen_like_costs(10, 32, 1), 2, chunks, items);
  EXPECT_TRUE(chunks.empty());
  EXPECT_TRUE(items.empty());
}

}  // namespace
}  // namespace moe::testing
