// MoeLayer on the CUDA backend against the same layer on the CPU backend, with the same bf16
// weights: synthetic layers of several shapes, and real checkpoints of the SiLU families from
// tests/data/hf (loaded through from_checkpoint, so the whole path from files to GPU is covered).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

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

void expect_same_layer_output(MoeLayer& cpu, MoeLayer& gpu, const Tensor& hidden) {
  const Tensor want = cpu.forward(hidden);
  const Tensor got = gpu.forward(hidden);
  const int64_t ids = hidden.size(0) * cpu.config().routing.top_k;
  for (int64_t p = 0; p < ids; ++p) {
    ASSERT_EQ(gpu.last_topk_ids().as<int32_t>()[p], cpu.last_topk_ids().as<int32_t>()[p])
        << "pair " << p;
    EXPECT_NEAR(gpu.last_topk_weights().as<float>()[p], cpu.last_topk_weights().as<float>()[p],
                1e-4)
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
  for (const char* family : {"qwen3_moe", "qwen3_moe_fused", "mixtral", "olmoe"}) {
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

TEST_F(CudaMoeLayer, RefusesWhatItDoesNotRunYet) {
  MoeConfig config = preset_config("qwen2-moe-a2.7b");  // gated shared expert
  config.experts.hidden_size = 64;
  config.experts.intermediate_size = 32;
  config.experts.shared_intermediate_size = 32;
  const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 1);
  try {
    MoeLayer gpu(config, weights, {Backend::kCuda});
    FAIL() << "expected moe::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe
