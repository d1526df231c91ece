// Block-aligned grouping of (token, expert) pairs, as vLLM's moe_align_block_size.
//
// Pair p = t * k + j is slot j of token t. sorted_pair_ids lists the pair ids grouped by expert
// (ascending expert id, ascending pair id inside a group), each group padded with the sentinel
// M * k up to a multiple of block_m. expert_ids holds one expert per block of block_m entries:
// the local id from expert_map, or -1 where the expert is not local (its blocks are skipped by the
// experts kernels). Experts with no pairs get no block.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/tensor.h"

namespace moe {

struct AlignedPairs {
  int64_t block_m = 0;
  int64_t num_pairs_post_padded = 0;     // = sorted_pair_ids.size()
  std::vector<int32_t> sorted_pair_ids;  // [num_pairs_post_padded]
  std::vector<int32_t> expert_ids;       // [num_pairs_post_padded / block_m]
};

// topk_ids [M, k] int32 with ids in [0, num_experts); expert_map, if given, [num_experts] int32
// with a local id or -1 per expert. Throws moe::Error on bad ids (checked in release builds too),
// sizes, block_m < 1, or a padded layout too large for int32 offsets.
AlignedPairs align_block_size(const TensorView& topk_ids, int64_t num_experts, int64_t block_m,
                              const TensorView& expert_map = {});

// The same layout into the caller's buffers, as vLLM's op: sorted_pair_ids [>= capacity] and
// expert_ids [>= capacity / block_m] int32, with capacity = max_num_pairs_post_padded(M * k,
// num_experts, block_m), and num_pairs_post_padded [1] int32; only the first
// num_pairs_post_padded entries (and blocks) are written. All tensors on one device. On the GPU
// (up to 8192 experts) every shape, dtype and size is checked before anything is queued on
// `cuda_stream` (a cudaStream_t; null is the legacy default stream), and the call returns without
// synchronizing; device memory is not read on the host, so instead of an error an id outside
// [0, num_experts) gets no slot and an expert_map entry below -1 counts as not local.
void align_block_size(const TensorView& topk_ids, int64_t num_experts, int64_t block_m,
                      const TensorView& expert_map, const TensorView& sorted_pair_ids,
                      const TensorView& expert_ids, const TensorView& num_pairs_post_padded,
                      void* cuda_stream = nullptr);

// vLLM skips the sort for tiny batches (M * k * 4 <= E, no expert map): most experts then get
// at most one pair, so sorting buys nothing.
bool use_tiny_batch_path(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                         bool has_expert_map);

// The tiny-batch layout: block_m = 1, pair i alone in block i, expert_ids = topk_ids flattened.
AlignedPairs align_tiny_batch(const TensorView& topk_ids, int64_t num_experts);

// Upper bound of num_pairs_post_padded, for sizing buffers once.
inline int64_t max_num_pairs_post_padded(int64_t num_pairs, int64_t num_experts, int64_t block_m) {
  return num_pairs + num_experts * (block_m - 1);
}

}  // namespace moe
