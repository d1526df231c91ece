// The avx512 router path: router_tile.h compiled for AVX-512F with the Avx512RouterShape
// blocking. The same template and shape also run on AVX2 machines: tests/routing compiles them for
// AVX2, so only this file's target needs AVX-512.
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

RouterKernel avx512_router_kernel() { return router_kernel_for<Avx512RouterShape>(); }

}  // namespace moe::cpu

#pragma GCC pop_options
