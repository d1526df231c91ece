// Hugging Face checkpoints: a folder holding config.json and the weights as safetensors, either one
// model.safetensors or shards listed by model.safetensors.index.json. Every file is memory-mapped,
// so opening a checkpoint reads only headers; load_moe_layer then reads one layer's tensors and
// builds the engine's LayerWeights from them.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "moe/config.h"
#include "moe/layer.h"
#include "moe/safetensors.h"
#include "moe/tensor.h"

namespace moe {

class Checkpoint {
 public:
  // Opens the checkpoint folder `dir`: config.json through load_hf_config, then, as transformers
  // does, model.safetensors when it exists, else the shards named by model.safetensors.index.json
  // ({"weight_map": {tensor: file}}). Throws moe::Error naming the file at fault: a missing
  // config.json or weights file, an index that is not JSON or whose weight_map is not an object of
  // file names in the folder, a shard that is not a valid safetensors file, a quantization_config
  // whose quant_method is neither "fp8" nor "mxfp4" or whose fp8 fmt is not "e4m3".
  static Checkpoint open(const std::string& dir);

  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  const MoeConfig& config() const { return config_; }
  // Rows and columns of one scale block of fp8 weights: config.json's
  // quantization_config.weight_block_size, or 128 x 128 (DeepSeek-V3's) when it gives none.
  const std::array<int64_t, 2>& fp8_block() const { return fp8_block_; }

  // Every tensor name of the checkpoint, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  // A read-only view into the mapping of the tensor's file; valid while this object lives.
  // Throws moe::Error naming the tensor and the checkpoint when there is none, and the tensor
  // and the shard when the index places it in a shard that lacks it.
  TensorView tensor(const std::string& name) const;
  // The path of the file holding `name` (the checkpoint folder when there is no such tensor), for
  // messages about the tensor.
  std::string file_of(const std::string& name) const;

 private:
  Checkpoint() = default;

  std::string dir_;
  MoeConfig config_;
  std::array<int64_t, 2> fp8_block_ = {128, 128};
  std::string catalog_;  // the file naming the tensors: the index, or the single weights file
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t> shard_of_;  // tensor name -> index into shards_
};

// The MoE block of decoder layer `layer` (0-based) in the engine's layout, converted to `dtype`
// (f32, bf16 or f16; the biases stay f32) and stacked over experts once, here.
//
// Tensor names follow the model family (config.json's model_type) under the layer's prefix
// ("model.layers.L.", or with "language_model." in front or after "model." as multimodal
// checkpoints have it): per-expert projections (experts.E.gate_proj/up_proj/down_proj.weight, or
// Mixtral's w1/w3/w2) and fused 3-D ones (experts.gate_up_proj and experts.down_proj), in the
// orientation of that family: [E, 2I, H] and [E, H, I] like the engine, transposed for Llama-4, and
// transposed with gate and up interleaved for gpt-oss. Quantized weights are dequantized here,
// once: f8_e4m3 weights (DeepSeek-V3, Qwen3 FP8) come with a block scale tensor named like them
// plus "_scale_inv", and value = fp8 * scale; MXFP4 experts (gpt-oss as published) are
// experts.gate_up_proj_blocks / down_proj_blocks [E, out, in / 32, 16] u8, two e2m1 values per
// byte (low nibble first), with experts.*_scales [E, out, in / 32] u8 e8m0 exponents, and value =
// e2m1 * 2^(scale - 127).
//
// Throws moe::Error when the layer is out of range or dense (listing the MoE layers), and naming
// the tensor and its file when a tensor is missing, has the wrong shape or a dtype other than a
// float one (u8 for MXFP4 blocks and scales).
LayerWeights load_moe_layer(const Checkpoint& checkpoint, int64_t layer, DType dtype);

}  // namespace moe
