// Checkpoints that cannot be loaded: each refusal is a moe::Error that names the tensor and the
// file at fault (or the layers that would work), never a crash or a silently wrong layer.
#include "moe/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/checkpoint_fixture.h"
#include "moe/error.h"

namespace moe {
namespace {

using testing::error_message;
using testing::TestCheckpoint;

void expect_message_has(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

// A valid Qwen3-MoE checkpoint (E = 3, H = 6, I = 4; layer 0 dense, layer 1 MoE) in one file,
// which each test then breaks in one way.
class BrokenCheckpoint : public ::testing::Test {
 protected:
  BrokenCheckpoint() : checkpoint_("broken") {
    const nlohmann::json config = testing::qwen3_config(3, 6, 4);
    checkpoint_.write_config(config);
    weights_ = testing::hand_placed_weights(parse_hf_config(config.dump()));
    testing::add_router(checkpoint_, kBlock, "gate.", weights_);
    testing::add_per_expert(checkpoint_, kBlock, weights_, "gate_proj", "up_proj", "down_proj");
  }

  std::string load_error(int64_t layer = 1) {
    return error_message(
        [&] { load_moe_layer(Checkpoint::open(checkpoint_.dir()), layer, DType::kF32); });
  }

  static constexpr const char* kBlock = "model.layers.1.mlp.";
  TestCheckpoint checkpoint_;
  LayerWeights weights_;
};

TEST_F(BrokenCheckpoint, DenseLayerListsTheMoeLayers) {
  checkpoint_.write_single_file();
  expect_message_has(load_error(0), {"layer 0", "dense", "MoE layers are 1"});
}

TEST_F(BrokenCheckpoint, LayerOutOfRange) {
  checkpoint_.write_single_file();
  expect_message_has(load_error(2), {"layer 2", "0..1"});
  expect_message_has(load_error(-1), {"layer -1", "0..1"});
}

TEST_F(BrokenCheckpoint, MissingTensorNamesTensorAndFile) {
  const std::string name = "model.layers.1.mlp.experts.2.up_proj.weight";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.write_single_file();
  expect_message_has(load_error(), {name, checkpoint_.path("model.safetensors")});
}

TEST_F(BrokenCheckpoint, MisshapenTensorNamesTensorFileAndShapes) {
  const std::string name = "model.layers.1.mlp.experts.1.down_proj.weight";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.add(name, Tensor::zeros(DType::kF32, {4, 6}));  // [I, H] where [H, I] belongs
  checkpoint_.write_shards(2);
  expect_message_has(load_error(), {name, ".safetensors", "expected shape [6, 4]", "got [4, 6]"});
}

TEST_F(BrokenCheckpoint, MistypedTensorNamesTensorFileAndDtype) {
  const std::string name = "model.layers.1.mlp.gate.weight";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.add(name, Tensor::zeros(DType::kI32, {3, 6}));
  checkpoint_.write_single_file();
  expect_message_has(load_error(), {name, checkpoint_.path("model.safetensors"), "dtype i32"});
}

TEST_F(BrokenCheckpoint, Fp8WithoutScalesNamesTheMissingScale) {
  const std::string name = "model.layers.1.mlp.experts.0.gate_proj.weight";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.add(name, Tensor::zeros(DType::kF8E4M3, {4, 6}));
  checkpoint_.write_single_file();
  expect_message_has(load_error(), {name, "model.safetensors", name + "_scale_inv"});
}

TEST_F(BrokenCheckpoint, Fp8ScalesOfTheWrongShape) {
  const std::string name = "model.layers.1.mlp.experts.0.gate_proj.weight";
  ASSERT_TRUE(checkpoint_.remove(name));
  checkpoint_.add(name, Tensor::zeros(DType::kF8E4M3, {4, 6}));
  checkpoint_.add(name + "_scale_inv", Tensor::zeros(DType::kF32, {2, 1}));
  checkpoint_.write_single_file();
  expect_message_has(load_error(), {name + "_scale_inv", "expected shape [1, 1]", "got [2, 1]"});
}

TEST_F(BrokenCheckpoint, IndexPlacingATensorInTheWrongShard) {
  checkpoint_.write_shards(2);
  // Point the router at the shard that does not hold it.
  const std::string index_path = checkpoint_.path("model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  std::string& shard =
      index["weight_map"]["model.layers.1.mlp.gate.weight"].get_ref<std::string&>();
  shard = shard == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                      : "model-00001-of-00002.safetensors";
  std::ofstream(index_path) << index.dump();
  expect_message_has(load_error(), {"model.layers.1.mlp.gate.weight", shard, "no such tensor"});
}

TEST_F(BrokenCheckpoint, IndexListingAMissingShard) {
  checkpoint_.write_shards(2);
  std::filesystem::remove(checkpoint_.path("model-00002-of-00002.safetensors"));
  expect_message_has(error_message([&] { Checkpoint::open(checkpoint_.dir()); }),
                     {"model.safetensors.index.json", "model-00002-of-00002.safetensors"});
}

TEST_F(BrokenCheckpoint, IndexReachingOutsideTheFolder) {
  checkpoint_.write_shards(1);
  const std::string index_path = checkpoint_.path("model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  index["weight_map"]["model.layers.1.mlp.gate.weight"] = "../elsewhere.safetensors";
  std::ofstream(index_path) << index.dump();
  expect_message_has(error_message([&] { Checkpoint::open(checkpoint_.dir()); }),
                     {"model.layers.1.mlp.gate.weight", "../elsewhere.safetensors",
                      "a file name in the checkpoint folder"});
}

TEST_F(BrokenCheckpoint, NoWeightsFile) {
  expect_message_has(error_message([&] { Checkpoint::open(checkpoint_.dir()); }),
                     {checkpoint_.dir(), "model.safetensors", "model.safetensors.index.json"});
}

TEST_F(BrokenCheckpoint, NoConfig) {
  checkpoint_.write_single_file();
  std::filesystem::remove(checkpoint_.path("config.json"));
  expect_message_has(error_message([&] { Checkpoint::open(checkpoint_.dir()); }),
                     {checkpoint_.dir(), "config.json"});
}

TEST_F(BrokenCheckpoint, NoRouterListsWhatWasLookedFor) {
  ASSERT_TRUE(checkpoint_.remove("model.layers.1.mlp.gate.weight"));
  checkpoint_.write_single_file();
  expect_message_has(load_error(), {"layer 1", "model.layers.1.mlp.gate.weight",
                                    "model.layers.1.feed_forward.router.weight"});
}

TEST_F(BrokenCheckpoint, LoadsOnceRepaired) {
  checkpoint_.write_single_file();
  testing::expect_same_weights(load_moe_layer(Checkpoint::open(checkpoint_.dir()), 1, DType::kF32),
                               weights_);
}

TEST(CheckpointErrors, NotAFolder) {
  expect_message_has(error_message([] { Checkpoint::open("no-such-checkpoint-folder"); }),
                     {"no-such-checkpoint-folder", "not a folder"});
}

TEST(CheckpointErrors, SharedExpertsMissing) {
  TestCheckpoint checkpoint("no_shared");
  const nlohmann::json config = testing::qwen2_config(3, 6, 4, 2);
  checkpoint.write_config(config);
  const LayerWeights w = testing::hand_placed_weights(parse_hf_config(config.dump()));
  testing::add_router(checkpoint, "model.layers.1.mlp.", "gate.", w);
  testing::add_per_expert(checkpoint, "model.layers.1.mlp.", w, "gate_proj", "up_proj",
                          "down_proj");
  checkpoint.write_single_file();
  expect_message_has(
      error_message([&] { load_moe_layer(Checkpoint::open(checkpoint.dir()), 1, DType::kF32); }),
      {"shared experts", "model.layers.1.mlp.shared_expert.gate_proj.weight"});
}

}  // namespace
}  // namespace moe
