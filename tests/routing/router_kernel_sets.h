// Every CPU router kernel this machine can run, for the tests that compare them: the real paths
// it supports (router_kernel(isa) for each), plus the avx512 path's template and shape (16 lanes,
// 12 rows, 2 panels) compiled for AVX2, so its loops and addressing run on machines without
// AVX-512 (the compiler splits each 16-lane vector into two YMM halves; the arithmetic is the
// same).
#pragma once

#include <string>
#include <vector>

#include "kernels/cpu/router_kernel.h"

namespace moe::testing {

struct RouterKernelSet {
  std::string name;
  cpu::RouterKernel kernel;
  // Adds each product with one fused multiply-add; plain rounds the product, then the sum.
  bool fused = true;
};

std::vector<RouterKernelSet> runnable_router_kernels();

// Needs AVX2 and FMA at run time.
cpu::RouterKernel avx512_router_logic_on_avx2();

}  // namespace moe::testing
