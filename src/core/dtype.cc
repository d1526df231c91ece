#include "moe/dtype.h"

#include <cmath>

#include "moe/error.h"

namespace moe {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kI8:
    case DType::kU8:
      return 1;
  }
  fail("unsupported dtype: {}", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kF8E4M3:
      return "f8_e4m3";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI64:
      return "i64";
    case DType::kF64:
      return "f64";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "fp32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16" || name == "fp16") return DType::kF16;
  if (name == "i32" || name == "int32") return DType::kI32;
  if (name == "f8_e4m3" || name == "float8_e4m3fn") return DType::kF8E4M3;
  if (name == "i8" || name == "int8") return DType::kI8;
  if (name == "u8" || name == "uint8") return DType::kU8;
  if (name == "i64" || name == "int64") return DType::kI64;
  if (name == "f64" || name == "float64") return DType::kF64;
  fail("dtype: expected one of f32, bf16, f16, f8_e4m3, f64, i8, u8, i32, i64; got '{}'", name);
}

bool is_floating(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF8E4M3:
    case DType::kF64:
      return true;
    case DType::kI32:
    case DType::kI8:
    case DType::kU8:
    case DType::kI64:
      return false;
  }
  return false;
}

float to_f32(f16 value) {
  const uint32_t sign = uint32_t{value.bits & 0x8000u} << 16;
  const uint32_t exponent = (value.bits >> 10) & 0x1fu;
  const uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));  // Inf/NaN
  if (exponent != 0) return f32_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Subnormal: mantissa * 2^-24, exact in f32.
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -magnitude : magnitude;
}

f16 to_f16(float value) {
  const uint32_t bits = f32_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u)};   // NaN stays NaN
  if (magnitude >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // rounds to Inf
  if (magnitude < 0x38800000u) {
    // Result is subnormal (or zero): round |value| / 2^-24 to the nearest integer, ties to even.
    // The division is exact and nearbyint rounds to even under the default rounding mode.
    const float scaled = std::ldexp(f32_from_bits(magnitude), 24);
    return f16{uint16_t(sign | static_cast<uint16_t>(std::nearbyint(scaled)))};
  }
  // Normal: rebias the exponent, then round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebased = magnitude - (112u << 23);
  const uint32_t lsb = (rebased >> 13) & 1u;
  return f16{uint16_t(sign | ((rebased + 0xfffu + lsb) >> 13))};
}

float to_f32(f8e4m3 value) {
  const uint32_t sign = uint32_t{value.bits & 0x80u} << 24;
  const uint32_t exponent = (value.bits >> 3) & 0xfu;
  const uint32_t mantissa = value.bits & 0x7u;
  if (exponent == 0xf && mantissa == 0x7) return f32_from_bits(sign | 0x7fc00000u);  // NaN
  if (exponent != 0) return f32_from_bits(sign | ((exponent + 120) << 23) | (mantissa << 20));
  // Subnormal: mantissa * 2^-9, exact in f32.
  const float magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  return sign ? -magnitude : magnitude;
}

f8e4m3 to_f8e4m3(float value) {
  const uint32_t bits = f32_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  // 464 ties to the even 448; anything larger would round to 480, whose pattern is NaN. Inf and
  // NaN compare larger too.
  constexpr uint32_t kLargestToMax = 0x43e80000u;  // 464.0f
  if (magnitude > kLargestToMax) return f8e4m3{uint8_t(sign | 0x7fu)};
  if (magnitude < 0x3c800000u) {
    // Result is subnormal (or zero, or the smallest normal 2^-6 after rounding up): round
    // |value| / 2^-9 to the nearest integer, ties to even; the division is exact.
    const float scaled = std::ldexp(f32_from_bits(magnitude), 9);
    return f8e4m3{uint8_t(sign | static_cast<uint8_t>(std::nearbyint(scaled)))};
  }
  // Normal: rebias the exponent (127 -> 7), then round the 20 dropped mantissa bits to nearest
  // even; a mantissa carry moves into the exponent, which is the right rounding.
  const uint32_t rebased = magnitude - (120u << 23);
  const uint32_t lsb = (rebased >> 20) & 1u;
  return f8e4m3{uint8_t(sign | ((rebased + 0x7ffffu + lsb) >> 20))};
}

void convert_to_f32(const void* src, DType dtype, float* dst, size_t count) {
  switch (dtype) {
    case DType::kF32: {
      const auto* in = static_cast<const float*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = in[i];
      return;
    }
    case DType::kBF16: {
      const auto* in = static_cast<const bf16*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = to_f32(in[i]);
      return;
    }
    case DType::kF16: {
      const auto* in = static_cast<const f16*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = to_f32(in[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* in = static_cast<const f8e4m3*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = to_f32(in[i]);
      return;
    }
    case DType::kF64: {
      const auto* in = static_cast<const double*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = static_cast<float>(in[i]);
      return;
    }
    case DType::kI32:
    case DType::kI8:
    case DType::kU8:
    case DType::kI64:
      break;
  }
  fail("convert_to_f32: unsupported source dtype {}", dtype_name(dtype));
}

void convert_from_f32(const float* src, DType dtype, void* dst, size_t count) {
  switch (dtype) {
    case DType::kF32: {
      auto* out = static_cast<float*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = src[i];
      return;
    }
    case DType::kBF16: {
      auto* out = static_cast<bf16*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* out = static_cast<f16*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = to_f16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* out = static_cast<f8e4m3*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = to_f8e4m3(src[i]);
      return;
    }
    case DType::kF64: {
      auto* out = static_cast<double*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = src[i];
      return;
    }
    case DType::kI32:
    case DType::kI8:
    case DType::kU8:
    case DType::kI64:
      break;
  }
  fail("convert_from_f32: unsupported target dtype {}", dtype_name(dtype));
}

}  // namespace moe
