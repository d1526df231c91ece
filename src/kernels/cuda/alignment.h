// Whether a pointer allows the kernels' 16-byte vector loads and stores (eight bf16 at a time).
#pragma once

#include <cstdint>

namespace moe::cuda {

inline bool aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

}  // namespace moe::cuda
