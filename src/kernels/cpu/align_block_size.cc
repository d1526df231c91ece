// Counting sort in three passes over topk_ids and the experts: count pairs per expert, turn the
// counts into padded group starts (writing the padding and expert_ids on the way), then scatter
// the pair ids. Serial on purpose: it touches num_pairs ids once or twice, microseconds next to
// the expert GEMMs it feeds, and a serial sort is deterministic without any merging.
#include "kernels/cpu/align_block_size.h"

#include <algorithm>
#include <numeric>

namespace moe::cpu {

int64_t align_block_size(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                         int64_t block_m, const int32_t* expert_map, int32_t* sorted_pair_ids,
                         int32_t* expert_ids, int32_t* expert_offsets) {
  const int32_t sentinel = static_cast<int32_t>(num_pairs);

  // Pass 1: the count of expert e goes to expert_offsets[e + 1], so pass 2 can overwrite
  // expert_offsets[e] while reading the count it still needs.
  std::fill(expert_offsets, expert_offsets + num_experts + 1, 0);
  for (int64_t p = 0; p < num_pairs; ++p) ++expert_offsets[topk_ids[p] + 1];

  // Pass 2: group starts, padding and block experts. expert_offsets[e] is left at the end of the
  // group's real entries, so pass 3 can fill each group from its back.
  int64_t group_start = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t count = expert_offsets[e + 1];
    const int64_t real_end = group_start + count;
    const int64_t padded_end = group_start + (count + block_m - 1) / block_m * block_m;
    std::fill(sorted_pair_ids + real_end, sorted_pair_ids + padded_end, sentinel);
    const int32_t block_expert = expert_map ? expert_map[e] : static_cast<int32_t>(e);
    std::fill(expert_ids + group_start / block_m, expert_ids + padded_end / block_m, block_expert);
    expert_offsets[e] = static_cast<int32_t>(real_end);
    group_start = padded_end;
  }
  expert_offsets[num_experts] = static_cast<int32_t>(group_start);

  // Pass 3: walking the pairs backwards and filling each group from its back keeps pair ids
  // ascending inside a group, and leaves expert_offsets[e] at the group's start.
  for (int64_t p = num_pairs - 1; p >= 0; --p) {
    sorted_pair_ids[--expert_offsets[topk_ids[p]]] = static_cast<int32_t>(p);
  }
  return group_start;
}

void align_tiny_batch(const int32_t* topk_ids, int64_t num_pairs, int32_t* sorted_pair_ids,
                      int32_t* expert_ids) {
  std::iota(sorted_pair_ids, sorted_pair_ids + num_pairs, 0);
  std::copy(topk_ids, topk_ids + num_pairs, expert_ids);
}

}  // namespace moe::cpu
