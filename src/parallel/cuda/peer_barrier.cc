#include "parallel/cuda/peer_barrier.h"

#include "kernels/cuda/check.h"
#include "moe/error.h"
#include "parallel/cuda/ep_kernels.h"

namespace moe::cuda::ep {

PeerBarrier::PeerBarrier(Communicator& host, uint64_t timeout_ns)
    : rank_(host.rank()),
      num_ranks_(host.size()),
      timeout_ns_(timeout_ns),
      words_(host, static_cast<size_t>(host.size()) * sizeof(uint64_t)) {
  if (num_ranks_ > kMaxRanks) fail("PeerBarrier: at most {} ranks, got {}", kMaxRanks, num_ranks_);
  timed_out_peer_.reserve(sizeof(int32_t));
  const int32_t none = -1;
  check(cudaMemcpy(timed_out_peer_.data(), &none, sizeof none, cudaMemcpyHostToDevice),
        "cudaMemcpy (PeerBarrier)");
}

void PeerBarrier::arrive_and_wait(cudaStream_t stream) {
  PeerBarrierArgs args;
  for (int d = 0; d < num_ranks_; ++d) {
    args.peer_words[d] = static_cast<uint64_t*>(words_.of_rank(d)) + rank_;
  }
  args.own_words = static_cast<const uint64_t*>(words_.of_rank(rank_));
  args.num_ranks = num_ranks_;
  args.round = ++round_;  // zeroed words carry round 0, which no barrier waits for
  args.timeout_ns = timeout_ns_;
  args.timed_out_peer = static_cast<int32_t*>(timed_out_peer_.data());
  peer_barrier(args, stream);
}

void PeerBarrier::throw_if_timed_out() const {
  int32_t peer = -1;
  check(cudaMemcpy(&peer, timed_out_peer_.data(), sizeof peer, cudaMemcpyDeviceToHost),
        "cudaMemcpy (PeerBarrier)");
  if (peer >= 0) {
    fail(
        "PeerBarrier: rank {} waited {} ns for rank {} in a barrier (of rounds up to {}); it never "
        "came",
        rank_, timeout_ns_, peer, round_);
  }
}

}  // namespace moe::cuda::ep
