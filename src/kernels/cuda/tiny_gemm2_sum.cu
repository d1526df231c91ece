// A thread block per kColumnsPerBlock output columns of one token (tiny_gemm2_sum.cuh says how its
// warps share the token's pairs and add them).
//
// Measured on the H200 (docs/perf.md) against the stream kernel's gemm2 plus the sum,
// Qwen3-30B-A3B: 25.7 against 28.5 us at 1 token, 44.4 against 46.8 at 2, about even at 4;
// DeepSeek-V3 even at 1 and 2 tokens. Past that it lost (Qwen3-30B-A3B at 8 tokens 130.0 against
// 127.5, DeepSeek-V3 at 4 tokens 604.2 against 598.7 and at 16 2133 against 2098): the runner takes
// it up to kTinySumMaxTokens. Two columns per block, eight, or the K loop unrolled twice were no
// faster at any size. A programmatic launch that let its blocks start during gemm1's tail saved
// 0.0-0.9 us at 1 and 2 tokens (up to 1.4% with its first weights loaded before the wait): not
// kept.
#include <cuda_bf16.h>

#include "kernels/cuda/alignment.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/tiny_gemm2_sum.cuh"
#include "moe/error.h"

namespace moe::cuda {
namespace {

constexpr int kColumnsPerBlock = 4;
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1, kMaxGridY = 65535;

template <int kColumns, bool kAligned>
__global__ void __launch_bounds__(kTinySumMaxWarps * 32) tiny_gemm2_sum_kernel(TinyGemm2SumArgs a) {
  tiny_gemm2_sum_columns<kColumns, kAligned, false>(a, blockIdx.x,
                                                    static_cast<int64_t>(blockIdx.y) * kColumns);
}

template <int kColumns>
void launch(const TinyGemm2SumArgs& args, bool aligned, cudaStream_t stream) {
  // Tokens vary fastest, so that the pairs of different tokens that share an expert read its
  // rows at about the same time and the repeat comes from L2.
  const dim3 grid(static_cast<unsigned>(args.num_tokens),
                  static_cast<unsigned>((args.hidden_size + kColumns - 1) / kColumns));
  const int warps = static_cast<int>(args.top_k < kTinySumMaxWarps ? args.top_k : kTinySumMaxWarps);
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
