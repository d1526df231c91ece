// Small device helpers shared by the CUDA kernels: 16-byte bf16 loads and conversions, SiLU, the
// steps of a warp's dot products.
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
    // Weights, and cache3 in the sum, are read once per call: stream them past L1 and evict them
    // first from L2.
    return kStreaming ? __ldcs(address) : __ldg(address);
  } else {
    alignas(16) __nv_bfloat16 values[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) values[i] = k + i < size ? row[k + i] : __float2bfloat16(0.0f);
    return *reinterpret_cast<const uint4*>(values);
  }
}

// x * sigmoid(x). __fdividef (a reciprocal and a product, about 2 ulp) instead of the IEEE
// division: the tma kernel's gemm1 epilogue runs while the tensor cores wait, and there the
// division cost Qwen3-30B-A3B's layer 0.7% at 1024 tokens and 1.9% at 16384 on an H100
// (docs/perf.md). A denominator past 2^126 (x below about -87) gives 0, the function's limit.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + __expf(-x)); }

// One step of a warp's dot products: acc[i] += w[i] · x over 8 values, in ascending order, where
// w[i] holds eight packed bf16 (a weight row's chunk) and x the input row's same eight.
template <int kRows>
__device__ __forceinline__ void add_bf16x8_products(const uint4 (&w)[kRows], const float (&x)[8],
                                                    float (&acc)[kRows]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    float values[8];
    bf16x8_to_float(w[i], values);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i] = fmaf(values[e], x[e], acc[i]);
  }
}

// `value` summed over the warp's 32 lanes (a butterfly: every lane gets the sum).
__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

}  // namespace moe::cuda
