// The local device memory one expert-parallel data path needs next to its buffers: the counters
// of dispatch_send, the step number, counts and the status, in one zeroed allocation; and the
// token -> slot table, grown to the largest batch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "parallel/cuda/ep_status.h"

namespace moe::cuda::ep {

class StepScratch {
 public:
  explicit StepScratch(int num_ranks);

  int32_t* send_counters() const;   // [N]
  uint32_t* dispatch_done() const;  // blocks of dispatch_send finished
  uint32_t* step() const;
  uint32_t* combine_published() const;  // the step whose combine flags this rank last published
  int32_t* sent_counts() const;         // [N]
  int32_t* received_counts() const;     // [N]
  Status* status() const;
  int32_t* slot_of(int64_t num_tokens);  // [M, N], grown (allocates only when M grows)

  // Copies the status to the host (synchronizes the stream).
  Status read_status(cudaStream_t stream) const;
  // Clears it after an error the next step recovers from (overflow).
  void clear_status(cudaStream_t stream) const;
  // Rows sent to / received from each rank in the last step (synchronizes the stream).
  std::vector<int64_t> read_counts(const int32_t* counts, cudaStream_t stream) const;

 private:
  int num_ranks_;
  DeviceBuffer fixed_, slot_of_;
};

}  // namespace moe::cuda::ep
