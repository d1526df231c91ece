// Feature detection and path choice: names, the MOE_CPU_ISA override and its errors, and the
// cpuid decoding checked against the flags the Linux kernel reports in /proc/cpuinfo.
#include "moe/cpu_isa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/expect_error.h"
#include "kernels/cpu/cpu_features.h"
#include "moe/error.h"
#include "moe/layer.h"

namespace moe::testing {
namespace {

constexpr CpuIsa kAllPaths[] = {CpuIsa::kPlain, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16,
                                CpuIsa::kAmx};

// Sets MOE_CPU_ISA for the lifetime of the object, then restores what was there.
class ScopedIsaEnv {
 public:
  explicit ScopedIsaEnv(const char* value) {
    if (const char* old = std::getenv("MOE_CPU_ISA")) saved_ = old, had_ = true;
    setenv("MOE_CPU_ISA", value, 1);
  }
  ~ScopedIsaEnv() {
    if (had_) {
      setenv("MOE_CPU_ISA", saved_.c_str(), 1);
    } else {
      unsetenv("MOE_CPU_ISA");
    }
  }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST(CpuIsa, NamesRoundTrip) {
  for (CpuIsa isa : kAllPaths) EXPECT_EQ(parse_cpu_isa(cpu_isa_name(isa)), isa);
  EXPECT_EQ(parse_cpu_isa("auto"), CpuIsa::kAuto);
  expect_error([] { parse_cpu_isa("avx9"); }, {"avx9", "avx512bf16"});
}

TEST(CpuIsa, SupportedPathsAreNestedAndReasoned) {
  const std::vector<CpuIsa> supported = supported_cpu_isas();
  ASSERT_FALSE(supported.empty());
  EXPECT_EQ(supported.front(), CpuIsa::kPlain);
  // The default is the most capable path, with avx512bf16 only on AMD's CPUs (DefaultPath).
  EXPECT_TRUE(cpu_isa_supported(best_cpu_isa()));
  EXPECT_EQ(best_cpu_isa(), cpu::default_isa(supported.back(), cpu::cpu_features()));
  // Each path needs everything the one before it needs.
  bool previous = true;
  for (CpuIsa isa : kAllPaths) {
    const bool ok = cpu_isa_supported(isa);
    EXPECT_TRUE(previous || !ok) << cpu_isa_name(isa) << " without the path below it";
    EXPECT_EQ(ok, cpu_isa_unsupported_reason(isa).empty()) << cpu_isa_name(isa);
    previous = ok;
  }
}

TEST(CpuIsa, EnvironmentForcesAPath) {
  {
    const ScopedIsaEnv env("plain");
    EXPECT_EQ(resolve_cpu_isa(), CpuIsa::kPlain);
    // An explicit request wins over the environment.
    EXPECT_EQ(resolve_cpu_isa(best_cpu_isa()), best_cpu_isa());
  }
  {
    const ScopedIsaEnv env("auto");
    EXPECT_EQ(resolve_cpu_isa(), best_cpu_isa());
  }
  {
    const ScopedIsaEnv env("avx9");
    expect_error([] { resolve_cpu_isa(); }, {"MOE_CPU_ISA", "avx9"});
  }
}

TEST(CpuIsa, UnsupportedPathIsAnErrorNamingWhatIsMissing) {
  for (CpuIsa isa : kAllPaths) {
    if (cpu_isa_supported(isa)) continue;
    const std::string reason = cpu_isa_unsupported_reason(isa);
    expect_error([&] { resolve_cpu_isa(isa); }, {std::string(cpu_isa_name(isa)), reason, "plain"});
    const ScopedIsaEnv env(std::string(cpu_isa_name(isa)).c_str());
    expect_error([] { resolve_cpu_isa(); }, {"MOE_CPU_ISA", reason});
    MoeConfig config = preset_config("qwen3-30b-a3b");
    config.experts.hidden_size = 16;
    config.experts.intermediate_size = 8;
    config.routing.num_experts = 4;
    config.routing.top_k = 2;
    const LayerWeights weights = synthetic_layer_weights(config, DType::kF32, 1);
    expect_error([&] { MoeLayer layer(config, weights); }, {"MOE_CPU_ISA", reason});
  }
}

TEST(CpuIsa, DefaultPath) {
  cpu::CpuFeatures intel, amd;
  amd.amd = true;
  for (CpuIsa isa : kAllPaths) {
    const CpuIsa expected_elsewhere = isa == CpuIsa::kAvx512Bf16 ? CpuIsa::kAvx512 : isa;
    EXPECT_EQ(cpu::default_isa(isa, intel), expected_elsewhere) << cpu_isa_name(isa);
    EXPECT_EQ(cpu::default_isa(isa, amd), isa) << cpu_isa_name(isa);
  }
}

TEST(CpuIsa, FeaturesMatchTheKernelsCpuinfoFlags) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, vendor;
  std::set<std::string> flags;
  while (std::getline(cpuinfo, line)) {
    const std::string value = line.substr(line.find(':') + 1);
    if (line.rfind("vendor_id", 0) == 0) std::istringstream(value) >> vendor;
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(value);
    for (std::string word; words >> word;) flags.insert(word);
    break;
  }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags on this system";
  EXPECT_EQ(cpu::cpu_features().amd, vendor == "AuthenticAMD") << "vendor_id " << vendor;
  std::set<std::string> ours;
  std::istringstream names(cpu_feature_names());
  for (std::string name; names >> name;) ours.insert(name);
  for (const char* name : {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                           "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}) {
    EXPECT_EQ(ours.count(name), flags.count(name)) << name << ": cpuid and /proc/cpuinfo differ";
  }
}

}  // namespace
}  // namespace moe::testing
