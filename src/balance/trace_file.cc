// Routing traces as safetensors files (format in include/moe/trace.h).
#include <charconv>
#include <map>
#include <utility>
#include <vector>

#include "moe/error.h"
#include "moe/safetensors.h"
#include "moe/trace.h"

namespace moe {

namespace {

std::string tensor_name(int64_t layer, const char* what) {
  return "layers." + std::to_string(layer) + "." + what;
}

int64_t metadata_int(const SafetensorsFile& file, const std::string& key) {
  const auto& metadata = file.metadata();
  const auto it = metadata.find(key);
  if (it == metadata.end()) fail("{}: trace metadata has no '{}'", file.path(), key);
  int64_t value = 0;
  const auto [end, error] =
      std::from_chars(it->second.data(), it->second.data() + it->second.size(), value);
  if (error != std::errc() || end != it->second.data() + it->second.size() || value < 0) {
    fail("{}: trace metadata '{}' must be a non-negative integer; got '{}'", file.path(), key,
         it->second);
  }
  return value;
}

template <typename T>
std::vector<T> copy_tensor(const SafetensorsFile& file, const std::string& name, DType dtype,
                           int64_t rank) {
  const TensorView view = file.tensor(name);
  if (view.dtype != dtype || view.dim() != rank) {
    fail("{}: tensor '{}' must be {}-D {}; got {} {}", file.path(), name, rank, dtype_name(dtype),
         dtype_name(view.dtype), shape_string(view.shape));
  }
  const T* data = view.as<T>();
  return std::vector<T>(data, data + view.numel());
}

void check_layer(const RoutingTrace& trace, int64_t l, const std::string& where) {
  const TraceLayer& layer = trace.layers[static_cast<size_t>(l)];
  const int64_t k = trace.top_k;
  if (k < 1 || static_cast<int64_t>(layer.topk_ids.size()) % k != 0) {
    fail("{}: layer {} topk_ids must hold whole tokens of top_k = {}; got {} ids", where, l, k,
         layer.topk_ids.size());
  }
  const int64_t tokens = static_cast<int64_t>(layer.topk_ids.size()) / k;
  for (size_t i = 0; i < layer.topk_ids.size(); ++i) {
    if (layer.topk_ids[i] < 0 || layer.topk_ids[i] >= trace.num_experts) {
      fail("{}: layer {} topk_ids[{}] = {} is outside [0, {})", where, l, i, layer.topk_ids[i],
           trace.num_experts);
    }
  }
  if (!layer.source_gpu.empty() && static_cast<int64_t>(layer.source_gpu.size()) != tokens) {
    fail("{}: layer {} source_gpu holds {} entries for {} tokens", where, l,
         layer.source_gpu.size(), tokens);
  }
  const std::vector<int64_t>& offsets = layer.step_offsets;
  if (!offsets.empty()) {
    bool ordered = offsets.front() == 0 && offsets.back() == tokens;
    for (size_t s = 1; s < offsets.size(); ++s) ordered = ordered && offsets[s - 1] <= offsets[s];
    if (!ordered) {
      fail("{}: layer {} step_offsets must rise from 0 to the {} tokens", where, l, tokens);
    }
  }
}

}  // namespace

void write_trace(const std::string& path, const RoutingTrace& trace, const std::string& model) {
  if (static_cast<int64_t>(trace.layers.size()) != trace.num_layers) {
    fail("write_trace: trace has {} layers but num_layers = {}", trace.layers.size(),
         trace.num_layers);
  }
  // Every tensor the file holds, with the step offsets made explicit for layers without them.
  std::vector<std::vector<int64_t>> offsets(trace.layers.size());
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    check_layer(trace, l, path);
    const TraceLayer& layer = trace.layers[static_cast<size_t>(l)];
    const int64_t tokens = static_cast<int64_t>(layer.topk_ids.size()) / trace.top_k;
    std::vector<int64_t>& steps = offsets[static_cast<size_t>(l)];
    steps = layer.step_offsets.empty() ? std::vector<int64_t>{0, tokens} : layer.step_offsets;
    tensors.emplace_back(tensor_name(l, "topk_ids"),
                         TensorView(const_cast<int32_t*>(layer.topk_ids.data()), DType::kI32,
                                    {tokens, trace.top_k}));
    tensors.emplace_back(
        tensor_name(l, "step_offsets"),
        TensorView(steps.data(), DType::kI64, {static_cast<int64_t>(steps.size())}));
    if (!layer.source_gpu.empty()) {
      tensors.emplace_back(
          tensor_name(l, "source_gpu"),
          TensorView(const_cast<int32_t*>(layer.source_gpu.data()), DType::kI32, {tokens}));
    }
  }
  std::map<std::string, std::string> metadata = {{"format", kTraceFormat},
                                                 {"num_layers", std::to_string(trace.num_layers)},
                                                 {"num_experts", std::to_string(trace.num_experts)},
                                                 {"top_k", std::to_string(trace.top_k)}};
  if (!model.empty()) metadata["model"] = model;
  write_safetensors(path, tensors, metadata);
}

RoutingTrace read_trace(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  const auto format = file.metadata().find("format");
  if (format == file.metadata().end() || format->second != kTraceFormat) {
    fail("{}: not a routing trace (metadata 'format' must be '{}')", path, kTraceFormat);
  }
  RoutingTrace trace;
  trace.num_layers = metadata_int(file, "num_layers");
  trace.num_experts = metadata_int(file, "num_experts");
  trace.top_k = metadata_int(file, "top_k");
  if (trace.num_experts < 1 || trace.top_k < 1 || trace.top_k > trace.num_experts) {
    fail("{}: trace needs 1 <= top_k <= num_experts; got top_k {} and {} experts", path,
         trace.top_k, trace.num_experts);
  }
  trace.layers.resize(static_cast<size_t>(trace.num_layers));
  for (int64_t l = 0; l < trace.num_layers; ++l) {
    TraceLayer& layer = trace.layers[static_cast<size_t>(l)];
    const std::string ids_name = tensor_name(l, "topk_ids");
    layer.topk_ids = copy_tensor<int32_t>(file, ids_name, DType::kI32, 2);
    if (file.tensor(ids_name).size(1) != trace.top_k) {
      fail("{}: tensor '{}' must be [num_tokens, top_k = {}]; got {}", path, ids_name, trace.top_k,
           shape_string(file.tensor(ids_name).shape));
    }
    layer.step_offsets = copy_tensor<int64_t>(file, tensor_name(l, "step_offsets"), DType::kI64, 1);
    if (file.contains(tensor_name(l, "source_gpu"))) {
      layer.source_gpu = copy_tensor<int32_t>(file, tensor_name(l, "source_gpu"), DType::kI32, 1);
    }
    check_layer(trace, l, path);
  }
  return trace;
}

}  // namespace moe
