// The avx512 path: fma_tile.h compiled for AVX-512F with the Avx512FmaShape blocking, f16 weights
// widened with vcvtph2ps, every multiply-add one vfmadd on a ZMM. The same template with the same
// shape also runs on AVX2 machines: tests/kernels compiles it for AVX2, so only this file's target,
// f16 loader and multiply-add need AVX-512.
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

constexpr int kLanes = Avx512FmaShape::kLanes;

struct F16Load {
  static constexpr int64_t kBytes = 2;
  static void load(const void* src, FmaVectors<kLanes>::Floats* dst) {
    const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(src)));
    std::memcpy(dst, &wide, sizeof *dst);
  }
};

struct Avx512Madd {
  using Floats = FmaVectors<kLanes>::Floats;
  static void madd(Floats& acc, float x, const Floats& w) {
    acc = _mm512_fmadd_ps(_mm512_set1_ps(x), w, acc);
  }
};

}  // namespace

ExpertKernels avx512_expert_kernels(DType weight_dtype) {
  return fma_expert_kernels<Avx512FmaShape, F16Load, Avx512Madd>(weight_dtype);
}

double avx512_peak_loop(int64_t iterations) { return fma_peak_loop<kLanes>(iterations); }

}  // namespace moe::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options
