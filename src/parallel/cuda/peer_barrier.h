// A barrier between the GPUs of one host, on their streams: each rank's kernel raises its flag in
// every peer's memory (CUDA IPC) and spins until every peer's flag of the same round arrived.
//
// For benchmarks of microsecond exchanges: a host barrier before them leaves the ranks' streams
// skewed by the host's scheduling (several microseconds between processes, more under load), and
// a stage that waits for a peer then times that skew too. After this barrier every rank's stream
// goes on within about one NVLink flag round trip of the others.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_buffer.h"
#include "moe/communicator.h"
#include "parallel/cuda/ipc_buffers.h"

namespace moe::cuda::ep {

class PeerBarrier {
 public:
  // A collective over `host` (every rank on this host, see ipc_reachable). `timeout_ns` bounds
  // each wait: a peer that never arrives is reported by throw_if_timed_out(), not waited for
  // forever.
  PeerBarrier(Communicator& host, uint64_t timeout_ns);

  // Queues the barrier on `stream`. Every rank must queue the same number of them.
  void arrive_and_wait(cudaStream_t stream);

  // Throws moe::Error naming the round and the peer if a wait queued so far timed out
  // (synchronizes with the device).
  void throw_if_timed_out() const;

 private:
  int rank_;
  int num_ranks_;
  uint64_t timeout_ns_;
  IpcBuffers words_;  // uint64 [N] per rank: word s is the latest round rank s reached
  uint32_t round_ = 0;
  DeviceBuffer timed_out_peer_;  // int32 on the device: -1, or the first peer that never came
};

}  // namespace moe::cuda::ep
