// Parameter and byte counting for a model described by a MoeConfig.
#pragma once

#include <cstdint>

#include "moe/config.h"

namespace moe {

struct ParamCounts {
  int64_t total = 0;                 // every parameter of the checkpoint's language model
  int64_t active_per_token = 0;      // executed for one token: routed experts counted k times
  int64_t embedding = 0;             // input embedding plus the output head (if untied)
  int64_t attention_per_layer = 0;   // projections, their biases and sinks; norms excluded
  int64_t router_per_layer = 0;      // router weight and biases
  int64_t per_expert = 0;            // one routed expert (with biases)
  int64_t routed_experts_total = 0;  // all routed experts of all layers
  int64_t shared_experts_per_layer = 0;
  int64_t moe_layer = 0;    // one MoE layer's FFN: router + routed + shared experts
  int64_t dense_layer = 0;  // one dense layer's FFN
  // All norm weights: two per layer, the final one, q/k norms and MLA's latent norms.
  int64_t norms_total = 0;
  double expert_share() const {  // fraction of total held by routed experts
    return total > 0 ? static_cast<double>(routed_experts_total) / total : 0.0;
  }
};

// Counts the language model only: no vision tower, no multi-token-prediction layers
// (DeepSeek-V3's num_nextn_predict_layers). Throws moe::Error if the config does not validate
// or a count overflows int64.
ParamCounts count_params(const MoeConfig& config);

// Bytes of `params` parameters stored in a format of `bits_per_param` bits.
inline int64_t param_bytes(int64_t params, int64_t bits_per_param) {
  return params * bits_per_param / 8;
}

}  // namespace moe
