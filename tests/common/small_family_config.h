// A layer of one routing family, shrunk so tests run it in microseconds: the layer tests' and the
// expert-parallel cases' shared starting point, before each picks its expert count and top-k.
#pragma once

#include <string>

#include "moe/config.h"

namespace moe::testing {

// family: "qwen3", "qwen2", "deepseek" (from their presets), "llama4" (sigmoid scores, top-1,
// the weight applied to the input, a shared expert) or "gpt-oss" (router bias, clamped SwiGLU,
// expert biases); the last two start from Qwen3-30B-A3B. H 40, I 24, shared experts 20 (llama4's
// 24). The routing keeps the preset's expert count, top-k and groups: the caller shrinks them.
inline MoeConfig small_family_config(const std::string& family) {
  MoeConfig c = preset_config(family == "deepseek" ? "deepseek-v3"
                              : family == "qwen2"  ? "qwen2-moe-a2.7b"
                                                   : "qwen3-30b-a3b");
  c.experts.hidden_size = 40;
  c.experts.intermediate_size = 24;
  if (c.experts.shared_intermediate_size > 0) c.experts.shared_intermediate_size = 20;
  if (family == "llama4") {
    c.routing.scoring = ScoringFunc::kSigmoid;
    c.routing.top_k = 1;
    c.routing.renormalize = false;
    c.routing.apply_weight_on_input = true;
    c.experts.shared_intermediate_size = 24;
  }
  if (family == "gpt-oss") {
    c.routing.has_router_bias = true;
    c.routing.renormalize = true;
    c.experts.activation = Activation::kClampedSwiglu;
    c.experts.has_bias = true;
  }
  return c;
}

}  // namespace moe::testing
