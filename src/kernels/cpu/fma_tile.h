// The f32 fused-multiply-add tile kernel, written once with GCC vector extensions and compiled
// once per instruction set: avx2_tile_kernels.cc (8 lanes) and avx512_tile_kernels.cc (16 lanes)
// include this file after their `#pragma GCC target`, and tests/kernels compiles the 16-lane
// variant for AVX2 so the AVX-512 kernel's logic runs on machines without AVX-512.
//
// Per step along k, each 16-column panel is one 64-byte group of the packed weights
// (packed_weights.h), read once for all rows of the block:
//   bf16: 16 dwords holding (w[c, 2kk], w[c, 2kk + 1]); `bits << 16` is w[., 2kk] in f32 and
//         `bits & 0xffff0000` is w[., 2kk + 1], exactly (bf16 is the top half of an f32)
//   f32:  16 floats of w[., k];  f16: 16 halves widened by the includer's F16 loader
// and every row does acc[r, c] += a[r, k] * w[c, k] in ascending k, one rounding per step: the
// includer's Madd (its target's FMA intrinsic), never the compiler's choice. Under
// -ffp-contract=fast GCC may fuse the multiply-adds of some instantiations and not others (the
// router's kernels showed it, router_tile.h), and then a row's result would depend on the size
// of the block it was computed in.
//
// NOTE: everything here has internal linkage (an unnamed namespace in a header) on purpose. Each
// includer compiles its own copy for its own target; a shared inline definition would let the
// linker pick the AVX-512 copy for the AVX2 path. The includer must include every header this one
// needs before its `#pragma GCC target`, so no library code is compiled for that target.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/ahead_lines.h"
#include "kernels/cpu/tile_kernel.h"

namespace moe::cpu {
namespace {

// Bytes of one panel's 16 columns at one step along k (one k pair for bf16).
constexpr int64_t kPanelStepBytes = 64;
// How far ahead of the current step the weight stream is prefetched: 32 steps (2 KiB of each
// panel), enough to cover DRAM latency when decode streams weights at full bandwidth. Against 16,
// call by call on an AVX-512 Xeon with bf16 weights (docs/perf.md): avx2 5-9% less time at 1 to
// 256 tokens of Qwen3-30B-A3B, avx512 0-5%; none at all cost 16-40%.
constexpr int64_t kPrefetchSteps = 32;

template <int kLanes>
struct FmaVectors {
  typedef float Floats __attribute__((vector_size(kLanes * sizeof(float))));
  typedef uint32_t Bits __attribute__((vector_size(kLanes * sizeof(uint32_t))));
};

// acc[r][v]: rows r of the block, vector v of the kPanels * 16 columns computed in this call:
// zero, or the sums so far when the call continues earlier k ranges.
template <int kLanes, int kRows, int kPanels>
void load_accumulators(
    typename FmaVectors<kLanes>::Floats (&acc)[kRows][kPanels * kPanelWidth / kLanes],
    const TileArgs& t, int first_panel) {
  constexpr int kVectorsPerPanel = kPanelWidth / kLanes;
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kPanels * kVectorsPerPanel; ++v) {
      if (t.accumulate) {
        std::memcpy(&acc[r][v], t.acc + r * kPairWidth + first_panel * kPanelWidth + v * kLanes,
                    sizeof acc[r][v]);
      } else {
        acc[r][v] = typename FmaVectors<kLanes>::Floats{};
      }
    }
  }
}

template <int kLanes, int kRows, int kPanels>
void store_accumulators(
    const typename FmaVectors<kLanes>::Floats (&acc)[kRows][kPanels * kPanelWidth / kLanes],
    int first_panel, float* out) {
  constexpr int kVectorsPerPanel = kPanelWidth / kLanes;
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kPanels * kVectorsPerPanel; ++v) {
      std::memcpy(out + r * kPairWidth + first_panel * kPanelWidth + v * kLanes, &acc[r][v],
                  sizeof acc[r][v]);
    }
  }
}

// Up to kRowsByOffset rows, a kernel reads row r's inputs at a[r * a_stride + k]. Beyond, GCC ran
// out of general registers for the rows' offsets and reloaded them from the stack at every step
// (the 12-row bf16 loop: 22 reloads, 134 instructions per k pair for its 48 multiply-adds), so
// larger blocks read them through GroupedRows: four rows from each base, at base + {0, 1, 2}
// strides or base + three strides, in five registers (109 instructions). Call by call on an
// AVX-512 Xeon, bf16 weights (docs/perf.md): 1.8-3.3% less time at 1024 tokens of Qwen3-30B-A3B in
// four runs of five, 2.5-5.6% at 4096 in two of three, 1.3-2.5% at 256. The avx2 path's blocks of
// at most 6 rows keep their offsets (grouped, its 6-row kernel was 2% slower at 1024 tokens).
constexpr int kRowsByOffset = 8;

// Up to kRowsByOffset rows: nothing to hold.
template <int kRows, bool kUsed = (kRows > kRowsByOffset)>
class GroupedRows {
 public:
  explicit GroupedRows(const TileArgs&) {}
};

template <int kRows>
class GroupedRows<kRows, true> {
 public:
  explicit GroupedRows(const TileArgs& t)
      : stride_(t.a_stride * static_cast<int64_t>(sizeof(float))), stride3_(3 * stride_) {
    for (int g = 0; g < kGroups; ++g) {
      base_[g] = static_cast<const char*>(t.a) + 4 * g * stride_;
    }
  }
  // a[r * a_stride + k]
  float at(int r, int64_t k) const {
    const char* p = base_[r / 4] + k * static_cast<int64_t>(sizeof(float));
    if (r % 4 == 1) p += stride_;
    if (r % 4 == 2) p += 2 * stride_;
    if (r % 4 == 3) p += stride3_;
    float x;
    std::memcpy(&x, p, sizeof x);
    return x;
  }

 private:
  static constexpr int kGroups = (kRows + 3) / 4;
  const char* base_[kGroups];
  int64_t stride_, stride3_;
};

// Panels first_panel .. first_panel + kPanels - 1 of the pair, bf16 weights, f32 rows.
// Madd::madd(acc, x, w): acc = acc + x * w with one rounding. kSpread: the kernel brings
// TileArgs::ahead into L2 over its steps (TileKernel::spreads_prefetch).
template <int kLanes, int kRows, int kPanels, bool kSpread, typename Madd>
void fma_tile_bf16(const TileArgs& t, int first_panel) {
  using Floats = typename FmaVectors<kLanes>::Floats;
  using Bits = typename FmaVectors<kLanes>::Bits;
  constexpr int kVectorsPerPanel = kPanelWidth / kLanes;
  const float* a = static_cast<const float*>(t.a);
  const GroupedRows<kRows> grouped(t);  // past kRowsByOffset rows
  const char* panels = static_cast<const char*>(t.pair) + first_panel * t.panel_bytes;
  Floats acc[kRows][kPanels * kVectorsPerPanel];
  load_accumulators<kLanes, kRows, kPanels>(acc, t, first_panel);
  constexpr int kVectors = kPanels * kVectorsPerPanel;
  AheadLines<kSpread> ahead(t, 2);
  for (int64_t kk = t.k_begin / 2; kk < t.k_end / 2; ++kk) {
    ahead.step();
    // Even k for every row, then odd k: only one set of widened weights is live at a time, so
    // the accumulators, those weights and one broadcast fit the register file.
    Bits bits[kVectors];
    for (int p = 0; p < kPanels; ++p) {
      const char* step = panels + p * t.panel_bytes + kk * kPanelStepBytes;
      __builtin_prefetch(step + kPrefetchSteps * kPanelStepBytes);
      for (int v = 0; v < kVectorsPerPanel; ++v) {
        std::memcpy(&bits[p * kVectorsPerPanel + v], step + v * kLanes * sizeof(uint32_t),
                    sizeof bits[0]);
      }
    }
    for (int half = 0; half < 2; ++half) {
      Floats w[kVectors];
      for (int v = 0; v < kVectors; ++v) {
        const Bits widened = half == 0 ? bits[v] << 16 : bits[v] & 0xffff0000u;
        std::memcpy(&w[v], &widened, sizeof w[v]);
      }
      for (int r = 0; r < kRows; ++r) {
        float x;
        if constexpr (kRows > kRowsByOffset) {
          x = grouped.at(r, 2 * kk + half);
        } else {
          x = a[r * t.a_stride + 2 * kk + half];
        }
        for (int v = 0; v < kVectors; ++v) Madd::madd(acc[r][v], x, w[v]);
      }
    }
  }
  store_accumulators<kLanes, kRows, kPanels>(acc, first_panel, t.acc);
}

// The same for k-major f32 or f16 panels; Load::load(src, dst) widens kLanes weights to f32.
template <int kLanes, int kRows, int kPanels, bool kSpread, typename Load, typename Madd>
void fma_tile_kmajor(const TileArgs& t, int first_panel) {
  using Floats = typename FmaVectors<kLanes>::Floats;
  constexpr int kVectorsPerPanel = kPanelWidth / kLanes;
  constexpr int64_t kStepBytes = kPanelWidth * Load::kBytes;
  const float* a = static_cast<const float*>(t.a);
  const GroupedRows<kRows> grouped(t);  // past kRowsByOffset rows
  const char* panels = static_cast<const char*>(t.pair) + first_panel * t.panel_bytes;
  Floats acc[kRows][kPanels * kVectorsPerPanel];
  load_accumulators<kLanes, kRows, kPanels>(acc, t, first_panel);
  constexpr int kVectors = kPanels * kVectorsPerPanel;
  AheadLines<kSpread> ahead(t, 1);
  for (int64_t k = t.k_begin; k < t.k_end; ++k) {
    ahead.step();
    Floats w[kVectors];
    for (int p = 0; p < kPanels; ++p) {
      const char* step = panels + p * t.panel_bytes + k * kStepBytes;
      __builtin_prefetch(step + kPrefetchSteps * kPanelStepBytes);
      for (int v = 0; v < kVectorsPerPanel; ++v) {
        Load::load(step + v * kLanes * Load::kBytes, &w[p * kVectorsPerPanel + v]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      float x;
      if constexpr (kRows > kRowsByOffset) {
        x = grouped.at(r, k);
      } else {
        x = a[r * t.a_stride + k];
      }
      for (int v = 0; v < kVectors; ++v) Madd::madd(acc[r][v], x, w[v]);
    }
  }
  store_accumulators<kLanes, kRows, kPanels>(acc, first_panel, t.acc);
}

template <int kLanes>
struct F32Load {
  static constexpr int64_t kBytes = 4;
  static void load(const void* src, typename FmaVectors<kLanes>::Floats* dst) {
    std::memcpy(dst, src, sizeof *dst);
  }
};

// Whole-pair kernels for a block of exactly kRows rows: both panels, kPanels at a time.
// Weights: 0 = bf16, 1 = f32, 2 = f16 (through F16Load).
template <int kLanes, int kRows, int kPanels, bool kSpread, int kWeights, typename F16Load,
          typename Madd>
void fma_pair(const TileArgs& t) {
  for (int first = 0; first < 2; first += kPanels) {
    if constexpr (kWeights == 0) {
      fma_tile_bf16<kLanes, kRows, kPanels, kSpread, Madd>(t, first);
    } else if constexpr (kWeights == 1) {
      fma_tile_kmajor<kLanes, kRows, kPanels, kSpread, F32Load<kLanes>, Madd>(t, first);
    } else {
      fma_tile_kmajor<kLanes, kRows, kPanels, kSpread, F16Load, Madd>(t, first);
    }
  }
}

// Dispatches t.rows (1..kRows) to the kernel compiled for exactly that many rows.
template <int kLanes, int kRows, int kPanels, bool kSpread, int kWeights, typename F16Load,
          typename Madd>
void fma_rows(const TileArgs& t) {
  if constexpr (kRows > 1) {
    if (t.rows < kRows) {
      return fma_rows<kLanes, kRows - 1, kPanels, kSpread, kWeights, F16Load, Madd>(t);
    }
  }
  fma_pair<kLanes, kRows, kPanels, kSpread, kWeights, F16Load, Madd>(t);
}

// The register blocking of each FMA path: kMaxRows rows by kPanels panels per call of the
// innermost loop, and its compute-to-bandwidth balance (ExpertKernels::flops_per_byte).
struct Avx2FmaShape {
  // 6 rows x one panel (two 8-lane vectors) = 12 accumulators in the 16 YMM registers, beside
  // the weights and the broadcast input.
  static constexpr int kLanes = 8;
  static constexpr int kMaxRows = 6;
  static constexpr int kPanels = 1;
  // About 150 GFLOP/s of f32 FMA against 20 GB/s of DRAM reads on two cores.
  static constexpr double kFlopsPerByte = 8;
  // Decode chunks prefetch no later block: on an AVX-512 Xeon, call by call, the next block
  // spread over the steps cost this path 9-16% at 1 to 64 tokens (docs/perf.md); at one row its
  // multiply-adds, not memory, set the pace.
  static constexpr bool kSpreadsPrefetch = false;
};

struct Avx512FmaShape {
  // 12 rows x both panels (one 16-lane vector each) = 24 accumulators in the 32 ZMM registers,
  // beside the two raw and two widened weight vectors. Each widening (a shift or a mask) then
  // serves 12 multiply-adds instead of 8: call by call against 8 rows on an AVX-512 Xeon, bf16
  // weights (docs/perf.md), 5-11% less time at 256 tokens of Qwen3-30B-A3B, 4% at 1024, 3% at
  // 4096, equal at 16 and 64; 10 rows gained less, 14 lost up to 19%.
  static constexpr int kLanes = 16;
  static constexpr int kMaxRows = 12;
  static constexpr int kPanels = 2;
  // About 300 GFLOP/s of f32 FMA against 25 GB/s of DRAM reads on two cores.
  static constexpr double kFlopsPerByte = 12;
  // Decode chunks (one row block) bring the next k block into L2 spread over the steps of the
  // current one; chunks of several row blocks do not. Call by call on an AVX-512 Xeon, bf16
  // weights (docs/perf.md): 4-7% less time at 1 token of Qwen3-30B-A3B, 5% at 4, 2-5% at 16,
  // within 2% either way from 64 to 1024; in every chunk it cost 2.5% at 256 tokens.
  static constexpr bool kSpreadsPrefetch = true;
};

// The kernel set of the FMA path with blocking `Shape`, f16 widening F16Load and multiply-add
// Madd (both the includer's, for its target).
template <typename Shape, typename F16Load, typename Madd>
ExpertKernels fma_expert_kernels(DType weight_dtype) {
  constexpr int kLanes = Shape::kLanes, kMaxRows = Shape::kMaxRows, kPanels = Shape::kPanels;
  constexpr bool kSpread = Shape::kSpreadsPrefetch;
  TileKernel kernel;
  kernel.a_dtype = DType::kF32;
  kernel.max_rows = kMaxRows;
  kernel.spreads_prefetch = kSpread;
  kernel.prefetch_blocks = kSpread ? 1 : 0;
  kernel.run = weight_dtype == DType::kBF16
                   ? &fma_rows<kLanes, kMaxRows, kPanels, kSpread, 0, F16Load, Madd>
               : weight_dtype == DType::kF32
                   ? &fma_rows<kLanes, kMaxRows, kPanels, kSpread, 1, F16Load, Madd>
                   : &fma_rows<kLanes, kMaxRows, kPanels, kSpread, 2, F16Load, Madd>;
  ExpertKernels kernels;
  kernels.tile = kernel;
  kernels.flops_per_byte = Shape::kFlopsPerByte;
  return kernels;
}

// kChains independent accumulators, each a dependent chain of multiply-adds: enough chains to
// cover the FMA latency on every port.
template <int kLanes>
double fma_peak_loop(int64_t iterations) {
  using Floats = typename FmaVectors<kLanes>::Floats;
  constexpr int kChains = 12;
  Floats acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = Floats{} + 1.0f + 0.001f * static_cast<float>(c);
  const Floats scale = Floats{} + 0.999999f, shift = Floats{} + 1e-7f;
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * scale + shift;
  }
  float sum = 0;
  for (int c = 0; c < kChains; ++c) sum += acc[c][0];
  // Keeps the chains alive: the loop's result is observed.
  volatile float sink = sum;
  (void)sink;
  return 2.0 * kLanes * kChains * static_cast<double>(iterations);
}

}  // namespace
}  // namespace moe::cpu
