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

// The 16 weights of one panel at step k, in f32 (packed_weights.h gives the layouts).
template <DType kWeights>
void load_step(const char* panel, int64_t k, float* w) {
  if constexpr (kWeights == DType::kBF16) {
    const char* pair = panel + (k / 2) * 2 * kPanelWidth * 2 + (k % 2) * 2;
    for (int64_t c = 0; c < kPanelWidth; ++c) {
      uint16_t bits;
      std::memcpy(&bits, pair + c * 4, sizeof bits);
      w[c] = f32_from_bits(uint32_t{bits} << 16);
    }
  } else if constexpr (kWeights == DType::kF32) {
    std::memcpy(w, panel + k * kPanelWidth * 4, kPanelWidth * 4);
  } else {
    for (int64_t c = 0; c < kPanelWidth; ++c) {
      uint16_t bits;
      std::memcpy(&bits, panel + (k * kPanelWidth + c) * 2, sizeof bits);
      w[c] = to_f32(f16{bits});
    }
  }
}

// One panel, kRows rows: acc[r][c] (+)= sum over the k range.
template <DType kWeights, int kRows>
void plain_panel(const TileArgs& t, int panel) {
  const float* a = static_cast<const float*>(t.a);
  const char* base = static_cast<const char*>(t.pair) + panel * t.panel_bytes;
  float acc[kRows][kPanelWidth] = {};
  if (t.accumulate) {
    for (int r = 0; r < kRows; ++r) {
      std::memcpy(acc[r], t.acc + r * kPairWidth + panel * kPanelWidth, sizeof acc[r]);
    }
  }
  for (int64_t k = t.k_begin; k < t.k_end; ++k) {
    float w[kPanelWidth];
    load_step<kWeights>(base, k, w);
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
  for (int panel = 0; panel < 2; ++panel) plain_panel<kWeights, kRows>(t, panel);
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
  // The plain kernel's inner loop without its loads: kMaxRows x 16 independent multiply-adds per
  // step, vectorized as far as the compiler's target allows.
  float acc[kMaxRows][kPanelWidth], w[kPanelWidth];
  for (int64_t c = 0; c < kPanelWidth; ++c) w[c] = 1e-7f * static_cast<float>(c + 1);
  for (int r = 0; r < kMaxRows; ++r) {
    for (int64_t c = 0; c < kPanelWidth; ++c) acc[r][c] = static_cast<float>(r);
  }
  for (int64_t i = 0; i < iterations; ++i) {
    for (int r = 0; r < kMaxRows; ++r) {
      for (int64_t c = 0; c < kPanelWidth; ++c) acc[r][c] = acc[r][c] * 0.999999f + w[c];
    }
  }
  float sum = 0;
  for (const auto& row : acc) {
    for (float value : row) sum += value;
  }
  volatile float sink = sum;
  (void)sink;
  return 2.0 * kMaxRows * kPanelWidth * static_cast<double>(iterations);
}

}  // namespace moe::cpu
