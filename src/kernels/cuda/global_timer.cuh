// The GPU's global timer, in nanoseconds, for timelines and deadlines. Its readings agree across
// the multiprocessors of a GPU, so marks taken by different thread blocks and kernels compare.
#pragma once

#include <cstdint>

namespace moe::cuda {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

}  // namespace moe::cuda
