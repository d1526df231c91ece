#include "kernels/cuda/check.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/time_mark.h"

namespace moe::cuda {
namespace {

__global__ void time_mark_kernel(uint64_t* slot) { *slot = global_timer_ns(); }

}  // namespace

void record_time_mark(uint64_t* slot, cudaStream_t stream) {
  time_mark_kernel<<<1, 1, 0, stream>>>(slot);
  check_launch("time_mark");
}

}  // namespace moe::cuda
