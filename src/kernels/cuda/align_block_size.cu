// One thread block per expert. Every block counts all pairs per expert (the ids are a few hundred
// KB at most and stay in L2), derives its own padded offset from the counts of the experts
// before it, then writes its pairs in ascending pair order with a block-wide scan of "is mine"
// flags. Redundant counting buys a single launch with no grid-wide synchronization and a stable,
// deterministic layout identical to the CPU kernel's.
#include "kernels/cuda/align_block_size.h"
#include "kernels/cuda/check.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ int32_t local_expert(const AlignArgs& a, int32_t expert) {
  if (a.expert_map == nullptr) return expert;
  const int32_t local = a.expert_map[expert];
  return (local >= 0 && local < a.num_local_experts) ? local : -1;
}

// Sum of `value` over the block; every thread gets the total.
__device__ int64_t block_sum(int64_t value, int64_t* scratch) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffff, value, offset);
  const int warp = threadIdx.x / 32;
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[warp] = value;
  __syncthreads();
  int64_t total = 0;
  for (int w = 0; w < kWarps; ++w) total += scratch[w];
  return total;
}

__global__ void __launch_bounds__(kThreads) align_kernel(AlignArgs a) {
  extern __shared__ int32_t counts[];  // [num_experts]
  __shared__ int64_t scratch[kWarps];
  __shared__ int32_t warp_totals[kWarps];
  const int32_t expert = blockIdx.x;
  const int64_t num_experts = a.num_experts;
  const int64_t block_m = a.block_m;

  for (int64_t e = threadIdx.x; e < num_experts; e += kThreads) counts[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < a.num_pairs; p += kThreads) {
    const int32_t id = a.topk_ids[p];
    if (id >= 0 && id < num_experts) atomicAdd(&counts[id], 1);
  }
  __syncthreads();

  int64_t before = 0, all = 0;
  for (int64_t e = threadIdx.x; e < num_experts; e += kThreads) {
    const int64_t padded = (counts[e] + block_m - 1) / block_m * block_m;
    all += padded;
    if (e < expert) before += padded;
  }
  const int64_t offset = block_sum(before, scratch);
  const int64_t total = block_sum(all, scratch);
  if (expert == 0 && threadIdx.x == 0) *a.num_pairs_post_padded = static_cast<int32_t>(total);

  const int64_t count = counts[expert];
  const int64_t padded = (count + block_m - 1) / block_m * block_m;
  const int32_t local = local_expert(a, expert);
  for (int64_t b = threadIdx.x; b < padded / block_m; b += kThreads) {
    a.expert_ids[offset / block_m + b] = local;
  }
  for (int64_t i = count + threadIdx.x; i < padded; i += kThreads) {
    a.sorted_pair_ids[offset + i] = static_cast<int32_t>(a.num_pairs);
  }

  // Stable scatter: chunk by chunk, each pair of this expert goes to offset + (number of this
  // expert's pairs before it). Stops once all `count` pairs are placed.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t placed = 0;
  for (int64_t start = 0; start < a.num_pairs && placed < count; start += kThreads) {
    const int64_t p = start + threadIdx.x;
    const bool mine = p < a.num_pairs && a.topk_ids[p] == expert;
    const uint32_t ballot = __ballot_sync(0xffffffff, mine);
    if (lane == 0) warp_totals[warp] = __popc(ballot);
    __syncthreads();
    int64_t rank = placed + __popc(ballot & ((1u << lane) - 1));
    int64_t chunk_total = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) rank += warp_totals[w];
      chunk_total += warp_totals[w];
    }
    if (mine) a.sorted_pair_ids[offset + rank] = static_cast<int32_t>(p);
    placed += chunk_total;
    __syncthreads();
  }
}

__global__ void tiny_kernel(AlignArgs a) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p == 0) *a.num_pairs_post_padded = static_cast<int32_t>(a.num_pairs);
  if (p >= a.num_pairs) return;
  const int32_t id = a.topk_ids[p];
  a.sorted_pair_ids[p] = static_cast<int32_t>(p);
  a.expert_ids[p] = (id >= 0 && id < a.num_experts) ? local_expert(a, id) : -1;
}

}  // namespace

void align_block_size(const AlignArgs& args, cudaStream_t stream) {
  const size_t shared_bytes = static_cast<size_t>(args.num_experts) * sizeof(int32_t);
  static const bool attribute_set = [] {
    check(cudaFuncSetAttribute(align_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kMaxAlignExperts * sizeof(int32_t)),
          "cudaFuncSetAttribute(align_kernel)");
    return true;
  }();
  (void)attribute_set;
  align_kernel<<<static_cast<unsigned>(args.num_experts), kThreads, shared_bytes, stream>>>(args);
  check_launch("align_block_size");
}

void align_tiny_batch(const AlignArgs& args, cudaStream_t stream) {
  const int64_t blocks = std::max<int64_t>(1, (args.num_pairs + 255) / 256);
  tiny_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(args);
  check_launch("align_tiny_batch");
}

}  // namespace moe::cuda
