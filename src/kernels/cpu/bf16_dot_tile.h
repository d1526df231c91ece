// The bf16 dot-product tile kernel (vdpbf16ps), written once over a small set of vector operations
// `Ops` so that its loop and addressing run on any machine: avx512bf16_tile_kernels.cc
// instantiates it with the AVX512-BF16 intrinsics, tests/kernels with a scalar emulation of them.
//
// Per k pair kk, each panel is one 64-byte group of the packed bf16 weights (16 columns x the
// pair w[c, 2kk], w[c, 2kk + 1]: packed_weights.h); each row broadcasts its own pair
// (a[r, 2kk], a[r, 2kk + 1]) as one dword, and one dot-product instruction adds both products
// into 16 f32 accumulators. Rows are bf16 and zero past k.
//
// Ops provides:
//   Acc, Weights, Pair             register types
//   zero(Acc*)                     Acc = 0
//   load_acc(const float* in, Acc*)  16 floats
//   load(const void*, Weights*)    64 bytes of packed weights
//   broadcast(const uint16_t* a, Pair*)   the bf16 pair a[0], a[1] in every dword
//   dot(Acc*, const Pair&, const Weights&)  Acc[c] += a0 * w[c].0 + a1 * w[c].1
//   store(const Acc&, float* out)  16 floats
//
// NOTE: internal linkage on purpose, as in fma_tile.h: each includer compiles its own copy.
#pragma once

#include <cstdint>

#include "kernels/cpu/ahead_lines.h"
#include "kernels/cpu/epilogue_rows.h"
#include "kernels/cpu/tile_kernel.h"

namespace moe::cpu {
namespace {

constexpr int64_t kDotStepBytes = 64;
constexpr int64_t kDotPrefetchSteps = 16;
// 8 rows x both panels = 16 ZMM accumulators, beside two weight registers and one broadcast.
constexpr int kBf16DotMaxRows = 8;
// About 0.6 TFLOP/s of bf16 dot products against 25 GB/s of DRAM reads on two cores.
constexpr double kBf16DotFlopsPerByte = 24;

template <typename Ops, int kRows>
void bf16_dot_pair(const TileArgs& t) {
  AheadLines<true> ahead(t, 2);
  const uint16_t* a = static_cast<const uint16_t*>(t.a);
  const char* panel0 = static_cast<const char*>(t.pair);
  const char* panel1 = panel0 + t.panel_bytes;
  typename Ops::Acc acc[kRows][2];
  for (int r = 0; r < kRows; ++r) {
    for (int half = 0; half < 2; ++half) {
      if (t.accumulate) {
        Ops::load_acc(t.acc + r * kPairWidth + half * kPanelWidth, &acc[r][half]);
      } else {
        Ops::zero(&acc[r][half]);
      }
    }
  }
  for (int64_t kk = t.k_begin / 2; kk < t.k_end / 2; ++kk) {
    ahead.step();
    __builtin_prefetch(panel0 + (kk + kDotPrefetchSteps) * kDotStepBytes);
    __builtin_prefetch(panel1 + (kk + kDotPrefetchSteps) * kDotStepBytes);
    typename Ops::Weights w0, w1;
    Ops::load(panel0 + kk * kDotStepBytes, &w0);
    Ops::load(panel1 + kk * kDotStepBytes, &w1);
    for (int r = 0; r < kRows; ++r) {
      typename Ops::Pair pair;
      Ops::broadcast(a + r * t.a_stride + 2 * kk, &pair);
      Ops::dot(&acc[r][0], pair, w0);
      Ops::dot(&acc[r][1], pair, w1);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    Ops::store(acc[r][0], t.acc + r * kPairWidth);
    Ops::store(acc[r][1], t.acc + r * kPairWidth + kPanelWidth);
  }
}

template <typename Ops, int kRows>
void bf16_dot_rows(const TileArgs& t) {
  if constexpr (kRows > 1) {
    if (t.rows < kRows) return bf16_dot_rows<Ops, kRows - 1>(t);
  }
  bf16_dot_pair<Ops, kRows>(t);
}

// The avx512bf16 path's kernel set (bf16 weights).
template <typename Ops>
ExpertKernels bf16_dot_expert_kernels() {
  TileKernel kernel;
  kernel.a_dtype = DType::kBF16;
  kernel.max_rows = kBf16DotMaxRows;
  // Every chunk brings the next k block into L2 spread over the steps. Call by call against this
  // kernel without it on AMD's Zen 4, Qwen3-30B-A3B (docs/perf.md): in decode chunks, as the avx512
  // kernel's do (fma_tile.h), 0.67-0.95 of its time at 64 tokens in all eight processes, at 1 to
  // 16 tokens medians 0.89-0.93 but 0.62-1.32 from process to process. In longer chunks too, unlike
  // the avx512 kernel (2.5% more time at 256 tokens on a Xeon, where its FMAs set the pace; here
  // the dot products run at twice the FMAs' rate, and memory sets it): 0.76-0.81 of its time at
  // 256 tokens, 0.91-0.95 at 1024, 0.97-0.99 at 4096 in six processes; two and three blocks ahead
  // did no better. (Chunks of three row blocks or more have since taken the whole of k, their
  // block ahead being the next pair: tile_kernel.h.)
  kernel.spreads_prefetch = true;
  kernel.prefetch_blocks = 1;
  kernel.prefill_prefetch_blocks = 1;
  kernel.whole_k_from_row_blocks = 3;
  kernel.run = &bf16_dot_rows<Ops, kBf16DotMaxRows>;
  ExpertKernels kernels;
  kernels.tile = kernel;
  kernels.flops_per_byte = kBf16DotFlopsPerByte;
  kernels.silu_rows = &silu_rows<16>;
  kernels.scale_rows = &scale_rows<16>;
  return kernels;
}

}  // namespace
}  // namespace moe::cpu
