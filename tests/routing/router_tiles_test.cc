// The router GEMM on a bf16 tile kernel (router_tiles.h) and the layer's choice of it
// (layer_router.h): against reference::router_logits on every kernel it can run here, the amx
// kernel's logic on emulated tiles everywhere and the real amx kernel where the machine has it.
//
// Small integers make every sum exact, so there each kernel must equal the reference bit for bit:
// that checks which token, expert and tail row each logit comes from. On normal operands the
// logits must stay within the worst-case bound of f32 summation (the hardware's order of adding a
// tile's products is its own). A logit must not depend on the batch, its place in the batch or the
// threads.
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "kernels/cpu/layer_router.h"
#include "kernels/cpu/router_tiles.h"
#include "kernels/cpu/routing.h"
#include "kernels/kernel_sets.h"
#include "kernels/reference/routing.h"
#include "moe/cpu_isa.h"
#include "moe/error.h"
#include "routing/guarded_buffer.h"

namespace moe {
namespace {

constexpr double kUnitRoundoff = 0x1p-24;

struct NamedTileKernel {
  std::string name;
  cpu::TileKernel kernel;
};

std::vector<NamedTileKernel> tile_kernels() {
  std::vector<NamedTileKernel> kernels = {{"emulated-amx", testing::emulated_amx_kernels().tile}};
  if (cpu_isa_supported(CpuIsa::kAmx)) kernels.push_back({"amx", cpu::amx_expert_kernels().tile});
  return kernels;
}

// The logits of tokens [first, first + count) of hidden [*, H] bf16.
std::vector<float> run_tiles(const cpu::TileKernel& kernel, const Tensor& hidden, int64_t first,
                             int64_t count, const Tensor& weight, const float* bias,
                             int num_threads) {
  const int64_t E = weight.size(0), H = weight.size(1);
  const Tensor packed = cpu::pack_router_tiles(weight.data<void>(), E, H, 2);
  std::vector<uint16_t> tail = cpu::router_tiles_tail_buffer(kernel, H);
  testing::GuardedBuffer<float> logits(count * E);
  cpu::router_logits_tiles(kernel, static_cast<const uint16_t*>(hidden.data<void>()) + first * H,
                           packed.data<uint8_t>(), bias, count, H, E, tail, logits.data(),
                           num_threads);
  EXPECT_TRUE(logits.guard_intact()) << "wrote past the end of logits";
  return std::vector<float>(logits.data(), logits.data() + logits.size());
}

std::vector<double> run_reference(const Tensor& hidden, const Tensor& weight, const float* bias) {
  const int64_t M = hidden.size(0), E = weight.size(0), H = weight.size(1);
  std::vector<double> logits(static_cast<size_t>(M * E));
  reference::router_logits(hidden.data<void>(), DType::kBF16, weight.data<void>(), DType::kBF16,
                           bias, M, H, E, logits.data());
  return logits;
}

// Token counts around the tail (16 rows) and the blocks (32), experts around a panel pair (32).
TEST(RouterTiles, ExactOnSmallIntegersForEveryRemainder) {
  int index = 0;
  for (int64_t m : {0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 70}) {
    for (int64_t e : {1, 8, 31, 32, 33, 128}) {
      for (int64_t h : {32, 96, 512}) {
        const uint64_t seed = 500 + static_cast<uint64_t>(index++);
        const bool with_bias = index % 2 == 0;
        SCOPED_TRACE(fmt::format("M={} E={} H={} bias {} seed {}", m, e, h, with_bias, seed));
        // |products| <= 9, H <= 512: every partial sum is an integer below 2^24.
        Tensor hidden(DType::kBF16, {m, h});
        Tensor weight(DType::kBF16, {e, h});
        Tensor bias(DType::kF32, {e});
        testing::fill_small_ints(hidden, seed, -3, 3);
        testing::fill_small_ints(weight, seed + 1, -3, 3);
        testing::fill_small_ints(bias, seed + 2, -8, 8);
        const float* b = with_bias ? bias.data<float>() : nullptr;
        const std::vector<double> expected = run_reference(hidden, weight, b);
        for (const NamedTileKernel& k : tile_kernels()) {
          const std::vector<float> got = run_tiles(k.kernel, hidden, 0, m, weight, b, 2);
          for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(static_cast<double>(got[i]), expected[i]) << k.name << ": logit " << i;
          }
        }
      }
    }
  }
}

// Any order of summing n terms in f32 is within gamma_n = n u / (1 - n u) of the exact sum,
// relative to the sum of |terms| (router_logits_test.cc says more); the products of bf16 values
// are exact.
TEST(RouterTiles, WithinTheF32SummationBoundOnNormalInputs) {
  // {tokens, experts, hidden size}: Qwen3-30B-A3B's, DeepSeek-V3's and gpt-oss's routers.
  const int64_t shapes[][3] = {{37, 128, 2048}, {3, 256, 7168}, {17, 60, 2880}};
  uint64_t seed = 91;
  for (const auto& [M, E, H] : shapes) {
    ++seed;
    SCOPED_TRACE(fmt::format("M={} E={} H={} seed {}", M, E, H, seed));
    const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, seed, 1.0f);
    const Tensor weight = testing::random_normal(DType::kBF16, {E, H}, seed + 1, 0.05f);
    const Tensor bias = testing::random_normal(DType::kF32, {E}, seed + 2);
    const std::vector<double> expected = run_reference(hidden, weight, bias.data<float>());
    for (const NamedTileKernel& k : tile_kernels()) {
      const std::vector<float> got =
          run_tiles(k.kernel, hidden, 0, M, weight, bias.data<float>(), 0);
      for (int64_t t = 0; t < M; ++t) {
        for (int64_t e = 0; e < E; ++e) {
          double magnitude = std::abs(bias.data<float>()[e]);
          for (int64_t h = 0; h < H; ++h) {
            magnitude +=
                std::abs(testing::element(hidden, t * H + h) * testing::element(weight, e * H + h));
          }
          const double bound = 1.01 * static_cast<double>(H + 2) * kUnitRoundoff * magnitude;
          const size_t i = static_cast<size_t>(t * E + e);
          ASSERT_LE(std::abs(got[i] - expected[i]), bound)
              << k.name << ": token " << t << " expert " << e;
        }
      }
    }
  }
}

TEST(RouterTiles, ALogitDependsOnlyOnItsTokenAndTheWeights) {
  const int64_t M = 53, E = 96, H = 256;
  const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, 5, 1.0f);
  const Tensor weight = testing::random_normal(DType::kBF16, {E, H}, 6, 0.05f);
  for (const NamedTileKernel& k : tile_kernels()) {
    SCOPED_TRACE(k.name);
    const std::vector<float> batch = run_tiles(k.kernel, hidden, 0, M, weight, nullptr, 2);
    for (int threads : {1, 3}) {
      const std::vector<float> again = run_tiles(k.kernel, hidden, 0, M, weight, nullptr, threads);
      EXPECT_EQ(std::memcmp(batch.data(), again.data(), batch.size() * sizeof(float)), 0)
          << threads << " threads";
    }
    // A token alone, and slices that put the same tokens in other blocks and in the tail.
    for (const auto& [first, count] :
         {std::pair<int64_t, int64_t>{0, 1}, {40, 1}, {52, 1}, {3, 20}, {7, 46}, {30, 23}}) {
      const std::vector<float> part = run_tiles(k.kernel, hidden, first, count, weight, nullptr, 2);
      EXPECT_EQ(std::memcmp(part.data(), batch.data() + first * E, part.size() * sizeof(float)), 0)
          << "tokens " << first << " to " << first + count - 1 << " on their own";
    }
  }
}

TEST(RouterTiles, RefusesWhatItCannotTake) {
  EXPECT_FALSE(cpu::router_tiles_fit(48));
  EXPECT_FALSE(cpu::router_tiles_fit(0));
  EXPECT_TRUE(cpu::router_tiles_fit(2048));
  const cpu::TileKernel kernel = testing::emulated_amx_kernels().tile;
  const Tensor hidden(DType::kBF16, {3, 48});
  const Tensor weight(DType::kBF16, {8, 64});
  const Tensor packed = cpu::pack_router_tiles(weight.data<void>(), 8, 64, 1);
  std::vector<uint16_t> tail = cpu::router_tiles_tail_buffer(kernel, 64);
  std::vector<float> logits(3 * 8);
  // The hidden rows are 48 wide here, which the [8, 64] weight does not match either: only the
  // argument that is wrong may be named.
  testing::expect_error(
      [&] {
        cpu::router_logits_tiles(kernel, hidden.data<void>(), packed.data<uint8_t>(), nullptr, 3,
                                 48, 8, tail, logits.data(), 1);
      },
      {"hidden_size", "multiple of 32", "48"});
  std::vector<uint16_t> short_tail(8);
  testing::expect_error(
      [&] {
        cpu::router_logits_tiles(kernel, hidden.data<void>(), packed.data<uint8_t>(), nullptr, 3,
                                 64, 8, short_tail, logits.data(), 1);
      },
      {"tail", "1024", "8"});
  const cpu::TileKernel f32_kernel = cpu::plain_expert_kernels(DType::kF32).tile;
  testing::expect_error(
      [&] {
        cpu::router_logits_tiles(f32_kernel, hidden.data<void>(), packed.data<uint8_t>(), nullptr,
                                 3, 64, 8, tail, logits.data(), 1);
      },
      {"kernel", "bf16", "f32"});
}

// The layer's router takes the tiles only on the amx path, for a bf16 weight and hidden and a
// hidden size they fit; any other hidden goes through the f32 panels, with their bits.
TEST(LayerRouter, TakesTheTilesOnlyOnTheAmxPathForBf16) {
  const int64_t M = 21, E = 40, H = 64;
  const Tensor weight = testing::random_normal(DType::kBF16, {E, H}, 8, 0.05f);
  const Tensor hidden_bf16 = testing::random_normal(DType::kBF16, {M, H}, 9, 1.0f);
  const Tensor hidden_f32 = Tensor::copy_of(hidden_bf16, DType::kF32);
  for (CpuIsa isa : supported_cpu_isas()) {
    if (isa == CpuIsa::kAuto) continue;
    SCOPED_TRACE(cpu_isa_name(isa));
    cpu::LayerRouter router(isa, weight.data<void>(), DType::kBF16, E, H, 2);
    EXPECT_EQ(router.takes_tiles(DType::kBF16), isa == CpuIsa::kAmx);
    EXPECT_FALSE(router.takes_tiles(DType::kF32));
    // The same bytes as a [40, 48] weight: 48 is no multiple of 32.
    const cpu::LayerRouter odd_size(isa, weight.data<void>(), DType::kBF16, E, 48, 2);
    EXPECT_FALSE(odd_size.takes_tiles(DType::kBF16));
    std::vector<float> got(static_cast<size_t>(M * E)), expected(got.size());
    router.logits(hidden_f32.data<void>(), DType::kF32, nullptr, M, got.data(), 2);
    const Tensor panels = cpu::pack_router_weight(weight.data<void>(), DType::kBF16, E, H, 2);
    cpu::router_logits(cpu::router_kernel(isa), hidden_f32.data<void>(), DType::kF32,
                       panels.data<float>(), nullptr, M, H, E, expected.data(), 2);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << "an f32 hidden goes through the f32 panels";
  }
}

}  // namespace
}  // namespace moe
