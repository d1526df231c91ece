// Quantized checkpoints as published: fp8 weights with 128 x 128 block scales (DeepSeek-V3 with
// f32 scales, Qwen3 FP8 with bf16 ones) and gpt-oss's MXFP4 experts. The decoders are checked on
// values worked out by hand; load_moe_layer on checkpoints in the published layout, against
// weights derived from the stored codes the plain way; then the refusals of malformed files.
// The agreement with transformers' own decoding is hf_agreement_test's deepseek_v3_fp8 and
// gpt_oss_mxfp4 cases.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "checkpoint/checkpoint_fixture.h"
#include "checkpoint/mxfp4.h"
#include "checkpoint/stored_matrix.h"
#include "moe/checkpoint.h"
#include "moe/dtype.h"

namespace moe {
namespace {

using testing::error_message;
using testing::TestCheckpoint;

void expect_message_has(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

MoeConfig parse(const nlohmann::json& config) { return parse_hf_config(config.dump()); }

// ---- decoders, on hand-computed values ----

TEST(Mxfp4, E2m1CodesDecodeToTheirValues) {
  // sign | 2 exponent bits (bias 1) | 1 mantissa bit; exponent 0 is subnormal: 0 and 0.5.
  const float want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(e2m1_value(static_cast<uint8_t>(code)), want[code]) << "code " << code;
    // The high nibble is the other element of the byte, never part of this code.
    EXPECT_EQ(e2m1_value(static_cast<uint8_t>(0xa0 | code)), want[code]) << "code " << code;
  }
  EXPECT_TRUE(std::signbit(e2m1_value(8)));
}

TEST(Mxfp4, E8m0ScalesArePowersOfTwoBiased127) {
  EXPECT_EQ(e8m0_value(127), 1.0f);
  EXPECT_EQ(e8m0_value(128), 2.0f);
  EXPECT_EQ(e8m0_value(126), 0.5f);
  EXPECT_EQ(e8m0_value(137), 1024.0f);
  EXPECT_EQ(e8m0_value(1), std::ldexp(1.0f, -126));  // the smallest normal f32
  EXPECT_EQ(e8m0_value(0), std::ldexp(1.0f, -127));  // a subnormal, still exact
  EXPECT_EQ(std::fpclassify(e8m0_value(0)), FP_SUBNORMAL);
  EXPECT_EQ(e8m0_value(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_value(255)));
}

// Element 2i of a group is the low nibble of byte i, element 2i + 1 the high one.
TEST(Mxfp4, RowDecodesLowNibbleFirstWithOneScalePerGroup) {
  uint8_t packed[32] = {};
  packed[0] = 0x21;                      // elements 0, 1: codes 1 (0.5), 2 (1)
  packed[1] = 0x9f;                      // elements 2, 3: codes 15 (-6), 9 (-0.5)
  packed[16] = 0x7c;                     // elements 32, 33: codes 12 (-2), 7 (6)
  packed[31] = 0x45;                     // elements 62, 63: codes 5 (3), 4 (2)
  const uint8_t scales[2] = {128, 125};  // x2 for elements 0..31, x0.25 for 32..63
  float got[64];
  dequantize_mxfp4_row(packed, scales, 64, got);
  float want[64] = {};
  want[0] = 1.0f, want[1] = 2.0f, want[2] = -12.0f, want[3] = -1.0f;
  want[32] = -0.5f, want[33] = 1.5f, want[62] = 0.75f, want[63] = 0.5f;
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
}

// A 3 x 5 fp8 matrix in blocks of 2 x 4, so both edges hold partial blocks, with bf16 scales as
// Qwen3 FP8 stores them.
TEST(Fp8Blocks, EachElementTakesTheScaleOfItsBlock) {
  uint8_t values[15];
  std::memset(values, 0x3c, sizeof values);  // 1.5: exponent 7 (bias 7), mantissa 4 of 8
  values[0] = 0xc0;                          // -2
  values[14] = 0x7e;                         // 448 = 1.75 * 2^8, the largest finite e4m3
  const bf16 scales[4] = {to_bf16(0.5f), to_bf16(2.0f), to_bf16(4.0f), to_bf16(0.125f)};
  StoredMatrix matrix;
  matrix.encoding = StoredEncoding::kFp8Blocks;
  matrix.values = TensorView(values, DType::kF8E4M3, {3, 5});
  matrix.scales = TensorView(const_cast<bf16*>(scales), DType::kBF16, {2, 2});
  matrix.block = {2, 4};
  float got[15];
  dequantize(matrix, got);
  const float want[15] = {-1.0f, 0.75f, 0.75f, 0.75f, 3.0f,  //
                          0.75f, 0.75f, 0.75f, 0.75f, 3.0f,  //
                          6.0f,  6.0f,  6.0f,  6.0f,  56.0f};
  for (int i = 0; i < 15; ++i) EXPECT_EQ(got[i], want[i]) << "element " << i;
}

// ---- fp8 checkpoints as DeepSeek-V3 and Qwen3 FP8 publish them ----

// Adds `name` [rows, cols] as f8_e4m3 with `name`_scale_inv of `scale_dtype` per 128 x 128
// block, and writes into `dst` its values computed the plain way: fp8 value times the scale of
// its block.
void add_fp8(TestCheckpoint& checkpoint, const std::string& name, int64_t rows, int64_t cols,
             DType scale_dtype, int64_t seed, float* dst) {
  const int64_t scale_rows = (rows + 127) / 128, scale_cols = (cols + 127) / 128;
  Tensor values(DType::kF8E4M3, {rows, cols});
  std::vector<float> scales(static_cast<size_t>(scale_rows * scale_cols));
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = 0.375f * static_cast<float>(static_cast<int64_t>(i) + 1 + seed);  // exact in bf16
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float value = 0.5f * static_cast<float>((r * 7 + c * 3 + seed) % 13) - 3.0f;
      values.data<f8e4m3>()[r * cols + c] = to_f8e4m3(value);
      dst[r * cols + c] = value * scales[static_cast<size_t>((r / 128) * scale_cols + c / 128)];
    }
  }
  Tensor scale_tensor(DType::kF32, {scale_rows, scale_cols});
  std::memcpy(scale_tensor.data<float>(), scales.data(), scale_tensor.nbytes());
  checkpoint.add(name, std::move(values));
  checkpoint.add(name + "_scale_inv", Tensor::copy_of(scale_tensor, scale_dtype));
}

// H = 192 and I = 160 are 1.5 and 1.25 blocks: every matrix has full blocks and partial ones at
// both edges, as DeepSeek-V3's kv_a_proj_with_mqa (576 x 7168) does.
TEST(LoadQuantized, DeepseekV3Fp8AsPublished) {
  const int64_t E = 4, H = 192, I = 160;
  TestCheckpoint checkpoint("deepseek_fp8");
  nlohmann::json config = testing::deepseek_config(E, H, I);
  config["quantization_config"] = {{"activation_scheme", "dynamic"},
                                   {"fmt", "e4m3"},
                                   {"quant_method", "fp8"},
                                   {"weight_block_size", {128, 128}}};
  checkpoint.write_config(config);
  LayerWeights expected = synthetic_layer_weights(parse(config), DType::kF32, 7);
  ASSERT_TRUE(expected.correction_bias.defined() && expected.shared_w13.defined());
  // The router and its correction bias stay unquantized, as published (bf16 and f32).
  expected.router = Tensor::copy_of(Tensor::copy_of(expected.router, DType::kBF16), DType::kF32);
  const std::string block = "model.layers.1.mlp.";
  checkpoint.add(block + "gate.weight", Tensor::copy_of(expected.router, DType::kBF16));
  checkpoint.add(block + "gate.e_score_correction_bias",
                 Tensor::copy_of(expected.correction_bias, DType::kF32));
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = fmt::format("{}experts.{}.", block, e);
    float* w13 = expected.w13.data<float>() + e * 2 * I * H;
    add_fp8(checkpoint, expert + "gate_proj.weight", I, H, DType::kF32, 3 * e, w13);
    add_fp8(checkpoint, expert + "up_proj.weight", I, H, DType::kF32, 3 * e + 1, w13 + I * H);
    add_fp8(checkpoint, expert + "down_proj.weight", H, I, DType::kF32, 3 * e + 2,
            expected.w2.data<float>() + e * H * I);
  }
  float* shared_w13 = expected.shared_w13.data<float>();
  add_fp8(checkpoint, block + "shared_experts.gate_proj.weight", I, H, DType::kF32, 20, shared_w13);
  add_fp8(checkpoint, block + "shared_experts.up_proj.weight", I, H, DType::kF32, 21,
          shared_w13 + I * H);
  add_fp8(checkpoint, block + "shared_experts.down_proj.weight", H, I, DType::kF32, 22,
          expected.shared_w2.data<float>());
  checkpoint.write_shards(3);  // weights and their scales may land in different shards
  const Checkpoint opened = Checkpoint::open(checkpoint.dir());
  EXPECT_EQ(opened.fp8_block()[0], 128);
  EXPECT_EQ(opened.fp8_block()[1], 128);
  testing::expect_same_weights(load_moe_layer(opened, 1, DType::kF32), expected);
}

// Qwen3 FP8: bf16 scales, the router listed in modules_to_not_convert and stored in bf16.
TEST(LoadQuantized, Qwen3Fp8WithBf16Scales) {
  const int64_t E = 3, H = 136, I = 96;
  TestCheckpoint checkpoint("qwen3_fp8");
  nlohmann::json config = testing::qwen3_config(E, H, I);
  config["quantization_config"] = {
      {"activation_scheme", "dynamic"},
      {"fmt", "e4m3"},
      {"quant_method", "fp8"},
      {"modules_to_not_convert", {"lm_head", "model.layers.1.mlp.gate"}},
      {"weight_block_size", {128, 128}}};
  checkpoint.write_config(config);
  LayerWeights expected = synthetic_layer_weights(parse(config), DType::kF32, 9);
  expected.router = Tensor::copy_of(Tensor::copy_of(expected.router, DType::kBF16), DType::kF32);
  const std::string block = "model.layers.1.mlp.";
  checkpoint.add(block + "gate.weight", Tensor::copy_of(expected.router, DType::kBF16));
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = fmt::format("{}experts.{}.", block, e);
    float* w13 = expected.w13.data<float>() + e * 2 * I * H;
    add_fp8(checkpoint, expert + "gate_proj.weight", I, H, DType::kBF16, 3 * e, w13);
    add_fp8(checkpoint, expert + "up_proj.weight", I, H, DType::kBF16, 3 * e + 1, w13 + I * H);
    add_fp8(checkpoint, expert + "down_proj.weight", H, I, DType::kBF16, 3 * e + 2,
            expected.w2.data<float>() + e * H * I);
  }
  checkpoint.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32),
                               expected);
}

// ---- MXFP4 experts as gpt-oss publishes them ----

// Adds experts.<proj>_blocks [E, rows, cols / 32, 16] and _scales [E, rows, cols / 32] of varied
// codes and exponents, and returns the [E, rows, cols] values they stand for, decoded the plain
// way from the definition: code of element c in the low nibble of byte c / 2 when c is even, the
// high one when odd; value = e2m1 * 2^(scale - 127).
std::vector<float> add_mxfp4(TestCheckpoint& checkpoint, const std::string& name, int64_t E,
                             int64_t rows, int64_t cols, int64_t seed) {
  const float e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  const int64_t groups = cols / 32;
  Tensor blocks(DType::kU8, {E, rows, groups, 16});
  Tensor scales(DType::kU8, {E, rows, groups});
  for (int64_t i = 0; i < blocks.numel(); ++i) {
    blocks.data<uint8_t>()[i] = static_cast<uint8_t>((i * 37 + seed * 11 + i / 16) % 256);
  }
  for (int64_t i = 0; i < scales.numel(); ++i) {
    scales.data<uint8_t>()[i] = static_cast<uint8_t>(118 + (i * 5 + seed) % 13);
  }
  std::vector<float> values(static_cast<size_t>(E * rows * cols));
  for (int64_t m = 0; m < E * rows; ++m) {  // matrix rows of all experts, one after another
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = blocks.data<uint8_t>()[m * cols / 2 + c / 2];
      const int code = c % 2 == 0 ? byte & 0x0f : byte >> 4;
      const int exponent = scales.data<uint8_t>()[m * groups + c / 32] - 127;
      values[static_cast<size_t>(m * cols + c)] = std::ldexp(e2m1[code], exponent);
    }
  }
  checkpoint.add(name + "_blocks", std::move(blocks));
  checkpoint.add(name + "_scales", std::move(scales));
  return values;
}

// A tiny gpt-oss layer 1 in the published layout: bf16 router and biases, MXFP4 experts. H = 96
// and I = 32 keep [E, 2I, H], [E, H, 2I] and [E, H, I] all distinct shapes.
class Mxfp4Checkpoint : public ::testing::Test {
 protected:
  static constexpr int64_t E = 3, H = 96, I = 32;
  static constexpr const char* kExperts = "model.layers.1.mlp.experts.";

  Mxfp4Checkpoint() : checkpoint_("gpt_oss_mxfp4") {}

  void write_config(int64_t hidden) {
    nlohmann::json config = testing::gpt_oss_config(E, hidden, I);
    config["quantization_config"] = {{"modules_to_not_convert",
                                      {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"}},
                                     {"quant_method", "mxfp4"}};
    checkpoint_.write_config(config);
    config_ = parse(config);
  }

  // The whole layer; `expected` gets the engine-layout weights it stands for.
  void add_layer() {
    write_config(H);
    expected_ = synthetic_layer_weights(config_, DType::kF32, 3);
    ASSERT_TRUE(expected_.router_bias.defined() && expected_.w13_bias.defined());
    // Stored in bf16 as published, so the expected values are the bf16 ones.
    for (Tensor* t :
         {&expected_.router, &expected_.router_bias, &expected_.w13_bias, &expected_.w2_bias}) {
      *t = Tensor::copy_of(Tensor::copy_of(*t, DType::kBF16), DType::kF32);
    }
    checkpoint_.add("model.layers.1.mlp.router.weight",
                    Tensor::copy_of(expected_.router, DType::kBF16));
    checkpoint_.add("model.layers.1.mlp.router.bias",
                    Tensor::copy_of(expected_.router_bias, DType::kBF16));

    // gate_up's 2I rows interleave gate and up (gate row j at 2j, up row j at 2j + 1), in the
    // blocks as in gate_up_proj_bias.
    const auto stored_row = [](int64_t row) { return row < I ? 2 * row : 2 * (row - I) + 1; };
    const std::vector<float> gate_up =
        add_mxfp4(checkpoint_, std::string(kExperts) + "gate_up_proj", E, 2 * I, H, 1);
    Tensor bias(DType::kF32, {E, 2 * I});
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t r = 0; r < 2 * I; ++r) {
        const int64_t s = stored_row(r);
        std::memcpy(expected_.w13.data<float>() + (e * 2 * I + r) * H,
                    gate_up.data() + (e * 2 * I + s) * H, H * sizeof(float));
        bias.data<float>()[e * 2 * I + s] = expected_.w13_bias.data<float>()[e * 2 * I + r];
      }
    }
    checkpoint_.add(std::string(kExperts) + "gate_up_proj_bias",
                    Tensor::copy_of(bias, DType::kBF16));
    const std::vector<float> down =
        add_mxfp4(checkpoint_, std::string(kExperts) + "down_proj", E, H, I, 2);
    std::memcpy(expected_.w2.data<float>(), down.data(), down.size() * sizeof(float));
    checkpoint_.add(std::string(kExperts) + "down_proj_bias",
                    Tensor::copy_of(expected_.w2_bias, DType::kBF16));
  }

  std::string load_error() {
    return error_message(
        [&] { load_moe_layer(Checkpoint::open(checkpoint_.dir()), 1, DType::kF32); });
  }

  TestCheckpoint checkpoint_;
  MoeConfig config_;
  LayerWeights expected_;
};

TEST_F(Mxfp4Checkpoint, GptOssExpertsDecodeToTheEngineLayout) {
  add_layer();
  checkpoint_.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint_.dir()), 1, DType::kF32),
                               expected_);
}

// Decoded once to the weight dtype: bf16 weights are the decoded values rounded to bf16 (the
// products of e2m1 and a power of two are exact there too).
TEST_F(Mxfp4Checkpoint, DecodesToBf16) {
  add_layer();
  checkpoint_.write_shards(2);
  const LayerWeights got = load_moe_layer(Checkpoint::open(checkpoint_.dir()), 1, DType::kBF16);
  LayerWeights want = expected_;
  want.router = Tensor::copy_of(expected_.router, DType::kBF16);
  want.w13 = Tensor::copy_of(expected_.w13, DType::kBF16);
  want.w2 = Tensor::copy_of(expected_.w2, DType::kBF16);
  testing::expect_same_weights(got, want);
  EXPECT_EQ(std::memcmp(Tensor::copy_of(got.w13, DType::kF32).data<float>(),
                        expected_.w13.data<float>(), expected_.w13.nbytes()),
            0);
}

TEST_F(Mxfp4Checkpoint, BlocksOfTheWrongDtypeNameTensorAndFile) {
  add_layer();
  const std::string name = std::string(kExperts) + "down_proj_blocks";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.add(name, Tensor::zeros(DType::kI8, {E, H, I / 32, 16}));
  checkpoint_.write_single_file();
  expect_message_has(load_error(),
                     {name, checkpoint_.path("model.safetensors"), "dtype i8", "expected u8"});
}

TEST_F(Mxfp4Checkpoint, BlocksOfTheWrongShapeNameTensorAndShapes) {
  add_layer();
  const std::string name = std::string(kExperts) + "gate_up_proj_blocks";
  ASSERT_TRUE(checkpoint_.remove(name));
  // Rows and groups swapped over, as a writer that forgot the [E, out, in] order would store them.
  checkpoint_.add(name, Tensor::zeros(DType::kU8, {E, H / 32, 2 * I, 16}));
  checkpoint_.write_shards(2);
  expect_message_has(load_error(),
                     {name, ".safetensors", "expected shape [3, 64, 3, 16]", "got [3, 3, 64, 16]"});
}

TEST_F(Mxfp4Checkpoint, MissingScalesNamesThem) {
  add_layer();
  const std::string name = std::string(kExperts) + "down_proj_scales";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.write_single_file();
  expect_message_has(load_error(), {name, checkpoint_.dir()});
}

TEST_F(Mxfp4Checkpoint, ScalesOfTheWrongShapeNameTensorAndShapes) {
  add_layer();
  const std::string name = std::string(kExperts) + "gate_up_proj_scales";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.add(name, Tensor::zeros(DType::kU8, {E, 2 * I, H / 32 + 1}));
  checkpoint_.write_single_file();
  expect_message_has(load_error(), {name, "expected shape [3, 64, 3]", "got [3, 64, 4]"});
}

TEST_F(Mxfp4Checkpoint, HiddenSizeNotAMultipleOf32) {
  write_config(40);
  checkpoint_.add("model.layers.1.mlp.router.weight", Tensor::zeros(DType::kBF16, {E, 40}));
  checkpoint_.add("model.layers.1.mlp.router.bias", Tensor::zeros(DType::kBF16, {E}));
  checkpoint_.add(std::string(kExperts) + "gate_up_proj_blocks",
                  Tensor::zeros(DType::kU8, {E, 2 * I, 1, 16}));
  checkpoint_.write_single_file();
  expect_message_has(load_error(),
                     {std::string(kExperts) + "gate_up_proj", "40", "multiple of 32"});
}

// ---- quantization_config ----

TEST(QuantizationConfig, UnsupportedMethodIsRefusedAtOpen) {
  TestCheckpoint checkpoint("awq");
  nlohmann::json config = testing::qwen3_config(3, 6, 4);
  config["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
  checkpoint.write_config(config);
  checkpoint.add("model.layers.1.mlp.gate.weight", Tensor::zeros(DType::kF32, {3, 6}));
  checkpoint.write_single_file();
  expect_message_has(
      error_message([&] { Checkpoint::open(checkpoint.dir()); }),
      {checkpoint.path("config.json"), "quantization_config.quant_method", "\"awq\"", "\"fp8\""});
}

TEST(QuantizationConfig, Fp8OtherThanE4m3IsRefusedAtOpen) {
  TestCheckpoint checkpoint("e5m2");
  nlohmann::json config = testing::qwen3_config(3, 6, 4);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e5m2"}};
  checkpoint.write_config(config);
  checkpoint.add("model.layers.1.mlp.gate.weight", Tensor::zeros(DType::kF32, {3, 6}));
  checkpoint.write_single_file();
  expect_message_has(error_message([&] { Checkpoint::open(checkpoint.dir()); }),
                     {"quantization_config.fmt", "\"e5m2\"", "e4m3"});
}

}  // namespace
}  // namespace moe
