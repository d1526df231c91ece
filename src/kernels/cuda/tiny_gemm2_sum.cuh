// The work of one tiny_gemm2_sum thread block (tiny_gemm2_sum.h), shared by that kernel and the
// decode kernel's gemm2 items (decode_experts.cu): kColumns output columns of one token. The
// block's warps take the token's pairs (pair j goes to warp j mod warps) and stream those
// columns' weight rows of the pair's expert, 16 bytes per lane per load; each warp scales its
// pairs' dots by their router weights and adds them; the block then adds the warps' sums in warp
// order, so the order of every addition is fixed by k and the warp count alone.
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/tiny_gemm2_sum.h"

namespace moe::cuda {

inline constexpr int kTinySumMaxWarps = 8;

// kAligned: 16-byte vector loads are legal. kCache2FromThisLaunch: other thread blocks of the
// running kernel wrote cache2, so it is read through L2 (the read-only path may hold stale lines).
template <int kColumns, bool kAligned, bool kCache2FromThisLaunch>
__device__ void tiny_gemm2_sum_columns(const TinyGemm2SumArgs& a, int64_t token,
                                       int64_t first_column) {
  static_assert(kAligned || !kCache2FromThisLaunch,
                "cache2 of this launch is read 16 bytes at a time");
  __shared__ float partial[kTinySumMaxWarps][kColumns];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t H = a.hidden_size, I = a.intermediate_size, k = a.top_k;

  const auto* w2 = static_cast<const __nv_bfloat16*>(a.w2);
  const auto* cache2 = static_cast<const __nv_bfloat16*>(a.cache2);
  int64_t row_offset[kColumns];
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    // Columns past the end re-read the first row; their sums are never stored.
    const int64_t column = first_column + c;
    row_offset[c] = (column < H ? column : 0) * I;
  }

  // Warp w adds pairs w, w + warps, ...: a fixed share, so a fixed order of additions.
  float total[kColumns] = {};
  for (int64_t j = warp; j < k; j += warps) {
    const int64_t pair = token * k + j;
    const int32_t expert = a.topk_ids[pair];
    if (expert < 0 || expert >= a.num_experts) continue;
    const __nv_bfloat16* expert_w2 = w2 + expert * H * I;
    const __nv_bfloat16* x_row = cache2 + pair * I;
    float acc[kColumns] = {};
#pragma unroll 1
    for (int64_t kk = lane * 8; kk < I; kk += 32 * 8) {
      uint4 packed[kColumns];
#pragma unroll
      for (int c = 0; c < kColumns; ++c) {
        packed[c] = load_bf16x8<kAligned, true>(expert_w2 + row_offset[c], kk, I);
      }
      float x[8];
      if constexpr (kCache2FromThisLaunch) {
        bf16x8_to_float(__ldcg(reinterpret_cast<const uint4*>(x_row + kk)), x);
      } else {
        bf16x8_to_float(load_bf16x8<kAligned, false>(x_row, kk, I), x);
      }
      add_bf16x8_products(packed, x, acc);
    }
    const float weight = a.topk_weights[pair];
#pragma unroll
    for (int c = 0; c < kColumns; ++c) total[c] = fmaf(weight, warp_sum(acc[c]), total[c]);
  }
#pragma unroll
  for (int c = 0; c < kColumns; ++c) {
    if (lane == c) partial[warp][c] = total[c];
  }
  __syncthreads();
  const int c = threadIdx.x;
  if (c < kColumns && first_column + c < H) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) sum += partial[w][c];
    static_cast<__nv_bfloat16*>(a.out)[token * H + first_column + c] = __float2bfloat16(sum);
  }
}

}  // namespace moe::cuda
