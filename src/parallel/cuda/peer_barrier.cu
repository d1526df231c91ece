// The kernel of PeerBarrier (peer_barrier.h); see ep_kernels.h.
#include "kernels/cuda/check.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ep_sync.cuh"

namespace moe::cuda::ep {
namespace {

// No data travels with the word, so a relaxed store does (one thread's stores to one word stay in
// order).
__global__ void peer_barrier_kernel(PeerBarrierArgs a) {
  const int d = static_cast<int>(threadIdx.x);
  if (d >= a.num_ranks) return;
  store_relaxed_sys(a.peer_words[d], make_flag(a.round, 0));
  bool timed_out = false;
  uint64_t seen = 0;
  wait_for_step(&a.own_words[d], a.round, global_timer_ns() + a.timeout_ns, &timed_out, &seen);
  if (timed_out) atomicCAS(a.timed_out_peer, -1, d);
}

}  // namespace

void peer_barrier(const PeerBarrierArgs& args, cudaStream_t stream) {
  peer_barrier_kernel<<<1, kMaxRanks, 0, stream>>>(args);
  check_launch("ep::peer_barrier");
}

}  // namespace moe::cuda::ep
