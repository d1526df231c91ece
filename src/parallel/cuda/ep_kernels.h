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
//   combine_send    (peer to peer) each received row's partial result (the sum of its pairs
//                   served here) back into the source's buffer, then the count with a release.
//   combine_sum     (optionally waiting for every rank's combine flag) out[t] = sum over ranks d
//                   ascending of the partial row d returned for token t, in f32.
//
// The pull combine (peer to peer, CombineKind::kPull; ep_combine_pull.cu) replaces the last two:
//   combine_publish (on the serving rank, after its experts) one flag per source: the partial
//                   rows for it are complete in this rank's IPC-mapped buffer.
//   combine_pull    waits for every rank's flag, then out[t] = sum over ranks d ascending of the
//                   partial row that rank d holds for token t, read from d's buffer in place.
// Both sums add in the same order and round alike, so the two combines give the same bits.
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

struct CombineSendArgs {
  const void* partial = nullptr;  // bf16 [N * capacity, H]: row s * capacity + i answers (s, i)
  const int32_t* received_counts = nullptr;  // [N]
  int64_t hidden_size = 0;
  int64_t capacity = 0;
  int num_ranks = 0;
  const uint32_t* step = nullptr;
  void* dest_rows[kMaxRanks] = {};       // bf16 [capacity, H] at source s, for this rank's rows
  uint64_t* dest_flags[kMaxRanks] = {};  // the flag word for this rank at s
  uint32_t* blocks_done = nullptr;       // zero on entry; the last block zeroes it again
  const Status* status = nullptr;        // read: an overflow seen here is passed on in the flags
};

struct CombineSumArgs {
  // Rank d's partial rows: the one for token t is row slot_of[t, d] of rows[d], bf16 [*, H].
  const void* rows[kMaxRanks] = {};
  const int32_t* slot_of = nullptr;  // [M, N]
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  int num_ranks = 0;
  void* out = nullptr;  // bf16 [M, H]
  // Low-latency: wait for every rank's combine flag of this step first (unless a dispatch wait
  // timed out: the step has failed). Null: no wait (the rows came through NCCL, already complete).
  const uint64_t* flags = nullptr;  // [N] local
  const uint32_t* step = nullptr;
  uint64_t timeout_ns = 0;
  Status* status = nullptr;
};

// Pull combine: the serving rank's flags.
struct CombinePublishArgs {
  const int32_t* received_counts = nullptr;  // [N]: rows from each source in this step
  int num_ranks = 0;
  const uint32_t* step = nullptr;
  uint64_t* dest_flags[kMaxRanks] = {};  // the flag word for this rank at source s
  const Status* status = nullptr;        // read: an overflow seen here is passed on in the flags
};

// Pull combine: the source's sum, reading each rank's partial rows where its experts wrote them.
struct CombinePullArgs {
  // Rank d's partial rows for this rank's tokens (a peer's through its IPC mapping): the one for
  // token t is row slot_of[t, d] of rows[d], bf16 [capacity, H].
  const void* rows[kMaxRanks] = {};
  const int32_t* slot_of = nullptr;  // [M, N]
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  int num_ranks = 0;
  void* out = nullptr;  // bf16 [M, H]
  // Every rank's combine_publish flag of this step is waited for first (no wait when a dispatch
  // wait timed out: the step has failed); a rank whose flag did not come is not read.
  const uint64_t* flags = nullptr;  // [N] local
  const uint32_t* step = nullptr;
  uint64_t timeout_ns = 0;
  Status* status = nullptr;
};

void dispatch_send(const DispatchSendArgs& args, cudaStream_t stream);
void combine_send(const CombineSendArgs& args, cudaStream_t stream);
void combine_sum(const CombineSumArgs& args, cudaStream_t stream);
void combine_publish(const CombinePublishArgs& args, cudaStream_t stream);
void combine_pull(const CombinePullArgs& args, cudaStream_t stream);

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
