// The public route() and align_block_size() on device tensors against the same calls on the CPU:
// route within the f32 rounding of the router GEMM (ids equal except near ties), align entry for
// entry, and bad input refused before anything is queued (outputs stay poisoned).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "cuda/routing_configs.h"
#include "moe/align.h"
#include "moe/routing.h"

namespace moe {
namespace {

using testing::deepseek_routing;
using testing::DeviceTensor;
using testing::expect_error;
using testing::softmax_routing;

struct RouteCase {
  const char* name;
  RoutingConfig config;
  DType dtype;
  bool router_bias = false;
};

// Largest error of an f32 logit, summed in any order: H roundings of at most eps * sum |x w|.
double logit_error_bound(const Tensor& hidden, const Tensor& router) {
  const int64_t M = hidden.size(0), E = router.size(0), H = hidden.size(1);
  double worst = 0;
  for (int64_t t = 0; t < M; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double magnitude = 0;
      for (int64_t h = 0; h < H; ++h) {
        magnitude +=
            std::fabs(testing::element(hidden, t * H + h) * testing::element(router, e * H + h));
      }
      worst = std::max(worst, magnitude);
    }
  }
  return static_cast<double>(H) * std::ldexp(1.0, -24) * worst;
}

class CudaRouteApi : public testing::GpuTest {};

TEST_F(CudaRouteApi, MatchesTheCpuBackend) {
  const RouteCase cases[] = {
      {"qwen3 bf16", softmax_routing(128, 8, true), DType::kBF16},
      {"mixtral f32", softmax_routing(8, 2, true), DType::kF32},
      {"deepseek-v3 bf16", deepseek_routing(64, 6, 8, 3), DType::kBF16},
      {"gpt-oss f32", softmax_routing(32, 4, true), DType::kF32, true},
  };
  constexpr int64_t H = 96;
  for (const RouteCase& rc : cases) {
    for (int64_t M : {0, 1, 7, 300}) {
      SCOPED_TRACE(fmt::format("{} M={}", rc.name, M));
      RoutingConfig config = rc.config;
      config.has_router_bias = rc.router_bias;
      const int64_t E = config.num_experts, k = config.top_k;
      const Tensor hidden = testing::random_normal(rc.dtype, {M, H}, 20 + M);
      const Tensor router = testing::random_normal(rc.dtype, {E, H}, 30 + E, 0.1f);
      const Tensor correction = testing::random_normal(DType::kF32, {E}, 40, 0.1f);
      const Tensor bias = testing::random_normal(DType::kF32, {E}, 50, 0.5f);
      RoutingInputs host_inputs;
      if (config.has_correction_bias) host_inputs.correction_bias = correction;
      if (config.has_router_bias) host_inputs.router_bias = bias;
      const RoutingOutput want = route(config, hidden, router, host_inputs, Backend::kCpu);

      DeviceTensor d_hidden(hidden), d_router(router), d_correction(correction), d_bias(bias);
      RoutingInputs inputs;
      if (config.has_correction_bias) inputs.correction_bias = d_correction;
      if (config.has_router_bias) inputs.router_bias = d_bias;
      auto ids = DeviceTensor::empty_like(DType::kI32, {M, k});
      auto weights = DeviceTensor::empty_like(DType::kF32, {M, k});
      auto counts = DeviceTensor::empty_like(DType::kI32, {E});
      route(config, d_hidden, d_router, inputs, ids, weights, counts);
      const Tensor got_ids = ids.to_host(), got_weights = weights.to_host();
      const Tensor got_counts = counts.to_host();

      // Softmax weights move by at most twice the logit error (relative), renormalizing by as
      // much again; a sigmoid moves less.
      const double logit_error = logit_error_bound(hidden, router);
      std::vector<int32_t> histogram(E, 0);
      for (int64_t p = 0; p < M * k; ++p) {
        const int32_t want_id = want.topk_ids.data<int32_t>()[p];
        const int32_t got_id = got_ids.data<int32_t>()[p];
        ASSERT_GE(got_id, 0);
        ASSERT_LT(got_id, E);
        ++histogram[got_id];
        if (want_id != got_id) {
          // Only a near tie may swap: the two logits within twice the GEMM's error.
          const int64_t t = p / k;
          auto logit = [&](int32_t e) {
            double sum = config.has_router_bias ? bias.data<float>()[e] : 0.0;
            for (int64_t h = 0; h < H; ++h) {
              sum += testing::element(hidden, t * H + h) * testing::element(router, e * H + h);
            }
            const double selection =
                config.scoring == ScoringFunc::kSoftmax ? sum : 1.0 / (1.0 + std::exp(-sum));
            return config.has_correction_bias ? selection + correction.data<float>()[e] : selection;
          };
          EXPECT_NEAR(logit(want_id), logit(got_id), 2 * logit_error + 1e-6)
              << "pair " << p << ": " << want_id << " vs " << got_id;
          continue;
        }
        const float w = want.topk_weights.data<float>()[p], g = got_weights.data<float>()[p];
        EXPECT_NEAR(g, w, (4 * logit_error + 1e-6) * std::fabs(w) + 1e-7) << "pair " << p;
      }
      for (int64_t e = 0; e < E; ++e) {
        EXPECT_EQ(got_counts.data<int32_t>()[e], histogram[e]) << "expert " << e;
      }
    }
  }
}

TEST_F(CudaRouteApi, BadInputIsRefusedBeforeLaunch) {
  const RoutingConfig config = softmax_routing(16, 2, true);
  const Tensor hidden = testing::random_normal(DType::kBF16, {4, 32}, 1);
  const Tensor router = testing::random_normal(DType::kBF16, {16, 32}, 2);
  const Tensor hidden_f16 = testing::random_normal(DType::kF16, {4, 32}, 3);
  const Tensor router_f32 = testing::random_normal(DType::kF32, {16, 32}, 4);
  DeviceTensor d_hidden(hidden), d_router(router), d_hidden_f16(hidden_f16);
  DeviceTensor d_router_f32(router_f32);
  auto ids = DeviceTensor::empty_like(DType::kI32, {4, 2});
  auto weights = DeviceTensor::empty_like(DType::kF32, {4, 2});
  Tensor host_ids(DType::kI32, {4, 2});

  expect_error([&] { route(config, d_hidden, router, {}, ids, weights); },
               {"router_weight", "GPU", "CPU"});
  expect_error([&] { route(config, d_hidden, d_router, {}, host_ids, weights); },
               {"topk_ids", "GPU", "CPU"});
  expect_error([&] { route(config, d_hidden_f16, d_router, {}, ids, weights); },
               {"router_weight", "bf16 or both f32", "f16"});
  expect_error([&] { route(config, d_hidden, d_router_f32, {}, ids, weights); },
               {"router_weight", "hidden bf16, router_weight f32"});
  expect_error([&] { route(config, d_hidden, d_router, {}, ids, weights, {}, Backend::kCpu); },
               {"backend", "GPU", "cpu"});
  expect_error([&] { route(config, d_hidden, d_router); }, {"hidden", "allocating route()"});
  RoutingConfig many = softmax_routing(600, 2, true);
  const Tensor router600 = testing::random_normal(DType::kBF16, {600, 32}, 5);
  DeviceTensor d_router600(router600);
  expect_error([&] { route(many, d_hidden, d_router600, {}, ids, weights); },
               {"config", "512 experts", "600"});
  // Nothing was queued: the outputs still hold their poison.
  const Tensor after = ids.to_host();
  for (int64_t p = 0; p < after.numel(); ++p) ASSERT_EQ(after.data<int32_t>()[p], -1);
}

class CudaAlignApi : public testing::GpuTest {};

TEST_F(CudaAlignApi, MatchesTheCpuLayoutExactly) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 40; ++i) {
    const int64_t E = 1 + rng() % 300, M = rng() % 600, block_m = 1 + rng() % 130;
    const int64_t k = 1 + rng() % std::min<int64_t>(E, 8);
    const bool with_map = i % 3 == 0;
    SCOPED_TRACE(fmt::format("case {}: M={} k={} E={} block_m={}{}", i, M, k, E, block_m,
                             with_map ? " map" : ""));
    Tensor ids(DType::kI32, {M, k});
    testing::fill_uniform_int(ids, 100 + i, 0, static_cast<int32_t>(E - 1));
    Tensor map(DType::kI32, {E});
    int32_t next = 0;
    for (int64_t e = 0; e < E; ++e) map.data<int32_t>()[e] = e % 3 == 1 ? -1 : next++;
    const TensorView host_map = with_map ? map.view() : TensorView();
    const AlignedPairs want = align_block_size(ids, E, block_m, host_map);

    const int64_t capacity = max_num_pairs_post_padded(M * k, E, block_m);
    DeviceTensor d_ids(ids), d_map(map);
    auto sorted = DeviceTensor::empty_like(DType::kI32, {capacity});
    auto blocks = DeviceTensor::empty_like(DType::kI32, {capacity / block_m});
    auto total = DeviceTensor::empty_like(DType::kI32, {1});
    align_block_size(d_ids, E, block_m, with_map ? d_map.view() : TensorView(), sorted, blocks,
                     total);
    ASSERT_EQ(total.to_host().data<int32_t>()[0], want.num_pairs_post_padded);
    const Tensor got_sorted = sorted.to_host(), got_blocks = blocks.to_host();
    for (int64_t j = 0; j < want.num_pairs_post_padded; ++j) {
      ASSERT_EQ(got_sorted.data<int32_t>()[j], want.sorted_pair_ids[j]) << "entry " << j;
    }
    for (size_t b = 0; b < want.expert_ids.size(); ++b) {
      ASSERT_EQ(got_blocks.data<int32_t>()[b], want.expert_ids[b]) << "block " << b;
    }
  }
}

TEST_F(CudaAlignApi, BadInputIsRefusedBeforeLaunch) {
  Tensor ids(DType::kI32, {3, 2});
  testing::fill_uniform_int(ids, 1, 0, 7);
  DeviceTensor d_ids(ids);
  const int64_t capacity = max_num_pairs_post_padded(6, 8, 4);
  auto sorted = DeviceTensor::empty_like(DType::kI32, {capacity});
  auto blocks = DeviceTensor::empty_like(DType::kI32, {capacity / 4});
  auto total = DeviceTensor::empty_like(DType::kI32, {1});
  auto short_sorted = DeviceTensor::empty_like(DType::kI32, {capacity - 1});
  Tensor host_total(DType::kI32, {1});
  Tensor map(DType::kI32, {8});
  testing::fill_uniform_int(map, 2, -1, 3);

  expect_error([&] { align_block_size(d_ids, 8, 4, {}, short_sorted, blocks, total); },
               {"sorted_pair_ids", "room for at least"});
  expect_error([&] { align_block_size(d_ids, 8, 4, {}, sorted, blocks, host_total); },
               {"num_pairs_post_padded", "GPU", "CPU"});
  expect_error([&] { align_block_size(d_ids, 8, 4, map, sorted, blocks, total); },
               {"expert_map", "GPU", "CPU"});
  expect_error([&] { align_block_size(d_ids, 8, 0, {}, sorted, blocks, total); }, {"block_m"});
  expect_error([&] { align_block_size(d_ids, 8, 4); }, {"topk_ids", "host vectors"});
  Tensor wide(DType::kI32, {3, 2});
  testing::fill_uniform_int(wide, 3, 0, 7);
  DeviceTensor d_wide(wide);
  const int64_t big = max_num_pairs_post_padded(6, 9000, 1);
  auto big_sorted = DeviceTensor::empty_like(DType::kI32, {big});
  expect_error([&] { align_block_size(d_wide, 9000, 1, {}, big_sorted, big_sorted, total); },
               {"num_experts", "8192", "9000"});
  const Tensor after = total.to_host();
  EXPECT_EQ(after.data<int32_t>()[0], -1);  // still poisoned: nothing ran
}

}  // namespace
}  // namespace moe
