// The avx2 router path: router_tile.h compiled for AVX2 + FMA with the Avx2RouterShape blocking,
// every multiply-add one vfmadd. Tested by tests/routing/router_logits_test.cc.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/router_kernel.h"

// Everything below is compiled for AVX2; router_tile.h explains why nothing is included after
// this.
#pragma GCC push_options
#pragma GCC target("avx2,fma")

#include "kernels/cpu/router_tile.h"

namespace moe::cpu {

namespace {

struct Avx2Madd {
  using Floats = RouterVectors<8>::Floats;
  static void madd(Floats& acc, float x, const Floats& w) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x), w, acc);
  }
};

}  // namespace

RouterKernel avx2_router_kernel() { return router_kernel_for<Avx2RouterShape, Avx2Madd>(); }

}  // namespace moe::cpu

#pragma GCC pop_options
