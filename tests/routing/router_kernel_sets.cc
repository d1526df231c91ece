#include "routing/router_kernel_sets.h"

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

// router_tile.h explains why nothing is included after this. This file is compiled with
// -ffp-contract=fast, as the library is (tests/routing/CMakeLists.txt), so the multiply-adds fuse.
#pragma GCC push_options
#pragma GCC target("avx2,fma")

#include "kernels/cpu/router_tile.h"

namespace moe::testing {

cpu::RouterKernel avx512_router_logic_on_avx2() {
  return cpu::router_kernel_for<cpu::Avx512RouterShape>();
}

}  // namespace moe::testing

#pragma GCC pop_options
