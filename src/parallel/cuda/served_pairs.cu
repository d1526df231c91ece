// Served-pair counting (served_pairs.h): one thread per id over a grid-stride loop, one atomic add
// per served pair into the [local slots] counts. It runs only in the steps a benchmark counts, so
// the atomics' contention on a few hot slots is not worth a shared-memory histogram.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "parallel/cuda/served_pairs.h"

namespace moe::cuda::ep {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__global__ void __launch_bounds__(kThreads) count_served_pairs_kernel(ServedPairsArgs a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < a.num_ids;
       i += stride) {
    const int32_t slot = a.ids[i];
    if (slot < 0 || slot >= a.num_slots) continue;
    const int32_t local = a.local_of_slot[slot];
    if (local >= 0) atomicAdd(&a.counts[local], 1);
  }
}

}  // namespace

void count_served_pairs(const ServedPairsArgs& args, cudaStream_t stream) {
  if (args.num_ids == 0) return;
  const int64_t blocks = std::min(kMaxBlocks, (args.num_ids + kThreads - 1) / kThreads);
  count_served_pairs_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  check_launch("ep::count_served_pairs");
}

}  // namespace moe::cuda::ep
