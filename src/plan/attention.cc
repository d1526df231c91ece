// Attention's terms that grow with context rather than with weights: the KV cache one token
// leaves on a device, and the score and value flops of a query over the cached positions.
#include <algorithm>

#include "plan/terms.h"

namespace moe::planning {

int64_t kv_bytes_per_token(const MoeConfig& config, int64_t tp, StorageFormat format) {
  const AttentionConfig& attention = config.attention;
  const int64_t bits = storage_bits(format);
  if (attention.kind == AttentionKind::kMla) {
    // One latent and one shared rope key per token and layer, whatever the heads; every tp rank
    // needs all of it, so it is replicated. vLLM's fp8 MLA cache keeps scales and a bf16 rope
    // key beside the fp8 latent (656 bytes, not 576, per token and layer); this counts 576.
    return config.num_layers * (attention.kv_lora_rank + attention.qk_rope_head_dim) * bits / 8;
  }
  // K and V of this device's kv heads; with fewer kv heads than tp, each device keeps one.
  const int64_t kv_heads = std::max<int64_t>(attention.num_kv_heads / tp, 1);
  return 2 * config.num_layers * kv_heads * attention.head_dim * bits / 8;
}

double attention_context_flops(const MoeConfig& config, int64_t tp, double context, bool decode) {
  const AttentionConfig& attention = config.attention;
  const double heads = static_cast<double>(attention.num_heads / tp);
  double score_dim = 0;  // length of the q . k dot product
  double value_dim = 0;  // length of the value rows summed
  if (attention.kind == AttentionKind::kMla && decode) {
    // Absorbed: queries meet the latent and the rope key; values are the latent itself.
    score_dim = static_cast<double>(attention.kv_lora_rank + attention.qk_rope_head_dim);
    value_dim = static_cast<double>(attention.kv_lora_rank);
  } else if (attention.kind == AttentionKind::kMla) {
    score_dim = static_cast<double>(attention.qk_nope_head_dim + attention.qk_rope_head_dim);
    value_dim = static_cast<double>(attention.v_head_dim);
  } else {
    score_dim = static_cast<double>(attention.head_dim);
    value_dim = static_cast<double>(attention.head_dim);
  }
  return 2 * heads * (score_dim + value_dim) * context;  // a multiply and an add per element
}

}  // namespace moe::planning
