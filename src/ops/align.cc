// The public align_block_size: checks its arguments once, then runs the CPU kernel.
#include "moe/align.h"

#include <limits>

#include "kernels/cpu/align_block_size.h"
#include "moe/error.h"

namespace moe {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// topk_ids must be a CPU int32 [M, k] tensor whose ids all name an expert. The id check stays on
// in release builds: an id from a corrupt routing would otherwise index past the counts.
void check_topk_ids(const TensorView& topk_ids, int64_t num_experts) {
  if (num_experts < 1 || num_experts > kMaxInt32) {
    fail("num_experts: expected 1..{}; got {}", kMaxInt32, num_experts);
  }
  check_rank(topk_ids, "topk_ids", 2);
  check_dtype(topk_ids, "topk_ids", {DType::kI32});
  check_device(topk_ids, "topk_ids", Device::kCpu);
  check_contiguous(topk_ids, "topk_ids");
  if (topk_ids.size(1) < 1) {
    fail("topk_ids: expected at least one expert per token (shape [M, k] with k >= 1); got {}",
         shape_string(topk_ids.shape));
  }
  // Pair ids and the sentinel M * k are int32.
  if (topk_ids.numel() >= kMaxInt32) {
    fail("topk_ids: expected fewer than {} pairs (M * k); got shape {}", kMaxInt32,
         shape_string(topk_ids.shape));
  }
  const int32_t* ids = topk_ids.as<const int32_t>();
  const int64_t top_k = topk_ids.size(1);
  for (int64_t i = 0; i < topk_ids.numel(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_experts) {
      fail("topk_ids: expected expert ids in [0, {}); got {} at flat index {} (token {}, slot {})",
           num_experts, ids[i], i, i / top_k, i % top_k);
    }
  }
}

void check_expert_map(const TensorView& expert_map, int64_t num_experts) {
  check_rank(expert_map, "expert_map", 1);
  check_dtype(expert_map, "expert_map", {DType::kI32});
  check_device(expert_map, "expert_map", Device::kCpu);
  check_contiguous(expert_map, "expert_map");
  check_shape(expert_map, "expert_map", {num_experts});
  const int32_t* map = expert_map.as<const int32_t>();
  for (int64_t e = 0; e < num_experts; ++e) {
    if (map[e] < -1) {
      fail(
          "expert_map: expected a local expert id >= 0 or -1 (not local) per expert; got {} for "
          "expert {}",
          map[e], e);
    }
  }
}

}  // namespace

AlignedPairs align_block_size(const TensorView& topk_ids, int64_t num_experts, int64_t block_m,
                              const TensorView& expert_map) {
  check_topk_ids(topk_ids, num_experts);
  const bool has_map = !expert_map.empty();
  if (has_map) check_expert_map(expert_map, num_experts);
  const int64_t num_pairs = topk_ids.numel();
  // Every entry, padding included, is addressed by int32 offsets, so the worst case must fit.
  if (block_m < 1 || block_m - 1 > (kMaxInt32 - num_pairs) / num_experts) {
    fail("block_m: expected 1..{} so that {} pairs padded for {} experts fit in int32; got {}",
         (kMaxInt32 - num_pairs) / num_experts + 1, num_pairs, num_experts, block_m);
  }

  const int64_t capacity = max_num_pairs_post_padded(num_pairs, num_experts, block_m);
  AlignedPairs aligned;
  aligned.block_m = block_m;
  aligned.sorted_pair_ids.resize(static_cast<size_t>(capacity));
  aligned.expert_ids.resize(static_cast<size_t>(capacity / block_m));
  std::vector<int32_t> expert_offsets(static_cast<size_t>(num_experts + 1));  // [E + 1]
  aligned.num_pairs_post_padded = cpu::align_block_size(
      topk_ids.as<const int32_t>(), num_pairs, num_experts, block_m,
      has_map ? expert_map.as<const int32_t>() : nullptr, aligned.sorted_pair_ids.data(),
      aligned.expert_ids.data(), expert_offsets.data());
  aligned.sorted_pair_ids.resize(static_cast<size_t>(aligned.num_pairs_post_padded));
  aligned.expert_ids.resize(static_cast<size_t>(aligned.num_pairs_post_padded / block_m));
  return aligned;
}

bool use_tiny_batch_path(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                         bool has_expert_map) {
  return num_tokens * top_k * 4 <= num_experts && !has_expert_map;
}

AlignedPairs align_tiny_batch(const TensorView& topk_ids, int64_t num_experts) {
  check_topk_ids(topk_ids, num_experts);
  const int64_t num_pairs = topk_ids.numel();
  AlignedPairs aligned;
  aligned.block_m = 1;
  aligned.num_pairs_post_padded = num_pairs;
  aligned.sorted_pair_ids.resize(static_cast<size_t>(num_pairs));
  aligned.expert_ids.resize(static_cast<size_t>(num_pairs));
  cpu::align_tiny_batch(topk_ids.as<const int32_t>(), num_pairs, aligned.sorted_pair_ids.data(),
                        aligned.expert_ids.data());
  return aligned;
}

}  // namespace moe
