// The router GEMM kernels: cpu::router_logits through every runnable kernel (router_kernel_sets.h)
// against reference::router_logits, and the packed layout it reads.
//
// Small integer operands make every product and partial sum exact in f32, so there each kernel
// must equal the reference bit for bit whatever its summation order; on normal operands it must
// stay within the worst-case bound of f32 summation, and the fused paths must equal one std::fma
// per product in ascending h, bit for bit. A logit must not depend on the thread count or on the
// batch its token is part of.
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "kernels/cpu/routing.h"
#include "kernels/reference/routing.h"
#include "routing/guarded_buffer.h"
#include "routing/router_kernel_sets.h"

namespace moe {
namespace {

using testing::RouterKernelSet;

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

Tensor pack(const GemmCase& c, const Tensor& weight) {
  return cpu::pack_router_weight(weight.data<void>(), c.weight_dtype, c.num_experts, c.hidden_size,
                                 2);
}

// The logits of `num_tokens` rows of hidden from row `first_token` on, on the packed weight
// (`panels`), or on the plain one converted on the way (`panels` null).
std::vector<float> run_cpu(const RouterKernelSet& set, const GemmCase& c, const Tensor& hidden,
                           int64_t first_token, int64_t num_tokens, const Tensor& weight,
                           const Tensor* panels, const float* bias, int num_threads) {
  testing::GuardedBuffer<float> logits(num_tokens * c.num_experts);
  const auto* rows = static_cast<const char*>(hidden.data<void>()) +
                     first_token * c.hidden_size * dtype_size(c.hidden_dtype);
  if (panels) {
    cpu::router_logits(set.kernel, rows, c.hidden_dtype, panels->data<float>(), bias, num_tokens,
                       c.hidden_size, c.num_experts, logits.data(), num_threads);
  } else {
    cpu::router_logits_unpacked(set.kernel, rows, c.hidden_dtype, weight.data<void>(),
                                c.weight_dtype, bias, num_tokens, c.hidden_size, c.num_experts,
                                logits.data(), num_threads);
  }
  EXPECT_TRUE(logits.guard_intact()) << set.name << ": router_logits wrote past the end of logits";
  return std::vector<float>(logits.data(), logits.data() + logits.size());
}

// Packed and unpacked weights: both forms must give these logits.
std::vector<std::vector<float>> run_both_forms(const RouterKernelSet& set, const GemmCase& c,
                                               const Tensor& hidden, const Tensor& weight,
                                               const float* bias, int num_threads) {
  const Tensor panels = pack(c, weight);
  return {run_cpu(set, c, hidden, 0, c.num_tokens, weight, &panels, bias, num_threads),
          run_cpu(set, c, hidden, 0, c.num_tokens, weight, nullptr, bias, num_threads)};
}

constexpr const char* kFormNames[] = {"packed", "unpacked"};

std::vector<double> run_reference(const GemmCase& c, const Tensor& hidden, const Tensor& weight,
                                  const float* bias) {
  std::vector<double> logits(static_cast<size_t>(c.num_tokens * c.num_experts));
  reference::router_logits(hidden.data<void>(), c.hidden_dtype, weight.data<void>(), c.weight_dtype,
                           bias, c.num_tokens, c.hidden_size, c.num_experts, logits.data());
  return logits;
}

bool same_bits(const std::vector<float>& a, const float* b) {
  return std::memcmp(a.data(), b, a.size() * sizeof(float)) == 0;
}

TEST(RouterLogits, PackedWeightIsPanelsOfExpertsStoredHMajor) {
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  // 16 experts per panel, or 8 for at most 8 experts.
  for (int64_t E : {1, 5, 8, 9, 37}) {
    const DType dtype = dtypes[E % 3];
    SCOPED_TRACE(fmt::format("E={} weight {}", E, dtype_name(dtype)));
    const int64_t H = 300, width = E <= 8 ? 8 : 16, num_panels = (E + width - 1) / width;
    ASSERT_EQ(cpu::router_panel_width(E), width);
    const Tensor weight = testing::random_normal(dtype, {E, H}, 11);
    const Tensor panels = cpu::pack_router_weight(weight.data<void>(), dtype, E, H, 2);
    ASSERT_EQ(panels.shape(), (Shape{num_panels, H, width}));
    for (int64_t p = 0; p < num_panels; ++p) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t c = 0; c < width; ++c) {
          const int64_t e = p * width + c;
          const double expected = e < E ? testing::element(weight, e * H + h) : 0.0;
          ASSERT_EQ(panels.data<float>()[(p * H + h) * width + c], expected)
              << "expert " << e << " h " << h;
        }
      }
    }
  }
}

// Sizes one below, at and one above the register tiles (2, 4, 6 and 12 rows; panels of 8 and 16
// experts), the work items (24 tokens x 128 experts) and the hidden chunk (256), plus M = 0.
TEST(RouterLogits, ExactOnSmallIntegersForEveryRemainder) {
  const std::vector<RouterKernelSet> sets = testing::runnable_router_kernels();
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  int index = 0;
  for (int64_t m : {0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 23, 24, 25, 49}) {
    for (int64_t e : {1, 2, 7, 8, 9, 16, 17, 33, 128, 129}) {
      for (int64_t h : {1, 7, 9, 255, 256, 257, 513}) {
        const GemmCase c{m, e, h, dtypes[index % 3], dtypes[(index / 3) % 3], index % 2 == 0};
        const uint64_t seed = 1000 + static_cast<uint64_t>(index++);
        SCOPED_TRACE(describe(c, seed) + "; reproduce: moe_tests --gtest_filter=" +
                     "RouterLogits.ExactOnSmallIntegersForEveryRemainder");
        // |products| <= 9 and H <= 513: every partial sum is an integer below 2^24.
        Tensor hidden(c.hidden_dtype, {m, h});
        Tensor weight(c.weight_dtype, {e, h});
        Tensor bias(DType::kF32, {e});
        testing::fill_small_ints(hidden, seed, -3, 3);
        testing::fill_small_ints(weight, seed + 1, -3, 3);
        testing::fill_small_ints(bias, seed + 2, -8, 8);
        const float* b = c.bias ? bias.data<float>() : nullptr;
        const std::vector<double> expected = run_reference(c, hidden, weight, b);
        for (const RouterKernelSet& set : sets) {
          const auto forms = run_both_forms(set, c, hidden, weight, b, 2);
          for (size_t form = 0; form < forms.size(); ++form) {
            for (size_t i = 0; i < forms[form].size(); ++i) {
              ASSERT_EQ(static_cast<double>(forms[form][i]), expected[i])
                  << set.name << ", " << kFormNames[form] << ": logit " << i;
            }
          }
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
    const std::vector<double> expected = run_reference(c, hidden, weight, b);
    for (const RouterKernelSet& set : testing::runnable_router_kernels()) {
      const Tensor panels = pack(c, weight);
      const std::vector<float> got =
          run_cpu(set, c, hidden, 0, c.num_tokens, weight, &panels, b, 0);
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
              << set.name << ": token " << t << " expert " << e << ": expected " << expected[i]
              << ", got " << got[i];
        }
      }
    }
  }
}

// The order router_kernel.h promises, bit for bit: logit = x_0 w_0 + x_1 w_1 + ... added in
// ascending h from 0, then + bias, in f32; fused (one std::fma per product) on every path but
// plain, which rounds each product and then each sum. Sizes cross the hidden chunks (256),
// several work items, both panel widths and every tile remainder.
TEST(RouterLogits, EveryPathAddsEachProductInAscendingH) {
  const GemmCase cases[] = {
      {29, 40, 700, DType::kBF16, DType::kBF16, true},
      {13, 130, 513, DType::kF32, DType::kF16, false},
      {7, 2, 2048, DType::kF16, DType::kF32, true},
      {9, 8, 64, DType::kF32, DType::kF32, false},
  };
  uint64_t seed = 300;
  for (const GemmCase& c : cases) {
    ++seed;
    SCOPED_TRACE(describe(c, seed) + "; reproduce: moe_tests --gtest_filter=" +
                 "RouterLogits.EveryPathAddsEachProductInAscendingH");
    const Tensor hidden =
        testing::random_normal(c.hidden_dtype, {c.num_tokens, c.hidden_size}, seed);
    const Tensor weight =
        testing::random_normal(c.weight_dtype, {c.num_experts, c.hidden_size}, seed + 1, 0.05f);
    const Tensor bias = testing::random_normal(DType::kF32, {c.num_experts}, seed + 2);
    const float* b = c.bias ? bias.data<float>() : nullptr;
    // [fused?][M * E]
    std::vector<float> expected[2];
    for (int fused = 0; fused < 2; ++fused) {
      for (int64_t t = 0; t < c.num_tokens; ++t) {
        for (int64_t e = 0; e < c.num_experts; ++e) {
          float sum = 0;
          for (int64_t h = 0; h < c.hidden_size; ++h) {
            const auto x = static_cast<float>(testing::element(hidden, t * c.hidden_size + h));
            const auto w = static_cast<float>(testing::element(weight, e * c.hidden_size + h));
            if (fused) {
              sum = std::fma(x, w, sum);
            } else {
              // Two statements: no compiler fuses across them.
              const float product = x * w;
              sum += product;
            }
          }
          expected[fused].push_back(b ? sum + b[e] : sum);
        }
      }
    }
    for (const RouterKernelSet& set : testing::runnable_router_kernels()) {
      const std::vector<float>& want = expected[set.fused ? 1 : 0];
      const auto forms = run_both_forms(set, c, hidden, weight, b, 2);
      for (size_t form = 0; form < forms.size(); ++form) {
        const std::vector<float>& got = forms[form];
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
              << set.name << ", " << kFormNames[form] << ": logit " << i << " expected " << want[i]
              << ", got " << got[i];
        }
      }
      // Each token alone, as decode runs it.
      const Tensor panels = pack(c, weight);
      for (int64_t t = 0; t < c.num_tokens; ++t) {
        const std::vector<float> alone = run_cpu(set, c, hidden, t, 1, weight, &panels, b, 1);
        ASSERT_TRUE(same_bits(alone, want.data() + t * c.num_experts))
            << set.name << ": token " << t << " alone";
      }
    }
  }
}

// Decode-sized batches split the experts across threads, larger ones the tokens; E = 200 makes
// two groups of panels even for one thread.
TEST(RouterLogits, BitwiseIndependentOfTheThreadCount) {
  for (int64_t m : {1, 5, 53}) {
    const GemmCase c{m, 200, 300, DType::kBF16, DType::kBF16, true};
    SCOPED_TRACE(describe(c, 5));
    const Tensor hidden = testing::random_normal(c.hidden_dtype, {c.num_tokens, c.hidden_size}, 5);
    const Tensor weight = testing::random_normal(c.weight_dtype, {c.num_experts, c.hidden_size}, 6);
    const Tensor bias = testing::random_normal(DType::kF32, {c.num_experts}, 7);
    const Tensor panels = pack(c, weight);
    for (const RouterKernelSet& set : testing::runnable_router_kernels()) {
      const float* b = bias.data<float>();
      const std::vector<float> one = run_cpu(set, c, hidden, 0, m, weight, &panels, b, 1);
      for (int threads : {2, 3, 0}) {
        const std::vector<float> many = run_cpu(set, c, hidden, 0, m, weight, &panels, b, threads);
        EXPECT_TRUE(same_bits(one, many.data())) << set.name << ", " << threads << " threads";
        const std::vector<float> unpacked =
            run_cpu(set, c, hidden, 0, m, weight, nullptr, b, threads);
        EXPECT_TRUE(same_bits(one, unpacked.data()))
            << set.name << ", unpacked, " << threads << " threads";
      }
    }
  }
}

// A token's logits alone, in a slice of the batch and in the whole batch, on the packed or the
// plain weight: the same bits.
TEST(RouterLogits, BitwiseIndependentOfTheBatch) {
  // Panels of 16 experts over two groups, and of 8.
  const GemmCase cases[] = {{61, 200, 300, DType::kF16, DType::kBF16, true},
                            {37, 5, 300, DType::kF32, DType::kF32, false}};
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(describe(c, 21));
    const Tensor hidden = testing::random_normal(c.hidden_dtype, {c.num_tokens, c.hidden_size}, 21);
    const Tensor weight =
        testing::random_normal(c.weight_dtype, {c.num_experts, c.hidden_size}, 22);
    const Tensor bias = testing::random_normal(DType::kF32, {c.num_experts}, 23);
    const Tensor panels = pack(c, weight);
    const float* b = c.bias ? bias.data<float>() : nullptr;
    const size_t E = static_cast<size_t>(c.num_experts);
    for (const RouterKernelSet& set : testing::runnable_router_kernels()) {
      const std::vector<float> batch =
          run_cpu(set, c, hidden, 0, c.num_tokens, weight, &panels, b, 2);
      for (int64_t t = 0; t < c.num_tokens; ++t) {
        const std::vector<float> alone = run_cpu(set, c, hidden, t, 1, weight, &panels, b, 2);
        ASSERT_TRUE(same_bits(alone, batch.data() + t * E)) << set.name << ": token " << t;
        // As route() runs a few tokens: on the plain weight.
        const std::vector<float> unpacked = run_cpu(set, c, hidden, t, 1, weight, nullptr, b, 2);
        ASSERT_TRUE(same_bits(unpacked, batch.data() + t * E))
            << set.name << ": token " << t << " on the unpacked weight";
      }
      const int64_t first = 7, count = 30;
      const std::vector<float> slice = run_cpu(set, c, hidden, first, count, weight, &panels, b, 3);
      EXPECT_TRUE(same_bits(slice, batch.data() + first * E))
          << set.name << ": tokens " << first << ".." << first + count - 1;
    }
  }
}

TEST(RouterLogits, NonFiniteTokenLeavesOtherTokensAlone) {
  const GemmCase c{6, 5, 20, DType::kF32, DType::kF32, false};
  Tensor hidden = testing::random_normal(c.hidden_dtype, {c.num_tokens, c.hidden_size}, 8);
  const Tensor weight = testing::random_normal(c.weight_dtype, {c.num_experts, c.hidden_size}, 9);
  for (const RouterKernelSet& set : testing::runnable_router_kernels()) {
    Tensor dirty_hidden = Tensor::copy_of(hidden, c.hidden_dtype);
    dirty_hidden.data<float>()[2 * c.hidden_size + 3] = INFINITY;
    dirty_hidden.data<float>()[4 * c.hidden_size + 19] = NAN;
    const Tensor panels = pack(c, weight);
    const std::vector<float> clean =
        run_cpu(set, c, hidden, 0, c.num_tokens, weight, &panels, nullptr, 2);
    const std::vector<float> dirty =
        run_cpu(set, c, dirty_hidden, 0, c.num_tokens, weight, &panels, nullptr, 2);
    for (int64_t t : {0, 1, 3, 5}) {
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const size_t i = static_cast<size_t>(t * c.num_experts + e);
        EXPECT_EQ(dirty[i], clean[i]) << set.name << ": token " << t << " expert " << e;
      }
    }
  }
}

}  // namespace
}  // namespace moe
