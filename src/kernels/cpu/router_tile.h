// The router tile kernel (router_kernel.h), written once with GCC vector extensions and compiled
// once per instruction set: plain_router_kernels.cc (the library's own target),
// avx2_router_kernels.cc and avx512_router_kernels.cc (after their `#pragma GCC target`); the
// tests compile the avx512 shape for AVX2 so its logic runs on machines without AVX-512.
//
// A call holds kRows rows x kPanels panels of kWidth experts in registers. Per step along h it
// loads each panel's weights once and broadcasts each row's x[r, h] once:
//   Madd::madd(acc[r][p], x[r, h], panel p [h]): acc += x * w per lane
// so kRows * kPanels * kWidth / kLanes multiply-adds per kRows + kPanels * kWidth / kLanes loads.
// The includer's Madd says how a multiply-add rounds: with an FMA intrinsic on avx2 and avx512,
// never by the compiler's choice (-ffp-contract=fast fuses some multiply-adds of a function and
// not others, and then a logit would depend on the tile its token fell in).
//
// NOTE: everything here has internal linkage (an unnamed namespace in a header) on purpose. Each
// includer compiles its own copy for its own target; a shared inline definition would let the
// linker pick the AVX-512 copy for the AVX2 path. The includer must include every header this one
// needs before its `#pragma GCC target`, so no library code is compiled for that target.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/router_kernel.h"

namespace moe::cpu {
namespace {

template <int kLanes>
struct RouterVectors {
  typedef float Floats __attribute__((vector_size(kLanes * sizeof(float))));
};

// Rows 0..kRows-1 of the call times panels first .. first + kPanels - 1, of kWidth experts each.
template <typename Madd, int kLanes, int kWidth, int kRows, int kPanels>
void router_tile(const RouterTileArgs& t, int64_t first) {
  using Floats = typename RouterVectors<kLanes>::Floats;
  constexpr int kVectorsPerPanel = kWidth / kLanes;
  constexpr int kVectors = kPanels * kVectorsPerPanel;
  Floats acc[kRows][kVectors];
  float* const out = t.acc + first * kWidth;
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) {
      if (t.accumulate) {
        std::memcpy(&acc[r][v], out + r * t.acc_stride + v * kLanes, sizeof acc[r][v]);
      } else {
        acc[r][v] = Floats{};
      }
    }
  }
  const float* const w = t.panels + first * t.panel_stride;
  for (int64_t s = 0; s < t.steps; ++s) {
    Floats wv[kVectors];
    for (int p = 0; p < kPanels; ++p) {
      for (int v = 0; v < kVectorsPerPanel; ++v) {
        std::memcpy(&wv[p * kVectorsPerPanel + v], w + p * t.panel_stride + s * kWidth + v * kLanes,
                    sizeof wv[0]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const float x = t.x[r * t.x_stride + s];
      for (int v = 0; v < kVectors; ++v) Madd::madd(acc[r][v], x, wv[v]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVectors; ++v) {
      std::memcpy(out + r * t.acc_stride + v * kLanes, &acc[r][v], sizeof acc[r][v]);
    }
  }
}

// Independent accumulators that keep the multiply-add pipes busy: two pipes of 4 cycles' latency.
constexpr int kMinAccumulators = 8;

// Dispatches t.rows (1..kRows) to the tile compiled for exactly that many rows. Panels go
// kPanels at a time, or more for few rows (decode), so that a call has kMinAccumulators chains;
// then one at a time.
template <typename Madd, int kLanes, int kWidth, int kRows, int kPanels>
void router_rows(const RouterTileArgs& t) {
  if constexpr (kRows > 1) {
    if (t.rows < kRows) return router_rows<Madd, kLanes, kWidth, kRows - 1, kPanels>(t);
  }
  constexpr int kPanelsPerCall = std::max(kPanels, kMinAccumulators * kLanes / (kRows * kWidth));
  int64_t p = 0;
  for (; p + kPanelsPerCall <= t.num_panels; p += kPanelsPerCall) {
    router_tile<Madd, kLanes, kWidth, kRows, kPanelsPerCall>(t, p);
  }
  if constexpr (kPanelsPerCall > 1) {
    for (; p < t.num_panels; ++p) router_tile<Madd, kLanes, kWidth, kRows, 1>(t, p);
  }
}

// panel[s * width + c] = rows[c * row_stride + s] for s < steps, c < width (a multiple of 8):
// blocks of 8 experts x 8 steps transposed in registers (the classic unpack, shuffle, swap-halves
// sequence), the last steps % 8 one at a time.
void router_transpose(const float* rows, int64_t row_stride, int64_t steps, int64_t width,
                      float* panel) {
  using Floats = RouterVectors<8>::Floats;
  typedef int32_t Mask __attribute__((vector_size(8 * sizeof(int32_t))));
  const int64_t whole = steps / 8 * 8;
  for (int64_t c0 = 0; c0 < width; c0 += 8) {
    for (int64_t s0 = 0; s0 < whole; s0 += 8) {
      Floats r[8], t[8], u[8];
      const float* block = rows + c0 * row_stride + s0;
      std::memcpy(&r[0], block, sizeof r[0]);
      std::memcpy(&r[1], block + row_stride, sizeof r[1]);
      std::memcpy(&r[2], block + 2 * row_stride, sizeof r[2]);
      std::memcpy(&r[3], block + 3 * row_stride, sizeof r[3]);
      std::memcpy(&r[4], block + 4 * row_stride, sizeof r[4]);
      std::memcpy(&r[5], block + 5 * row_stride, sizeof r[5]);
      std::memcpy(&r[6], block + 6 * row_stride, sizeof r[6]);
      std::memcpy(&r[7], block + 7 * row_stride, sizeof r[7]);
      // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved, steps {0, 1, 4, 5} and {2, 3, 6, 7}.
      for (int i = 0; i < 4; ++i) {
        t[2 * i] = __builtin_shuffle(r[2 * i], r[2 * i + 1], Mask{0, 8, 1, 9, 4, 12, 5, 13});
        t[2 * i + 1] = __builtin_shuffle(r[2 * i], r[2 * i + 1], Mask{2, 10, 3, 11, 6, 14, 7, 15});
      }
      // u[k] (k < 4): rows 0-3 at steps k and k + 4; u[k + 4]: rows 4-7 at the same steps.
      for (int half = 0; half < 2; ++half) {
        const Floats* a = t + 4 * half;
        Floats* b = u + 4 * half;
        b[0] = __builtin_shuffle(a[0], a[2], Mask{0, 1, 8, 9, 4, 5, 12, 13});
        b[1] = __builtin_shuffle(a[0], a[2], Mask{2, 3, 10, 11, 6, 7, 14, 15});
        b[2] = __builtin_shuffle(a[1], a[3], Mask{0, 1, 8, 9, 4, 5, 12, 13});
        b[3] = __builtin_shuffle(a[1], a[3], Mask{2, 3, 10, 11, 6, 7, 14, 15});
      }
      for (int k = 0; k < 4; ++k) {
        const Floats low = __builtin_shuffle(u[k], u[k + 4], Mask{0, 1, 2, 3, 8, 9, 10, 11});
        const Floats high = __builtin_shuffle(u[k], u[k + 4], Mask{4, 5, 6, 7, 12, 13, 14, 15});
        std::memcpy(panel + (s0 + k) * width + c0, &low, sizeof low);
        std::memcpy(panel + (s0 + k + 4) * width + c0, &high, sizeof high);
      }
    }
    for (int64_t s = whole; s < steps; ++s) {
      for (int64_t c = c0; c < c0 + 8; ++c) panel[s * width + c] = rows[c * row_stride + s];
    }
  }
}

template <typename Shape, typename Madd>
void router_run(const RouterTileArgs& t) {
  if (t.panel_width == kRouterNarrowPanelWidth) {
    return router_rows<Madd, Shape::kNarrowLanes, kRouterNarrowPanelWidth, Shape::kNarrowRows, 1>(
        t);
  }
  router_rows<Madd, Shape::kLanes, kRouterPanelWidth, Shape::kMaxRows, Shape::kPanels>(t);
}

// The register blocking of each path: kMaxRows rows x kPanels panels of kLanes-wide vectors on
// panels of 16 experts; kNarrowRows rows x one kNarrowLanes-wide vector on panels of 8.
struct PlainRouterShape {
  // Vectors of 4 lanes, which every SIMD target has (SSE2 on the x86-64 baseline, 16 registers):
  // 2 rows x 4 vectors = 8 accumulators beside a panel's 4 weight vectors; 4 rows x 2 on narrow
  // panels.
  static constexpr int kLanes = 4;
  static constexpr int kMaxRows = 2;
  static constexpr int kPanels = 1;
  static constexpr int kNarrowLanes = 4;
  static constexpr int kNarrowRows = 4;
};

struct Avx2RouterShape {
  // 6 rows x one panel (two 8-lane vectors) = 12 accumulators in the 16 YMM registers, beside
  // the two weight vectors and the broadcast; 12 rows x one vector on narrow panels.
  static constexpr int kLanes = 8;
  static constexpr int kMaxRows = 6;
  static constexpr int kPanels = 1;
  static constexpr int kNarrowLanes = 8;
  static constexpr int kNarrowRows = 12;
};

struct Avx512RouterShape {
  // 12 rows x two panels = 24 accumulators in the 32 ZMM registers; 12 rows x one YMM vector on
  // narrow panels.
  static constexpr int kLanes = 16;
  static constexpr int kMaxRows = 12;
  static constexpr int kPanels = 2;
  static constexpr int kNarrowLanes = 8;
  static constexpr int kNarrowRows = 12;
};

// Madd::madd(acc, x, w) does acc += x * w per lane, for vectors of Shape::kLanes and
// Shape::kNarrowLanes lanes.
template <typename Shape, typename Madd>
RouterKernel router_kernel_for() {
  static_assert(Shape::kMaxRows <= kRouterMaxRows && Shape::kNarrowRows <= kRouterMaxRows);
  static_assert(kRouterPanelWidth % Shape::kLanes == 0);
  static_assert(kRouterNarrowPanelWidth % Shape::kNarrowLanes == 0);
  RouterKernel kernel;
  kernel.max_rows_wide = Shape::kMaxRows;
  kernel.max_rows_narrow = Shape::kNarrowRows;
  kernel.run = &router_run<Shape, Madd>;
  kernel.transpose = &router_transpose;
  return kernel;
}

}  // namespace
}  // namespace moe::cpu
