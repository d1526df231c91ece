// Whole 16-byte output chunks from the warpgroup MMA accumulator layout.
//
// In that layout the four lanes of a quad (lane / 4 equal) share an output row, and for every
// 8-column chunk of it lane q holds columns 2q and 2q + 1. Storing that as it stands writes 4
// bytes per lane: per row and instruction, half a 32-byte sector. Nsight Compute flagged exactly
// that in the tma kernel's epilogue (16 of 32 bytes per sector used). The quad trades values so
// that each lane holds one whole chunk and stores it with one 16-byte store instead: a quarter of
// the store instructions, and per row 64 contiguous bytes per instruction.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace moe::cuda {

__device__ __forceinline__ uint32_t pack_bf16_pair(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Lane q of a quad holds x[j] = columns 2q and 2q + 1 of chunk j (j = 0..3). Returns chunk q
// whole: element i = columns 2i and 2i + 1 of it, from lane i. A 4 x 4 transpose across the quad
// in two exchanges: lanes two apart swap the halves of j whose bit 1 is not their own bit 1,
// then lanes one apart those whose bit 0 is not theirs. Every lane of the warp must call it.
__device__ __forceinline__ uint4 transpose_quad(const uint32_t (&x)[4]) {
  const int lane = threadIdx.x % 32;
  const bool high = lane & 2, odd = lane & 1;
  constexpr unsigned kAll = 0xffffffffu;
  // After the first exchange: a[2 i + j] = column pair of chunk 2 (lane's bit 1) + j held by the
  // quad lane whose bit 1 is i and bit 0 is this lane's.
  const uint32_t from_two_0 = __shfl_xor_sync(kAll, high ? x[0] : x[2], 2);
  const uint32_t from_two_1 = __shfl_xor_sync(kAll, high ? x[1] : x[3], 2);
  const uint32_t a0 = high ? from_two_0 : x[0], a1 = high ? from_two_1 : x[1];
  const uint32_t a2 = high ? x[2] : from_two_0, a3 = high ? x[3] : from_two_1;
  // Keep the entries of this lane's chunk (j = its bit 0), send the others to the lane one apart.
  const uint32_t from_one_0 = __shfl_xor_sync(kAll, odd ? a0 : a1, 1);
  const uint32_t from_one_1 = __shfl_xor_sync(kAll, odd ? a2 : a3, 1);
  return make_uint4(odd ? from_one_0 : a0, odd ? a1 : from_one_0, odd ? from_one_1 : a2,
                    odd ? a3 : from_one_1);
}

}  // namespace moe::cuda
