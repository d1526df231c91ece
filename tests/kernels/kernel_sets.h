// Every CPU experts kernel set this machine can run, for the tests that compare them: the real
// paths it supports, plus the logic of the paths it lacks run on emulated or narrower hardware:
//   emulated-avx512bf16   bf16_dot_tile.h on a scalar emulation of vdpbf16ps
//   emulated-amx          amx_bf16_tile.h on a scalar emulation of the AMX tiles
//   avx512-logic-on-avx2  fma_tile.h with the avx512 path's shape (16 lanes, 12 rows, 2 panels),
//                         compiled for AVX2
// The emulations follow the instructions' documented arithmetic (bf16 products are exact in f32,
// accumulated pair by pair); the hardware flushes denormals, and tdpbf16ps on the 2-core AMX VM
// rounds its sums in an order of its own (docs/cpu-kernels.md, "The router on the tiles"), so
// the two agree bit for bit only where every sum is exact, as on small integers.
#pragma once

#include <string>
#include <vector>

#include "kernels/cpu/tile_kernel.h"

namespace moe::testing {

struct KernelSet {
  std::string name;
  cpu::ExpertKernels kernels;
  bool bf16_inputs = false;  // the kernels round their input rows to bf16
};

cpu::ExpertKernels emulated_avx512bf16_kernels();
cpu::ExpertKernels emulated_amx_kernels();
// Needs AVX2, FMA and F16C at run time.
cpu::ExpertKernels avx512_logic_on_avx2_kernels(DType weight_dtype);

// For `weight_dtype`: every supported path (by its name) and every emulation that applies.
std::vector<KernelSet> runnable_kernel_sets(DType weight_dtype);

}  // namespace moe::testing
