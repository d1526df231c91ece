// The one dispatch from (path, weight dtype) to tile kernels and peak loops.
#include "kernels/cpu/tile_kernel.h"
#include "moe/error.h"

namespace moe::cpu {

ExpertKernels expert_kernels(CpuIsa isa, DType weight_dtype) {
  const bool bf16 = weight_dtype == DType::kBF16;
  switch (isa) {
    case CpuIsa::kPlain:
      return plain_expert_kernels(weight_dtype);
    case CpuIsa::kAvx2:
      return avx2_expert_kernels(weight_dtype);
    case CpuIsa::kAvx512:
      return avx512_expert_kernels(weight_dtype);
    case CpuIsa::kAvx512Bf16:
      return bf16 ? avx512bf16_expert_kernels() : avx512_expert_kernels(weight_dtype);
    case CpuIsa::kAmx:
      return bf16 ? amx_expert_kernels() : avx512_expert_kernels(weight_dtype);
    case CpuIsa::kAuto:
      break;
  }
  fail("expert kernels: unsupported cpu isa: {}", cpu_isa_name(isa));
}

PeakLoop peak_loop(CpuIsa isa, DType weight_dtype) {
  const bool bf16 = weight_dtype == DType::kBF16;
  switch (isa) {
    case CpuIsa::kPlain:
      return &plain_peak_loop;
    case CpuIsa::kAvx2:
      return &avx2_peak_loop;
    case CpuIsa::kAvx512:
      return &avx512_peak_loop;
    case CpuIsa::kAvx512Bf16:
      return bf16 ? &avx512bf16_peak_loop : &avx512_peak_loop;
    case CpuIsa::kAmx:
      return bf16 ? &amx_peak_loop : &avx512_peak_loop;
    case CpuIsa::kAuto:
      break;
  }
  fail("peak loop: unsupported cpu isa: {}", cpu_isa_name(isa));
}

}  // namespace moe::cpu
