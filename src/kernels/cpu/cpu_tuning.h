// Knobs of the CPU experts kernels read from the environment once per process, so that one build
// compares variants on one machine (`scripts/cpu-amx-variants` sweeps them):
//   MOE_CPU_KBLOCK     k values per block of a panel pair (a positive multiple of 32), in every
//                      chunk; unset or 0: the default, 16 KiB of a pair (256 k for bf16), and
//                      the whole of k in chunks of at most TileKernel::whole_k_row_blocks row
//                      blocks (amx: 2) and of at least whole_k_from_row_blocks (avx512bf16: 3).
//                      The sums carry exactly from one block to the next, so the block changes
//                      speed, never results.
//   MOE_CPU_PREFETCH   how many k blocks ahead of the one being multiplied are prefetched into L2
//                      (0..8; default: the kernel's, TileKernel::prefetch_blocks in short chunks
//                      and prefill_prefetch_blocks in longer ones: 1 and 2 for the amx kernel,
//                      whose short chunks' block is the whole of k, so 1 is the next pair; 1 and
//                      0 for avx512; 1 and 1 for avx512bf16; 0, left to the hardware prefetcher,
//                      for the others). More keeps more of the weight stream in flight while
//                      the tiles compute and the epilogue runs.
//   MOE_CPU_HUGEPAGES  1 (default): ask the kernel to back packed weights with transparent huge
//                      pages; 0: ordinary pages.
// A malformed value is a moe::Error naming the variable and what it takes.
#pragma once

#include <cstdint>
#include <optional>

namespace moe::cpu {

struct CpuTuning {
  int64_t k_block = 0;                     // 0: the default
  std::optional<int64_t> prefetch_blocks;  // unset: the kernel's own
  bool huge_pages = true;
};

// The process's knobs: read_cpu_tuning()'s result on the first call, kept from then on.
const CpuTuning& cpu_tuning();

// Reads the variables now (for tests; the kernels use cpu_tuning()).
CpuTuning read_cpu_tuning();

}  // namespace moe::cpu
