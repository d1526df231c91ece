// The naming schemes, as huggingface/transformers writes them (see docs/checkpoints.md for the
// source files each was checked against):
//   Qwen3-MoE, Qwen2-MoE, OLMoE, DeepSeek-V3: mlp.gate.weight, mlp.experts.E.{gate,up,down}_proj;
//     DeepSeek adds mlp.gate.e_score_correction_bias and mlp.shared_experts.*, Qwen2-MoE
//     mlp.shared_expert.* and mlp.shared_expert_gate.weight.
//   Mixtral: block_sparse_moe.gate.weight, block_sparse_moe.experts.E.w1 (gate) / w3 (up) / w2.
//   transformers 5 fuses all of these into mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then
//     up) and mlp.experts.down_proj [E, H, I], renaming Mixtral's block to mlp.
//   Llama-4: feed_forward.router.weight, feed_forward.experts.gate_up_proj [E, H, 2I] (gate
//     columns, then up) and down_proj [E, I, H], feed_forward.shared_expert.*.
//   gpt-oss: mlp.router.weight and .bias, mlp.experts.gate_up_proj [E, H, 2I] with gate and up
//     interleaved, gate_up_proj_bias [E, 2I] likewise, down_proj [E, I, H], down_proj_bias [E, H].
//     As published, MXFP4: mlp.experts.gate_up_proj_blocks [E, 2I, H / 32, 16] and _scales
//     [E, 2I, H / 32] (rows still interleaved), down_proj_blocks [E, H, I / 32, 16] and _scales;
//     transformers' dequantization (integrations/mxfp4.py) yields [E, out, in] and transposes
//     it to the [E, in, out] above.
#include "checkpoint/moe_tensor_names.h"

#include <optional>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "moe/error.h"

namespace moe {

namespace {

// Where decoder layers sit: text models, then multimodal ones (Llama-4) as transformers 4 and 5
// name their language model.
std::vector<std::string> layer_prefixes(int64_t layer) {
  return {fmt::format("model.layers.{}.", layer),
          fmt::format("language_model.model.layers.{}.", layer),
          fmt::format("model.language_model.layers.{}.", layer)};
}

constexpr const char* kBlocks[] = {"mlp.", "block_sparse_moe.", "feed_forward."};
constexpr const char* kRouters[] = {"gate.", "router."};

struct Located {
  std::string block;   // "model.layers.3.mlp."
  std::string router;  // "model.layers.3.mlp.gate."
};

std::optional<Located> locate_router(const Checkpoint& checkpoint, int64_t layer,
                                     std::vector<std::string>& tried) {
  for (const std::string& prefix : layer_prefixes(layer)) {
    for (const char* block : kBlocks) {
      for (const char* router : kRouters) {
        const std::string module = prefix + block + router;
        if (checkpoint.contains(module + "weight")) return Located{prefix + block, module};
        tried.push_back(module + "weight");
      }
    }
  }
  return std::nullopt;
}

void set_fused_orientation(const std::string& model_type, MoeTensorNames& names) {
  const bool llama4 = model_type == "llama4" || model_type == "llama4_text";
  const bool gpt_oss = model_type == "gpt_oss";
  names.transposed = llama4 || gpt_oss;
  names.interleaved = gpt_oss;
}

}  // namespace

std::string MoeTensorNames::expert(int64_t index, const std::string& projection) const {
  return fmt::format("{}{}.{}.weight", expert_prefix, index, projection);
}

MoeTensorNames find_moe_tensor_names(const Checkpoint& checkpoint, int64_t layer) {
  const MoeConfig& config = checkpoint.config();
  std::vector<std::string> tried;
  const std::optional<Located> located = locate_router(checkpoint, layer, tried);
  if (!located) {
    fail("layer {}: no MoE router weight in checkpoint {}; looked for {}", layer, checkpoint.dir(),
         fmt::join(tried, ", "));
  }
  MoeTensorNames names;
  names.router = located->router + "weight";
  if (config.routing.has_router_bias) names.router_bias = located->router + "bias";
  if (config.routing.has_correction_bias) {
    names.correction_bias = located->router + "e_score_correction_bias";
  }

  const std::string experts = located->block + "experts.";
  const bool mxfp4 = checkpoint.contains(experts + "gate_up_proj_blocks");
  if (mxfp4 || checkpoint.contains(experts + "gate_up_proj")) {
    names.fused_gate_up = experts + "gate_up_proj";
    names.fused_down = experts + "down_proj";
    if (config.experts.has_bias) {
      names.fused_gate_up_bias = experts + "gate_up_proj_bias";
      names.fused_down_bias = experts + "down_proj_bias";
    }
    set_fused_orientation(config.model_type, names);
    if (mxfp4) {
      names.mxfp4 = true;
      names.transposed = false;  // blocks are [E, out, in] in every family
    }
  } else if (checkpoint.contains(experts + "0.gate_proj.weight")) {
    names.expert_prefix = experts;
    names.gate_proj = "gate_proj";
    names.up_proj = "up_proj";
    names.down_proj = "down_proj";
  } else if (checkpoint.contains(experts + "0.w1.weight")) {
    names.expert_prefix = experts;
    names.gate_proj = "w1";
    names.up_proj = "w3";
    names.down_proj = "w2";
  } else {
    fail(
        "layer {}: no experts in checkpoint {}; looked for {}gate_up_proj, {}gate_up_proj_blocks "
        "(MXFP4), {}0.gate_proj.weight and {}0.w1.weight",
        layer, checkpoint.dir(), experts, experts, experts, experts);
  }
  if (config.experts.has_bias && !names.fused()) {
    fail(
        "layer {}: the config has expert biases, which are read from fused experts only "
        "({}gate_up_proj_bias); checkpoint {} has per-expert tensors",
        layer, experts, checkpoint.dir());
  }

  if (config.experts.shared_intermediate_size > 0) {
    for (const char* module : {"shared_expert.", "shared_experts."}) {
      if (checkpoint.contains(located->block + module + "gate_proj.weight")) {
        names.shared_prefix = located->block + module;
        break;
      }
    }
    if (names.shared_prefix.empty()) {
      fail(
          "layer {}: the config has shared experts (intermediate size {}), but checkpoint {} has "
          "neither {}shared_expert.gate_proj.weight nor {}shared_experts.gate_proj.weight",
          layer, config.experts.shared_intermediate_size, checkpoint.dir(), located->block,
          located->block);
    }
    if (config.experts.shared_gate) {
      names.shared_gate = located->block + "shared_expert_gate.weight";
    }
  }
  return names;
}

}  // namespace moe
