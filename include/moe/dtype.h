// Element types and exact conversions between them.
//
// bf16 and f16 are stored as raw 16-bit patterns. Conversion from f32 rounds to nearest, ties
// to even, and keeps NaN a (quiet) NaN; conversion to f32 is exact. These are the conversions
// every backend uses, so a value rounded on the CPU is bit-identical to one rounded elsewhere.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moe {

enum class DType : uint8_t { kF32, kBF16, kF16, kI32 };

// Bytes per element.
size_t dtype_size(DType dtype);
// "f32", "bf16", "f16", "i32".
std::string_view dtype_name(DType dtype);
// Parses the names above (and "float32", "bfloat16", "float16", "int32"); throws moe::Error.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);

struct bf16 {
  uint16_t bits = 0;
};
struct f16 {
  uint16_t bits = 0;
};

inline uint32_t f32_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float f32_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline float to_f32(bf16 value) { return f32_from_bits(uint32_t{value.bits} << 16); }

inline bf16 to_bf16(float value) {
  const uint32_t bits = f32_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((bits >> 16) | 0x0040u)};  // NaN
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. Overflow of the
  // mantissa carries into the exponent, which is exactly the rounding we want (up to Inf).
  const uint32_t lsb = (bits >> 16) & 1u;
  return bf16{uint16_t((bits + 0x7fffu + lsb) >> 16)};
}

float to_f32(f16 value);
f16 to_f16(float value);

inline float to_f32(float value) { return value; }

// Converts `count` elements of `src` (of type `dtype`) to f32.
void convert_to_f32(const void* src, DType dtype, float* dst, size_t count);
// Converts `count` f32 values to `dtype`, rounding to nearest even.
void convert_from_f32(const float* src, DType dtype, void* dst, size_t count);

}  // namespace moe
