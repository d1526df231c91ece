// The MOE_CPU_* knobs of cpu_tuning.h: defaults, accepted values, and the error for each malformed
// one (the variable's name and what it takes).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "kernels/cpu/cpu_tuning.h"

namespace moe::testing {
namespace {

// Sets one variable for the scope of a test and restores what it was.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(CpuTuning, DefaultsWhenUnset) {
  const ScopedEnv k("MOE_CPU_KBLOCK", nullptr), p("MOE_CPU_PREFETCH", nullptr),
      h("MOE_CPU_HUGEPAGES", "");
  const cpu::CpuTuning t = cpu::read_cpu_tuning();
  EXPECT_EQ(t.k_block, 0);
  EXPECT_FALSE(t.prefetch_blocks.has_value());  // each kernel's own
  EXPECT_TRUE(t.huge_pages);
}

TEST(CpuTuning, ReadsEachKnob) {
  const ScopedEnv k("MOE_CPU_KBLOCK", "1024"), p("MOE_CPU_PREFETCH", "0"),
      h("MOE_CPU_HUGEPAGES", "0");
  const cpu::CpuTuning t = cpu::read_cpu_tuning();
  EXPECT_EQ(t.k_block, 1024);
  EXPECT_EQ(t.prefetch_blocks, 0);
  EXPECT_FALSE(t.huge_pages);
}

TEST(CpuTuning, RejectsMalformedValues) {
  const struct {
    const char* name;
    const char* value;
    std::vector<std::string> message;
  } cases[] = {
      {"MOE_CPU_KBLOCK", "100", {"MOE_CPU_KBLOCK", "multiple of 32", "got 100"}},
      {"MOE_CPU_KBLOCK", "-32", {"MOE_CPU_KBLOCK", "non-negative integer", "'-32'"}},
      {"MOE_CPU_KBLOCK", "256k", {"MOE_CPU_KBLOCK", "non-negative integer", "'256k'"}},
      {"MOE_CPU_KBLOCK", "99999999999999999999", {"MOE_CPU_KBLOCK", "non-negative integer"}},
      {"MOE_CPU_PREFETCH", "9", {"MOE_CPU_PREFETCH", "0 to 8", "got 9"}},
      {"MOE_CPU_HUGEPAGES", "2", {"MOE_CPU_HUGEPAGES", "0 or 1", "got 2"}},
      {"MOE_CPU_HUGEPAGES", "yes", {"MOE_CPU_HUGEPAGES", "'yes'"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.name) + "=" + c.value);
    const ScopedEnv bad(c.name, c.value);
    expect_error([] { cpu::read_cpu_tuning(); }, c.message);
  }
}

}  // namespace
}  // namespace moe::testing
