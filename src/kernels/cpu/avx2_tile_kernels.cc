// The avx2 path: fma_tile.h compiled for AVX2 + FMA (8 lanes), f16 weights widened with F16C.
// Blocks of 6 rows by one 16-column panel keep 12 accumulators in the 16 YMM registers beside the
// weights and the broadcast input. Tested by tests/kernels/tile_kernels_test.cc.
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

constexpr int kLanes = 8;
constexpr int kMaxRows = 6;
constexpr int kPanelsPerBlock = 1;
// About 150 GFLOP/s of f32 FMA against 20 GB/s of DRAM reads on two cores.
constexpr double kFlopsPerByte = 8;

struct F16cLoad {
  static constexpr int64_t kBytes = 2;
  static void load(const void* src, FmaVectors<kLanes>::Floats* dst) {
    const __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(src)));
    std::memcpy(dst, &wide, sizeof *dst);
  }
};

}  // namespace

ExpertKernels avx2_expert_kernels(DType weight_dtype) {
  return fma_expert_kernels<kLanes, kMaxRows, kPanelsPerBlock, F16cLoad>(weight_dtype,
                                                                        kFlopsPerByte);
}

double avx2_peak_loop(int64_t iterations) { return fma_peak_loop<kLanes>(iterations); }

}  // namespace moe::cpu

#pragma GCC pop_options
