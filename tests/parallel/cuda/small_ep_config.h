// The layer shapes the GPU expert-parallel test programs run, shrunk so a step takes
// microseconds (H 256, I 128, 16 experts, top-4): Qwen3-30B-A3B's routing and activation, and
// layers with shared experts.
#pragma once

#include "moe/config.h"

namespace moe::testing {

inline MoeConfig small_ep_config() {
  MoeConfig config = preset_config("qwen3-30b-a3b");
  config.experts.hidden_size = 256;
  config.experts.intermediate_size = 128;
  config.routing.num_experts = 16;
  config.routing.top_k = 4;
  return config;
}

// DeepSeek-V3's routing (groups, correction bias, scaling) and ungated shared MLP, two experts
// wide, at the same size.
inline MoeConfig small_ep_deepseek_v3() {
  MoeConfig config = preset_config("deepseek-v3");
  config.experts.hidden_size = 256;
  config.experts.intermediate_size = 128;
  config.experts.shared_intermediate_size = 256;
  config.routing.num_experts = 16;
  config.routing.top_k = 4;
  config.routing.num_groups = 4;
  config.routing.topk_groups = 2;
  return config;
}

// Qwen2-MoE's routing and gated shared MLP, wider than the experts (Is != I).
inline MoeConfig small_ep_qwen2_moe() {
  MoeConfig config = preset_config("qwen2-moe-a2.7b");
  config.experts.hidden_size = 256;
  config.experts.intermediate_size = 128;
  config.experts.shared_intermediate_size = 320;
  config.routing.num_experts = 16;
  config.routing.top_k = 4;
  return config;
}

}  // namespace moe::testing
