// Replica choice on the GPU (replica_choice.h). With one candidate per expert the slot is a
// lookup, one thread per pair. Otherwise each pair needs n, the number of earlier pairs of its
// expert in the batch: one block walks the pairs in chunks of kThreads, in order. Inside a chunk
// each warp groups its lanes by expert (__match_any_sync: the rank among equal lanes is the
// popcount of the lower ones); each group's size goes to a [warp, expert] table in shared memory,
// which an exclusive scan over the warps (one thread per expert, starting from the count the
// earlier chunks left) turns into each group's first n. A batch of M * k pairs takes
// M * k / kThreads chunks of four barriers each: 64 at 4096 tokens of top-8.
#include "kernels/cuda/check.h"
#include "kernels/cuda/routing.h"
#include "parallel/cuda/replica_choice.h"

namespace moe::cuda::ep {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kLookupThreads = 256;
static_assert(kMaxChoiceExperts >= kMaxRoutedExperts);

__device__ int32_t expert_of(const ReplicaChoiceArgs& a, int64_t p) {
  const int32_t e = a.topk_ids[p];
  return e >= 0 && e < a.num_experts ? e : -1;
}

__device__ int32_t candidate(const ReplicaChoiceArgs& a, int32_t e, int32_t n) {
  const int32_t first = a.candidate_offsets[e], count = a.candidate_offsets[e + 1] - first;
  return a.candidates[first + (count == 1 ? 0 : (n + a.rank) % count)];
}

__global__ void __launch_bounds__(kLookupThreads) lookup_slots_kernel(ReplicaChoiceArgs a) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p >= a.num_pairs) return;
  const int32_t e = expert_of(a, p);
  a.slot_ids[p] = e < 0 ? -1 : candidate(a, e, 0);
}

__global__ void __launch_bounds__(kThreads) rank_replicas_kernel(ReplicaChoiceArgs a) {
  __shared__ int32_t seen[kMaxChoiceExperts];             // [E]: pairs of each expert so far
  __shared__ int32_t first_n[kWarps][kMaxChoiceExperts];  // [warp, E]: group size, then first n
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const unsigned lower_lanes = (1u << lane) - 1;
  for (int64_t e = threadIdx.x; e < a.num_experts; e += kThreads) seen[e] = 0;
  for (int64_t base = 0; base < a.num_pairs; base += kThreads) {
    for (int64_t i = threadIdx.x; i < kWarps * a.num_experts; i += kThreads) {
      first_n[i / a.num_experts][i % a.num_experts] = 0;
    }
    __syncthreads();

    const int64_t p = base + threadIdx.x;
    const int32_t e = p < a.num_pairs ? expert_of(a, p) : -1;
    const unsigned group = __match_any_sync(0xffffffffu, e);
    const int32_t rank_in_group = __popc(group & lower_lanes);
    if (e >= 0 && rank_in_group == 0) first_n[warp][e] = __popc(group);
    __syncthreads();

    for (int64_t x = threadIdx.x; x < a.num_experts; x += kThreads) {
      int32_t running = seen[x];
      for (int w = 0; w < kWarps; ++w) {
        const int32_t size = first_n[w][x];
        first_n[w][x] = running;
        running += size;
      }
      seen[x] = running;
    }
    __syncthreads();

    if (p < a.num_pairs) {
      a.slot_ids[p] = e < 0 ? -1 : candidate(a, e, first_n[warp][e] + rank_in_group);
    }
    __syncthreads();  // first_n is zeroed for the next chunk
  }
}

}  // namespace

void choose_replicas(const ReplicaChoiceArgs& args, cudaStream_t stream) {
  if (args.num_pairs == 0) return;
  if (args.max_candidates <= 1) {
    const int64_t blocks = (args.num_pairs + kLookupThreads - 1) / kLookupThreads;
    lookup_slots_kernel<<<static_cast<unsigned>(blocks), kLookupThreads, 0, stream>>>(args);
    check_launch("ep::lookup_slots");
    return;
  }
  rank_replicas_kernel<<<1, kThreads, 0, stream>>>(args);
  check_launch("ep::rank_replicas");
}

}  // namespace moe::cuda::ep
