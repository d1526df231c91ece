// Checkpoint: one Hugging Face checkpoint folder. The config is parsed and every weights file is
// mapped once, at open; a tensor is then found by name through the index, in whichever shard
// holds it.
#include "moe/checkpoint.h"

#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/json_fields.h"
#include "core/text_file.h"
#include "moe/error.h"

namespace moe {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// An index lists every tensor name once; DeepSeek-V3's, with ~90k tensors, is under 10 MB.
// Refusing much bigger files keeps a mistaken path from being read into memory whole.
constexpr std::uintmax_t kMaxJsonBytes = 256u << 20;

Json read_json_object(const fs::path& path) {
  const std::string text = read_small_text_file(path, kMaxJsonBytes, "a JSON file");
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& error) {
    fail("{}: not valid JSON: {}", path.string(), error.what());
  }
  if (!root.is_object()) {
    fail("{}: expected a JSON object at the top; got {}", path.string(), describe_json(root));
  }
  return root;
}

// The part of config.json's quantization_config that loading depends on: the method, which must be
// one whose tensors load_moe_layer decodes, and for fp8 the format and the scale block ([rows,
// cols], 128 x 128 when the config gives none, which is what DeepSeek-V3 uses). Other fields
// (activation_scheme, modules_to_not_convert) say how a runtime treats activations or which
// modules stayed unquantized, which the tensors' own dtypes already tell.
std::array<int64_t, 2> read_fp8_block(const fs::path& config_path) {
  const Json root = read_json_object(config_path);
  const auto quantization = root.find("quantization_config");
  if (quantization == root.end() || quantization->is_null()) return {128, 128};
  const std::string source = config_path.string();
  if (!quantization->is_object()) {
    fail("{}: field \"quantization_config\": expected an object; got {}", source,
         describe_json(*quantization));
  }
  const JsonFields fields(*quantization, source, "quantization_config.");
  // Without a quant_method the tensors' dtypes decide, and a weight_block_size is still read.
  const std::string method = fields.string_or("quant_method", "");
  if (method == "mxfp4") return {128, 128};  // MXFP4 groups are fixed at 32; no block to read
  if (!method.empty() && method != "fp8") {
    fields.fail_field("quant_method",
                      "\"fp8\" (f8_e4m3 weights with block scales) or \"mxfp4\" (gpt-oss "
                      "experts); other quantized checkpoints are not supported",
                      fmt::format("\"{}\"", method));
  }
  const std::string format = fields.string_or("fmt", "e4m3");
  if (format != "e4m3") {
    fields.fail_field("fmt", "\"e4m3\" (f8_e4m3 weights)", fmt::format("\"{}\"", format));
  }
  const std::vector<int64_t> block = fields.integer_list_or_empty("weight_block_size");
  if (block.empty()) return {128, 128};
  if (block.size() != 2 || block[0] <= 0 || block[1] <= 0) {
    fields.fail_field("weight_block_size", "two positive integers [rows, cols]",
                      fmt::format("{} numbers", block.size()));
  }
  return {block[0], block[1]};
}

// The index's weight_map: tensor name -> file name, each file in the checkpoint folder.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const Json root = read_json_object(index_path);
  const std::string source = index_path.string();
  const auto map = root.find("weight_map");
  if (map == root.end() || !map->is_object()) {
    fail("{}: expected an object \"weight_map\" of tensor name -> file name; got {}", source,
         map == root.end() ? std::string("none") : describe_json(*map));
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string()) {
      fail("{}: weight_map[\"{}\"]: expected a file name; got {}", source, tensor,
           describe_json(file));
    }
    const std::string name = file.get<std::string>();
    // Shards live next to the index; a path elsewhere is a broken or hostile index.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      fail("{}: weight_map[\"{}\"]: expected a file name in the checkpoint folder; got \"{}\"",
           source, tensor, name);
    }
    weight_map.emplace(tensor, name);
  }
  return weight_map;
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    fail(
        "checkpoint {}: not a folder; expected a Hugging Face checkpoint folder holding {} and "
        "{} (or {} and its shards)",
        dir, kConfigFile, kSingleFile, kIndexFile);
  }
  const fs::path folder(dir);
  const fs::path config_path = folder / kConfigFile;
  if (!fs::exists(config_path, error)) {
    fail("checkpoint {}: no {}; expected a Hugging Face checkpoint folder", dir, kConfigFile);
  }

  Checkpoint checkpoint;
  checkpoint.dir_ = dir;
  checkpoint.config_ = load_hf_config(config_path.string());
  checkpoint.fp8_block_ = read_fp8_block(config_path);

  // As in transformers: the single file when there is one, else the index and its shards.
  const fs::path single_path = folder / kSingleFile;
  const fs::path index_path = folder / kIndexFile;
  if (fs::exists(single_path, error)) {
    checkpoint.catalog_ = single_path.string();
    checkpoint.shards_.push_back(SafetensorsFile::open(checkpoint.catalog_));
    for (const std::string& name : checkpoint.shards_.front().names()) {
      checkpoint.shard_of_.emplace(name, 0);
    }
    return checkpoint;
  }
  if (!fs::exists(index_path, error)) {
    fail("checkpoint {}: neither {} nor {}; expected the weights as safetensors", dir, kSingleFile,
         kIndexFile);
  }
  checkpoint.catalog_ = index_path.string();
  const std::map<std::string, std::string> weight_map = read_weight_map(index_path);
  std::set<std::string> files;
  for (const auto& entry : weight_map) files.insert(entry.second);
  std::map<std::string, size_t> shard_of_file;
  for (const std::string& file : files) {
    const fs::path shard_path = folder / file;
    if (!fs::exists(shard_path, error)) {
      fail("{}: lists shard {}, which is not in the checkpoint folder", checkpoint.catalog_, file);
    }
    shard_of_file.emplace(file, checkpoint.shards_.size());
    checkpoint.shards_.push_back(SafetensorsFile::open(shard_path.string()));
  }
  for (const auto& [tensor, file] : weight_map) {
    checkpoint.shard_of_.emplace(tensor, shard_of_file.at(file));
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  names.reserve(shard_of_.size());
  for (const auto& entry : shard_of_) names.push_back(entry.first);
  return names;
}

TensorView Checkpoint::tensor(const std::string& name) const {
  const auto found = shard_of_.find(name);
  if (found == shard_of_.end()) {
    fail("tensor \"{}\": not in checkpoint {} ({} names {} tensors, not this one)", name, dir_,
         catalog_, shard_of_.size());
  }
  const SafetensorsFile& shard = shards_[found->second];
  if (!shard.contains(name)) {
    fail("tensor \"{}\": {} places it in {}, which holds no such tensor", name, kIndexFile,
         shard.path());
  }
  return shard.tensor(name);
}

std::string Checkpoint::file_of(const std::string& name) const {
  const auto found = shard_of_.find(name);
  return found == shard_of_.end() ? dir_ : shards_[found->second].path();
}

}  // namespace moe
