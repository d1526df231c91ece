// Which instruction set the CPU experts kernels use, chosen at run time from what the CPU and the
// operating system support.
//
//   amx          AMX-BF16 tiles (TDPBF16PS)
//   avx512bf16   AVX512-BF16 dot products (vdpbf16ps)
//   avx512       AVX-512F fused multiply-adds in f32
//   avx2         AVX2 + FMA fused multiply-adds in f32
//   plain        portable C++ loops
//
// The bf16 paths (amx, avx512bf16) round the GEMM inputs to bf16, as the hardware requires, and
// apply to bf16 weights; with f32 or f16 weights they run the avx512 kernels. Every path reads the
// same packed weights, so a layer packed once can be run on any path.
//
// The environment variable MOE_CPU_ISA (one of the names above) forces a path wherever the caller
// leaves the choice to the library (CpuIsa::kAuto), for testing and comparison.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moe {

// Ordered from the most portable to the most capable (each needs what the one before needs).
enum class CpuIsa : uint8_t { kAuto, kPlain, kAvx2, kAvx512, kAvx512Bf16, kAmx };

// "auto", "plain", "avx2", "avx512", "avx512bf16", "amx".
std::string_view cpu_isa_name(CpuIsa isa);
// Parses the names above; throws moe::Error naming the accepted ones.
CpuIsa parse_cpu_isa(std::string_view name);

// True when this CPU and OS can run `isa` (kAuto and kPlain always can).
bool cpu_isa_supported(CpuIsa isa);
// Empty when supported; otherwise what is missing ("the CPU lacks avx512_bf16", "the OS has not
// enabled the AMX tile state", ...).
std::string cpu_isa_unsupported_reason(CpuIsa isa);
// Every path this machine can run, from plain up to the most capable.
std::vector<CpuIsa> supported_cpu_isas();
// The path kAuto runs: the fastest supported one as measured, which is the most capable one
// except that a CPU with avx512bf16 but no amx runs avx512 unless it is AMD's (elsewhere its f32
// FMAs beat vdpbf16ps at prefill wherever both were measured; docs/cpu-kernels.md).
CpuIsa best_cpu_isa();

// The path a call with `requested` runs: `requested` itself, or for kAuto the path MOE_CPU_ISA
// names, or the fastest supported one. Throws moe::Error when the path is unknown or this machine
// cannot run it, naming what is missing and the supported paths.
CpuIsa resolve_cpu_isa(CpuIsa requested = CpuIsa::kAuto);

// The instruction-set features this machine can use, named as in /proc/cpuinfo ("avx2 fma f16c
// avx512f ..."): those the CPU reports and whose register state the OS saves.
std::string cpu_feature_names();

}  // namespace moe
