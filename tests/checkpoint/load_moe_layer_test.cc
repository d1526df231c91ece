// load_moe_layer on tiny checkpoints written in every naming scheme the families use: the loaded
// tensors must equal the hand-placed engine-layout weights they were derived from, bit for bit.
#include "moe/checkpoint.h"

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint_fixture.h"
#include "common/random_tensors.h"

namespace moe {
namespace {

using testing::TestCheckpoint;

MoeConfig parse(const nlohmann::json& config) { return parse_hf_config(config.dump()); }

TEST(LoadMoeLayer, PerExpertSingleFile) {
  TestCheckpoint checkpoint("qwen3_per_expert");
  const nlohmann::json config = testing::qwen3_config(3, 6, 4);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", expected);
  testing::add_per_expert(checkpoint, "model.layers.1.mlp.", expected, "gate_proj", "up_proj",
                          "down_proj");
  checkpoint.write_single_file();
  const Checkpoint opened = Checkpoint::open(checkpoint.dir());
  EXPECT_EQ(opened.config().model_type, "qwen3_moe");
  testing::expect_same_weights(load_moe_layer(opened, 1, DType::kF32), expected);
}

// H = 2I makes [E, 2I, H] and [E, H, 2I] the same shape: only the family decides orientation.
TEST(LoadMoeLayer, FusedExpertsAcrossShardsWithIndex) {
  TestCheckpoint checkpoint("qwen3_fused");
  const nlohmann::json config = testing::qwen3_config(3, 8, 4);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", expected);
  testing::add_fused(checkpoint, "model.layers.1.mlp.", expected);
  checkpoint.write_shards(2);
  const Checkpoint opened = Checkpoint::open(checkpoint.dir());
  EXPECT_EQ(opened.names().size(), 3u);
  EXPECT_NE(opened.file_of("model.layers.1.mlp.gate.weight"),
            opened.file_of("model.layers.1.mlp.experts.gate_up_proj"));
  testing::expect_same_weights(load_moe_layer(opened, 1, DType::kF32), expected);
}

TEST(LoadMoeLayer, MixtralW1W3W2UnderBlockSparseMoe) {
  TestCheckpoint checkpoint("mixtral_per_expert");
  const nlohmann::json config = testing::mixtral_config(4, 6, 5);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  testing::add_router(checkpoint, "model.layers.1.block_sparse_moe.", "gate.", expected);
  testing::add_per_expert(checkpoint, "model.layers.1.block_sparse_moe.", expected, "w1", "w3",
                          "w2");
  checkpoint.write_shards(3);
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

// transformers 5 renames Mixtral's block to mlp and fuses its experts.
TEST(LoadMoeLayer, MixtralFusedUnderMlp) {
  TestCheckpoint checkpoint("mixtral_fused");
  const nlohmann::json config = testing::mixtral_config(4, 6, 5);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  testing::add_router(checkpoint, "model.layers.0.mlp.", "gate.", expected);
  testing::add_fused(checkpoint, "model.layers.0.mlp.", expected);
  checkpoint.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 0, DType::kF32),
                               expected);
}

TEST(LoadMoeLayer, Qwen2SharedExpertWithGate) {
  TestCheckpoint checkpoint("qwen2_shared");
  const nlohmann::json config = testing::qwen2_config(3, 6, 4, 5);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  ASSERT_TRUE(expected.shared_gate.defined());
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", expected);
  testing::add_per_expert(checkpoint, "model.layers.1.mlp.", expected, "gate_proj", "up_proj",
                          "down_proj");
  testing::add_shared(checkpoint, "model.layers.1.mlp.", "shared_expert.", expected);
  checkpoint.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

TEST(LoadMoeLayer, DeepseekCorrectionBiasAndSharedExperts) {
  TestCheckpoint checkpoint("deepseek");
  const nlohmann::json config = testing::deepseek_config(4, 6, 3);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  ASSERT_TRUE(expected.correction_bias.defined());
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", expected);
  testing::add_fused(checkpoint, "model.layers.1.mlp.", expected);
  testing::add_shared(checkpoint, "model.layers.1.mlp.", "shared_experts.", expected);
  checkpoint.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

// Llama-4 as the multimodal checkpoints hold it: language_model. in front, a text_config, and
// experts stored for x @ W. H = 2I again, so a wrong orientation cannot hide behind a shape error.
TEST(LoadMoeLayer, Llama4TransposedUnderLanguageModel) {
  TestCheckpoint checkpoint("llama4");
  const nlohmann::json config = testing::llama4_config(3, 8, 4);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  const std::string block = "language_model.model.layers.1.feed_forward.";
  testing::add_router(checkpoint, block, "router.", expected);
  testing::add_fused_llama4(checkpoint, block, expected);
  testing::add_shared(checkpoint, block, "shared_expert.", expected);
  checkpoint.write_shards(2);
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

TEST(LoadMoeLayer, GptOssInterleavedWithBiases) {
  TestCheckpoint checkpoint("gpt_oss");
  const nlohmann::json config = testing::gpt_oss_config(3, 8, 4);
  checkpoint.write_config(config);
  const LayerWeights expected = testing::hand_placed_weights(parse(config));
  ASSERT_TRUE(expected.w13_bias.defined() && expected.router_bias.defined());
  testing::add_router(checkpoint, "model.layers.1.mlp.", "router.", expected);
  testing::add_fused_gpt_oss(checkpoint, "model.layers.1.mlp.", expected);
  checkpoint.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

// Weights convert to the asked dtype by round to nearest even; biases stay f32.
TEST(LoadMoeLayer, ConvertsWeightsToBf16AndF16) {
  TestCheckpoint checkpoint("convert");
  const nlohmann::json config = testing::gpt_oss_config(3, 6, 4);
  checkpoint.write_config(config);
  const LayerWeights f32 = testing::hand_placed_weights(parse(config));
  testing::add_router(checkpoint, "model.layers.0.mlp.", "router.", f32);
  testing::add_fused_gpt_oss(checkpoint, "model.layers.0.mlp.", f32);
  checkpoint.write_single_file();
  const Checkpoint opened = Checkpoint::open(checkpoint.dir());
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    LayerWeights expected = f32;
    expected.router = Tensor::copy_of(f32.router, dtype);
    expected.w13 = Tensor::copy_of(f32.w13, dtype);
    expected.w2 = Tensor::copy_of(f32.w2, dtype);
    testing::expect_same_weights(load_moe_layer(opened, 0, dtype), expected);
  }
}

// DeepSeek-V3's fp8 layout: f8_e4m3 weights, each with a weight_scale_inv of one scale per
// block (here 2 x 4, from quantization_config, with partial blocks at the edges: I = 5, H = 6).
TEST(LoadMoeLayer, DequantizesFp8WithBlockScales) {
  TestCheckpoint checkpoint("fp8");
  nlohmann::json config = testing::deepseek_config(4, 6, 5);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {2, 4}}};
  checkpoint.write_config(config);
  const MoeConfig parsed = parse(config);
  const int64_t E = 4, H = 6, I = 5;
  LayerWeights expected = testing::hand_placed_weights(parsed);
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", expected);
  testing::add_shared(checkpoint, "model.layers.1.mlp.", "shared_experts.", expected);

  // One projection [rows, cols] of expert e as fp8 and scales; `dst` receives the dequantized
  // values, computed here the plain way: fp8 value times the scale of its block.
  const auto add_fp8 = [&](const std::string& name, int64_t rows, int64_t cols, uint64_t seed,
                           float* dst) {
    Tensor values(DType::kF8E4M3, {rows, cols});
    Tensor scales(DType::kF32, {(rows + 1) / 2, (cols + 3) / 4});
    for (int64_t i = 0; i < scales.numel(); ++i) {
      scales.data<float>()[i] = 0.375f * static_cast<float>(i + 1 + seed);
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float value = 0.5f * static_cast<float>((r * 7 + c * 3 + seed) % 13) - 3.0f;
        const f8e4m3 stored = to_f8e4m3(value);
        values.data<f8e4m3>()[r * cols + c] = stored;
        dst[r * cols + c] = to_f32(stored) * scales.data<float>()[(r / 2) * scales.size(1) + c / 4];
      }
    }
    checkpoint.add(name, std::move(values));
    checkpoint.add(name + "_scale_inv", std::move(scales));
  };
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    float* w13 = expected.w13.data<float>() + e * 2 * I * H;
    add_fp8(expert + "gate_proj.weight", I, H, 3 * e, w13);
    add_fp8(expert + "up_proj.weight", I, H, 3 * e + 1, w13 + I * H);
    add_fp8(expert + "down_proj.weight", H, I, 3 * e + 2, expected.w2.data<float>() + e * H * I);
  }
  checkpoint.write_shards(2);
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

// Without a weight_block_size the blocks are DeepSeek-V3's 128 x 128: one scale per matrix here.
TEST(LoadMoeLayer, Fp8BlocksDefaultTo128) {
  TestCheckpoint checkpoint("fp8_default_block");
  const nlohmann::json config = testing::qwen3_config(3, 6, 4);
  checkpoint.write_config(config);
  LayerWeights expected = testing::hand_placed_weights(parse(config));
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", expected);
  testing::add_per_expert(checkpoint, "model.layers.1.mlp.", expected, "gate_proj", "up_proj",
                          "down_proj");
  // Expert 2's down projection becomes fp8 with the single scale 0.25.
  const std::string down = "model.layers.1.mlp.experts.2.down_proj.weight";
  ASSERT_TRUE(checkpoint.remove(down));
  Tensor values(DType::kF8E4M3, {6, 4});
  Tensor scale(DType::kF32, {1, 1});
  scale.data<float>()[0] = 0.25f;
  for (int64_t i = 0; i < 24; ++i) {
    values.data<f8e4m3>()[i] = to_f8e4m3(static_cast<float>(i % 9) - 4.0f);
    expected.w2.data<float>()[2 * 24 + i] = (static_cast<float>(i % 9) - 4.0f) * 0.25f;
  }
  checkpoint.add(down, std::move(values));
  checkpoint.add(down + "_scale_inv", std::move(scale));
  checkpoint.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

// from_checkpoint(weights written out) runs exactly like a layer built from those weights.
TEST(LoadMoeLayer, FromCheckpointRunsLikeTheWeightsItWasWrittenFrom) {
  TestCheckpoint checkpoint("from_checkpoint");
  const nlohmann::json config_json = testing::qwen2_config(6, 16, 8, 12);
  checkpoint.write_config(config_json);
  const MoeConfig config = parse(config_json);
  const LayerWeights weights = synthetic_layer_weights(config, DType::kF32, 5);
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", weights);
  testing::add_per_expert(checkpoint, "model.layers.1.mlp.", weights, "gate_proj", "up_proj",
                          "down_proj");
  testing::add_shared(checkpoint, "model.layers.1.mlp.", "shared_expert.", weights);
  checkpoint.write_single_file();

  const LayerOptions options{Backend::kCpu, 2, 0};
  MoeLayer loaded = MoeLayer::from_checkpoint(checkpoint.dir(), 1, DType::kF32, options);
  MoeLayer direct(config, weights, options);
  const Tensor hidden = testing::random_normal(DType::kF32, {7, 16}, 11);
  const Tensor got = loaded.forward(hidden);
  const Tensor want = direct.forward(hidden);
  EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), got.nbytes()), 0);
}

}  // namespace
}  // namespace moe
