// The layer shape both GPU expert-parallel test programs run: Qwen3-30B-A3B's routing and
// activation, shrunk so a step takes microseconds (H 256, I 128, 16 experts, top-4).
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

}  // namespace moe::testing
