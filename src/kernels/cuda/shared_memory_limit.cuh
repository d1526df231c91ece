// Raising a kernel's dynamic shared-memory limit above the default 48 KiB, once per device.
// The limit is a function attribute of one device's context: set on GPU 0 only, a launch of the
// same kernel on GPU 1 fails with cudaErrorInvalidValue (seen from Python with tensors on two
// GPUs), so the first launch on each device sets it there.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>

#include "kernels/cuda/check.h"

namespace moe::cuda {

// Devices past this many are still served, by setting the attribute on every launch.
inline constexpr int kDevicesRemembered = 64;

// `bytes` must be the same on every call for one kernel.
template <auto kKernel>
void allow_shared_bytes(size_t bytes, const char* what) {
  static std::array<std::atomic<bool>, kDevicesRemembered> done{};
  int device = 0;
  check(cudaGetDevice(&device), what);
  const bool remembered = device >= 0 && device < kDevicesRemembered;
  if (remembered && done[device].load(std::memory_order_acquire)) return;
  check(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes)),
        what);
  if (remembered) done[device].store(true, std::memory_order_release);
}

}  // namespace moe::cuda
