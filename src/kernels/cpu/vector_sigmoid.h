// sigmoid(x) = 1 / (1 + exp(-x)) on 16 floats at once, written with GCC vector extensions so that
// each includer compiles it for its own instruction set: gated_activation.cc (the library's
// baseline) and epilogue_rows.h (inside each path's translation unit).
//
// exp(t) = 2^n * e^r with n = round(t / ln 2) and |r| <= ln(2) / 2, e^r by its degree-6 Taylor
// polynomial (truncation below 2e-7 relative); t is clamped to where 2^n stays a normal float. NaN
// stays NaN (it passes through r). Tested through gated_activation_test.cc.
//
// NOTE: internal linkage on purpose, as in fma_tile.h: each includer compiles its own copy.
#pragma once

#include <cstdint>
#include <cstring>

namespace moe::cpu {
namespace {

typedef float SigmoidFloats __attribute__((vector_size(16 * sizeof(float))));
typedef int32_t SigmoidInts __attribute__((vector_size(16 * sizeof(int32_t))));

// Arguments by reference: a 64-byte vector passed by value has an ABI that depends on the target.
void vector_sigmoid(const SigmoidFloats& x, SigmoidFloats& out) {
  SigmoidFloats t = -x;
  t = t < -87.3f ? SigmoidFloats{} - 87.3f : t;
  t = t > 88.7f ? SigmoidFloats{} + 88.7f : t;
  // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
  constexpr float kRound = 12582912.0f;
  const SigmoidFloats shifted = t * 1.44269504088896341f + kRound;
  const SigmoidFloats n = shifted - kRound;
  const SigmoidFloats r = t - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  SigmoidFloats p = SigmoidFloats{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  SigmoidInts shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  const SigmoidInts round_bits = SigmoidInts{} + 0x4b400000;  // bits of kRound
  const SigmoidInts n_bits = ((shifted_bits - round_bits) + 127) << 23;
  SigmoidFloats scale;
  std::memcpy(&scale, &n_bits, sizeof scale);
  out = 1.0f / (1.0f + p * scale);
}

}  // namespace
}  // namespace moe::cpu
