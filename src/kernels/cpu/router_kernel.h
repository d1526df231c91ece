// The innermost CPU router kernel, one per instruction set: a few f32 hidden rows times panels of
// the packed router weight (routing.h: panels of 16 experts, or 8 for routers of at most 8,
// stored h-major), over one range of h.
//
//   acc[r, width * p + c] (+)= sum over s in [0, steps) of x[r, s] * panel p [s, c]
//
// Each output adds its products one multiply-add at a time in ascending h (one FMA instruction on
// avx2 and avx512; plain rounds the product, then the sum, in every build), and the driver carries
// the sums from one range of h to the next exactly, as f32. So a logit depends only on its token's
// row and its expert's weights: not on the rows or panels that share a call, the thread, the panel
// width or the path's vector width (avx2 and avx512 give the same bits; plain its own).
//
// Variants: plain_router_kernels.cc, avx2_router_kernels.cc, avx512_router_kernels.cc over the
// shared template router_tile.h. Tested in tests/routing/router_logits_test.cc.
#pragma once

#include <cstdint>

#include "moe/cpu_isa.h"

namespace moe::cpu {

// Experts per panel of the packed router weight: one AVX-512 vector, two AVX2 vectors. Routers of
// at most 8 experts take panels of 8 (one AVX2 vector), so that they multiply half as much zero
// padding or less: every step of a panel costs each row one broadcast and one multiply-add per
// vector, whatever the number of real experts in it.
inline constexpr int64_t kRouterPanelWidth = 16;
inline constexpr int64_t kRouterNarrowPanelWidth = 8;
inline int64_t router_panel_width(int64_t num_experts) {
  return num_experts <= kRouterNarrowPanelWidth ? kRouterNarrowPanelWidth : kRouterPanelWidth;
}
// Most rows a kernel takes per call (the driver's staging buffers are sized for this).
inline constexpr int64_t kRouterMaxRows = 12;

struct RouterTileArgs {
  const float* x = nullptr;  // [rows, x_stride]: column s is step s of the range
  int64_t x_stride = 0;
  int64_t rows = 0;  // 1..RouterKernel::max_rows(panel_width)
  // Panel p's step s at panels + p * panel_stride + panel_width * s.
  const float* panels = nullptr;
  int64_t panel_width = kRouterPanelWidth;  // or kRouterNarrowPanelWidth
  int64_t panel_stride = 0;
  int64_t num_panels = 0;
  int64_t steps = 0;
  bool accumulate = false;  // add to acc (the sums of earlier ranges) rather than overwrite it
  float* acc = nullptr;     // [rows, acc_stride], acc_stride >= panel_width * num_panels
  int64_t acc_stride = 0;
};

struct RouterKernel {
  // Rows per call (<= kRouterMaxRows) on panels of 16 and of 8 experts.
  int64_t max_rows_wide = 1;
  int64_t max_rows_narrow = 1;
  void (*run)(const RouterTileArgs& args) = nullptr;
  // panel[s * width + c] = rows[c * row_stride + s] for s < steps and c < width (8 or 16): how
  // the driver turns f32 weight rows into a panel.
  void (*transpose)(const float* rows, int64_t row_stride, int64_t steps, int64_t width,
                    float* panel) = nullptr;

  int64_t max_rows(int64_t panel_width) const {
    return panel_width == kRouterPanelWidth ? max_rows_wide : max_rows_narrow;
  }
};

// The kernel of a supported, resolved path (never kAuto). The router is f32 math on every path:
// avx512bf16 and amx, whose bf16 instructions would round the inputs, run the avx512 kernel. (A
// layer whose router weight and hidden are already bf16 takes the amx tiles: layer_router.h.)
RouterKernel router_kernel(CpuIsa isa);

// Per-path kernels, for router_kernel and the tests of each variant.
RouterKernel plain_router_kernel();
RouterKernel avx2_router_kernel();
RouterKernel avx512_router_kernel();

}  // namespace moe::cpu
