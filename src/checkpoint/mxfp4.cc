// MXFP4 decoding: a 16-entry table for the e2m1 codes and an exponent built in the f32 bits for
// the e8m0 scales, so every decoded value is exact (the products have at most 2 significant
// bits and stay within f32's range up to 6 * 2^127, which overflows to Inf as in PyTorch).
#include "checkpoint/mxfp4.h"

#include <limits>

#include "moe/dtype.h"

namespace moe {

namespace {

constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

float e2m1_value(uint8_t code) { return kE2m1Values[code & 0x0f]; }

float e8m0_value(uint8_t scale) {
  if (scale == 0xff) return std::numeric_limits<float>::quiet_NaN();
  // 2^(scale - 127) has f32 exponent field `scale`; scale 0 has none, and is the subnormal 2^-127.
  if (scale == 0) return f32_from_bits(0x00400000u);
  return f32_from_bits(uint32_t{scale} << 23);
}

void dequantize_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t cols, float* out) {
  for (int64_t group = 0; group < cols / kMxfp4GroupSize; ++group) {
    const float scale = e8m0_value(scales[group]);
    const uint8_t* bytes = packed + group * kMxfp4BytesPerGroup;
    float* values = out + group * kMxfp4GroupSize;
    for (int64_t i = 0; i < kMxfp4BytesPerGroup; ++i) {
      values[2 * i] = e2m1_value(bytes[i]) * scale;
      values[2 * i + 1] = e2m1_value(static_cast<uint8_t>(bytes[i] >> 4)) * scale;
    }
  }
}

}  // namespace moe
