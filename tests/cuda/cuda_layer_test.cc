// MoeLayer on the CUDA backend against the same layer on the CPU backend, with the same bf16
// weights: synthetic layers of several shapes, and real checkpoints of the SiLU families from
// tests/data/hf (loaded through from_checkpoint, so the whole path from files to GPU is covered).
// Layers with shared experts (DeepSeek-V3-like and Qwen2-MoE-like) against the reference backend.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <filesystem>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "moe/checkpoint.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "moe/safetensors.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

constexpr double kBf16Tolerance = 1e-2;

// `want` is the same layer on the cpu or the reference backend.
void expect_same_layer_output(MoeLayer& want_layer, MoeLayer& gpu, const Tensor& hidden) {
  const Tensor want = want_layer.forward(hidden);
  const Tensor got = gpu.forward(hidden);
  const int64_t ids = hidden.size(0) * want_layer.config().routing.top_k;
  for (int64_t p = 0; p < ids; ++p) {
    ASSERT_EQ(gpu.last_topk_ids().as<int32_t>()[p], want_layer.last_topk_ids().as<int32_t>()[p])
        << "pair " << p;
    EXPECT_NEAR(gpu.last_topk_weights().as<float>()[p],
                want_layer.last_topk_weights().as<float>()[p], 1e-4)
        << "pair " << p;
  }
  const testing::Comparison cmp =
      testing::compare(Tensor::copy_of(got, DType::kF32), Tensor::copy_of(want, DType::kF32));
  EXPECT_FALSE(cmp.nan_mismatch) << cmp.describe();
  EXPECT_LT(cmp.max_rel_error, kBf16Tolerance) << cmp.describe();
}

class CudaMoeLayer : public testing::GpuTest {};

TEST_F(CudaMoeLayer, MatchesTheCpuLayerOnSyntheticWeights) {
  struct Shape {
    int64_t H, I, E, k;
  };
  for (const Shape& shape : {Shape{256, 128, 32, 4}, Shape{512, 96, 128, 8}, Shape{72, 40, 6, 2}}) {
    MoeConfig config = preset_config("qwen3-30b-a3b");
    config.experts.hidden_size = shape.H;
    config.experts.intermediate_size = shape.I;
    config.routing.num_experts = shape.E;
    config.routing.top_k = shape.k;
    const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, shape.E);
    MoeLayer cpu(config, weights, {Backend::kCpu});
    MoeLayer gpu(config, weights, {Backend::kCuda});
    for (int64_t M : {1, 7, 300}) {
      SCOPED_TRACE(fmt::format("H {} I {} E {} k {} M {}", shape.H, shape.I, shape.E, shape.k, M));
      expect_same_layer_output(cpu, gpu, testing::random_normal(DType::kBF16, {M, shape.H}, M));
    }
  }
}

TEST_F(CudaMoeLayer, MatchesTheCpuLayerOnCheckpoints) {
  const fs::path root = fs::path(MOE_TEST_DATA_DIR) / "hf";
  for (const char* family :
       {"qwen3_moe", "qwen3_moe_fused", "mixtral", "olmoe", "qwen2_moe", "deepseek_v3"}) {
    SCOPED_TRACE(family);
    const std::string dir = (root / family).string();
    ASSERT_TRUE(fs::is_directory(dir)) << dir;
    const Checkpoint checkpoint = Checkpoint::open(dir);
    const int64_t layer = checkpoint.config().first_moe_layer();
    MoeLayer cpu = MoeLayer::from_checkpoint(dir, layer, DType::kBF16, {Backend::kCpu});
    MoeLayer gpu = MoeLayer::from_checkpoint(dir, layer, DType::kBF16, {Backend::kCuda});
    const SafetensorsFile io = SafetensorsFile::open((root / family / "io.safetensors").string());
    expect_same_layer_output(cpu, gpu, Tensor::copy_of(io.tensor("hidden_states"), DType::kBF16));
  }
}

// DeepSeek-V3's layer shrunk: group-limited sigmoid routing with a correction bias and scaling,
// and an ungated shared MLP two experts wide.
MoeConfig small_deepseek_v3() {
  MoeConfig config = preset_config("deepseek-v3");
  config.experts.hidden_size = 128;
  config.experts.intermediate_size = 64;
  config.experts.shared_intermediate_size = 128;
  config.routing.num_experts = 32;
  config.routing.top_k = 4;
  config.routing.num_groups = 8;
  config.routing.topk_groups = 4;
  return config;
}

// Qwen2-MoE's layer shrunk: softmax top-k without renormalization, and a gated shared MLP wider
// than the experts (Is != I).
MoeConfig small_qwen2_moe() {
  MoeConfig config = preset_config("qwen2-moe-a2.7b");
  config.experts.hidden_size = 96;
  config.experts.intermediate_size = 48;
  config.experts.shared_intermediate_size = 176;
  config.routing.num_experts = 12;
  config.routing.top_k = 4;
  return config;
}

TEST_F(CudaMoeLayer, RunsSharedExpertsAsTheReference) {
  for (const MoeConfig& config : {small_deepseek_v3(), small_qwen2_moe()}) {
    ASSERT_GT(config.experts.shared_intermediate_size, 0);
    const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 3);
    MoeLayer reference(config, weights, {Backend::kReference});
    MoeLayer gpu(config, weights, {Backend::kCuda});
    for (int64_t M : {0, 1, 7, 33}) {
      SCOPED_TRACE(fmt::format("{} M {}", config.name, M));
      const Tensor hidden =
          testing::random_normal(DType::kBF16, {M, config.experts.hidden_size}, 40 + M);
      expect_same_layer_output(reference, gpu, hidden);
      if (M > 0) {
        EXPECT_GT(gpu.last_stage_times().shared_us, 0.0) << "shared time not recorded";
      }
    }
  }
}

// Device tensors on a stream of the caller's: the same result; hidden and out overlapping (the
// shared experts read hidden after the routed sum went to out) refused before anything runs.
TEST_F(CudaMoeLayer, RunsSharedExpertsOnDeviceTensorsAndRefusesOverlap) {
  const MoeConfig config = small_qwen2_moe();
  const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 4);
  MoeLayer reference(config, weights, {Backend::kReference});
  MoeLayer gpu(config, weights, {Backend::kCuda});
  const int64_t M = 21, H = config.experts.hidden_size;
  const Tensor hidden = testing::random_normal(DType::kBF16, {M, H}, 9);
  const testing::DeviceTensor d_hidden(hidden);
  const testing::DeviceTensor d_out = testing::DeviceTensor::empty_like(DType::kBF16, {M, H});
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  gpu.forward(d_hidden, d_out, stream);
  const testing::Comparison cmp =
      testing::compare(Tensor::copy_of(d_out.to_host(), DType::kF32),
                       reference.forward(Tensor::copy_of(hidden, DType::kF32)));
  EXPECT_FALSE(cmp.nan_mismatch) << cmp.describe();
  EXPECT_LT(cmp.max_rel_error, kBf16Tolerance) << cmp.describe();
  testing::expect_error([&] { gpu.forward(d_hidden, d_hidden, stream); },
                        {"hidden and out not to overlap"});
  cudaStreamDestroy(stream);
}

TEST_F(CudaMoeLayer, RefusesWhatItDoesNotRunYet) {
  MoeConfig biases = small_qwen2_moe();
  biases.experts.has_bias = true;
  MoeConfig weight_on_input = preset_config("qwen3-30b-a3b");
  weight_on_input.experts.hidden_size = 64;
  weight_on_input.experts.intermediate_size = 32;
  weight_on_input.routing.num_experts = 8;
  weight_on_input.routing.top_k = 1;
  weight_on_input.routing.apply_weight_on_input = true;
  for (const MoeConfig& config : {biases, weight_on_input}) {
    const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 1);
    testing::expect_error([&] { MoeLayer gpu(config, weights, {Backend::kCuda}); },
                          {"MoeLayer on CUDA", "without biases or the weight on the input"});
  }
}

}  // namespace
}  // namespace moe
