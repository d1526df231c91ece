// Exact parameter counts from a MoeConfig, tensor by tensor as the checkpoints store them.
// Sizes come from untrusted files, so every product and sum is checked for int64 overflow.
#include "moe/params.h"

#include "moe/error.h"

namespace moe {
namespace {

// Overflow-checked arithmetic on counts; `what` names the quantity in the error.
class Counter {
 public:
  explicit Counter(const MoeConfig& config) : config_(config) {}

  int64_t mul(int64_t a, int64_t b) const {
    int64_t product = 0;
    if (__builtin_mul_overflow(a, b, &product)) overflow();
    return product;
  }
  int64_t mul(int64_t a, int64_t b, int64_t c) const { return mul(mul(a, b), c); }
  int64_t add(int64_t a, int64_t b) const {
    int64_t sum = 0;
    if (__builtin_add_overflow(a, b, &sum)) overflow();
    return sum;
  }
  template <typename... Rest>
  int64_t add(int64_t a, int64_t b, Rest... rest) const {
    return add(add(a, b), rest...);
  }

 private:
  [[noreturn]] void overflow() const {
    fail(
        "count_params: config \"{}\": parameter count overflows int64; expected sizes of a "
        "real model",
        config_.name);
  }
  const MoeConfig& config_;
};

// Weights and biases of the attention projections (norms are counted with the other norms).
int64_t attention_params(const Counter& n, const AttentionConfig& attention, int64_t hidden) {
  const int64_t heads = attention.num_heads;
  if (attention.kind == AttentionKind::kMla) {
    const int64_t qk_head_dim = attention.qk_nope_head_dim + attention.qk_rope_head_dim;
    const int64_t q_width = n.mul(heads, qk_head_dim);
    // q_a_proj then q_b_proj through the q latent, or one q_proj without it.
    const int64_t q = attention.q_lora_rank > 0 ? n.add(n.mul(hidden, attention.q_lora_rank),
                                                        n.mul(attention.q_lora_rank, q_width))
                                                : n.mul(hidden, q_width);
    const int64_t kv_a = n.mul(hidden, n.add(attention.kv_lora_rank, attention.qk_rope_head_dim));
    const int64_t kv_b = n.mul(attention.kv_lora_rank, heads,
                               n.add(attention.qk_nope_head_dim, attention.v_head_dim));
    const int64_t o = n.mul(heads, attention.v_head_dim, hidden);
    return n.add(q, kv_a, kv_b, o);
  }
  const int64_t q_width = n.mul(heads, attention.head_dim);
  const int64_t kv_width = n.mul(attention.num_kv_heads, attention.head_dim);
  const int64_t q_and_o = n.mul(2, hidden, q_width);
  const int64_t k_and_v = n.mul(2, hidden, kv_width);
  const int64_t qkv_bias = attention.qkv_bias ? n.add(q_width, n.mul(2, kv_width)) : 0;
  const int64_t o_bias = attention.o_bias ? hidden : 0;
  const int64_t sinks = attention.sinks ? heads : 0;
  return n.add(q_and_o, k_and_v, qkv_bias, o_bias, sinks);
}

// RMSNorm weights of one layer: before attention, before the FFN, and those inside attention.
int64_t layer_norm_params(const Counter& n, const AttentionConfig& attention, int64_t hidden) {
  int64_t inner = 0;
  if (attention.kind == AttentionKind::kMla) {
    inner = n.add(attention.q_lora_rank, attention.kv_lora_rank);  // q_a / kv_a layernorms
  } else if (attention.qk_norm == AttentionConfig::QkNorm::kPerHead) {
    inner = n.mul(2, attention.head_dim);
  } else if (attention.qk_norm == AttentionConfig::QkNorm::kWhole) {
    inner = n.mul(n.add(attention.num_heads, attention.num_kv_heads), attention.head_dim);
  }
  return n.add(n.mul(2, hidden), inner);
}

// Gate, up and down projections of one SwiGLU MLP.
int64_t mlp_params(const Counter& n, int64_t hidden, int64_t intermediate) {
  return n.mul(3, hidden, intermediate);
}

}  // namespace

ParamCounts count_params(const MoeConfig& config) {
  validate(config);
  const Counter n(config);
  const RoutingConfig& routing = config.routing;
  const ExpertsConfig& experts = config.experts;
  const int64_t hidden = experts.hidden_size;
  const int64_t num_layers = config.num_layers;
  const int64_t num_moe = config.num_moe_layers();
  const int64_t num_dense = num_layers - num_moe;

  ParamCounts counts;
  counts.embedding = n.mul(config.tie_word_embeddings ? 1 : 2, config.vocab_size, hidden);
  counts.attention_per_layer = attention_params(n, config.attention, hidden);
  counts.router_per_layer =
      n.add(n.mul(routing.num_experts, hidden), routing.has_router_bias ? routing.num_experts : 0,
            routing.has_correction_bias ? routing.num_experts : 0);
  // With biases: gate and up rows carry 2I, the down projection H.
  counts.per_expert =
      n.add(mlp_params(n, hidden, experts.intermediate_size),
            experts.has_bias ? n.add(n.mul(2, experts.intermediate_size), hidden) : 0);
  if (experts.shared_intermediate_size > 0) {
    counts.shared_experts_per_layer = n.add(mlp_params(n, hidden, experts.shared_intermediate_size),
                                            experts.shared_gate ? hidden : 0);  // gate: [1, H]
  }
  const int64_t routed_per_layer = n.mul(routing.num_experts, counts.per_expert);
  counts.moe_layer =
      n.add(counts.router_per_layer, routed_per_layer, counts.shared_experts_per_layer);
  counts.dense_layer = mlp_params(n, hidden, config.dense_intermediate_size);
  counts.routed_experts_total = n.mul(num_moe, routed_per_layer);
  counts.norms_total =
      n.add(n.mul(num_layers, layer_norm_params(n, config.attention, hidden)), hidden);

  counts.total =
      n.add(counts.embedding, n.mul(num_layers, counts.attention_per_layer), counts.norms_total,
            n.mul(num_moe, counts.moe_layer), n.mul(num_dense, counts.dense_layer));
  const int64_t active_routed = n.mul(num_moe, routing.top_k, counts.per_expert);
  counts.active_per_token = n.add(counts.total - counts.routed_experts_total, active_routed);
  return counts;
}

}  // namespace moe
