// Tensor and TensorView shapes: counts as given, empty tensors, and a moe::Error for a negative
// extent or a shape whose counts would wrap around in int64 (a small buffer would then pass for a
// huge tensor, and every later bound check with it).
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
  EXPECT_EQ(v.stride(0), 1024);
}

TEST(TensorShape, EmptyTensorsHaveNoElements) {
  const TensorView v(nullptr, DType::kF32, {0, kHuge, 1024});
  EXPECT_EQ(v.numel(), 0);
  EXPECT_EQ(v.stride(0), kHuge * 1024);
  const Tensor t(DType::kBF16, {kHuge, 1024, 0});
  EXPECT_EQ(t.nbytes(), 0u);
}

TEST(TensorShape, RefusesNegativeExtents) {
  expect_error(
      [] {
        TensorView(nullptr, DType::kF32, {2, -1});
      },
      {"tensor shape", "extents must be >= 0", "[2, -1]"});
  expect_error(
      [] {
        Tensor(DType::kF32, {kHuge, kHuge, -3});
      },
      {"extents must be >= 0", "[1099511627776, 1099511627776, -3]"});
}

TEST(TensorShape, RefusesShapesWhoseCountsOverflowInt64) {
  // 2^40 * 2^40 elements overflow on their own; 2^31 * 2^31 * 4 bytes only with the dtype's size.
  expect_error(
      [] {
        TensorView(nullptr, DType::kBF16, {kHuge, kHuge});
      },
      {"tensor shape", "times 2 bytes fits in int64", "[1099511627776, 1099511627776]"});
  const int64_t half = int64_t{1} << 31;
  expect_error(
      [&] {
        TensorView(nullptr, DType::kF32, {half, half}, {half, 1}, Device::kCpu);
      },
      {"times 4 bytes fits in int64"});
  expect_error(
      [] {
        Tensor(DType::kF32, {std::numeric_limits<int64_t>::max(), 2});
      },
      {"fits in int64"});
  // An empty shape too: its strides are products of the other extents.
  expect_error(
      [] {
        Tensor(DType::kF32, {0, kHuge, kHuge});
      },
      {"zeros counted as ones", "[0, 1099511627776, 1099511627776]"});
  // The largest count that fits still passes (a view: nothing is allocated).
  const TensorView fits(nullptr, DType::kBF16, {half, half - 1});
  EXPECT_EQ(fits.numel(), half * (half - 1));
}

}  // namespace
}  // namespace moe
