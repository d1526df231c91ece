// A thread block owns a few output columns of one token; its warps take the token's pairs, one
// each (pair j goes to warp j mod warps), and stream those columns' weight rows of the pair's
// expert, 16 bytes per lane per load, as the stream kernel does. Each warp scales its pairs'
// dots by their router weights and adds them; the block then adds the warps' sums in warp order,
// so the order of every addition is fixed by k alone.
//
// Measured on the H200 (docs/perf.md) against the stream kernel's gemm2 plus the sum,
// Qwen3-30B-A3B: 25.7 against 28.5 us at 1 token, 44.4 against 46.8 at 2, about even at 4;
// DeepSeek-V3 even at 1 and 2 tokens. Past that it lost (Qwen3-30B-A3B at 8 tokens 130.0 against
// 127.5, DeepSeek-V3 at 4 tokens 604.2 against 598.7 and at 16 2133 against 2098): the runner takes
// it up to kTinySumMaxTokens. Two columns per block, eight, or the K loop unrolled twice were no
// faster at any size.
#include <cuda_bf16.h>

#include "kernels/cuda/alignment.h"
#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/tiny_gemm2_sum.h"
#include "moe/error.h"

namespace moe::cuda {
namespace {

constexpr int kMaxWarps = 8;
constexpr int kColumnsPerBlock = 4;
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1, kMaxGridY = 65535;

// kColumns: output columns of the block (every warp the same ones, each a different pair);
// kAligned: 16-byte vector loads are legal.
template <int kColumns, bool kAligned>
__global__ void __launch_bounds__(kMaxWarps * 32) tiny_gemm2_sum_kernel(TinyGemm2SumArgs a) {
  __shared__ float partial[kMaxWarps][kColumns];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t H = a.hidden_size, I = a.intermediate_size, k = a.top_k;
  const int64_t token = blockIdx.x;
  const int64_t first_column = static_cast<int64_t>(blockIdx.y) * kColumns;

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
      bf16x8_to_float(load_bf16x8<kAligned, false>(x_row, kk, I), x);
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

template <int kColumns>
void launch(const TinyGemm2SumArgs& args, bool aligned, cudaStream_t stream) {
  // Tokens vary fastest, so that the pairs of different tokens that share an expert read its
  // rows at about the same time and the repeat comes from L2.
  const dim3 grid(static_cast<unsigned>(args.num_tokens),
                  static_cast<unsigned>((args.hidden_size + kColumns - 1) / kColumns));
  const int warps = static_cast<int>(args.top_k < kMaxWarps ? args.top_k : kMaxWarps);
  if (aligned) {
    tiny_gemm2_sum_kernel<kColumns, true><<<grid, warps * 32, 0, stream>>>(args);
  } else {
    tiny_gemm2_sum_kernel<kColumns, false><<<grid, warps * 32, 0, stream>>>(args);
  }
}

}  // namespace

void tiny_gemm2_sum(const TinyGemm2SumArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0 || args.hidden_size == 0) return;
  const int64_t column_blocks = (args.hidden_size + kColumnsPerBlock - 1) / kColumnsPerBlock;
  if (column_blocks > kMaxGridY || args.num_tokens > kMaxGridX) {
    fail("tiny_gemm2_sum: expected at most {} tokens and H at most {}; got {} and {}", kMaxGridX,
         kMaxGridY * kColumnsPerBlock, args.num_tokens, args.hidden_size);
  }
  const bool aligned =
      args.intermediate_size % 8 == 0 && aligned16(args.cache2) && aligned16(args.w2);
  launch<kColumnsPerBlock>(args, aligned, stream);
  check_launch("tiny_gemm2_sum");
}

}  // namespace moe::cuda
