// The public face of the CPU feature detection: path names, support with reasons, and the
// MOE_CPU_ISA override.
#include "moe/cpu_isa.h"

#include <cstdlib>

#include <fmt/format.h>

#include "kernels/cpu/cpu_features.h"
#include "moe/error.h"

namespace moe {

namespace {

constexpr CpuIsa kPaths[] = {CpuIsa::kPlain, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                             CpuIsa::kAmx};

std::string supported_list() {
  std::string names;
  for (CpuIsa isa : supported_cpu_isas()) {
    if (!names.empty()) names += ", ";
    names += cpu_isa_name(isa);
  }
  return names;
}

// The first missing item of `needed` (name, present) pairs, as "the CPU lacks ...".
std::string first_missing(std::initializer_list<std::pair<const char*, bool>> needed) {
  for (const auto& [name, present] : needed) {
    if (!present) return fmt::format("the CPU lacks {}", name);
  }
  return "";
}

}  // namespace

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kPlain:
      return "plain";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "unknown";
}

CpuIsa parse_cpu_isa(std::string_view name) {
  if (name == "auto") return CpuIsa::kAuto;
  for (CpuIsa isa : kPaths) {
    if (name == cpu_isa_name(isa)) return isa;
  }
  fail("cpu isa: expected one of auto, plain, avx2, avx512, avx512bf16, amx; got '{}'", name);
}

std::string cpu_isa_unsupported_reason(CpuIsa isa) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  std::string missing;
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kPlain:
      return "";
    case CpuIsa::kAmx:
      missing = first_missing({{"amx_tile", f.amx_tile}, {"amx_bf16", f.amx_bf16}});
      if (missing.empty() && !f.os_amx) missing = "the OS has not enabled the AMX tile state";
      if (missing.empty() && !f.amx_permitted) {
        missing = fmt::format("Linux refused AMX to this process (arch_prctl: {})",
                              f.amx_permission_error);
      }
      if (!missing.empty()) return missing;
      [[fallthrough]];
    case CpuIsa::kAvx512Bf16:
      missing = first_missing({{"avx512_bf16", f.avx512_bf16}});
      if (!missing.empty()) return missing;
      [[fallthrough]];
    case CpuIsa::kAvx512:
      missing = first_missing({{"avx512f", f.avx512f},
                               {"avx512bw", f.avx512bw},
                               {"avx512vl", f.avx512vl},
                               {"avx512dq", f.avx512dq}});
      if (missing.empty() && !f.os_avx512) missing = "the OS has not enabled the AVX-512 state";
      if (!missing.empty()) return missing;
      [[fallthrough]];
    case CpuIsa::kAvx2:
      missing = first_missing({{"avx2", f.avx2}, {"fma", f.fma}, {"f16c", f.f16c}});
      if (missing.empty() && !f.os_avx) missing = "the OS has not enabled the AVX state";
      return missing;
  }
  return fmt::format("unknown path {}", static_cast<int>(isa));
}

bool cpu_isa_supported(CpuIsa isa) { return cpu_isa_unsupported_reason(isa).empty(); }

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> paths;
  for (CpuIsa isa : kPaths) {
    if (cpu_isa_supported(isa)) paths.push_back(isa);
  }
  return paths;
}

CpuIsa best_cpu_isa() { return cpu::default_isa(supported_cpu_isas().back(), cpu::cpu_features()); }

CpuIsa resolve_cpu_isa(CpuIsa requested) {
  const char* source = "cpu isa";
  if (requested == CpuIsa::kAuto) {
    const char* forced = std::getenv("MOE_CPU_ISA");
    if (forced == nullptr || *forced == '\0') return best_cpu_isa();
    source = "MOE_CPU_ISA";
    try {
      requested = parse_cpu_isa(forced);
    } catch (const Error&) {
      fail("MOE_CPU_ISA: expected one of auto, plain, avx2, avx512, avx512bf16, amx; got '{}'",
           forced);
    }
    if (requested == CpuIsa::kAuto) return best_cpu_isa();
  }
  const std::string reason = cpu_isa_unsupported_reason(requested);
  if (!reason.empty()) {
    fail("{}: this machine cannot run the {} path ({}); supported here: {}", source,
         cpu_isa_name(requested), reason, supported_list());
  }
  return requested;
}

std::string cpu_feature_names() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  std::string names;
  // Like the Linux kernel's flags, a feature counts only when the OS saves its register state.
  const bool avx = f.os_avx, avx512 = f.os_avx512, amx = f.os_amx;
  const std::pair<const char*, bool> features[] = {{"avx2", avx && f.avx2},
                                                   {"fma", avx && f.fma},
                                                   {"f16c", avx && f.f16c},
                                                   {"avx512f", avx512 && f.avx512f},
                                                   {"avx512bw", avx512 && f.avx512bw},
                                                   {"avx512vl", avx512 && f.avx512vl},
                                                   {"avx512dq", avx512 && f.avx512dq},
                                                   {"avx512_bf16", avx512 && f.avx512_bf16},
                                                   {"amx_tile", amx && f.amx_tile},
                                                   {"amx_bf16", amx && f.amx_bf16},
                                                   {"amx_int8", amx && f.amx_int8}};
  for (const auto& [name, present] : features) {
    if (!present) continue;
    if (!names.empty()) names += ' ';
    names += name;
  }
  return names;
}

}  // namespace moe
