// The public align_block_size: checks its arguments once, then runs the CPU kernel, or the CUDA
// kernel for tensors in GPU memory.
#include "moe/align.h"

#include <limits>

#include "kernels/cpu/align_block_size.h"
#include "moe/error.h"

#ifdef MOE_WITH_CUDA
#include "kernels/cuda/align_block_size.h"
#include "ops/cuda_stream_scratch.h"
#endif

namespace moe {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// topk_ids must be an int32 [M, k] tensor whose ids all name an expert. The id check stays on
// in release builds: an id from a corrupt routing would otherwise index past the counts. Device
// memory is not read here (that would synchronize): the CUDA kernel gives bad ids no slot.
void check_topk_ids(const TensorView& topk_ids, int64_t num_experts) {
  if (num_experts < 1 || num_experts > kMaxInt32) {
    fail("num_experts: expected 1..{}; got {}", kMaxInt32, num_experts);
  }
  check_rank(topk_ids, "topk_ids", 2);
  check_dtype(topk_ids, "topk_ids", {DType::kI32});
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
  if (topk_ids.numel() > 0 && topk_ids.data == nullptr) fail("topk_ids: data pointer is null");
  if (topk_ids.device != Device::kCpu) return;
  const int32_t* ids = topk_ids.as<const int32_t>();
  const int64_t top_k = topk_ids.size(1);
  for (int64_t i = 0; i < topk_ids.numel(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_experts) {
      fail("topk_ids: expected expert ids in [0, {}); got {} at flat index {} (token {}, slot {})",
           num_experts, ids[i], i, i / top_k, i % top_k);
    }
  }
}

void check_expert_map(const TensorView& expert_map, int64_t num_experts, Device device) {
  check_rank(expert_map, "expert_map", 1);
  check_dtype(expert_map, "expert_map", {DType::kI32});
  check_device(expert_map, "expert_map", device);
  check_contiguous(expert_map, "expert_map");
  check_shape(expert_map, "expert_map", {num_experts});
  if (expert_map.data == nullptr) fail("expert_map: data pointer is null");
  if (device != Device::kCpu) return;  // the CUDA kernel counts entries below -1 as not local
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

// Every entry, padding included, is addressed by int32 offsets, so the worst case must fit.
void check_block_m(int64_t block_m, int64_t num_pairs, int64_t num_experts) {
  if (block_m < 1 || block_m - 1 > (kMaxInt32 - num_pairs) / num_experts) {
    fail("block_m: expected 1..{} so that {} pairs padded for {} experts fit in int32; got {}",
         (kMaxInt32 - num_pairs) / num_experts + 1, num_pairs, num_experts, block_m);
  }
}

// A 1-D int32 output on `device` with room for at least `entries`.
void check_output(const TensorView& t, const char* name, int64_t entries, Device device) {
  check_rank(t, name, 1);
  check_dtype(t, name, {DType::kI32});
  check_device(t, name, device);
  check_contiguous(t, name);
  if (t.numel() < entries) {
    fail("{}: expected room for at least {} entries; got shape {}", name, entries,
         shape_string(t.shape));
  }
  if (t.numel() > 0 && t.data == nullptr) fail("{}: data pointer is null", name);
}

}  // namespace

AlignedPairs align_block_size(const TensorView& topk_ids, int64_t num_experts, int64_t block_m,
                              const TensorView& expert_map) {
  if (topk_ids.device != Device::kCpu) {
    fail(
        "topk_ids: a GPU tensor, but this align_block_size() returns host vectors; pass device "
        "outputs to align_block_size(topk_ids, num_experts, block_m, expert_map, "
        "sorted_pair_ids, expert_ids, num_pairs_post_padded, cuda_stream)");
  }
  check_topk_ids(topk_ids, num_experts);
  const bool has_map = !expert_map.empty();
  if (has_map) check_expert_map(expert_map, num_experts, Device::kCpu);
  const int64_t num_pairs = topk_ids.numel();
  check_block_m(block_m, num_pairs, num_experts);

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

void align_block_size(const TensorView& topk_ids, int64_t num_experts, int64_t block_m,
                      const TensorView& expert_map, const TensorView& sorted_pair_ids,
                      const TensorView& expert_ids, const TensorView& num_pairs_post_padded,
                      void* cuda_stream) {
  const Device device = topk_ids.device;
  check_topk_ids(topk_ids, num_experts);
  const bool has_map = !expert_map.empty();
  if (has_map) check_expert_map(expert_map, num_experts, device);
  const int64_t num_pairs = topk_ids.numel();
  check_block_m(block_m, num_pairs, num_experts);
  const int64_t capacity = max_num_pairs_post_padded(num_pairs, num_experts, block_m);
  check_output(sorted_pair_ids, "sorted_pair_ids", capacity, device);
  check_output(expert_ids, "expert_ids", capacity / block_m, device);
  check_output(num_pairs_post_padded, "num_pairs_post_padded", 1, device);
  if (num_pairs_post_padded.numel() != 1) {
    fail("num_pairs_post_padded: expected shape [1]; got {}",
         shape_string(num_pairs_post_padded.shape));
  }
  const int32_t* map = has_map ? expert_map.as<const int32_t>() : nullptr;

  if (device == Device::kCpu) {
    std::vector<int32_t> expert_offsets(static_cast<size_t>(num_experts + 1));  // [E + 1]
    *num_pairs_post_padded.as<int32_t>() = static_cast<int32_t>(cpu::align_block_size(
        topk_ids.as<const int32_t>(), num_pairs, num_experts, block_m, map,
        sorted_pair_ids.as<int32_t>(), expert_ids.as<int32_t>(), expert_offsets.data()));
    return;
  }
#ifdef MOE_WITH_CUDA
  if (num_experts > cuda::kMaxAlignExperts) {
    fail("num_experts: align_block_size on CUDA supports up to {} experts; got {}",
         cuda::kMaxAlignExperts, num_experts);
  }
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  const CudaStreamScratch scratch(cuda::align_scratch_bytes(num_pairs, num_experts), stream,
                                  "cudaMallocAsync (align scratch)");
  // Map entries pass through as the CPU kernel writes them; only negative ones mean not local.
  cuda::align_block_size({topk_ids.as<const int32_t>(), map, num_pairs, num_experts, kMaxInt32,
                          block_m, sorted_pair_ids.as<int32_t>(), expert_ids.as<int32_t>(),
                          num_pairs_post_padded.as<int32_t>(), scratch.as<int32_t>()},
                         stream);
#else
  fail(
      "topk_ids: a GPU tensor, but this build has no CUDA backend (configure with "
      "MOE_WITH_CUDA=ON)");
#endif
}

bool use_tiny_batch_path(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                         bool has_expert_map) {
  return num_tokens * top_k * 4 <= num_experts && !has_expert_map;
}

AlignedPairs align_tiny_batch(const TensorView& topk_ids, int64_t num_experts) {
  check_device(topk_ids, "topk_ids", Device::kCpu);
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
