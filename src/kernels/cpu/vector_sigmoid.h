// sigmoid(x) = 1 / (1 + exp(-x)) on a vector of floats, written with GCC vector extensions so that
// each includer compiles it for its own instruction set: gated_activation.cc and packed_gemm.cc
// (the library's baseline) and epilogue_rows.h (inside each bf16 path's translation unit). The
// width is the includer's: GCC 12 lowers vector comparisons well only at the target's own width
// (4 lanes for SSE2, 8 for AVX, 16 for AVX-512) and takes wider ones apart lane by lane. Every
// width gives the same bits: each lane's arithmetic is the same.
//
// exp(t) = 2^n * e^r with n = round(t / ln 2) and |r| <= ln(2) / 2, e^r by its degree-6 Taylor
// polynomial (truncation below 2e-7 relative); t is clamped to where 2^n stays a normal float. NaN
// stays NaN (it passes through r). Tested through gated_activation_test.cc and
// epilogue_rows_test.cc.
//
// NOTE: internal linkage on purpose, as in fma_tile.h: each includer compiles its own copy.
// Vectors go by reference: one passed by value has an ABI that depends on the target.
#pragma once

#include <cstdint>
#include <cstring>

namespace moe::cpu {
namespace {

template <int kLanes>
struct Lanes {
  typedef float Floats __attribute__((vector_size(kLanes * sizeof(float))));
  typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));
};

// The library's own target's width (see above), for the includers compiled without a pragma.
#if defined(__AVX512F__)
constexpr int kBaselineLanes = 16;
#elif defined(__AVX__)
constexpr int kBaselineLanes = 8;
#else
constexpr int kBaselineLanes = 4;
#endif

// value = mask ? other : value, lane by lane, for a comparison's all-ones or all-zero lanes.
template <int kLanes>
void replace_lanes(const typename Lanes<kLanes>::Ints& mask,
                   const typename Lanes<kLanes>::Floats& other,
                   typename Lanes<kLanes>::Floats& value) {
  typename Lanes<kLanes>::Ints other_bits, value_bits;
  std::memcpy(&other_bits, &other, sizeof other_bits);
  std::memcpy(&value_bits, &value, sizeof value_bits);
  value_bits = (mask & other_bits) | (~mask & value_bits);
  std::memcpy(&value, &value_bits, sizeof value);
}

template <int kLanes>
void vector_sigmoid(const typename Lanes<kLanes>::Floats& x, typename Lanes<kLanes>::Floats& out) {
  using Floats = typename Lanes<kLanes>::Floats;
  using Ints = typename Lanes<kLanes>::Ints;
  Floats t = -x;
  replace_lanes<kLanes>(t < -87.3f, Floats{} - 87.3f, t);
  replace_lanes<kLanes>(t > 88.7f, Floats{} + 88.7f, t);
  // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
  constexpr float kRound = 12582912.0f;
  const Floats shifted = t * 1.44269504088896341f + kRound;
  const Floats n = shifted - kRound;
  const Floats r = t - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  Floats p = Floats{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  Ints shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  const Ints round_bits = Ints{} + 0x4b400000;  // bits of kRound
  const Ints n_bits = ((shifted_bits - round_bits) + 127) << 23;
  Floats scale;
  std::memcpy(&scale, &n_bits, sizeof scale);
  out = 1.0f / (1.0f + p * scale);
}

}  // namespace
}  // namespace moe::cpu
