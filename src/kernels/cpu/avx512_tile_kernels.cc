// The avx512 path: fma_tile.h compiled for AVX-512F (16 lanes), f16 weights widened with
// vcvtph2ps. Blocks of 8 rows by both panels keep 16 accumulators in the 32 ZMM registers.
// This machine-independent logic is also run on AVX2 machines: tests/kernels compiles the same
// 16-lane template for AVX2.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile_kernel.h"

// Everything below is compiled for AVX-512; fma_tile.h explains why nothing is included after
// this.
#pragma GCC push_options
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), deliberately uninitialized values
// that its own warnings then flag inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

#include "kernels/cpu/fma_tile.h"

namespace moe::cpu {

namespace {

constexpr int kLanes = 16;
constexpr int kMaxRows = 8;
constexpr int kPanelsPerBlock = 2;
// About 300 GFLOP/s of f32 FMA against 25 GB/s of DRAM reads on two cores.
constexpr double kFlopsPerByte = 12;

struct F16Load {
  static constexpr int64_t kBytes = 2;
  static void load(const void* src, FmaVectors<kLanes>::Floats* dst) {
    const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(src)));
    std::memcpy(dst, &wide, sizeof *dst);
  }
};

}  // namespace

ExpertKernels avx512_expert_kernels(DType weight_dtype) {
  return fma_expert_kernels<kLanes, kMaxRows, kPanelsPerBlock, F16Load>(weight_dtype,
                                                                       kFlopsPerByte);
}

double avx512_peak_loop(int64_t iterations) { return fma_peak_loop<kLanes>(iterations); }

}  // namespace moe::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options
