// Tiny Hugging Face checkpoints written by tests: a config.json, and the tensors of one MoE layer
// in each family's naming scheme and orientation, derived from engine-layout weights whose every
// element is a distinct, hand-placed value (so a transposed or swapped block cannot go unseen).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/expect_error.h"
#include "moe/config.h"
#include "moe/layer.h"
#include "moe/tensor.h"

namespace moe::testing {

// A fresh folder under the system's temporary directory, removed with the object.
class TestCheckpoint {
 public:
  explicit TestCheckpoint(const std::string& name);
  ~TestCheckpoint();
  TestCheckpoint(const TestCheckpoint&) = delete;
  TestCheckpoint& operator=(const TestCheckpoint&) = delete;

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& file) const { return dir_ + "/" + file; }

  void write_config(const nlohmann::json& config) const;
  void add(const std::string& name, Tensor tensor);
  // Drops tensor `name` (to make one go missing); returns whether it was there.
  bool remove(const std::string& name);
  void write_single_file() const;  // model.safetensors
  // model-0000s-of-0000n.safetensors, tensor i in shard i % num_shards, and the index.
  void write_shards(int num_shards) const;

 private:
  std::string dir_;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

// The config.json of a two-layer model of each family whose layer 1 is MoE (layer 0 is dense
// where the family allows it): E experts, hidden size H, expert size I.
nlohmann::json qwen3_config(int64_t E, int64_t H, int64_t I);
nlohmann::json qwen2_config(int64_t E, int64_t H, int64_t I, int64_t shared_I);
nlohmann::json mixtral_config(int64_t E, int64_t H, int64_t I);
nlohmann::json deepseek_config(int64_t E, int64_t H, int64_t I);  // one shared expert of size I
nlohmann::json llama4_config(int64_t E, int64_t H, int64_t I);    // multimodal, text_config
nlohmann::json gpt_oss_config(int64_t E, int64_t H, int64_t I);

// f32 weights in the engine's layout for `config`, each element distinct and exact in f32.
LayerWeights hand_placed_weights(const MoeConfig& config);

// Adds `w` (engine layout, f32) to `checkpoint` as a family stores it. `block` is the MoE
// module's prefix ("model.layers.1.mlp."); `router` the router module's name in it ("gate.").
void add_router(TestCheckpoint& checkpoint, const std::string& block, const std::string& router,
                const LayerWeights& w);
// experts.E.<gate>.weight [I, H], <up> [I, H], <down> [H, I].
void add_per_expert(TestCheckpoint& checkpoint, const std::string& block, const LayerWeights& w,
                    const std::string& gate, const std::string& up, const std::string& down);
// experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I], as the engine has them.
void add_fused(TestCheckpoint& checkpoint, const std::string& block, const LayerWeights& w);
// Llama-4: gate_up_proj [E, H, 2I] with x @ gate_up_proj = [gate | up], down_proj [E, I, H].
void add_fused_llama4(TestCheckpoint& checkpoint, const std::string& block, const LayerWeights& w);
// gpt-oss: as Llama-4 but gate at columns 0::2 and up at 1::2 of gate_up_proj and its bias.
void add_fused_gpt_oss(TestCheckpoint& checkpoint, const std::string& block, const LayerWeights& w);
// <block><module>gate_proj.weight [Is, H], up_proj [Is, H], down_proj [H, Is]; and, when `w`
// has one, the gate <block>shared_expert_gate.weight [1, H].
void add_shared(TestCheckpoint& checkpoint, const std::string& block, const std::string& module,
                const LayerWeights& w);

// Expects every tensor of `got` to equal `expected`'s bit for bit (dtype, shape and bytes),
// undefined ones included.
void expect_same_weights(const LayerWeights& got, const LayerWeights& expected);

}  // namespace moe::testing
