// Parameters one device holds, part by part, with vLLM's sharding: column- and row-parallel
// projections split tp-ways, kv heads replicated when tp exceeds them, MLA's down-projections
// (q_a, kv_a) replicated, the vocabulary split tp-ways, norms and router replicated. At tp = 1
// and one device the parts sum to count_params's total, which the tests check.
#include <algorithm>

#include "moe/params.h"
#include "plan/terms.h"

namespace moe::planning {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t attention_per_device(const AttentionConfig& attention, int64_t hidden, int64_t tp) {
  const int64_t heads = attention.num_heads / tp;  // tp divides the heads (resolve_layout)
  if (attention.kind == AttentionKind::kMla) {
    const int64_t qk_head_dim = attention.qk_nope_head_dim + attention.qk_rope_head_dim;
    const int64_t q = attention.q_lora_rank > 0 ? hidden * attention.q_lora_rank +
                                                      attention.q_lora_rank * heads * qk_head_dim
                                                : hidden * heads * qk_head_dim;
    const int64_t kv_a = hidden * (attention.kv_lora_rank + attention.qk_rope_head_dim);
    const int64_t kv_b =
        attention.kv_lora_rank * heads * (attention.qk_nope_head_dim + attention.v_head_dim);
    const int64_t o = heads * attention.v_head_dim * hidden;
    return q + kv_a + kv_b + o;
  }
  const int64_t kv_heads = std::max<int64_t>(attention.num_kv_heads / tp, 1);
  const int64_t q_width = heads * attention.head_dim;
  const int64_t kv_width = kv_heads * attention.head_dim;
  const int64_t qkv_bias = attention.qkv_bias ? q_width + 2 * kv_width : 0;
  const int64_t o_bias = attention.o_bias ? hidden : 0;  // added once, after the all-reduce
  const int64_t sinks = attention.sinks ? heads : 0;
  return 2 * hidden * q_width + 2 * hidden * kv_width + qkv_bias + o_bias + sinks;
}

// A SwiGLU MLP whose intermediate size is split `ways` (gate and up by columns, down by rows).
int64_t mlp_per_device(int64_t hidden, int64_t intermediate, int64_t ways) {
  return 3 * hidden * ceil_div(intermediate, ways);
}

}  // namespace

DeviceParams device_params(const MoeConfig& config, const Layout& layout) {
  // count_params checks that the whole model's counts fit int64; one device holds less.
  const ParamCounts counts = count_params(config);
  const ExpertsConfig& experts = config.experts;
  const int64_t hidden = experts.hidden_size;
  const int64_t tp = layout.tp;

  DeviceParams params;
  params.attention_per_layer = attention_per_device(config.attention, hidden, tp);
  const int64_t vocab_slice = ceil_div(config.vocab_size, tp) * hidden;
  params.embedding = (config.tie_word_embeddings ? 1 : 2) * vocab_slice;
  params.head = vocab_slice;
  params.dense_ffn_per_layer = mlp_per_device(hidden, config.dense_intermediate_size, tp);
  if (experts.shared_intermediate_size > 0) {
    params.shared_experts_per_layer = mlp_per_device(hidden, experts.shared_intermediate_size, tp) +
                                      (experts.shared_gate ? hidden : 0);  // gate: replicated
  }
  params.router_per_layer = counts.router_per_layer;
  params.norms = counts.norms_total;

  const int64_t shards = layout.expert_shards;
  const int64_t slice = ceil_div(experts.intermediate_size, shards);
  // Biases: gate and up biases split with the columns; the down bias is added once.
  params.expert_slice = mlp_per_device(hidden, experts.intermediate_size, shards) +
                        (experts.has_bias ? 2 * slice + hidden : 0);
  params.experts_per_device = ceil_div(config.routing.num_experts, layout.ep);
  return params;
}

}  // namespace moe::planning
