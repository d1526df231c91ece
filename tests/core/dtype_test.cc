#include "moe/dtype.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "moe/error.h"

namespace moe {
namespace {

// Round-to-nearest-even reference computed in double: the representable neighbours of `value`
// in a format with `mantissa_bits` explicit bits, picked by distance, ties to the even one.
double round_reference(double value, int mantissa_bits, int min_exponent) {
  if (value == 0 || std::isinf(value)) return value;
  int exponent = std::ilogb(value);
  exponent = std::max(exponent, min_exponent);  // subnormals share the smallest exponent's ulp
  const double ulp = std::ldexp(1.0, exponent - mantissa_bits);
  const double scaled = value / ulp;
  double rounded = std::floor(scaled);
  const double diff = scaled - rounded;
  if (diff > 0.5 || (diff == 0.5 && std::fmod(rounded, 2.0) != 0)) rounded += 1;
  return rounded * ulp;
}

TEST(DType, Bf16RoundTripIsExactForEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const bf16 value{static_cast<uint16_t>(bits)};
    const float f = to_f32(value);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_f32(to_bf16(f)))) << bits;
      continue;
    }
    EXPECT_EQ(to_bf16(f).bits, value.bits) << "pattern " << bits;
  }
}

TEST(DType, F16RoundTripIsExactForEveryPattern) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const f16 value{static_cast<uint16_t>(bits)};
    const float f = to_f32(value);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_f32(to_f16(f)))) << bits;
      continue;
    }
    EXPECT_EQ(to_f16(f).bits, value.bits) << "pattern " << bits;
  }
}

// Walks f32 patterns with a stride that hits every exponent, including values exactly halfway
// between two neighbours (low 16 bits = 0x8000), and compares with the double reference.
TEST(DType, Bf16RoundsToNearestEven) {
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 0x1235) {
    for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = f32_from_bits(static_cast<uint32_t>((bits & ~0xffffull) | low));
      const double expected = round_reference(f, 7, -126);
      const double expected_clamped =
          std::abs(expected) > 3.3895313892515355e38 ? INFINITY : expected;
      ASSERT_EQ(static_cast<double>(to_f32(to_bf16(f))), expected_clamped) << f;
      ASSERT_EQ(static_cast<double>(to_f32(to_bf16(-f))), -expected_clamped) << -f;
    }
  }
}

TEST(DType, F16RoundsToNearestEvenIncludingSubnormalsAndOverflow) {
  for (uint64_t bits = 0; bits < 0x47800000u; bits += 0x0f1) {
    const float f = f32_from_bits(static_cast<uint32_t>(bits));
    double expected = round_reference(f, 10, -14);
    if (expected > 65504.0) expected = INFINITY;
    ASSERT_EQ(static_cast<double>(to_f32(to_f16(f))), expected) << f << " bits " << bits;
    ASSERT_EQ(static_cast<double>(to_f32(to_f16(-f))), -expected) << -f;
  }
  EXPECT_EQ(to_f16(65519.996f).bits, 0x7bffu);  // just below the midpoint: max finite
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00u);     // midpoint ties to even: Inf
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -25)).bits, 0x0000u);  // half the smallest subnormal: 0
  EXPECT_EQ(to_f16(std::ldexp(1.5f, -25)).bits, 0x0001u);
}

TEST(DType, NanStaysNanAndInfStaysInf) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(nan))));
  EXPECT_TRUE(std::isnan(to_f32(to_f16(nan))));
  // A NaN whose payload sits only in the low bits must not truncate to Inf.
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(f32_from_bits(0x7f800001u)))));
  EXPECT_EQ(to_f32(to_bf16(inf)), inf);
  EXPECT_EQ(to_f32(to_f16(-inf)), -inf);
}

TEST(DType, ParseNamesAndRejectUnknown) {
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("f32"), DType::kF32);
  try {
    parse_dtype("fp64");
    FAIL() << "expected moe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp64"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe
