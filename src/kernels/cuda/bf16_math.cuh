// Small device helpers shared by the CUDA kernels: 16-byte bf16 loads and conversions, SiLU.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moe::cuda {

// Eight bf16 values as f32.
__device__ __forceinline__ void bf16x8_to_float(const uint4& packed, float (&out)[8]) {
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Eight bf16 at row[k..k+8) (zeros past `size`). kAligned: row + k is 16-byte aligned and
// size % 8 == 0, so one vector load does it.
template <bool kAligned, bool kStreaming>
__device__ __forceinline__ uint4 load_bf16x8(const __nv_bfloat16* row, int64_t k, int64_t size) {
  if constexpr (kAligned) {
    if (k >= size) return make_uint4(0, 0, 0, 0);
    const auto* address = reinterpret_cast<const uint4*>(row + k);
    // Weights are read once per call: stream them past L1 and evict them first from L2.
    return kStreaming ? __ldcs(address) : __ldg(address);
  } else {
    alignas(16) __nv_bfloat16 values[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) values[i] = k + i < size ? row[k + i] : __float2bfloat16(0.0f);
    return *reinterpret_cast<const uint4*>(values);
  }
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

}  // namespace moe::cuda
