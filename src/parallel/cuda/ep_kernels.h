// The expert-parallel kernels on GPUs of one host: raw pointers, sizes and a stream; no
// communicator here (the host code in this folder sets the pointers up).
//
//   dispatch_send   each token row once per destination rank that serves one of its experts (a
//                   token picking two experts of one rank goes once), with its k expert ids (ids
//                   of other ranks' experts replaced by -1) and router weights, into the
//                   destination's region for this source. Peer to peer (low-latency, and
//                   high-throughput on a P2P host): the regions are peers' buffers mapped through
//                   CUDA IPC and the kernel publishes each row count with a system-scope release.
//                   Over NCCL: local staging buffers that NCCL sends.
//                   Peer to peer, its last block then waits on the GPU for every source's count
//                   of this step and masks the ids of the slots past each count (-1), so the
//                   experts read the whole [sources * capacity] layout in place and skip empty
//                   slots (no kernel of its own: one launch fewer on the step's critical path).
//   combine_sum     out[t] = sum over ranks d ascending of the partial row rank d holds for token
//                   t, in f32, rounded to bf16 once. Peer to peer it first publishes this
//                   rank's flags, one per source (the partial rows for it, the sum of its pairs
//                   served here, are complete in this rank's IPC-mapped buffer), then waits for
//                   every rank's flag and reads each rank's rows in place (a peer's over
//                   NVLink); over NCCL the rows are local and there are no flags.
//
// Step numbers live in device memory (the last block of dispatch_send advances them), so a
// captured CUDA graph replays correct flags. Waits are bounded (timeout_ns); a timeout or an
// overflow is written to Status and the step completes without hanging.
// Tests: tests/parallel/cuda (mpirun -np 2, label gpu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "parallel/cuda/ep_status.h"

namespace moe::cuda::ep {

// The receiving side of a peer-to-peer dispatch, run by dispatch_send's last block once it
// published this rank's counts.
struct DispatchWaitArgs {
  const uint64_t* flags = nullptr;  // [N] local: word s written by source s; null: no wait (NCCL)
  int32_t* ids = nullptr;           // [N, capacity, k] local: slots past each count set to -1
  uint64_t timeout_ns = 0;
  int32_t* received_counts = nullptr;  // [N]: rows from each source in this step (<= capacity)
};

struct DispatchSendArgs {
  const void* hidden = nullptr;             // bf16 [M, H]
  const int32_t* topk_ids = nullptr;        // [M, k]: ids outside [0, E) go nowhere
  const float* topk_weights = nullptr;      // [M, k]
  const int32_t* rank_of_expert = nullptr;  // [E]
  int64_t num_tokens = 0;                   // M (may be 0: counts of 0 are still published)
  int64_t hidden_size = 0;                  // H, a multiple of 8
  int64_t top_k = 0;
  int64_t num_experts = 0;
  int num_ranks = 0;
  int rank = 0;
  int64_t capacity = 0;  // rows of each destination region; rows past it are counted, not sent
  // Destination d's region for this rank's rows.
  void* dest_rows[kMaxRanks] = {};       // bf16 [capacity, H]
  int32_t* dest_ids[kMaxRanks] = {};     // [capacity, k]
  float* dest_weights[kMaxRanks] = {};   // [capacity, k]
  uint64_t* dest_flags[kMaxRanks] = {};  // the flag word for this source at d; null: no flag
  // Local scratch and results.
  int32_t* send_counters = nullptr;  // [N], zero on entry; the last block zeroes them again
  uint32_t* blocks_done = nullptr;   // zero on entry; the last block zeroes it again
  uint32_t* step = nullptr;          // this rank's step number: the last block advances it
  int32_t* slot_of = nullptr;        // [M, N]: the token's row at each destination, or -1
  int32_t* sent_counts = nullptr;    // [N]: rows needed per destination (may exceed capacity)
  Status* status = nullptr;
  DispatchWaitArgs wait;
};

// The serving rank's combine flags (peer to peer), raised by the first block of its combine_sum
// to run.
struct CombinePublishArgs {
  uint64_t* dest_flags[kMaxRanks] = {};      // the flag word for this rank at source s
  const int32_t* received_counts = nullptr;  // [N]: rows from each source in this step
  // The step whose flags this rank last published: the block that swaps this step in publishes.
  uint32_t* published_step = nullptr;
};

struct CombineSumArgs {
  // Rank d's partial rows for this rank's tokens (peer to peer a peer's through its IPC mapping):
  // the one for token t is row slot_of[t, d] of rows[d], bf16 [*, H].
  const void* rows[kMaxRanks] = {};
  const int32_t* slot_of = nullptr;  // [M, N]
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  int num_ranks = 0;
  void* out = nullptr;  // bf16 [M, H]
  // Peer to peer: every rank's combine flag of this step is waited for first (no wait
  // when a dispatch wait timed out: the step has failed), and a rank whose flag did not come is
  // not read. Null: no wait, every rank read (over NCCL: the rows are local and complete).
  const uint64_t* flags = nullptr;  // [N] local
  const uint32_t* step = nullptr;
  uint64_t timeout_ns = 0;
  Status* status = nullptr;
  CombinePublishArgs publish;  // peer to peer; unused over NCCL (null flags)
};

void dispatch_send(const DispatchSendArgs& args, cudaStream_t stream);
void combine_sum(const CombineSumArgs& args, cudaStream_t stream);

// Keeps the stream busy for `microseconds` (a spin on the global timer), so the host queues the
// next stages before the GPU reaches them: benchmarks of microsecond stages then time the GPU,
// not the host's launch calls.
void hold_stream(int64_t microseconds, cudaStream_t stream);

// A barrier of the GPUs (PeerBarrier, peer_barrier.h): one thread per rank d raises this rank's
// word at rank d, then waits for rank d's word here to carry `round`; the first rank whose word
// never came by the timeout goes to *timed_out_peer.
struct PeerBarrierArgs {
  uint64_t* peer_words[kMaxRanks] = {};  // this rank's word in each rank's flags
  const uint64_t* own_words = nullptr;   // [N]: each rank's word here
  int num_ranks = 0;
  uint32_t round = 0;
  uint64_t timeout_ns = 0;
  int32_t* timed_out_peer = nullptr;
};
void peer_barrier(const PeerBarrierArgs& args, cudaStream_t stream);

}  // namespace moe::cuda::ep
