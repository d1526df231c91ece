// The router GEMM kernels: cpu::router_logits against reference::router_logits.
//
// Small integer operands make every product and partial sum exact in f32, so there the cpu result
// must equal the reference bit for bit whatever its summation order; on normal operands it must
// stay within the worst-case bound of f32 summation.
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "kernels/cpu/routing.h"
#include "kernels/reference/routing.h"
#include "routing/guarded_buffer.h"

namespace moe {
namespace {

constexpr double kUnitRoundoff = 0x1p-24;

struct GemmCase {
  int64_t num_tokens;
  int64_t num_experts;
  int64_t hidden_size;
  DType hidden_dtype;
  DType weight_dtype;
  bool bias;
};

std::string describe(const GemmCase& c, uint64_t seed) {
  return fmt::format("M={} E={} H={} hidden {} weight {} bias {} seed {}", c.num_tokens,
                     c.num_experts, c.hidden_size, dtype_name(c.hidden_dtype),
                     dtype_name(c.weight_dtype), c.bias, seed);
}

std::vector<float> run_cpu(const GemmCase& c, const Tensor& hidden, const Tensor& weight,
                           const float* bias, int num_threads) {
  testing::GuardedBuffer<float> logits(c.num_tokens * c.num_experts);
  cpu::router_logits(hidden.data<void>(), c.hidden_dtype, weight.data<void>(), c.weight_dtype, bias,
                     c.num_tokens, c.hidden_size, c.num_experts, logits.data(), num_threads);
  EXPECT_TRUE(logits.guard_intact()) << "router_logits wrote past the end of logits";
  return std::vector<float>(logits.data(), logits.data() + logits.size());
}

std::vector<double> run_reference(const GemmCase& c, const Tensor& hidden, const Tensor& weight,
                                  const float* bias) {
  std::vector<double> logits(static_cast<size_t>(c.num_tokens * c.num_experts));
  reference::router_logits(hidden.data<void>(), c.hidden_dtype, weight.data<void>(), c.weight_dtype,
                           bias, c.num_tokens, c.hidden_size, c.num_experts, logits.data());
  return logits;
}

// Sizes one below, at and one above the kernel's register tile (8 experts), blocks (16 tokens x
// 16 experts), vector width (8) and hidden chunk (128), plus M = 0.
TEST(RouterLogits, ExactOnSmallIntegersForEveryRemainder) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  int index = 0;
  for (int64_t m : {0, 1, 2, 3, 12, 15, 16, 17, 33}) {
    for (int64_t e : {1, 2, 7, 8, 9, 15, 16, 17, 33}) {
      for (int64_t h : {1, 7, 8, 9, 127, 128, 129, 257}) {
        const GemmCase c{m, e, h, dtypes[index % 3], dtypes[(index / 3) % 3], index % 2 == 0};
        const uint64_t seed = 1000 + static_cast<uint64_t>(index++);
        SCOPED_TRACE(describe(c, seed) + "; reproduce: moe_tests --gtest_filter=" +
                     "RouterLogits.ExactOnSmallIntegersForEveryRemainder");
        // |products| <= 9 and H <= 257: every partial sum is an integer below 2^24.
        Tensor hidden(c.hidden_dtype, {m, h});
        Tensor weight(c.weight_dtype, {e, h});
        Tensor bias(DType::kF32, {e});
        testing::fill_small_ints(hidden, seed, -3, 3);
        testing::fill_small_ints(weight, seed + 1, -3, 3);
        testing::fill_small_ints(bias, seed + 2, -8, 8);
        const float* b = c.bias ? bias.data<float>() : nullptr;
        const std::vector<float> got = run_cpu(c, hidden, weight, b, 2);
        const std::vector<double> expected = run_reference(c, hidden, weight, b);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(static_cast<double>(got[i]), expected[i]) << "logit " << i;
        }
      }
    }
  }
}

// Any order of summing n terms in f32 is within gamma_n = n u / (1 - n u) of the exact sum,
// relative to the sum of |terms| (Higham, Accuracy and Stability, 4.2); the H rounded products
// add u each. So |cpu - exact| <= (H + 2) u (sum_h |x_h w_h| + |b|), with a little slack for the
// 1 / (1 - n u) factor.
TEST(RouterLogits, WithinTheF32SummationBoundOnNormalInputs) {
  const GemmCase cases[] = {
      {5, 128, 2048, DType::kBF16, DType::kBF16, false},
      {3, 256, 7168, DType::kBF16, DType::kF32, false},
      {17, 32, 2880, DType::kF32, DType::kF32, true},
      {9, 24, 300, DType::kF16, DType::kBF16, true},
  };
  uint64_t seed = 77;
  for (const GemmCase& c : cases) {
    ++seed;
    SCOPED_TRACE(describe(c, seed) + "; reproduce: moe_tests --gtest_filter=" +
                 "RouterLogits.WithinTheF32SummationBoundOnNormalInputs");
    const Tensor hidden =
        testing::random_normal(c.hidden_dtype, {c.num_tokens, c.hidden_size}, seed, 1.0f);
    const Tensor weight =
        testing::random_normal(c.weight_dtype, {c.num_experts, c.hidden_size}, seed + 1, 0.05f);
    const Tensor bias = testing::random_normal(DType::kF32, {c.num_experts}, seed + 2);
    const float* b = c.bias ? bias.data<float>() : nullptr;
    const std::vector<float> got = run_cpu(c, hidden, weight, b, 0);
    const std::vector<double> expected = run_reference(c, hidden, weight, b);
    const double slack = 1.01;
    for (int64_t t = 0; t < c.num_tokens; ++t) {
      for (int64_t e = 0; e < c.num_experts; ++e) {
        double magnitude = b ? std::abs(b[e]) : 0.0;
        for (int64_t h = 0; h < c.hidden_size; ++h) {
          magnitude += std::abs(testing::element(hidden, t * c.hidden_size + h) *
                                testing::element(weight, e * c.hidden_size + h));
        }
        const double bound =
            slack * static_cast<double>(c.hidden_size + 2) * kUnitRoundoff * magnitude;
        const size_t i = static_cast<size_t>(t * c.num_experts + e);
        ASSERT_LE(std::abs(got[i] - expected[i]), bound)
            << "token " << t << " expert " << e << ": expected " << expected[i] << ", got "
            << got[i];
      }
    }
  }
}

TEST(RouterLogits, BitwiseIndependentOfTheThreadCount) {
  const GemmCase c{37, 40, 300, DType::kBF16, DType::kBF16, true};
  const Tensor hidden = testing::random_normal(c.hidden_dtype, {c.num_tokens, c.hidden_size}, 5);
  const Tensor weight = testing::random_normal(c.weight_dtype, {c.num_experts, c.hidden_size}, 6);
  const Tensor bias = testing::random_normal(DType::kF32, {c.num_experts}, 7);
  const std::vector<float> one = run_cpu(c, hidden, weight, bias.data<float>(), 1);
  for (int threads : {2, 3, 0}) {
    const std::vector<float> many = run_cpu(c, hidden, weight, bias.data<float>(), threads);
    EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
        << threads << " threads";
  }
}

TEST(RouterLogits, NonFiniteTokenLeavesOtherTokensAlone) {
  const GemmCase c{6, 5, 20, DType::kF32, DType::kF32, false};
  Tensor hidden = testing::random_normal(c.hidden_dtype, {c.num_tokens, c.hidden_size}, 8);
  const Tensor weight = testing::random_normal(c.weight_dtype, {c.num_experts, c.hidden_size}, 9);
  const std::vector<float> clean = run_cpu(c, hidden, weight, nullptr, 2);
  hidden.data<float>()[2 * c.hidden_size + 3] = INFINITY;
  hidden.data<float>()[4 * c.hidden_size + 19] = NAN;
  const std::vector<float> dirty = run_cpu(c, hidden, weight, nullptr, 2);
  for (int64_t t : {0, 1, 3, 5}) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const size_t i = static_cast<size_t>(t * c.num_experts + e);
      EXPECT_EQ(dirty[i], clean[i]) << "token " << t << " expert " << e;
    }
  }
}

}  // namespace
}  // namespace moe
