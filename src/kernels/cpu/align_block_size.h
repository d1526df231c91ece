// Block-aligned grouping of (token, expert) pairs on the CPU: a stable counting sort by expert.
//
// align_block_size writes sorted_pair_ids (pair ids grouped by ascending expert, ascending inside
// a group, each group padded with the sentinel num_pairs up to a multiple of block_m) and one
// expert_ids entry per block (expert_map[e], or e without a map). align_tiny_batch writes the
// unsorted one-pair-per-block layout. Inputs are trusted: the API edge (src/ops/align.cc) has
// checked every id. Tested by tests/align/align_block_size_test.cc (properties on random routings,
// poisoned outputs with guard regions).
#pragma once

#include <cstdint>

namespace moe::cpu {

// topk_ids [num_pairs] with ids in [0, num_experts); expert_map [num_experts] or nullptr.
// sorted_pair_ids needs max_num_pairs_post_padded(num_pairs, num_experts, block_m) entries and
// expert_ids that many divided by block_m; only the first num_pairs_post_padded (returned) and
// num_pairs_post_padded / block_m are written. Allocates nothing, so a layer can call it every
// forward with buffers sized once. On return expert_offsets [num_experts + 1] holds where each
// expert's group starts in sorted_pair_ids, with expert_offsets[num_experts] =
// num_pairs_post_padded.
int64_t align_block_size(const int32_t* topk_ids, int64_t num_pairs, int64_t num_experts,
                         int64_t block_m, const int32_t* expert_map, int32_t* sorted_pair_ids,
                         int32_t* expert_ids, int32_t* expert_offsets);

// sorted_pair_ids [num_pairs] = 0..num_pairs-1 and expert_ids [num_pairs] = topk_ids: block_m 1,
// pair i alone in block i.
void align_tiny_batch(const int32_t* topk_ids, int64_t num_pairs, int32_t* sorted_pair_ids,
                      int32_t* expert_ids);

}  // namespace moe::cpu
