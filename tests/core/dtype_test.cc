#include "moe/dtype.h"

#include <cmath>
#include <iterator>
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
  EXPECT_EQ(to_f16(65519.996f).bits, 0x7bffu);             // just below the midpoint: max finite
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00u);               // midpoint ties to even: Inf
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

// The value of an e4m3fn pattern from the definition: (-1)^s * 2^(e-7) * 1.m, subnormals
// 2^-6 * 0.m, and S.1111.111 NaN.
double f8e4m3_value(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa / 8.0, -6);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

TEST(DType, F8E4M3DecodesEveryPatternExactly) {
  for (uint32_t bits = 0; bits < 0x100; ++bits) {
    const f8e4m3 value{static_cast<uint8_t>(bits)};
    const double expected = f8e4m3_value(value.bits);
    const float got = to_f32(value);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << "pattern " << bits;
      EXPECT_EQ(to_f8e4m3(got).bits, bits) << "NaN keeps its sign";
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), expected) << "pattern " << bits;
    EXPECT_EQ(std::signbit(got), (bits & 0x80) != 0) << "pattern " << bits;
    EXPECT_EQ(to_f8e4m3(got).bits, bits) << "round trip of pattern " << bits;
  }
  EXPECT_EQ(to_f32(f8e4m3{0x7e}), 448.0f);
  EXPECT_EQ(to_f32(f8e4m3{0x01}), std::ldexp(1.0f, -9));
}

// Between every two neighbouring values: the midpoint goes to the even pattern, anything off
// the midpoint to the nearer value.
TEST(DType, F8E4M3RoundsTiesToEven) {
  for (uint8_t low = 0; low < 0x7e; ++low) {
    const uint8_t high = low + 1;
    const float a = to_f32(f8e4m3{low});
    const float b = to_f32(f8e4m3{high});
    const float mid = (a + b) / 2;  // exact: one more bit than e4m3 has
    const uint8_t even = (low & 1) ? high : low;
    for (float sign : {1.0f, -1.0f}) {
      const uint8_t sign_bit = sign < 0 ? 0x80 : 0;
      EXPECT_EQ(to_f8e4m3(sign * mid).bits, even | sign_bit) << sign * mid;
      EXPECT_EQ(to_f8e4m3(sign * std::nextafter(mid, 0.0f)).bits, low | sign_bit) << mid;
      EXPECT_EQ(to_f8e4m3(sign * std::nextafter(mid, INFINITY)).bits, high | sign_bit) << mid;
    }
  }
}

TEST(DType, F8E4M3RoundsLikeTheDoubleReference) {
  for (uint64_t bits = 0; bits < 0x44000000u; bits += 0x3f1) {
    const float f = f32_from_bits(static_cast<uint32_t>(bits));
    const double expected = round_reference(f, 3, -6);
    if (expected > 448.0) {
      ASSERT_TRUE(std::isnan(to_f32(to_f8e4m3(f)))) << f;
      continue;
    }
    ASSERT_EQ(static_cast<double>(to_f32(to_f8e4m3(f))), expected) << f << " bits " << bits;
    ASSERT_EQ(static_cast<double>(to_f32(to_f8e4m3(-f))), -expected) << -f;
  }
}

// No Inf in e4m3fn: like PyTorch's float8_e4m3fn cast, whatever rounds beyond 448 is NaN.
TEST(DType, F8E4M3OverflowIsNanNotSaturation) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(to_f8e4m3(448.0f).bits, 0x7eu);
  EXPECT_EQ(to_f8e4m3(-448.0f).bits, 0xfeu);
  EXPECT_EQ(to_f8e4m3(464.0f).bits, 0x7eu);  // the midpoint to 480 ties to the even 448
  EXPECT_EQ(to_f8e4m3(std::nextafter(464.0f, inf)).bits, 0x7fu);
  EXPECT_EQ(to_f8e4m3(480.0f).bits, 0x7fu);
  EXPECT_EQ(to_f8e4m3(1e30f).bits, 0x7fu);
  EXPECT_EQ(to_f8e4m3(inf).bits, 0x7fu);
  EXPECT_EQ(to_f8e4m3(-inf).bits, 0xffu);
  EXPECT_TRUE(std::isnan(to_f32(to_f8e4m3(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(to_f8e4m3(std::ldexp(1.0f, -10)).bits, 0x00u);  // half the smallest subnormal
  EXPECT_EQ(to_f8e4m3(-std::ldexp(1.0f, -10)).bits, 0x80u);
  EXPECT_EQ(to_f8e4m3(std::ldexp(1.5f, -10)).bits, 0x01u);
  EXPECT_EQ(to_f8e4m3(std::ldexp(1.0f, -30)).bits, 0x00u);
}

TEST(DType, NewStorageTypesHaveSizesNamesAndConversions) {
  const DType all[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kF8E4M3,
                       DType::kI8,  DType::kU8,   DType::kI64, DType::kF64};
  const size_t sizes[] = {4, 2, 2, 4, 1, 1, 1, 8, 8};
  const bool floating[] = {true, true, true, false, true, false, false, false, true};
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]) << dtype_name(all[i]);
    EXPECT_EQ(is_floating(all[i]), floating[i]) << dtype_name(all[i]);
    EXPECT_EQ(parse_dtype(dtype_name(all[i])), all[i]);
  }
  EXPECT_EQ(dtype_name(DType::kF8E4M3), "f8_e4m3");
  EXPECT_EQ(parse_dtype("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("uint8"), DType::kU8);
  EXPECT_EQ(parse_dtype("float64"), DType::kF64);

  const float values[] = {1.0f / 3, -448.0f, 0.0f, 1e-3f};
  double f64[4];
  convert_from_f32(values, DType::kF64, f64, 4);
  float back[4];
  convert_to_f32(f64, DType::kF64, back, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], values[i]);
  const double third = 1.0 / 3;
  convert_to_f32(&third, DType::kF64, back, 1);
  EXPECT_EQ(back[0], 1.0f / 3);  // double -> float rounds to nearest

  f8e4m3 f8[4];
  convert_from_f32(values, DType::kF8E4M3, f8, 4);
  convert_to_f32(f8, DType::kF8E4M3, back, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], to_f32(to_f8e4m3(values[i])));

  const int8_t ints[] = {1, 2};
  EXPECT_THROW(convert_to_f32(ints, DType::kI8, back, 2), Error);
  EXPECT_THROW(convert_from_f32(values, DType::kI64, f64, 1), Error);
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
