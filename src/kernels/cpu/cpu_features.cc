#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace moe::cpu {

namespace {

// Linux: a process must ask before its first AMX instruction, so the kernel knows to save the
// 8 KiB of tile data on context switches (arch/x86/include/uapi/asm/prctl.h).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool bit(uint32_t value, int index) { return (value >> index) & 1u; }

uint64_t read_xcr0() {
  uint32_t low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (uint64_t{high} << 32) | low;
}

CpuFeatures detect() {
  CpuFeatures f;
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return f;
  char vendor[12];
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  f.amd = std::memcmp(vendor, "AuthenticAMD", sizeof vendor) == 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  f.fma = bit(ecx, 12);
  f.f16c = bit(ecx, 29);
  const bool osxsave = bit(ecx, 27);
  if (osxsave) {
    const uint64_t xcr0 = read_xcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;                   // SSE and AVX state
    f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000) == 0x60000;           // XTILECFG, XTILEDATA
  }
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    const uint32_t max_subleaf = eax;
    f.avx2 = bit(ebx, 5);
    f.avx512f = bit(ebx, 16);
    f.avx512dq = bit(ebx, 17);
    f.avx512bw = bit(ebx, 30);
    f.avx512vl = bit(ebx, 31);
    f.amx_bf16 = bit(edx, 22);
    f.amx_tile = bit(edx, 24);
    f.amx_int8 = bit(edx, 25);
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
      f.avx512_bf16 = bit(eax, 5);
    }
  }
  if (f.amx_tile && f.os_amx) {
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) {
      f.amx_permitted = true;
    } else {
      f.amx_permission_error = std::strerror(errno);
    }
  }
  return f;
}

}  // namespace

CpuIsa default_isa(CpuIsa most_capable, const CpuFeatures& features) {
  if (most_capable == CpuIsa::kAvx512Bf16 && !features.amd) return CpuIsa::kAvx512;
  return most_capable;
}

const CpuFeatures& cpu_features() {
  // A function-local static: initialized once, thread-safely, before any kernel can ask.
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace moe::cpu
