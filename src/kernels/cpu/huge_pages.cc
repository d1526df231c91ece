#include "kernels/cpu/huge_pages.h"

#include <sys/mman.h>

#include "kernels/cpu/cpu_tuning.h"

namespace moe::cpu {

void advise_huge_pages(void* data, int64_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  if (!cpu_tuning().huge_pages) return;
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) & ~(kHugePage - 1);
  if (last <= first) return;
  // A refusal (THP disabled, an old kernel) leaves ordinary pages: nothing to report.
  madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace moe::cpu
