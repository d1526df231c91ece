// align_block_size on the GPU, with the same layout as the CPU kernel (kernels/cpu), so the
// grouped GEMMs of every backend read the same thing. See include/moe/align.h for the meaning.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moe::cuda {

struct AlignArgs {
  const int32_t* topk_ids = nullptr;    // [num_pairs]: expert ids; ids outside [0, E) get no slot
  const int32_t* expert_map = nullptr;  // [num_experts]: local id or -1; null = identity
  int64_t num_pairs = 0;                // M * k (also the padding sentinel)
  int64_t num_experts = 0;              // E
  int64_t num_local_experts = 0;        // map entries outside [0, this) count as not local
  int64_t block_m = 0;
  int32_t* sorted_pair_ids = nullptr;        // [max_num_pairs_post_padded]
  int32_t* expert_ids = nullptr;             // [max_num_pairs_post_padded / block_m]
  int32_t* num_pairs_post_padded = nullptr;  // [1]
  int32_t* scratch = nullptr;  // [align_scratch_bytes / 4]: per-segment counts (three launches)
};

// Device scratch align_block_size needs for num_pairs pairs over num_experts experts: none up to
// 8192 pairs and 256 experts, at most 512 KiB whatever the sizes (the three-launch path's; the
// cluster path, which takes those batches on Hopper, leaves it unused).
size_t align_scratch_bytes(int64_t num_pairs, int64_t num_experts);

// The sorted layout: pair ids grouped by expert, ascending inside each group (stable), each group
// padded to a multiple of block_m. A counting sort over segments of the pairs: one launch for up to
// 8192 pairs and 256 experts, and on Hopper for any number of pairs over up to 256 experts; three
// launches otherwise. No host synchronization.
void align_block_size(const AlignArgs& args, cudaStream_t stream);

// The tiny-batch layout (block_m must be 1): pair i alone in block i, no sort.
void align_tiny_batch(const AlignArgs& args, cudaStream_t stream);

// Largest expert count align_block_size accepts (its per-expert counts live in shared memory).
inline constexpr int64_t kMaxAlignExperts = 8192;

}  // namespace moe::cuda
