// Each tile kernel on its own: one packed panel pair times blocks of every row count it accepts,
// for k one below, at and above every vector and tile width. Inputs are small integers, so every
// product and partial sum is exact in f32 (and the inputs exact in bf16): each kernel must match
// the integer dot products bit for bit, whatever its accumulation order. The f32 FMA kernels are
// also held to their rounding on random reals: one fused multiply-add per step, ascending k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/random_tensors.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/tile_kernel.h"
#include "kernels/kernel_sets.h"

namespace moe::testing {
namespace {

// What check_tile fills the inputs with, and what it compares each output with.
enum class Expect {
  kExactIntegers,  // small integers: the exact dot product
  kFmaChain,       // random reals: std::fma(a, w, acc) from zero in ascending k, in f32
};

// Runs one kernel on rows x k inputs and a 32 x k weight matrix; fails on the first output that
// differs from the expected result.
void check_tile(const KernelSet& set, const cpu::TileKernel& kernel, DType weight_dtype, int64_t k,
                int64_t rows, uint64_t seed, Expect expect = Expect::kExactIntegers) {
  SCOPED_TRACE(set.name + " weights=" + std::string(dtype_name(weight_dtype)) +
               " k=" + std::to_string(k) + " rows=" + std::to_string(rows) +
               " seed=" + std::to_string(seed));
  const cpu::PackedLayout layout = cpu::plain_layout(weight_dtype, cpu::kPairWidth, k);
  Tensor w(weight_dtype, {cpu::kPairWidth, k});
  Tensor values(DType::kF32, {rows, k});
  if (expect == Expect::kExactIntegers) {
    fill_small_ints(w, seed, -4, 4);
    fill_small_ints(values, seed + 1, -4, 4);
  } else {
    fill_normal(w, seed);
    fill_normal(values, seed + 1);
  }
  Tensor packed(DType::kU8, {layout.bytes()});
  cpu::pack_matrices(layout, w.data<void>(), 1, nullptr, packed.data<void>(), 1);

  // Input rows in the kernel's dtype, zero past k and up to the kernel's row multiple.
  const int64_t padded_rows =
      (rows + kernel.row_multiple - 1) / kernel.row_multiple * kernel.row_multiple;
  Tensor a_f32(DType::kF32, {padded_rows, layout.k_padded});
  std::fill(a_f32.data<float>(), a_f32.data<float>() + a_f32.numel(), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(values.data<float>() + r * k, values.data<float>() + (r + 1) * k,
              a_f32.data<float>() + r * layout.k_padded);
  }
  const Tensor a = Tensor::copy_of(a_f32, kernel.a_dtype);

  std::vector<float> acc(32 * cpu::kPairWidth, std::nanf(""));
  cpu::TileArgs t;
  t.a = a.data<void>();
  t.a_stride = layout.k_padded;
  t.rows = rows;
  t.pair = packed.data<void>();
  t.panel_bytes = layout.panel_bytes();
  t.acc = acc.data();
  // k in two ranges when it is long enough to split on bf16's k multiple, as the driver does.
  const int64_t split = layout.k_padded >= 64 ? 32 : layout.k_padded;
  if (kernel.thread_begin) kernel.thread_begin();
  t.k_begin = 0;
  t.k_end = split;
  kernel.run(t);
  if (split < layout.k_padded) {
    t.k_begin = split;
    t.k_end = layout.k_padded;
    t.accumulate = true;
    kernel.run(t);
  }
  if (kernel.thread_end) kernel.thread_end();

  const Tensor w_f32 = Tensor::copy_of(w, DType::kF32);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cpu::kPairWidth; ++c) {
      const float* x = values.data<float>() + r * k;
      const float* wc = w_f32.data<float>() + c * k;
      double expected = 0;
      if (expect == Expect::kExactIntegers) {
        for (int64_t i = 0; i < k; ++i) expected += double{x[i]} * wc[i];
      } else {
        float chain = 0;
        for (int64_t i = 0; i < k; ++i) chain = std::fma(x[i], wc[i], chain);
        expected = chain;
      }
      const float got = acc[r * cpu::kPairWidth + c];
      ASSERT_EQ(got, expected) << "row " << r << " column " << c;
    }
  }
}

void check_kernel_set(const KernelSet& set, DType weight_dtype) {
  uint64_t seed = 1;
  const cpu::TileKernel& kernel = set.kernels.tile;
  for (int64_t k : {1, 2, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100}) {
    for (int64_t rows = 1; rows <= kernel.max_rows; ++rows) {
      check_tile(set, kernel, weight_dtype, k, rows, seed++);
    }
  }
}

TEST(TileKernels, EveryRunnableKernelIsExactOnSmallIntegers) {
  for (DType weight_dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const KernelSet& set : runnable_kernel_sets(weight_dtype)) {
      check_kernel_set(set, weight_dtype);
    }
  }
}

// avx2 and avx512 promise the same bits for every row of every block size: each multiply-add is
// their FMA instruction (the includer's Madd), not left to the compiler to fuse or not.
TEST(TileKernels, FmaKernelsRoundOncePerMultiplyAdd) {
  int checked = 0;
  for (DType weight_dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (const KernelSet& set : runnable_kernel_sets(weight_dtype)) {
      if (set.name != "avx2" && set.name != "avx512" && set.name != "avx512-logic-on-avx2") {
        continue;
      }
      uint64_t seed = 100;
      for (int64_t k : {1, 17, 64, 65, 300}) {
        for (int64_t rows = 1; rows <= set.kernels.tile.max_rows; ++rows) {
          check_tile(set, set.kernels.tile, weight_dtype, k, rows, seed++, Expect::kFmaChain);
        }
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no FMA kernel set runs on this machine";
}

TEST(TileKernels, EveryPathOfThisMachineIsListed) {
  // The sets under test include each supported path, so a machine with AVX-512 or AMX runs
  // them for real.
  const std::vector<KernelSet> sets = runnable_kernel_sets(DType::kBF16);
  for (CpuIsa isa : supported_cpu_isas()) {
    EXPECT_TRUE(std::any_of(sets.begin(), sets.end(), [&](const KernelSet& s) {
      return s.name == cpu_isa_name(isa);
    })) << cpu_isa_name(isa);
  }
}

TEST(TileKernels, PeakLoopsCountTheirWork) {
  for (CpuIsa isa : supported_cpu_isas()) {
    for (DType weight_dtype : {DType::kBF16, DType::kF32}) {
      const cpu::PeakLoop loop = cpu::peak_loop(isa, weight_dtype);
      const double flops = loop(1000);
      EXPECT_GT(flops, 0) << cpu_isa_name(isa);
      EXPECT_EQ(loop(2000), 2 * flops) << cpu_isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace moe::testing
