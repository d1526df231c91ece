// What the CPU and the operating system let the experts kernels use: cpuid for the instructions,
// xgetbv for the register state the OS saves on a context switch (a CPU with AVX-512 under an OS
// that does not save ZMM state cannot use it), and on Linux the per-process permission AMX needs
// before its first tile instruction. Detected once per process; tested by tests/kernels.
#pragma once

#include <string>

#include "moe/cpu_isa.h"

namespace moe::cpu {

struct CpuFeatures {
  bool amd = false;  // cpuid's vendor string is "AuthenticAMD"
  // Instructions, from cpuid.
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  // Register state the OS saves (XCR0), and AMX use granted by the kernel.
  bool os_avx = false;     // YMM
  bool os_avx512 = false;  // opmask and ZMM
  bool os_amx = false;     // XTILECFG and XTILEDATA
  bool amx_permitted = false;
  std::string amx_permission_error;  // why the request failed, when it did

  bool can_avx2() const { return avx2 && fma && f16c && os_avx; }
  bool can_avx512() const {
    return can_avx2() && avx512f && avx512bw && avx512vl && avx512dq && os_avx512;
  }
  bool can_avx512_bf16() const { return can_avx512() && avx512_bf16; }
  bool can_amx() const {
    return can_avx512_bf16() && amx_tile && amx_bf16 && os_amx && amx_permitted;
  }
};

// The path `auto` runs on a CPU with `features` whose most capable supported path is
// `most_capable`: that path, except that avx512bf16 gives way to avx512 on CPUs other than AMD's.
// There vdpbf16ps is no faster than the f32 FMAs (a Xeon with AVX512-BF16 and no AMX, call by
// call: avx512bf16 1.12x avx512's time at 64 tokens, 1.65x at 1024; the Sapphire Rapids host:
// 1.3-1.6x from 64 tokens on); on AMD's Zen 4 it does twice the FMAs' multiply-adds (0.41-0.47
// against 0.21-0.23 TFLOP/s on two cores) and avx512bf16 took 0.50-0.51x avx512's time at 4096
// tokens, 0.52x at 1024, 0.54-0.55x at 256 and 0.94-1.03x from 1 to 64 (docs/perf.md).
CpuIsa default_isa(CpuIsa most_capable, const CpuFeatures& features);

// Detects on the first call (and asks Linux for AMX permission when the CPU has AMX); later calls
// return the same answer.
const CpuFeatures& cpu_features();

}  // namespace moe::cpu
