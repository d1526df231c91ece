// The `moe` program on a checkpoint written here, run as a user would: `moe forward` must write
// exactly what the same layer computes in-process, and `moe run --checkpoint` must run the
// checkpoint's weights. The build passes the program's path as MOE_CLI_PATH.
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "checkpoint/checkpoint_fixture.h"
#include "common/random_tensors.h"
#include "moe/checkpoint.h"
#include "moe/layer.h"
#include "moe/safetensors.h"

namespace moe {
namespace {

using testing::TestCheckpoint;

constexpr int64_t kTokens = 5, kHidden = 16;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void expect_same_bytes(const TensorView& got, const TensorView& want, const char* name) {
  ASSERT_EQ(dtype_name(got.dtype), dtype_name(want.dtype)) << name;
  ASSERT_EQ(shape_string(got.shape), shape_string(want.shape)) << name;
  EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes()), 0) << name << " differs";
}

// A Qwen2-MoE checkpoint (6 experts, top-2, a gated shared expert; layer 0 dense, layer 1 MoE)
// with synthetic weights, and an input file next to it.
class MoeCli : public ::testing::Test {
 protected:
  MoeCli() : checkpoint_("cli") {
    const nlohmann::json config = testing::qwen2_config(6, kHidden, 8, 12);
    checkpoint_.write_config(config);
    config_ = parse_hf_config(config.dump());
    const LayerWeights weights = synthetic_layer_weights(config_, DType::kF32, 3);
    testing::add_router(checkpoint_, "model.layers.1.mlp.", "gate.", weights);
    testing::add_per_expert(checkpoint_, "model.layers.1.mlp.", weights, "gate_proj", "up_proj",
                            "down_proj");
    testing::add_shared(checkpoint_, "model.layers.1.mlp.", "shared_expert.", weights);
    checkpoint_.write_single_file();
  }

  std::string write_input(DType dtype, int64_t width = kHidden) const {
    const std::string path = checkpoint_.path("input.safetensors");
    const Tensor hidden = testing::random_normal(dtype, {kTokens, width}, 17);
    write_safetensors(path, {{"hidden_states", hidden.view()}});
    return path;
  }

  // Runs `moe <arguments>`, its output kept in log(); returns the exit status.
  int moe(const std::string& arguments) const {
    const std::string command =
        fmt::format("\"{}\" {} > \"{}\" 2>&1", MOE_CLI_PATH, arguments, log_path());
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string log() const { return read_text(log_path()); }
  std::string log_path() const { return checkpoint_.path("moe.log"); }

  // What `moe forward` must have written, computed in-process.
  void expect_output_matches_layer(const std::string& output, const std::string& input, DType dtype,
                                   Backend backend) const {
    const Checkpoint checkpoint = Checkpoint::open(checkpoint_.dir());
    MoeLayer layer(config_, load_moe_layer(checkpoint, 1, dtype), LayerOptions{backend, 2, 0});
    const SafetensorsFile in = SafetensorsFile::open(input);
    const Tensor want = layer.forward(in.tensor("hidden_states"));
    const SafetensorsFile out = SafetensorsFile::open(output);
    expect_same_bytes(out.tensor("hidden_states"), want, "hidden_states");
    expect_same_bytes(out.tensor("topk_ids"), layer.last_topk_ids(), "topk_ids");
    expect_same_bytes(out.tensor("topk_weights"), layer.last_topk_weights(), "topk_weights");
    EXPECT_EQ(out.metadata().at("layer"), "1");
  }

  TestCheckpoint checkpoint_;
  MoeConfig config_;
};

TEST_F(MoeCli, ForwardWritesTheLayerOutputAndRouting) {
  const std::string input = write_input(DType::kF32);
  const std::string output = checkpoint_.path("output.safetensors");
  ASSERT_EQ(moe(fmt::format("forward --checkpoint \"{}\" --layer 1 --input \"{}\" --output \"{}\" "
                            "--dtype f32 --threads 2 --backend cpu",
                            checkpoint_.dir(), input, output)),
            0)
      << log();
  expect_output_matches_layer(output, input, DType::kF32, Backend::kCpu);
}

// Without --layer the first MoE layer runs; without --dtype the input's dtype is used.
TEST_F(MoeCli, ForwardDefaultsToTheFirstMoeLayerAndTheInputDtype) {
  const std::string input = write_input(DType::kBF16);
  const std::string output = checkpoint_.path("output.safetensors");
  ASSERT_EQ(moe(fmt::format("forward --checkpoint \"{}\" --input \"{}\" --output \"{}\" "
                            "--threads 2 --backend reference",
                            checkpoint_.dir(), input, output)),
            0)
      << log();
  expect_output_matches_layer(output, input, DType::kBF16, Backend::kReference);
}

TEST_F(MoeCli, ForwardRefusesADenseLayer) {
  const std::string input = write_input(DType::kF32);
  EXPECT_EQ(moe(fmt::format("forward --checkpoint \"{}\" --layer 0 --input \"{}\" --output \"{}\"",
                            checkpoint_.dir(), input, checkpoint_.path("output.safetensors"))),
            1);
  EXPECT_NE(log().find("moe: error: layer 0"), std::string::npos) << log();
  EXPECT_NE(log().find("dense"), std::string::npos) << log();
}

TEST_F(MoeCli, ForwardRejectsAnInputOfTheWrongWidth) {
  const std::string input = write_input(DType::kF32, kHidden - 1);
  EXPECT_EQ(moe(fmt::format("forward --checkpoint \"{}\" --input \"{}\" --output \"{}\"",
                            checkpoint_.dir(), input, checkpoint_.path("output.safetensors"))),
            1);
  EXPECT_NE(log().find("\"hidden_states\": expected a float tensor [M, 16]"), std::string::npos)
      << log();
}

TEST_F(MoeCli, RunUsesTheCheckpointWeights) {
  ASSERT_EQ(moe(fmt::format("run --checkpoint \"{}\" --tokens 1,9 --repeats 1 --dtype f32 "
                            "--threads 2 --json",
                            checkpoint_.dir())),
            0)
      << log();
  EXPECT_NE(log().find("\"weights\": \"layer 1 of"), std::string::npos) << log();
  EXPECT_NE(log().find("\"within_bound\": true"), std::string::npos) << log();
}

}  // namespace
}  // namespace moe
