// What every GPU --ep command (`moe run --ep --device cuda`, `moe bench --ep --device cuda`) sets
// up alike on its rank: the settings the GPU layer refuses, the GPU of the rank, CudaEpOptions
// from the --ep settings, and tensors in GPU memory. Built with moe::cuda_ep.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_buffer.h"
#include "moe/communicator.h"
#include "moe/cuda_ep_layer.h"
#include "moe/tensor.h"
#include "tools/moe/ep_options.h"

namespace moe::cli {

// Refuses, by name and before any GPU work, the --ep settings the GPU layer does not take:
// --ranks-per-host (the GPUs and peer-to-peer paths follow the real hosts), --timeout-ms <= 0, and
// --over-nccl with the low-latency dispatcher (peer to peer only).
void check_gpu_ep_settings(const EpSettings& settings);

// Makes the GPU of this rank's index among its host's ranks current and returns it. Throws
// moe::Error when a host runs more ranks than it has GPUs.
int take_gpu_of_this_rank(const Communicator& host);

// The GPU layer's options from the settings, as the CPU ranks' EpOptions come from them: the
// dispatcher, the low-latency capacity (tokens_per_rank unless --ll-capacity), two-batch overlap,
// --over-nccl, --block-m and --timeout-ms.
CudaEpOptions cuda_ep_options(const EpSettings& settings, int64_t tokens_per_rank, int64_t block_m);

// A contiguous tensor in GPU memory: uninitialized, or a copy of a host tensor.
class DeviceTensor {
 public:
  DeviceTensor(DType dtype, Shape shape);
  explicit DeviceTensor(const TensorView& host);
  TensorView view() const;

 private:
  cuda::DeviceBuffer buffer_;
  DType dtype_;
  Shape shape_;
};

}  // namespace moe::cli
