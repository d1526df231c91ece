// The fused act against the float64 formulas of the reference backend. Each f32 result is a few
// roundings from the exact value and the vectorized exp adds a truncation below 2e-7 relative,
// hence 2e-6 relative. GELU's 1 + erf(x) (or 1 + tanh) cancels for negative x, turning the f32
// rounding of erf (a few 2^-24 absolute) into an absolute error of a few 2^-24 * |gate * up|:
// hence 1e-6 * |gate * up| more, and a denormal-sized slack for results that underflow.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gated_activation.h"
#include "kernels/reference/experts.h"

namespace moe::testing {
namespace {

constexpr double kRelativeBound = 2e-6;
constexpr double kCancellationBound = 1e-6;
constexpr double kAbsoluteSlack = 1e-35;

void check_activation(Activation activation, const std::vector<float>& gate,
                      const std::vector<float>& up) {
  const cpu::ActivationParams params{activation, 1.702f, 7.0f};
  for (int64_t width : {1, 5, 15, 16, 17, 31, 32, 40}) {
    if (width > static_cast<int64_t>(gate.size())) break;
    std::vector<float> out(static_cast<size_t>(width) + 1, 12345.0f);  // one guard element
    cpu::gated_activation(params, gate.data(), up.data(), width, out.data());
    EXPECT_EQ(out[width], 12345.0f) << "wrote past width " << width;
    for (int64_t i = 0; i < width; ++i) {
      const double expected =
          reference::gated_activation(activation, gate[i], up[i], params.alpha, params.limit);
      const double bound = kRelativeBound * std::abs(expected) +
                           kCancellationBound * std::abs(double{gate[i]} * up[i]) + kAbsoluteSlack;
      ASSERT_LE(std::abs(out[i] - expected), bound)
          << "activation " << static_cast<int>(activation) << " gate " << gate[i] << " up " << up[i]
          << " got " << out[i] << " expected " << expected;
    }
  }
}

TEST(GatedActivation, MatchesTheFloat64Formulas) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int a = 0; a < 4; ++a) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> gate(40), up(40);
      for (float& g : gate) g = normal(rng);
      for (float& u : up) u = normal(rng);
      check_activation(static_cast<Activation>(a), gate, up);
    }
  }
}

TEST(GatedActivation, ExtremeGates) {
  // Past both ends of the exp's clamp, zero, and values where sigmoid saturates.
  const std::vector<float> gate = {-200, -100,  -88,   -87.3f, -20, -1e-30f, 0,  1e-30f,
                                   20,   87.3f, 88.7f, 89,     100, 200,     -3, 3};
  const std::vector<float> up(gate.size(), 1.5f);
  for (int a = 0; a < 4; ++a) check_activation(static_cast<Activation>(a), gate, up);
}

TEST(GatedActivation, NanStaysNan) {
  std::vector<float> gate(16, 1.0f), up(16, 1.0f), out(16);
  gate[3] = std::numeric_limits<float>::quiet_NaN();
  cpu::gated_activation({Activation::kSilu, 1.702f, 7.0f}, gate.data(), up.data(), 16, out.data());
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_FALSE(std::isnan(out[4]));
}

}  // namespace
}  // namespace moe::testing
