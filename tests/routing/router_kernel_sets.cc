#include "routing/router_kernel_sets.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/router_kernel.h"
#include "moe/cpu_isa.h"

namespace moe::testing {

std::vector<RouterKernelSet> runnable_router_kernels() {
  std::vector<RouterKernelSet> sets;
  for (CpuIsa isa : supported_cpu_isas()) {
    // The bf16 paths run the avx512 router kernel: listed once, as avx512.
    if (isa == CpuIsa::kAvx512Bf16 || isa == CpuIsa::kAmx) continue;
    sets.push_back(
        {std::string(cpu_isa_name(isa)), cpu::router_kernel(isa), isa != CpuIsa::kPlain});
  }
  if (cpu_isa_supported(CpuIsa::kAvx2)) {
    sets.push_back({"avx512-logic-on-avx2", avx512_router_logic_on_avx2(), true});
  }
  return sets;
}

}  // namespace moe::testing

// router_tile.h explains why nothing is included after this.
#pragma GCC push_options
#pragma GCC target("avx2,fma")

#include "kernels/cpu/router_tile.h"

namespace moe::testing {

namespace {

// The avx512 path's multiply-adds on AVX2: a 16-lane vector as two halves, each one vfmadd.
struct Avx512MaddOnAvx2 {
  static void madd(cpu::RouterVectors<16>::Floats& acc, float x,
                   const cpu::RouterVectors<16>::Floats& w) {
    __m256 a[2], b[2];
    std::memcpy(a, &acc, sizeof a);
    std::memcpy(b, &w, sizeof b);
    const __m256 broadcast = _mm256_set1_ps(x);
    for (int half = 0; half < 2; ++half) a[half] = _mm256_fmadd_ps(broadcast, b[half], a[half]);
    std::memcpy(&acc, a, sizeof a);
  }
  static void madd(cpu::RouterVectors<8>::Floats& acc, float x,
                   const cpu::RouterVectors<8>::Floats& w) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x), w, acc);
  }
};

}  // namespace

cpu::RouterKernel avx512_router_logic_on_avx2() {
  return cpu::router_kernel_for<cpu::Avx512RouterShape, Avx512MaddOnAvx2>();
}

}  // namespace moe::testing

#pragma GCC pop_options
