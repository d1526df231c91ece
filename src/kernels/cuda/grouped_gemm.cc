#include "kernels/cuda/grouped_gemm.h"

#include "kernels/cuda/alignment.h"
#include "kernels/cuda/grouped_gemm_launch.h"
#include "moe/error.h"

namespace moe::cuda {

bool mma_supports_block_m(int64_t block_m) {
  return block_m == 16 || block_m == 32 || block_m == 64 || block_m == 128;
}

bool wgmma_supports_block_m(int64_t block_m) { return block_m == 64 || block_m == 128; }

bool tma_supports_block_m(int64_t block_m) {
  return block_m == 16 || wgmma_supports_block_m(block_m);
}

bool mma_supports(const GroupedGemmArgs& args) {
  return args.k_dim % 8 == 0 && aligned16(args.input) && aligned16(args.weights);
}

void grouped_gemm(GemmKernel kernel, bool gated, const GroupedGemmArgs& args, cudaStream_t stream) {
  if (args.max_blocks == 0 || args.out_columns == 0) return;
  if (!is_tma_kernel(kernel) && (args.out_in_block_order || args.input_in_block_order)) {
    // The other kernels read and write rows in pair order only, and would silently do so.
    fail("grouped_gemm: rows in block order need a tma kernel; got kernel {} (gemm {})",
         static_cast<int>(kernel), gated ? 1 : 2);
  }
  switch (kernel) {
    case GemmKernel::kStream:
      if (args.block_m < 1 || args.block_m > kMaxStreamRows) {
        fail("grouped_gemm: the stream kernel takes block_m in [1, {}]; got {}", kMaxStreamRows,
             args.block_m);
      }
      stream_grouped_gemm(gated, args, mma_supports(args), stream);
      return;
    case GemmKernel::kMma:
      if (!mma_supports_block_m(args.block_m) || !mma_supports(args)) {
        fail(
            "grouped_gemm: the tensor-core kernel needs block_m 16, 32, 64 or 128, K % 8 == 0 and "
            "16-byte aligned rows; got block_m {}, K {}",
            args.block_m, args.k_dim);
      }
      mma_grouped_gemm(gated, args, stream);
      return;
    case GemmKernel::kWgmma:
      if (!wgmma_available()) fail("grouped_gemm: the wgmma kernel needs a Hopper GPU (sm_90)");
      if (!wgmma_supports_block_m(args.block_m) || !mma_supports(args)) {
        fail(
            "grouped_gemm: the wgmma kernel needs block_m 64 or 128, K % 8 == 0 and 16-byte "
            "aligned rows; got block_m {}, K {}",
            args.block_m, args.k_dim);
      }
      wgmma_grouped_gemm(gated, args, stream);
      return;
    case GemmKernel::kTma:
    case GemmKernel::kTmaEager:
    case GemmKernel::kTmaPair:
    case GemmKernel::kTmaDynamic:
      if (!wgmma_available()) fail("grouped_gemm: the tma kernel needs a Hopper GPU (sm_90)");
      // It stores whole 16-byte chunks of output rows, so those must be aligned too.
      if (!tma_supports_block_m(args.block_m) || !mma_supports(args) || args.out_columns % 8 != 0 ||
          !aligned16(args.out)) {
        fail(
            "grouped_gemm: the tma kernel needs block_m 16, 64 or 128, K % 8 == 0, output "
            "columns % 8 == 0 and 16-byte aligned rows; got block_m {}, K {}, output columns {}",
            args.block_m, args.k_dim, args.out_columns);
      }
      tma_grouped_gemm(kernel, gated, args, stream);
      return;
    case GemmKernel::kDecode:
      fail(
          "grouped_gemm: the decode kernel runs a whole experts call (decode_experts), not one "
          "grouped GEMM");
  }
  fail("grouped_gemm: unsupported kernel: {}", static_cast<int>(kernel));
}

}  // namespace moe::cuda
