// The GPU expert-parallel tests' verdict on a layer's output against the single-GPU layer's.
//
// Equal within bf16 rounding, not bitwise: each partial row (a token's pairs served by one rank)
// is rounded to bf16 before the source adds them, where the single-GPU layer adds the k pair rows;
// and the experts may pick another kernel plan for the rows they see. Each rounding is at most
// 2^-9 relative to values of the order of the row's largest output, and there are at most k pair
// roundings that differ plus N partial roundings plus the output's: the bound below. With shared
// experts both layers round the routed sum to bf16 and then its sum with the shared experts' row
// (the same on both up to f32 accumulation order: the same rows and weights): one rounding more.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "moe/tensor.h"

namespace moe::testing {

// Every token row within (k + N + 1) bf16 roundings of its largest output, one more with shared
// experts.
inline void expect_close(const Tensor& got, const Tensor& want, int64_t k, int num_ranks,
                         bool shared_experts = false) {
  ASSERT_EQ(got.shape(), want.shape());
  const Tensor g = Tensor::copy_of(got, DType::kF32), w = Tensor::copy_of(want, DType::kF32);
  const int64_t M = want.size(0), H = want.size(1);
  const double rounding = std::ldexp(1.0, -8);
  for (int64_t t = 0; t < M; ++t) {
    double scale = 1e-6;
    for (int64_t h = 0; h < H; ++h)
      scale = std::max(scale, std::fabs(double{w.data<float>()[t * H + h]}));
    const double roundings = static_cast<double>(k + num_ranks + 1 + (shared_experts ? 1 : 0));
    const double tolerance = roundings * rounding * scale;
    for (int64_t h = 0; h < H; ++h) {
      const double a = g.data<float>()[t * H + h], b = w.data<float>()[t * H + h];
      ASSERT_TRUE(std::isfinite(a)) << "token " << t << " element " << h << ": " << a;
      ASSERT_LE(std::fabs(a - b), tolerance) << "token " << t << " element " << h << ": got " << a
                                             << ", single GPU " << b << ", tolerance " << tolerance;
    }
  }
}

}  // namespace moe::testing
