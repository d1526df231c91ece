// align_scratch_bytes, the device scratch a workspace reserves for align_block_size: host code,
// so it runs on the CPU. The kernels' use of it is checked on the GPU (tests/cuda, under
// compute-sanitizer memcheck).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/align_block_size.h"

namespace moe {
namespace {

using cuda::align_scratch_bytes;

// The one-launch kernel keeps its counts in shared memory: up to 8192 pairs and 256 experts a
// workspace needs none.
TEST(CudaAlignScratch, NoneWhileOneLaunchSorts) {
  for (const int64_t pairs : {0, 1, 2048, 8192}) {
    for (const int64_t experts : {1, 128, 256}) {
      EXPECT_EQ(align_scratch_bytes(pairs, experts), 0u) << pairs << " pairs, " << experts;
    }
  }
  EXPECT_GT(align_scratch_bytes(8193, 256), 0u);
  EXPECT_GT(align_scratch_bytes(100, 257), 0u);
  EXPECT_GT(align_scratch_bytes(131072, 128), 0u);
}

TEST(CudaAlignScratch, NeverMoreThanHalfAMebibyte) {
  for (const int64_t pairs : {int64_t{8193}, int64_t{1} << 18, int64_t{1} << 28}) {
    for (const int64_t experts : {1, 257, 4096, 8192}) {
      EXPECT_LE(align_scratch_bytes(pairs, experts), size_t{512} << 10)
          << pairs << " pairs, " << experts;
    }
  }
}

// A workspace is reserved once for a call's longest chunk and then serves its shorter last one.
TEST(CudaAlignScratch, ALongerBatchReservesEnoughForEveryShorterOne) {
  for (const int64_t experts : {1, 64, 256, 257, 1000, 8192}) {
    size_t most = 0;
    for (int64_t pairs = 0; pairs <= 70000; ++pairs) {
      const size_t bytes = align_scratch_bytes(pairs, experts);
      most = std::max(most, bytes);
      ASSERT_EQ(bytes, most) << pairs << " pairs, " << experts << " experts";
    }
  }
}

}  // namespace
}  // namespace moe
