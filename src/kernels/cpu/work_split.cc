#include "kernels/cpu/work_split.h"

#include <algorithm>
#include <cmath>

namespace moe::cpu {

namespace {

// Items per thread on average: slack for the dynamic schedule to even out what the cost model
// gets wrong (cache hits, a thread descheduled on a shared machine).
constexpr double kItemsPerThread = 4;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

double pair_cost(const WorkCosts& costs, int64_t rows) {
  return costs.pair_bytes * costs.flops_per_byte +
         static_cast<double>(rows) * costs.pair_flops_per_row;
}

}  // namespace

void split_work(const ExpertRows* groups, int64_t num_groups, const WorkCosts& costs,
                int num_threads, std::vector<ExpertRows>& chunks, std::vector<WorkItem>& items) {
  chunks.clear();
  items.clear();
  const int64_t rows_per_pass = std::max<int64_t>(costs.rows_per_pass, 1);
  const int64_t threads = std::max(num_threads, 1);
  int64_t total_rows = 0;
  for (int64_t g = 0; g < num_groups; ++g) total_rows += groups[g].num_rows;
  // A group of r rows makes ceil(r / rows_per_pass) chunks; a chunk of cost c makes at most
  // c / target + 1 items, and at least min(threads, pairs) or one: see the loop below.
  const int64_t max_chunks = num_groups + total_rows / rows_per_pass;
  chunks.reserve(static_cast<size_t>(max_chunks));
  items.reserve(static_cast<size_t>(kItemsPerThread * threads + max_chunks * (threads + 1)));
  for (int64_t g = 0; g < num_groups; ++g) {
    const ExpertRows& group = groups[g];
    const int64_t passes = (group.num_rows + rows_per_pass - 1) / rows_per_pass;
    if (passes == 0) continue;
    // Equal chunks, rounded to the kernel's row block, never past rows_per_pass rounded the same.
    const int64_t size =
        std::min(round_up((group.num_rows + passes - 1) / passes, costs.row_multiple),
                 round_up(rows_per_pass, costs.row_multiple));
    for (int64_t begin = 0; begin < group.num_rows; begin += size) {
      ExpertRows chunk = group;
      chunk.ids = group.ids + begin;
      chunk.num_rows = static_cast<int32_t>(std::min(size, group.num_rows - begin));
      chunks.push_back(chunk);
    }
  }
  if (chunks.empty() || costs.num_pairs == 0) return;

  double total = 0;
  for (const ExpertRows& chunk : chunks) total += pair_cost(costs, chunk.num_rows);
  total *= static_cast<double>(costs.num_pairs);
  const double target = total / (kItemsPerThread * std::max(num_threads, 1));
  const int64_t min_pieces = std::min<int64_t>(std::max(num_threads, 1), costs.num_pairs);
  // Prefill: with enough chunks to go round, a chunk of more than one row block is cut by its cost
  // alone, so most go to one thread whole. Cut into min_pieces, every thread gathered the same
  // rows of every chunk (packed_gemm.cc gathers a chunk's rows per thread): a 4096-token layer
  // took about 3% longer (amx path) and 4% (avx2).
  const bool prefill = static_cast<double>(chunks.size()) >= kItemsPerThread * threads;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const double cost = pair_cost(costs, chunks[c].num_rows) * static_cast<double>(costs.num_pairs);
    const bool whole = prefill && chunks[c].num_rows > costs.row_multiple;
    const int64_t pieces = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(cost / target)),
                                               whole ? 1 : min_pieces, costs.num_pairs);
    for (int64_t i = 0; i < pieces; ++i) {
      items.push_back({static_cast<int32_t>(c), static_cast<int32_t>(i * costs.num_pairs / pieces),
                       static_cast<int32_t>((i + 1) * costs.num_pairs / pieces)});
    }
  }
}

}  // namespace moe::cpu
