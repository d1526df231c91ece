// `moe cpu`: what this CPU and OS support, path by path, with the reason a path is out of reach,
// and the path the CPU backend would pick (MOE_CPU_ISA, else the fastest).
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moe/cpu_isa.h"
#include "moe/error.h"
#include "tools/moe/commands.h"

namespace moe::cli {

namespace {

constexpr CpuIsa kPaths[] = {CpuIsa::kAmx, CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2,
                             CpuIsa::kPlain};

struct CpuOptions {
  bool json = false;
  bool supported = false;
};

// The path kAuto resolves to, or the reason it cannot (a bad MOE_CPU_ISA).
std::string auto_path() {
  try {
    return std::string(cpu_isa_name(resolve_cpu_isa()));
  } catch (const Error& e) {
    return fmt::format("none: {}", e.what());
  }
}

void cpu(const CpuOptions& o) {
  if (o.supported) {
    std::string names;
    for (CpuIsa isa : kPaths) {
      if (!cpu_isa_supported(isa)) continue;
      if (!names.empty()) names += ' ';
      names += cpu_isa_name(isa);
    }
    fmt::print("{}\n", names);
    return;
  }
  if (o.json) {
    nlohmann::json paths = nlohmann::json::array();
    for (CpuIsa isa : kPaths) {
      paths.push_back({{"isa", cpu_isa_name(isa)},
                       {"supported", cpu_isa_supported(isa)},
                       {"reason", cpu_isa_unsupported_reason(isa)}});
    }
    const nlohmann::json result = {
        {"features", cpu_feature_names()}, {"paths", paths}, {"auto", auto_path()}};
    fmt::print("{}\n", result.dump(2));
    return;
  }
  fmt::print("cpu features: {}\n\n", cpu_feature_names());
  for (CpuIsa isa : kPaths) {
    const std::string reason = cpu_isa_unsupported_reason(isa);
    fmt::print("  {:<11} {}\n", cpu_isa_name(isa), reason.empty() ? "yes" : "no: " + reason);
  }
  fmt::print("\nthe cpu backend runs: {}\n", auto_path());
}

}  // namespace

void add_cpu_command(CLI::App& app) {
  auto options = std::make_shared<CpuOptions>();
  CLI::App* cmd = app.add_subcommand(
      "cpu",
      "The CPU experts paths this machine supports (amx, avx512bf16, avx512, avx2, plain), why "
      "the others are not, and the one the cpu backend picks");
  CLI::Option* json = cmd->add_flag("--json", options->json, "Print one JSON object");
  cmd->add_flag("--supported", options->supported,
                "Print only the supported paths' names, fastest first, space separated")
      ->excludes(json);
  cmd->callback([options] { cpu(*options); });
}

}  // namespace moe::cli
