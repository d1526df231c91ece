// Transparent huge pages for the packed expert weights. Decode and prefill stream gigabytes of
// weights (1.2 GB per Qwen3-30B-A3B layer's experts): on 4 KiB pages that is a TLB miss and a
// page walk every 64 cache lines, and the L2 streamer prefetcher stops at every page boundary.
// Linux distributions commonly enable THP only for memory that asks (`enabled` = madvise), so
// the packed copy asks, before its first write, for the 2 MiB-aligned part of its range.
#pragma once

#include <cstdint>

namespace moe::cpu {

// Advises huge pages for the whole 2 MiB pages inside [data, data + bytes) when MOE_CPU_HUGEPAGES
// allows (cpu_tuning.h); a no-op elsewhere, and where the system refuses (the advice is a hint).
void advise_huge_pages(void* data, int64_t bytes);

}  // namespace moe::cpu
