// Element types and exact conversions between them.
//
// bf16, f16 and f8_e4m3 are stored as raw bit patterns. Conversion from f32 rounds to nearest,
// ties to even, and keeps NaN a NaN; conversion to f32 is exact. These are the conversions every
// backend uses, so a value rounded on the CPU is bit-identical to one rounded elsewhere.
//
// The 8-bit integer, i64 and f64 types exist so that checkpoints, inputs and traces holding them
// can be read and written; the kernels compute on f32, bf16 and f16.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace moe {

// New values go at the end: the numeric values of the existing ones stay put.
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kF8E4M3, kI8, kU8, kI64, kF64 };

// Bytes per element.
size_t dtype_size(DType dtype);
// "f32", "bf16", "f16", "i32", "f8_e4m3", "i8", "u8", "i64", "f64".
std::string_view dtype_name(DType dtype);
// Parses the names above and the long forms ("float32", "bfloat16", "float16", "int32",
// "float8_e4m3fn", "int8", "uint8", "int64", "float64"); throws moe::Error.
DType parse_dtype(std::string_view name);
// True for f32, bf16, f16, f8_e4m3 and f64: the types convert_to_f32 and convert_from_f32 take.
bool is_floating(DType dtype);

struct bf16 {
  uint16_t bits = 0;
};
struct f16 {
  uint16_t bits = 0;
};
// OCP fp8 e4m3fn ("fn": finite, with NaN): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits.
// No Inf; S.1111.111 is NaN, so the largest magnitude is 1.75 * 2^8 = 448.
struct f8e4m3 {
  uint8_t bits = 0;
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

float to_f32(f8e4m3 value);
// Rounds to nearest even. Magnitudes that round beyond 448 (anything above 464, the midpoint
// between 448 and the next step 480), Inf and NaN all become NaN (0x7f with the input's sign).
// This is what PyTorch's float8_e4m3fn cast does (c10::Float8_e4m3fn), so weights quantized
// here match those quantized in PyTorch bit for bit. Scaled quantizers that want saturation
// clamp to +-448 before converting, as they do in PyTorch.
f8e4m3 to_f8e4m3(float value);

inline float to_f32(float value) { return value; }

// Converts `count` elements of `src` (of a floating `dtype`) to f32; f64 rounds to nearest even.
// Throws moe::Error for integer dtypes. `src` must be aligned for its dtype.
void convert_to_f32(const void* src, DType dtype, float* dst, size_t count);
// Converts `count` f32 values to a floating `dtype`, rounding to nearest even (f64 is exact).
void convert_from_f32(const float* src, DType dtype, void* dst, size_t count);

}  // namespace moe
