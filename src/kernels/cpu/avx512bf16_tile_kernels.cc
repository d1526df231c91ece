// The avx512bf16 path: bf16_dot_tile.h on the AVX512-BF16 instructions. bf16 weights only; the path
// runs the avx512 kernels for other weight dtypes (expert_kernels.cc). The loop itself is
// exercised on any machine through an emulation of these four operations in
// tests/kernels/tile_kernels_test.cc; only this file's intrinsics need the real CPU.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile_kernel.h"

// Everything below is compiled for AVX512-BF16; fma_tile.h explains why nothing is included after
// this.
#pragma GCC push_options
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), deliberately uninitialized values
// that its own warnings then flag inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")

#include "kernels/cpu/bf16_dot_tile.h"

namespace moe::cpu {

namespace {

struct Avx512Bf16Ops {
  using Acc = __m512;
  using Weights = __m512bh;
  using Pair = __m512bh;
  static void zero(Acc* acc) { *acc = _mm512_setzero_ps(); }
  static void load_acc(const float* in, Acc* acc) { *acc = _mm512_loadu_ps(in); }
  static void load(const void* src, Weights* w) {
    *w = reinterpret_cast<__m512bh>(_mm512_loadu_si512(src));
  }
  static void broadcast(const uint16_t* a, Pair* pair) {
    int32_t bits;
    std::memcpy(&bits, a, sizeof bits);
    *pair = reinterpret_cast<__m512bh>(_mm512_set1_epi32(bits));
  }
  static void dot(Acc* acc, const Pair& pair, const Weights& w) {
    *acc = _mm512_dpbf16_ps(*acc, pair, w);
  }
  static void store(const Acc& acc, float* out) { _mm512_storeu_ps(out, acc); }
};

}  // namespace

ExpertKernels avx512bf16_expert_kernels() { return bf16_dot_expert_kernels<Avx512Bf16Ops>(); }

double avx512bf16_peak_loop(int64_t iterations) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));  // (1, 1)
  const __m512bh w = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));  // (1e-7, 1e-7)
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, w);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  // Each instruction: 16 lanes x 2 multiply-adds.
  return 2.0 * 32 * kChains * static_cast<double>(iterations);
}

}  // namespace moe::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options
