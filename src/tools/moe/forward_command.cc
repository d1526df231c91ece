// `moe forward`: the MoE block of one decoder layer of a Hugging Face checkpoint (router, routed
// experts, shared experts: everything between the post-attention norm and the residual add) on
// the hidden states of a safetensors file. Writes the output and the routing to another, so the
// engine can be compared tensor by tensor with other implementations.
#include <omp.h>

#include <string>

#include <fmt/format.h>

#include "moe/checkpoint.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "moe/safetensors.h"
#include "tools/moe/commands.h"

namespace moe::cli {

namespace {

constexpr const char* kHiddenName = "hidden_states";

struct ForwardOptions {
  std::string checkpoint;
  int64_t layer = 0;
  bool layer_given = false;  // otherwise the first MoE layer
  std::string input;
  std::string output;
  std::string dtype;  // empty: the input's dtype
  int threads = 0;
  std::string backend = "cpu";
  std::string device = "cpu";  // cuda: the layer runs on the GPU (backend cuda)
};

// The weights' dtype: as asked, else the input's when the kernels take it, else f32.
DType weight_dtype(const std::string& asked, DType input) {
  if (!asked.empty()) return parse_dtype(asked);
  const bool kernel_dtype = input == DType::kF32 || input == DType::kBF16 || input == DType::kF16;
  return kernel_dtype ? input : DType::kF32;
}

void forward(const ForwardOptions& o) {
  if (o.threads < 0) fail("--threads: expected >= 0 (0 = all cores); got {}", o.threads);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const Checkpoint checkpoint = Checkpoint::open(o.checkpoint);
  const MoeConfig& config = checkpoint.config();
  const int64_t layer = o.layer_given ? o.layer : config.first_moe_layer();

  const SafetensorsFile input = SafetensorsFile::open(o.input);
  const TensorView hidden = input.tensor(kHiddenName);
  const int64_t H = config.experts.hidden_size;
  if (hidden.dim() != 2 || hidden.size(1) != H || !is_floating(hidden.dtype)) {
    fail("{}: \"{}\": expected a float tensor [M, {}] (the checkpoint's hidden size); got {} {}",
         o.input, kHiddenName, H, dtype_name(hidden.dtype), shape_string(hidden.shape));
  }
  const DType dtype = weight_dtype(o.dtype, hidden.dtype);

  LayerOptions options;
  options.backend = parse_backend(o.backend);
  if (o.device == "cuda") {
    if (o.backend != "cpu" && o.backend != "cuda") {
      fail("--device cuda runs the cuda backend; got --backend {}", o.backend);
    }
    options.backend = Backend::kCuda;
  }
  options.num_threads = o.threads;
  MoeLayer moe_layer(config, load_moe_layer(checkpoint, layer, dtype), options);
  const Tensor out = moe_layer.forward(Tensor::copy_of(hidden, dtype));
  const Tensor topk_ids = Tensor::copy_of(moe_layer.last_topk_ids(), DType::kI32);
  const Tensor topk_weights = Tensor::copy_of(moe_layer.last_topk_weights(), DType::kF32);
  write_safetensors(o.output,
                    {{kHiddenName, out}, {"topk_ids", topk_ids}, {"topk_weights", topk_weights}},
                    {{"layer", std::to_string(layer)},
                     {"model_type", config.model_type},
                     {"dtype", std::string(dtype_name(dtype))},
                     {"backend", std::string(backend_name(options.backend))}});
  fmt::print("moe forward: layer {} ({}) on {} tokens, {} weights, {} backend -> {}\n", layer,
             config.model_type, hidden.size(0), dtype_name(dtype), backend_name(options.backend),
             o.output);
}

}  // namespace

void add_forward_command(CLI::App& app) {
  auto options = std::make_shared<ForwardOptions>();
  CLI::App* cmd = app.add_subcommand(
      "forward",
      "Run the MoE block of one layer of a Hugging Face checkpoint on the tensor \"hidden_states\" "
      "[M, H] of a safetensors file; write \"hidden_states\", \"topk_ids\" and \"topk_weights\"");
  cmd->add_option("--checkpoint", options->checkpoint,
                  "Checkpoint folder: config.json and model.safetensors or its sharded index")
      ->required();
  CLI::Option* layer =
      cmd->add_option("--layer", options->layer, "Decoder layer (default: the first MoE layer)");
  cmd->add_option("--input", options->input, "Safetensors file holding \"hidden_states\" [M, H]")
      ->required();
  cmd->add_option("--output", options->output, "Safetensors file to write")->required();
  cmd->add_option("--dtype", options->dtype,
                  "Weights and computation: f32, bf16 or f16 (default: the input's dtype)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--threads", options->threads, "Worker threads (0 = all cores)")
      ->capture_default_str();
  cmd->add_option("--backend", options->backend,
                  "cpu, reference (the float64 oracle) or cuda (same as --device cuda)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "reference", "cuda"}));
  cmd->add_option("--device", options->device,
                  "cpu, or cuda: the GPU (bf16 weights; see docs/cuda.md for what it runs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->callback([options, layer] {
    options->layer_given = layer->count() > 0;
    forward(*options);
  });
}

}  // namespace moe::cli
