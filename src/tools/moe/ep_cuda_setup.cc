#include "tools/moe/ep_cuda_setup.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "kernels/cuda/check.h"
#include "moe/error.h"
#include "moe/nccl_communicator.h"

namespace moe::cli {

using cuda::check;

void check_gpu_ep_settings(const EpSettings& s) {
  if (s.ranks_per_host != 0) {
    fail(
        "--ranks-per-host: --ep --device cuda takes the real hosts (peer-to-peer paths and the "
        "GPU of each rank follow them); got {}",
        s.ranks_per_host);
  }
  if (s.timeout_ms <= 0) fail("--timeout-ms: expected > 0; got {}", s.timeout_ms);
  if (s.over_nccl && s.dispatcher != "ht") {
    fail("--over-nccl: the low-latency path is peer to peer only; use it with --dispatcher ht");
  }
}

int take_gpu_of_this_rank(const Communicator& host) {
  const int me = host.rank();
  int local_index = 0, local_ranks = 0;
  for (int r = 0; r < host.size(); ++r) {
    if (!host.same_host(r, me)) continue;
    local_index += r < me;
    ++local_ranks;
  }
  const int devices = cuda_device_count();
  if (local_ranks > devices) {
    fail(
        "--device cuda: each rank takes a GPU of its own; rank {}'s host runs {} rank{} of this "
        "job and has {} CUDA device{} (start at most one rank per GPU, or run --device cpu)",
        me, local_ranks, local_ranks > 1 ? "s" : "", devices, devices == 1 ? "" : "s");
  }
  check(cudaSetDevice(local_index), "cudaSetDevice");
  return local_index;
}

CudaEpOptions cuda_ep_options(const EpSettings& settings, int64_t tokens_per_rank,
                              int64_t block_m) {
  CudaEpOptions options;
  options.dispatcher = parse_dispatcher(settings.dispatcher);
  options.low_latency_capacity = low_latency_capacity(settings, tokens_per_rank);
  options.two_batch_overlap = settings.overlap;
  options.high_throughput_over_nccl = settings.over_nccl;
  options.block_m = block_m;
  options.timeout = std::chrono::milliseconds(settings.timeout_ms);
  return options;
}

DeviceTensor::DeviceTensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  buffer_.reserve(std::max<size_t>(view().nbytes(), 1));
}

DeviceTensor::DeviceTensor(const TensorView& host) : DeviceTensor(host.dtype, host.shape) {
  if (!host.is_contiguous()) fail("DeviceTensor: expected a contiguous host tensor");
  if (host.nbytes() == 0) return;  // an empty vector's data() may be null
  check(cudaMemcpy(buffer_.data(), host.data, host.nbytes(), cudaMemcpyHostToDevice),
        "cudaMemcpy (to the GPU)");
}

TensorView DeviceTensor::view() const {
  return TensorView(buffer_.data(), dtype_, shape_, Device::kCuda);
}

}  // namespace moe::cli
