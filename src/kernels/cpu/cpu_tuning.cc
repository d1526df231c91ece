#include "kernels/cpu/cpu_tuning.h"

#include <cerrno>
#include <cstdlib>

#include "kernels/cpu/packed_weights.h"
#include "moe/error.h"

namespace moe::cpu {

namespace {

// The variable's value as a non-negative integer, or `fallback` when unset or empty.
int64_t read_count(const char* name, int64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 0 || errno == ERANGE) {
    fail("{}: expected a non-negative integer; got '{}'", name, text);
  }
  return value;
}

}  // namespace

CpuTuning read_cpu_tuning() {
  CpuTuning t;
  t.k_block = read_count("MOE_CPU_KBLOCK", 0);
  if (t.k_block % kBf16KMultiple != 0) {
    fail(
        "MOE_CPU_KBLOCK: expected 0 (the default) or a multiple of {} (the AMX tile depth); got {}",
        kBf16KMultiple, t.k_block);
  }
  const int64_t prefetch = read_count("MOE_CPU_PREFETCH", -1);
  if (prefetch > 8) fail("MOE_CPU_PREFETCH: expected 0 to 8 k blocks; got {}", prefetch);
  if (prefetch >= 0) t.prefetch_blocks = prefetch;
  const int64_t huge = read_count("MOE_CPU_HUGEPAGES", 1);
  if (huge > 1) fail("MOE_CPU_HUGEPAGES: expected 0 or 1; got {}", huge);
  t.huge_pages = huge == 1;
  return t;
}

const CpuTuning& cpu_tuning() {
  static const CpuTuning tuning = read_cpu_tuning();
  return tuning;
}

}  // namespace moe::cpu
