// Tensor and TensorView shapes: counts as given, empty tensors, and a moe::Error for a negative
// extent or a shape whose bytes int64 cannot count (which would otherwise wrap around to a small
// buffer that every later bound check trusted).
#include "moe/tensor.h"

#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "common/expect_error.h"

namespace moe {
namespace {

using testing::expect_error;

constexpr int64_t kHuge = int64_t{1} << 40;

TEST(TensorShape, CountsElementsAndBytes) {
  const Tensor t(DType::kBF16, {3, 5, 7});
  EXPECT_EQ(t.numel(), 105);
  EXPECT_EQ(t.nbytes(), 210u);
  const TensorView v(nullptr, DType::kF32, {kHuge, 1024});  // 2^52 bytes: a view may describe it
  EXPECT_EQ(v.numel(), kHuge * 1024);
  EXPECT_EQ(v.nbytes(), static_cast<size_t>(kHuge) * 4096);
}

TEST(TensorShape, EmptyExtentsAreFineHoweverLargeTheOthers) {
  const TensorView v(nullptr, DType::kF32, {0, kHuge, kHuge});
  EXPECT_EQ(v.numel(), 0);
  const Tensor t(DType::kBF16, {kHuge, kHuge, 0});
  EXPECT_EQ(t.nbytes(), 0u);
}

TEST(TensorShape, RefusesNegativeExtents) {
  expect_error(
      [] {
        TensorView(nullptr, DType::kF32, {2, -1});
      },
      {"tensor shape", "extents must be >= 0", "[2, -1]"});
  expect_error([] { Tensor(DType::kF32, {-3}); }, {"extents must be >= 0", "[-3]"});
}

TEST(TensorShape, RefusesShapesWhoseBytesOverflowInt64) {
  // 2^40 * 2^40 elements overflow on their own; 2^31 * 2^31 * 4 bytes only with the dtype's size.
  expect_error(
      [] {
        TensorView(nullptr, DType::kBF16, {kHuge, kHuge});
      },
      {"tensor shape", "at most 2^63 - 1 bytes", "[1099511627776, 1099511627776]", "bf16"});
  const int64_t half = int64_t{1} << 31;
  expect_error(
      [&] {
        TensorView(nullptr, DType::kF32, {half, half}, {half, 1}, Device::kCpu);
      },
      {"at most 2^63 - 1 bytes", "f32"});
  expect_error(
      [] {
        Tensor(DType::kF32, {std::numeric_limits<int64_t>::max(), 2});
      },
      {"at most 2^63 - 1 bytes"});
  // The largest count that fits still passes the check (a view: nothing is allocated).
  const TensorView fits(nullptr, DType::kBF16, {half, half - 1});
  EXPECT_EQ(fits.numel(), half * (half - 1));
}

}  // namespace
}  // namespace moe
