// Seeded random inputs and comparison helpers shared by the tests.
#pragma once

#include <cstdint>
#include <string>

#include "moe/tensor.h"

namespace moe::testing {

// Fills a float tensor (f32/bf16/f16) with N(0, stddev^2) values, rounded to its dtype.
void fill_normal(const TensorView& t, uint64_t seed, float stddev = 1.0f);
Tensor random_normal(DType dtype, Shape shape, uint64_t seed, float stddev = 1.0f);

// Fills an int32 tensor with uniform integers in [lo, hi].
void fill_uniform_int(const TensorView& t, uint64_t seed, int32_t lo, int32_t hi);

// Fills a float tensor with small integers in [lo, hi] (exact in every float dtype), so a GEMM
// over them is exact in f32 accumulation and outputs can be compared bit for bit.
void fill_small_ints(const TensorView& t, uint64_t seed, int lo, int hi);

// Fills every byte of a tensor with 0xff (NaN for floats, -1 for int32): a poison that shows any
// element a kernel forgot to write.
void poison(const TensorView& t);

// Worst element of |got - expected| relative to max |expected| over the whole tensor.
struct Comparison {
  double max_abs_error = 0;  // largest |got - expected|
  double max_abs_expected = 0;
  double max_rel_error = 0;  // max_abs_error / max(max_abs_expected, tiny)
  int64_t worst_index = -1;  // flat index of the largest error (or of the first NaN mismatch)
  double worst_expected = 0;
  double worst_got = 0;
  bool nan_mismatch = false;  // NaN in one tensor where the other has a number
  std::string describe() const;
};
Comparison compare(const TensorView& got, const TensorView& expected);

// The value of element `index` of a tensor as double.
double element(const TensorView& t, int64_t index);

}  // namespace moe::testing
