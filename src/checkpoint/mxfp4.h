// MXFP4 (OCP Microscaling FP4) as gpt-oss checkpoints store their experts: each group of 32
// consecutive input elements of a row shares one e8m0 scale, and each element is an e2m1 code, two
// codes per byte with the element of even index in the low nibble. value = e2m1 * 2^(scale - 127).
// The engine computes on f32, bf16 and f16, so MXFP4 is decoded once, at load.
#pragma once

#include <cstdint>

namespace moe {

constexpr int64_t kMxfp4GroupSize = 32;                       // elements per scale
constexpr int64_t kMxfp4BytesPerGroup = kMxfp4GroupSize / 2;  // 16: two codes per byte

// The value of a 4-bit e2m1 code (1 sign, 2 exponent bits of bias 1, 1 mantissa bit): 0, 0.5, 1,
// 1.5, 2, 3, 4, 6 for codes 0..7, and their negatives (-0 included) for 8..15. Only the low 4 bits
// of `code` are read.
float e2m1_value(uint8_t code);

// The power of two an e8m0 scale byte stands for: 2^(scale - 127), exact in f32 for 0..254
// (2^-127 is an f32 subnormal); 255 is the format's NaN.
float e8m0_value(uint8_t scale);

// One row of `cols` elements (a multiple of kMxfp4GroupSize) to f32: `packed` holds cols / 2
// bytes, `scales` cols / kMxfp4GroupSize exponents.
void dequantize_mxfp4_row(const uint8_t* packed, const uint8_t* scales, int64_t cols, float* out);

}  // namespace moe
