// Host-side checks of the grouped GEMMs' arguments that refuse a call before anything touches a
// GPU, so they run on the CPU.
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "kernels/cuda/grouped_gemm.h"

namespace moe {
namespace {

using cuda::GemmKernel;
using testing::expect_error;

// Rows in block order are the layout of the tma kernels only: any other kernel would read or
// write rows in pair order and produce wrong rows without a word.
TEST(CudaGroupedGemmArgs, RowsInBlockOrderAreRefusedByKernelsThatKeepPairOrder) {
  cuda::GroupedGemmArgs args;
  args.max_blocks = 1;
  args.out_columns = 8;
  args.k_dim = 8;
  for (const GemmKernel kernel : {GemmKernel::kStream, GemmKernel::kMma, GemmKernel::kWgmma}) {
    for (const bool gated : {true, false}) {
      args.block_m = kernel == GemmKernel::kStream ? 1 : 64;
      args.out_in_block_order = gated;
      args.input_in_block_order = !gated;
      expect_error([&] { cuda::grouped_gemm(kernel, gated, args, nullptr); },
                   {"rows in block order need a tma kernel", gated ? "gemm 1" : "gemm 2"});
    }
  }
}

}  // namespace
}  // namespace moe
