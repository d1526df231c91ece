// The avx512 router path: router_tile.h compiled for AVX-512F with the Avx512RouterShape
// blocking, every multiply-add one vfmadd (on ZMM, and on YMM for panels of 8). The same template
// and shape also run on AVX2 machines: tests/routing compiles them for AVX2, so only this file's
// target and its multiply-add need AVX-512.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/router_kernel.h"

// Everything below is compiled for AVX-512; router_tile.h explains why nothing is included after
// this.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")

#include "kernels/cpu/router_tile.h"

namespace moe::cpu {

namespace {

struct Avx512Madd {
  static void madd(RouterVectors<16>::Floats& acc, float x, const RouterVectors<16>::Floats& w) {
    acc = _mm512_fmadd_ps(_mm512_set1_ps(x), w, acc);
  }
  static void madd(RouterVectors<8>::Floats& acc, float x, const RouterVectors<8>::Floats& w) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(x), w, acc);
  }
};

}  // namespace

RouterKernel avx512_router_kernel() { return router_kernel_for<Avx512RouterShape, Avx512Madd>(); }

}  // namespace moe::cpu

#pragma GCC pop_options
