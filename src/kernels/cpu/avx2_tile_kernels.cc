// The avx2 path: fma_tile.h compiled for AVX2 + FMA with the Avx2FmaShape blocking, f16 weights
// widened with F16C, every multiply-add one vfmadd. Tested by tests/kernels/tile_kernels_test.cc.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile_kernel.h"

// Everything below is compiled for AVX2; fma_tile.h explains why nothing is included after this.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "kernels/cpu/fma_tile.h"

namespace moe::cpu {

namespace {

constexpr int kLanes = Avx2FmaShape::kLanes;

struct F16cLoad {
  static constexpr int64_t kBytes = 2;
  static void load(const void* src, FmaVectors<kLanes>::Floats* dst) {
    const __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(src)));
    std::memcpy(dst, &wide, sizeof *dst);
  }
};

struct Avx2Madd {
  using Floats = FmaVectors<kLanes>::Floats;
  static void madd(Floats& acc, float x, const Floats& w) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x), w, acc);
  }
};

}  // namespace

ExpertKernels avx2_expert_kernels(DType weight_dtype) {
  return fma_expert_kernels<Avx2FmaShape, F16cLoad, Avx2Madd>(weight_dtype);
}

double avx2_peak_loop(int64_t iterations) { return fma_peak_loop<kLanes>(iterations); }

}  // namespace moe::cpu

#pragma GCC pop_options
