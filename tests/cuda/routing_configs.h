// Routing configurations the CUDA routing tests share: plain softmax top-k, and DeepSeek-V3's
// sigmoid scoring with group-limited selection, a correction bias and a scaling factor.
#pragma once

#include <cstdint>

#include "moe/routing.h"

namespace moe::testing {

inline RoutingConfig softmax_routing(int64_t E, int64_t k, bool renormalize) {
  RoutingConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.renormalize = renormalize;
  return c;
}

inline RoutingConfig deepseek_routing(int64_t E, int64_t k, int64_t groups, int64_t topk_groups) {
  RoutingConfig c = softmax_routing(E, k, true);
  c.scoring = ScoringFunc::kSigmoid;
  c.num_groups = groups;
  c.topk_groups = topk_groups;
  c.has_correction_bias = true;
  c.routed_scaling_factor = 2.5f;
  return c;
}

}  // namespace moe::testing
