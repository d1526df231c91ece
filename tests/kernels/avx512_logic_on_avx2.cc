// The avx512 path's FMA kernel (fma_tile.h with Avx512FmaShape: 16 lanes, 12 rows, 2 panels)
// compiled for AVX2, so its loops and addressing are tested on machines without AVX-512. The
// compiler splits each 16-lane vector into two YMM halves; the arithmetic is the same.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile_kernel.h"
#include "kernels/kernel_sets.h"

// fma_tile.h explains why nothing is included after this.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "kernels/cpu/fma_tile.h"

namespace moe::testing {

namespace {

// 16 halves widened by two F16C conversions of 8 (vcvtph2ps on a ZMM does it in one).
struct F16LoadOnAvx2 {
  static constexpr int64_t kBytes = 2;
  static void load(const void* src, cpu::FmaVectors<16>::Floats* dst) {
    const __m256 low = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(src)));
    const __m256 high = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(src) + 1));
    std::memcpy(dst, &low, sizeof low);
    std::memcpy(reinterpret_cast<char*>(dst) + sizeof low, &high, sizeof high);
  }
};

// A 16-lane multiply-add as two YMM vfmadds: the same rounding as one on a ZMM.
struct MaddOnAvx2 {
  using Floats = cpu::FmaVectors<16>::Floats;
  static void madd(Floats& acc, float x, const Floats& w) {
    const __m256 broadcast = _mm256_set1_ps(x);
    __m256 halves[2], weights[2];
    std::memcpy(halves, &acc, sizeof halves);
    std::memcpy(weights, &w, sizeof weights);
    for (int h = 0; h < 2; ++h) halves[h] = _mm256_fmadd_ps(broadcast, weights[h], halves[h]);
    std::memcpy(&acc, halves, sizeof halves);
  }
};

}  // namespace

cpu::ExpertKernels avx512_logic_on_avx2_kernels(DType weight_dtype) {
  return cpu::fma_expert_kernels<cpu::Avx512FmaShape, F16LoadOnAvx2, MaddOnAvx2>(weight_dtype);
}

}  // namespace moe::testing

#pragma GCC pop_options
