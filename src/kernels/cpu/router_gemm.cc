// Router GEMM on the CPU: logits [M, E] = hidden [M, H] · weight [E, H]^T (+ bias), f32 math, on
// f32 panels of 16 (or 8) experts: the weight packed once (pack_router_weight), or its plain rows
// converted chunk by chunk on the way (router_logits_unpacked).
//
// Work items are blocks of kRouterBlockTokens tokens x a group of panels, spread over the threads.
// An item walks H in chunks of kBlockH: the chunk of its panels (at most 128 KiB) stays in L2
// while every register tile of its rows passes over it, each tile's rows converted to f32 on the
// stack first. The sums wait in an f32 buffer between chunks, exactly, so each logit is one chain
// of multiply-adds in ascending h whatever the item, chunk, thread or form of the weight
// (router_kernel.h). Tested against the float64 reference in tests/routing/router_logits_test.cc.
#include <algorithm>

#include "kernels/cpu/routing.h"
#include "kernels/cpu/threads.h"
#include "moe/error.h"

namespace moe::cpu {

RouterKernel router_kernel(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPlain:
      return plain_router_kernel();
    case CpuIsa::kAvx2:
      return avx2_router_kernel();
    case CpuIsa::kAvx512:
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAmx:
      return avx512_router_kernel();
    case CpuIsa::kAuto:
      break;
  }
  fail("router kernel: unsupported cpu isa: {}", cpu_isa_name(isa));
}

namespace {

constexpr int64_t kBlockRows = kRouterBlockTokens;  // their sums stay on the stack
constexpr int64_t kBlockH = 256;           // h per chunk: a tile's staged rows (12 KiB) stay in L1
constexpr int64_t kMaxGroupExperts = 128;  // experts of one item: 128 KiB per chunk, in L2
// Experts of one item when it converts the plain weight rows itself: 32 KiB per chunk, on the
// stack.
constexpr int64_t kMaxStagedGroupExperts = 32;
// Small batches split the panels until every thread has this many items, so that in decode
// all threads stream the weights side by side.
constexpr int64_t kItemsPerThread = 2;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Problem {
  RouterKernel kernel;
  const void* hidden = nullptr;
  DType hidden_dtype = DType::kF32;
  const float* panels = nullptr;  // packed, or null: then the plain rows of weight
  const void* weight = nullptr;   // [num_experts, hidden_size]
  DType weight_dtype = DType::kF32;
  int64_t panel_width = 0;
  const float* router_bias = nullptr;
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  int64_t num_experts = 0;
  float* logits = nullptr;
};

// Panels [panel0, panel0 + num_panels) of the plain weight rows over columns [h0, h0 + steps), in
// f32: panel q's step s at out + q * panel_stride + s * width, the experts past num_experts zero.
void stage_panels(const RouterKernel& kernel, const void* weight, DType weight_dtype,
                  int64_t num_experts, int64_t hidden_size, int64_t width, int64_t panel0,
                  int64_t num_panels, int64_t h0, int64_t steps, float* out, int64_t panel_stride) {
  // One panel's rows in f32 first, then transposed (storing each row with a stride of a line
  // instead is several times slower).
  float rows[kRouterPanelWidth * kBlockH];  // [width, kBlockH]
  const size_t element_size = dtype_size(weight_dtype);
  for (int64_t q = 0; q < num_panels; ++q) {
    for (int64_t c = 0; c < width; ++c) {
      const int64_t e = (panel0 + q) * width + c;
      float* row = rows + c * kBlockH;
      if (e < num_experts) {
        const auto* src = static_cast<const char*>(weight) +
                          static_cast<size_t>(e * hidden_size + h0) * element_size;
        convert_to_f32(src, weight_dtype, row, static_cast<size_t>(steps));
      } else {
        std::fill(row, row + steps, 0.0f);
      }
    }
    kernel.transpose(rows, kBlockH, steps, width, out + q * panel_stride);
  }
}

// Tokens [row0, row0 + rows) x panels [panel0, panel0 + num_panels).
void run_item(const Problem& p, int64_t row0, int64_t rows, int64_t panel0, int64_t num_panels) {
  alignas(64) float acc[kBlockRows * kMaxGroupExperts];  // [rows, acc_stride]
  alignas(64) float staged[kRouterMaxRows * kBlockH];    // [tile rows, kBlockH] hidden in f32
  // Unpacked weights: [num_panels, kBlockH, width], this chunk of the item's panels.
  alignas(64) float staged_panels[kMaxStagedGroupExperts * kBlockH];
  const int64_t H = p.hidden_size, width = p.panel_width;
  const int64_t tile_rows = p.kernel.max_rows(width);
  const int64_t acc_stride = num_panels * width;
  const size_t element_size = dtype_size(p.hidden_dtype);
  // At least one chunk, so that H = 0 still writes zero sums.
  const int64_t num_chunks = std::max<int64_t>(1, ceil_div(H, kBlockH));
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    const int64_t h0 = chunk * kBlockH;
    const int64_t steps = std::min(kBlockH, H - h0);
    const float* panels = staged_panels;
    int64_t panel_stride = kBlockH * width;
    if (p.panels != nullptr) {
      panels = p.panels + (panel0 * H + h0) * width;
      panel_stride = H * width;
    } else {
      stage_panels(p.kernel, p.weight, p.weight_dtype, p.num_experts, H, width, panel0, num_panels,
                   h0, steps, staged_panels, panel_stride);
    }
    for (int64_t i = 0; i < rows; i += tile_rows) {
      RouterTileArgs t;
      t.rows = std::min(tile_rows, rows - i);
      // Rows of hidden are often a multiple of 4 KiB apart, which would put every row of the
      // tile in the same L1 set: even f32 rows are copied.
      for (int64_t r = 0; r < t.rows; ++r) {
        const auto* src = static_cast<const char*>(p.hidden) +
                          static_cast<size_t>((row0 + i + r) * H + h0) * element_size;
        convert_to_f32(src, p.hidden_dtype, staged + r * kBlockH, static_cast<size_t>(steps));
      }
      t.x = staged;
      t.x_stride = kBlockH;
      t.panels = panels;
      t.panel_width = width;
      t.panel_stride = panel_stride;
      t.num_panels = num_panels;
      t.steps = steps;
      t.accumulate = chunk > 0;
      t.acc = acc + i * acc_stride;
      t.acc_stride = acc_stride;
      p.kernel.run(t);
    }
  }
  const int64_t e0 = panel0 * width;
  const int64_t experts = std::min(acc_stride, p.num_experts - e0);
  for (int64_t i = 0; i < rows; ++i) {
    float* out = p.logits + (row0 + i) * p.num_experts + e0;
    for (int64_t j = 0; j < experts; ++j) {
      out[j] =
          p.router_bias ? acc[i * acc_stride + j] + p.router_bias[e0 + j] : acc[i * acc_stride + j];
    }
  }
}

// The items of a call and the thread team that runs them.
void run_items(const Problem& p, int num_threads) {
  const int64_t num_row_blocks = ceil_div(p.num_tokens, kBlockRows);
  if (num_row_blocks == 0 || p.num_experts == 0) return;
  // Always the caller's team size, even for fewer items than threads: threads.h says why.
  const int threads = resolve_num_threads(num_threads);
  const int64_t num_panels = ceil_div(p.num_experts, p.panel_width);
  const int64_t max_group_experts = p.panels ? kMaxGroupExperts : kMaxStagedGroupExperts;
  const int64_t wanted_groups = ceil_div(threads * kItemsPerThread, num_row_blocks);
  const int64_t group_panels = std::clamp<int64_t>(ceil_div(num_panels, wanted_groups), 1,
                                                   max_group_experts / p.panel_width);
  const int64_t num_groups = ceil_div(num_panels, group_panels);
  const int64_t num_items = num_row_blocks * num_groups;
  // Consecutive items share their tokens, so a thread's static chunk reuses its hidden rows.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t item = 0; item < num_items; ++item) {
    const int64_t row0 = item / num_groups * kBlockRows;
    const int64_t panel0 = item % num_groups * group_panels;
    run_item(p, row0, std::min(kBlockRows, p.num_tokens - row0), panel0,
             std::min(group_panels, num_panels - panel0));
  }
}

}  // namespace

Tensor pack_router_weight(const void* weight, DType weight_dtype, int64_t num_experts,
                          int64_t hidden_size, int num_threads) {
  const int64_t width = router_panel_width(num_experts);
  const int64_t num_panels = ceil_div(num_experts, width);
  Tensor panels(DType::kF32, {num_panels, hidden_size, width});
  float* out = panels.data<float>();
  // Once per layer: the portable build of the transpose does.
  const RouterKernel kernel = plain_router_kernel();
  const int threads = resolve_num_threads(num_threads);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t q = 0; q < num_panels; ++q) {
    for (int64_t h0 = 0; h0 < hidden_size; h0 += kBlockH) {
      stage_panels(kernel, weight, weight_dtype, num_experts, hidden_size, width, q, 1, h0,
                   std::min(kBlockH, hidden_size - h0), out + (q * hidden_size + h0) * width,
                   hidden_size * width);
    }
  }
  return panels;
}

void router_logits(const RouterKernel& kernel, const void* hidden, DType hidden_dtype,
                   const float* router_panels, const float* router_bias, int64_t num_tokens,
                   int64_t hidden_size, int64_t num_experts, float* logits, int num_threads) {
  run_items({.kernel = kernel,
             .hidden = hidden,
             .hidden_dtype = hidden_dtype,
             .panels = router_panels,
             .panel_width = router_panel_width(num_experts),
             .router_bias = router_bias,
             .num_tokens = num_tokens,
             .hidden_size = hidden_size,
             .num_experts = num_experts,
             .logits = logits},
            num_threads);
}

void router_logits_unpacked(const RouterKernel& kernel, const void* hidden, DType hidden_dtype,
                            const void* weight, DType weight_dtype, const float* router_bias,
                            int64_t num_tokens, int64_t hidden_size, int64_t num_experts,
                            float* logits, int num_threads) {
  run_items({.kernel = kernel,
             .hidden = hidden,
             .hidden_dtype = hidden_dtype,
             .weight = weight,
             .weight_dtype = weight_dtype,
             .panel_width = router_panel_width(num_experts),
             .router_bias = router_bias,
             .num_tokens = num_tokens,
             .hidden_size = hidden_size,
             .num_experts = num_experts,
             .logits = logits},
            num_threads);
}

}  // namespace moe::cpu
