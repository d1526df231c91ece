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
//   dispatch_wait   (peer to peer) waits on the GPU for every source's count of this step, masks
//                   the ids of the slots past each count (-1), so the experts read the whole
//                   [sources * capacity] layout in place and skip empty slots.
//   combine_publish (peer to peer, on the serving rank, after its experts) one flag per source:
//                   the partial rows for it (the sum of its pairs served here) are complete in
//                   this rank's IPC-mapped buffer.
//   combine_sum     out[t] = sum over ranks d ascending of the partial row rank d holds for token
//                   t, in f32, rounded to bf16 once. Peer to peer it first waits for every rank's
//                   combine flag and reads each rank's rows in place (a peer's over NVLink);
//                   over NCCL the rows are local and there are no flags.
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
};

struct DispatchWaitArgs {
  const uint64_t* flags = nullptr;  // [N] local: word s written by source s
  const uint32_t* step = nullptr;
  int32_t* ids = nullptr;  // [N, capacity, k] local: slots past each count set to -1
  int64_t top_k = 0;
  int64_t capacity = 0;
  int num_ranks = 0;
  uint64_t timeout_ns = 0;
  int32_t* received_counts = nullptr;  // [N]: rows from each source in this step (<= capacity)
  Status* status = nullptr;
};

// The serving rank's combine flags (peer to peer).
struct CombinePublishArgs {
  const int32_t* received_counts = nullptr;  // [N]: rows from each source in this step
  int num_ranks = 0;
  const uint32_t* step = nullptr;
  uint64_t* dest_flags[kMaxRanks] = {};  // the flag word for this rank at source s
  const Status* status = nullptr;        // read: an overflow seen here is passed on in the flags
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
  // Peer to peer: every rank's combine_publish flag of this step is waited for first (no wait
  // when a dispatch wait timed out: the step has failed), and a rank whose flag did not come is
  // not read. Null: no wait, every rank read (over NCCL: the rows are local and complete).
  const uint64_t* flags = nullptr;  // [N] local
  const uint32_t* step = nullptr;
  uint64_t timeout_ns = 0;
  Status* status = nullptr;
};

void dispatch_send(const DispatchSendArgs& args, cudaStream_t stream);
void dispatch_wait(const DispatchWaitArgs& args, cudaStream_t stream);
void combine_publish(const CombinePublishArgs& args, cudaStream_t stream);
void combine_sum(const CombineSumArgs& args, cudaStream_t stream);

// Keeps the stream busy for `microseconds` (a spin on the global timer), so the host queues the
// next stages before the GPU reaches them: benchmarks of microsecond stages then time the GPU,
// not the host's launch calls.
void hold_stream(int64_t microseconds, cudaStream_t stream);

}  // namespace moe::cuda::ep
