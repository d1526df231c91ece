// The plain path: portable C++ loops over the packed panels, the same products in the same
// ascending-k order as the vector FMA kernels. Runs on any CPU; the specification the other f32
// paths are compared with in tests/kernels/tile_kernels_test.cc.
#include <cstring>

#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/tile_kernel.h"

namespace moe::cpu {

namespace {

constexpr int kMaxRows = 4;
// A scalar loop does a few GFLOP/s per core against 20 GB/s of DRAM reads on two cores.
constexpr double kFlopsPerByte = 1;

float widen(uint16_t bits, DType dtype) {
  if (dtype == DType::kBF16) return to_f32(bf16{bits});
  return to_f32(f16{bits});
}

// One panel, kRows rows: acc[r][c] over all k.
template <int kRows>
void plain_panel(const TileArgs& t, DType weight_dtype, int panel) {
  const float* a = static_cast<const float*>(t.a);
  const char* base = static_cast<const char*>(t.pair) + panel * t.panel_bytes;
  float acc[kRows][kPanelWidth] = {};
  if (t.accumulate) {
    for (int r = 0; r < kRows; ++r) {
      std::memcpy(acc[r], t.acc + r * kPairWidth + panel * kPanelWidth, sizeof acc[r]);
    }
  }
  PackedLayout layout;  // element_offset depends on the dtype only
  layout.dtype = weight_dtype;
  for (int64_t k = t.k_begin; k < t.k_end; ++k) {
    float w[kPanelWidth];
    for (int64_t c = 0; c < kPanelWidth; ++c) {
      const int64_t offset = layout.element_offset(k, c);
      if (weight_dtype == DType::kF32) {
        std::memcpy(&w[c], base + offset * 4, 4);
      } else {
        uint16_t bits;
        std::memcpy(&bits, base + offset * 2, 2);
        w[c] = widen(bits, weight_dtype);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const float x = a[r * t.a_stride + k];
      for (int64_t c = 0; c < kPanelWidth; ++c) acc[r][c] += x * w[c];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    std::memcpy(t.acc + r * kPairWidth + panel * kPanelWidth, acc[r], sizeof acc[r]);
  }
}

template <DType kWeights, int kRows>
void plain_rows(const TileArgs& t) {
  if constexpr (kRows > 1) {
    if (t.rows < kRows) return plain_rows<kWeights, kRows - 1>(t);
  }
  for (int panel = 0; panel < 2; ++panel) plain_panel<kRows>(t, kWeights, panel);
}

}  // namespace

ExpertKernels plain_expert_kernels(DType weight_dtype) {
  TileKernel kernel;
  kernel.a_dtype = DType::kF32;
  kernel.max_rows = kMaxRows;
  kernel.run = weight_dtype == DType::kBF16  ? &plain_rows<DType::kBF16, kMaxRows>
               : weight_dtype == DType::kF32 ? &plain_rows<DType::kF32, kMaxRows>
                                             : &plain_rows<DType::kF16, kMaxRows>;
  ExpertKernels kernels;
  kernels.tile = kernel;
  kernels.flops_per_byte = kFlopsPerByte;
  return kernels;
}

double plain_peak_loop(int64_t iterations) {
  // Independent chains of scalar multiply-adds, as the plain kernel's inner loop does them.
  constexpr int kChains = 8;
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = 1.0f + 0.001f * static_cast<float>(c);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * 0.999999f + 1e-7f;
  }
  float sum = 0;
  for (float value : acc) sum += value;
  volatile float sink = sum;
  (void)sink;
  return 2.0 * kChains * static_cast<double>(iterations);
}

}  // namespace moe::cpu
