// The two expert-parallel data paths of CudaEpLayer behind one interface: dispatch leaves the
// received rows where the experts read them in place, combine takes the experts' partial rows
// back and sums them into the output.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/communicator.h"
#include "moe/error.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ep_status.h"
#include "parallel/cuda/step_scratch.h"

namespace moe::cuda::ep {

struct PathShape {
  int num_ranks = 0;
  int rank = 0;
  int64_t hidden_size = 0;
  int64_t top_k = 0;
  int64_t num_experts = 0;
  const int32_t* rank_of_expert = nullptr;  // [E] on the device
};

struct TokensIn {
  const void* hidden = nullptr;         // bf16 [M, H]
  const int32_t* topk_ids = nullptr;    // [M, k]
  const float* topk_weights = nullptr;  // [M, k]
  int64_t num_tokens = 0;
};

// The dispatch kernel's arguments that both paths fill alike, its scratch from the path's
// StepScratch (slot_of grown to in.num_tokens); the destinations are each path's own.
inline DispatchSendArgs dispatch_send_args(const TokensIn& in, const PathShape& shape,
                                           int64_t capacity, StepScratch& scratch) {
  DispatchSendArgs send;
  send.hidden = in.hidden;
  send.topk_ids = in.topk_ids;
  send.topk_weights = in.topk_weights;
  send.rank_of_expert = shape.rank_of_expert;
  send.num_tokens = in.num_tokens;
  send.hidden_size = shape.hidden_size;
  send.top_k = shape.top_k;
  send.num_experts = shape.num_experts;
  send.num_ranks = shape.num_ranks;
  send.rank = shape.rank;
  send.capacity = capacity;
  send.send_counters = scratch.send_counters();
  send.blocks_done = scratch.dispatch_done();
  send.step = scratch.step();
  send.slot_of = scratch.slot_of(in.num_tokens);
  send.sent_counts = scratch.sent_counts();
  send.status = scratch.status();
  return send;
}

// The ranks of `num_ranks` other than `rank`: the peers an exchange of the whole group waits for.
inline std::vector<int> other_ranks(int num_ranks, int rank) {
  std::vector<int> peers;
  for (int p = 0; p < num_ranks; ++p) {
    if (p != rank) peers.push_back(p);
  }
  return peers;
}

// Runs `exchange`, an operation of a communicator inside step `step` (1 for a path's first), and
// turns its moe::Error into one that names the step, this rank, the stage and the peers waited
// for (format_exchange_failure), as a timed-out wait on the device names them.
template <typename Exchange>
void exchange_in_step(uint32_t step, int rank, const char* stage, const std::string& what,
                      const std::vector<int>& peers, Exchange&& exchange) {
  try {
    exchange();
  } catch (const Error& e) {
    throw Error(format_exchange_failure(step, rank, stage, what.c_str(), peers, e.what()));
  }
}

// Where the experts read and write: rows [num_rows, H] with their ids and weights [num_rows, k]
// (ids of slots without a row are -1), partial [num_rows, H] for the experts' sums.
struct ReceivedRows {
  const void* rows = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int64_t num_rows = 0;
  void* partial = nullptr;
};

class DataPath {
 public:
  virtual ~DataPath() = default;
  virtual void dispatch(const TokensIn& in, cudaStream_t stream) = 0;
  virtual ReceivedRows received() const = 0;
  virtual void combine(void* out, cudaStream_t stream) = 0;
  // After the step (synchronizes): the status, then rows sent to and received from each rank.
  virtual Status read_status(cudaStream_t stream) const = 0;
  virtual void clear_status(cudaStream_t stream) const = 0;
  virtual std::vector<int64_t> rows_sent(cudaStream_t stream) const = 0;
  virtual std::vector<int64_t> rows_received(cudaStream_t stream) const = 0;
};

// Peer-to-peer over CUDA IPC; `host` bootstraps the buffers (a collective). The experts leave
// their partial rows in this rank's IPC-mapped buffer and each source reads its own from every
// rank's in place (combine_sum, which also raises this rank's flags).
std::unique_ptr<DataPath> make_low_latency_path(Communicator& host, const PathShape& shape,
                                                int64_t capacity, uint64_t timeout_ns);
// The high-throughput path where ipc_reachable(host): the same peer-to-peer kernels, the
// buffers sized (collectively, before a step) for the most tokens any rank has, so rows land
// where the experts read them and counts travel in the flags, without staging or a host
// synchronization.
std::unique_ptr<DataPath> make_peer_high_throughput_path(Communicator& host, const PathShape& shape,
                                                         uint64_t timeout_ns);
// Counts through `host`, rows through `device` (NCCL): across hosts, or where GPUs cannot reach
// each other peer to peer.
std::unique_ptr<DataPath> make_high_throughput_path(Communicator& host, Communicator& device,
                                                    const PathShape& shape);

}  // namespace moe::cuda::ep
