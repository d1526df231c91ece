// MoeLayer end to end (route + experts) against the same layer on the reference backend, and
// the properties a serving engine relies on: workspace reuse, counts, isolation of bad tokens.
#include "moe/layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "common/small_family_config.h"
#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/error.h"

namespace moe {
namespace {

using testing::compare;
using testing::Comparison;
using testing::expect_error;
using testing::random_normal;
using testing::small_family_config;

// A small layer of each routing family, built through the same code as the presets.
MoeConfig small_config(const std::string& family) {
  MoeConfig c = small_family_config(family);
  if (family == "deepseek") {
    c.routing.num_experts = 16;  // 8 groups of 2, 4 groups kept, top-8 as in the model
  } else {
    c.routing.num_experts = 12;
    c.routing.top_k = std::min<int64_t>(c.routing.top_k, 4);
  }
  return c;
}

// Output rounding (bf16: 1e-2, as in tests/experts), plus 1e-2 where the path rounds the GEMM
// inputs of bf16 weights to bf16 (amx, avx512bf16: tests/experts derives it).
double layer_tolerance(DType dtype, CpuIsa isa) {
  const bool bf16_inputs =
      dtype == DType::kBF16 && (isa == CpuIsa::kAmx || isa == CpuIsa::kAvx512Bf16);
  return (dtype == DType::kF32 ? 1e-5 : 1e-2) + (bf16_inputs ? 1e-2 : 0.0);
}

void expect_layer_matches_reference(const std::string& family, DType dtype, int64_t tokens,
                                    CpuIsa isa = CpuIsa::kAuto, int64_t hidden_size = 40) {
  SCOPED_TRACE(family + " " + std::string(dtype_name(dtype)) + " M=" + std::to_string(tokens) +
               " H=" + std::to_string(hidden_size) + " isa=" + std::string(cpu_isa_name(isa)));
  MoeConfig config = small_config(family);
  config.experts.hidden_size = hidden_size;
  const LayerWeights weights = synthetic_layer_weights(config, dtype, 42);
  MoeLayer layer(config, weights, LayerOptions{Backend::kCpu, 2, 0, isa});
  MoeLayer reference(config, weights, LayerOptions{Backend::kReference, 1, 0});
  const Tensor hidden = random_normal(dtype, {tokens, config.experts.hidden_size}, 7);
  const Tensor got = layer.forward(hidden);
  const Tensor expected = reference.forward(Tensor::copy_of(hidden, DType::kF32));
  const Comparison cmp = compare(got, expected);
  EXPECT_LE(cmp.max_rel_error, layer_tolerance(dtype, layer.cpu_isa())) << cmp.describe();

  const TensorView ids = layer.last_topk_ids();
  const TensorView ref_ids = reference.last_topk_ids();
  ASSERT_EQ(ids.shape, ref_ids.shape);
  EXPECT_TRUE(std::equal(ids.as<int32_t>(), ids.as<int32_t>() + ids.numel(), ref_ids.as<int32_t>()))
      << "routing differs";
  int64_t total = 0;
  const TensorView counts = layer.last_expert_counts();
  for (int64_t e = 0; e < counts.numel(); ++e) total += counts.as<int32_t>()[e];
  EXPECT_EQ(total, tokens * config.routing.top_k);
}

TEST(MoeLayer, EveryFamilyMatchesReference) {
  for (const char* family : {"qwen3", "qwen2", "deepseek", "llama4", "gpt-oss"}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t tokens : {0, 1, 3, 37}) expect_layer_matches_reference(family, dtype, tokens);
    }
  }
}

TEST(MoeLayer, EverySupportedPathMatchesReference) {
  for (CpuIsa isa : supported_cpu_isas()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t tokens : {1, 40}) expect_layer_matches_reference("qwen2", dtype, tokens, isa);
    }
  }
}

// bf16 layers whose hidden size the router's tile kernel takes (a multiple of 32): the amx path
// routes them through it (kernels/cpu/layer_router.h), the others through the f32 panels.
TEST(MoeLayer, Bf16LayersOfATileSizeMatchReferenceOnEveryPath) {
  for (CpuIsa isa : supported_cpu_isas()) {
    for (const char* family : {"qwen3", "deepseek", "gpt-oss"}) {
      for (int64_t tokens : {1, 17, 40}) {
        expect_layer_matches_reference(family, DType::kBF16, tokens, isa, 64);
      }
    }
  }
}

TEST(MoeLayer, KeepsOnlyThePackedExpertWeights) {
  const MoeConfig config = small_config("qwen2");
  const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 4);
  const MoeLayer layer(config, weights, LayerOptions{Backend::kCpu, 2, 0});
  EXPECT_EQ(layer.cpu_isa(), resolve_cpu_isa());
  EXPECT_EQ(layer.weight_dtype(), DType::kBF16);
  for (const Tensor* plain : {&layer.weights().w13, &layer.weights().w2,
                              &layer.weights().shared_w13, &layer.weights().shared_w2}) {
    EXPECT_FALSE(plain->defined());
  }
  EXPECT_TRUE(layer.weights().router.defined());
  const LayerWeights unpacked = layer.unpacked_weights();
  for (const auto& [name, got, expected] :
       {std::tuple{"w13", unpacked.w13, weights.w13}, std::tuple{"w2", unpacked.w2, weights.w2},
        std::tuple{"shared_w13", unpacked.shared_w13, weights.shared_w13},
        std::tuple{"shared_w2", unpacked.shared_w2, weights.shared_w2}}) {
    ASSERT_EQ(got.shape(), expected.shape()) << name;
    EXPECT_EQ(std::memcmp(got.data<void>(), expected.data<void>(), got.nbytes()), 0) << name;
  }
  // The reference backend keeps the plain weights.
  const MoeLayer reference(config, weights, LayerOptions{Backend::kReference, 1, 0});
  EXPECT_TRUE(reference.weights().w13.defined());
  EXPECT_EQ(reference.cpu_isa(), CpuIsa::kAuto);
}

TEST(MoeLayer, ForwardExpertsOnTheLayersOwnRoutingIsForward) {
  const MoeConfig config = small_config("deepseek");
  const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 8);
  MoeLayer layer(config, weights, LayerOptions{Backend::kCpu, 2, 0});
  const Tensor hidden = random_normal(DType::kBF16, {13, 40}, 9);
  const Tensor routed = layer.forward(hidden);
  const Tensor ids = Tensor::copy_of(layer.last_topk_ids(), DType::kI32);
  const Tensor weights_of_pairs = Tensor::copy_of(layer.last_topk_weights(), DType::kF32);
  Tensor experts(DType::kBF16, {13, 40});
  layer.forward_experts(hidden, ids, weights_of_pairs, experts);
  EXPECT_EQ(std::memcmp(routed.data<void>(), experts.data<void>(), routed.nbytes()), 0);

  ids.data<int32_t>()[5] = static_cast<int32_t>(config.routing.num_experts);
  expect_error([&] { layer.forward_experts(hidden, ids, weights_of_pairs, experts); },
               {"topk_ids", std::to_string(config.routing.num_experts)});
  expect_error([&] { layer.forward_experts(hidden, weights_of_pairs, ids, experts); },
               {"topk_ids"});
}

// Calls a layer cannot take fail with the argument named, before anything is read: no data
// behind hidden, out or the routing, more pairs than int32 numbers, a weight that is not finite.
TEST(MoeLayer, BadCallsNameTheArgument) {
  const MoeConfig config = small_config("qwen3");
  const LayerWeights weights = synthetic_layer_weights(config, DType::kF32, 1);
  MoeLayer layer(config, weights, LayerOptions{Backend::kCpu, 1, 0});
  const int64_t H = config.experts.hidden_size, k = config.routing.top_k;
  const Tensor hidden = random_normal(DType::kF32, {3, H}, 5);
  Tensor out(DType::kF32, {3, H});
  const TensorView no_rows(nullptr, DType::kF32, {3, H});
  expect_error([&] { layer.forward(no_rows, out); }, {"hidden", "null"});
  expect_error([&] { layer.forward(hidden, no_rows); }, {"out", "null"});
  // A shape whose pairs int32 cannot number; its data is never read.
  const int64_t too_many = std::numeric_limits<int32_t>::max() / k + 1;
  const TensorView huge(hidden.data<float>(), DType::kF32, {too_many, H});
  expect_error([&] { layer.forward(huge, huge); }, {"hidden", std::to_string(too_many), "pairs"});

  layer.forward(hidden, out);
  const Tensor ids = Tensor::copy_of(layer.last_topk_ids(), DType::kI32);
  const Tensor weights_of_pairs = Tensor::copy_of(layer.last_topk_weights(), DType::kF32);
  expect_error(
      [&] {
        layer.forward_experts(hidden, TensorView(nullptr, DType::kI32, {3, k}), weights_of_pairs,
                              out);
      },
      {"topk_ids", "null"});
  expect_error(
      [&] {
        layer.forward_experts(hidden, ids, TensorView(nullptr, DType::kF32, {3, k}), out);
      },
      {"topk_weights", "null"});
  weights_of_pairs.data<float>()[k + 1] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { layer.forward_experts(hidden, ids, weights_of_pairs, out); },
               {"topk_weights", "finite", "token 1, slot 1"});
}

TEST(MoeLayer, ReusesItsWorkspaceAcrossBatchSizes) {
  const MoeConfig config = small_config("qwen3");
  const LayerWeights weights = synthetic_layer_weights(config, DType::kF32, 1);
  MoeLayer layer(config, weights);
  MoeLayer fresh(config, weights);
  for (int64_t tokens : {50, 1, 20, 0, 50}) {
    const Tensor hidden = random_normal(DType::kF32, {tokens, 40}, 100 + tokens);
    const Tensor a = layer.forward(hidden);
    MoeLayer once(config, weights);
    const Tensor b = once.forward(hidden);
    EXPECT_EQ(std::memcmp(a.data<void>(), b.data<void>(), a.nbytes()), 0) << "M=" << tokens;
  }
}

// Hidden size 64 also routes through the router's tiles on the amx path.
TEST(MoeLayer, NanTokenChangesNoOtherToken) {
  for (const int64_t H : {40, 64}) {
    SCOPED_TRACE("H=" + std::to_string(H));
    MoeConfig config = small_config("deepseek");
    config.experts.hidden_size = H;
    const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 3);
    MoeLayer layer(config, weights);
    Tensor hidden = random_normal(DType::kBF16, {9, H}, 5);
    const Tensor clean = layer.forward(hidden);
    hidden.data<bf16>()[4 * H + 1] = to_bf16(std::numeric_limits<float>::quiet_NaN());
    const Tensor dirty = layer.forward(hidden);
    const size_t row_bytes = static_cast<size_t>(H) * sizeof(bf16);
    for (int64_t t = 0; t < 9; ++t) {
      if (t == 4) continue;
      EXPECT_EQ(std::memcmp(clean.data<bf16>() + t * H, dirty.data<bf16>() + t * H, row_bytes), 0)
          << "token " << t;
    }
    const TensorView ids = layer.last_topk_ids();
    for (int64_t j = 0; j < config.routing.top_k; ++j) {
      const int32_t id = ids.as<int32_t>()[4 * config.routing.top_k + j];
      EXPECT_TRUE(id >= 0 && id < config.routing.num_experts) << id;
    }
  }
}

TEST(MoeLayer, RejectsWeightsThatDoNotMatchTheConfig) {
  const MoeConfig config = small_config("qwen2");
  LayerWeights weights = synthetic_layer_weights(config, DType::kF32, 1);
  LayerWeights no_shared = weights;
  no_shared.shared_w13 = Tensor();
  EXPECT_THROW(MoeLayer(config, no_shared), Error);
  LayerWeights bad_router = weights;
  bad_router.router = Tensor(DType::kF32, {3, 40});
  try {
    MoeLayer layer(config, bad_router);
    FAIL() << "expected moe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router"), std::string::npos) << e.what();
  }
  MoeLayer layer(config, weights);
  EXPECT_THROW(layer.forward(Tensor(DType::kF32, {2, 41})), Error);
}

}  // namespace
}  // namespace moe
