// MoeConfig: everything about a model that shapes its MoE layers, read from a Hugging Face
// config.json or taken from a built-in preset, plus what parameter counting needs of the rest of
// the model (attention, dense layers, embeddings).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moe {

// How router logits become scores.
enum class ScoringFunc : uint8_t {
  kSoftmax,  // softmax over all experts (Qwen, Mixtral, OLMoE, gpt-oss)
  kSigmoid,  // independent sigmoid per expert (DeepSeek-V3, Llama-4)
};

// The gated activation between gemm1 and gemm2; the first half of gemm1's output is the gate,
// the second half the up projection.
enum class Activation : uint8_t {
  kSilu,           // silu(gate) * up
  kGelu,           // gelu(gate) * up, exact erf form
  kGeluTanh,       // gelu(gate) * up, tanh approximation
  kClampedSwiglu,  // gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
                   //          (u + 1) * g * sigmoid(alpha * g)
};

std::string_view scoring_name(ScoringFunc scoring);
std::string_view activation_name(Activation activation);

// The routing half of a MoE layer.
struct RoutingConfig {
  int64_t num_experts = 0;  // E, routed experts
  int64_t top_k = 0;        // k
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  bool renormalize = false;  // divide the k kept weights by their sum
  // Group-limited top-k: experts form num_groups equal groups; a token first picks the
  // topk_groups best groups, then its k experts inside them. num_groups = 1 disables it.
  int64_t num_groups = 1;
  int64_t topk_groups = 1;
  // A learned per-expert bias added to the scores for selection only (DeepSeek-V3's
  // e_score_correction_bias); the weights come from the unbiased scores.
  bool has_correction_bias = false;
  bool has_router_bias = false;  // gpt-oss: logits = hidden · Wr^T + b
  float routed_scaling_factor = 1.0f;
  // Llama-4: the router weight multiplies the expert's input instead of its output.
  bool apply_weight_on_input = false;
};

// The expert MLPs of a MoE layer.
struct ExpertsConfig {
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I, per routed expert
  Activation activation = Activation::kSilu;
  float swiglu_alpha = 1.702f;  // kClampedSwiglu only
  float swiglu_limit = 7.0f;    // kClampedSwiglu only
  bool has_bias = false;        // per-expert biases on both projections (gpt-oss)
  // Shared experts, run on every token, as one MLP of this intermediate size (0 = none).
  int64_t shared_intermediate_size = 0;
  bool shared_gate = false;  // Qwen2-MoE: shared output scaled by sigmoid(hidden · w_gate)
};

enum class AttentionKind : uint8_t { kGqa, kMla };

// Only what parameter counting needs.
struct AttentionConfig {
  AttentionKind kind = AttentionKind::kGqa;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  bool qkv_bias = false;  // biases on q, k, v (Qwen2-MoE)
  bool o_bias = false;    // bias on the output projection (gpt-oss)
  // Per-head RMSNorm on q and k (Qwen3), or over the whole projection (OLMoE).
  enum class QkNorm : uint8_t { kNone, kPerHead, kWhole } qk_norm = QkNorm::kNone;
  bool sinks = false;  // gpt-oss: one learned sink logit per head
  // MLA (DeepSeek-V3); q_lora_rank = 0 means a plain q projection.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
};

struct MoeConfig {
  std::string name;        // preset name, or model_type for a config.json
  std::string model_type;  // Hugging Face model_type ("qwen3_moe", "deepseek_v3", ...)
  RoutingConfig routing;
  ExpertsConfig experts;
  AttentionConfig attention;
  int64_t num_layers = 0;
  std::vector<bool> is_moe_layer;       // [num_layers]; dense FFN where false
  int64_t dense_intermediate_size = 0;  // FFN size of the dense layers
  int64_t vocab_size = 0;
  bool tie_word_embeddings = false;

  int64_t num_moe_layers() const;
  int64_t first_moe_layer() const;  // -1 when no layer is MoE
};

// Parses the text of a Hugging Face config.json (a nested "text_config" is used when present).
// Throws moe::Error naming the field on a missing field, a wrong type or an impossible value;
// `source` names the file in those messages.
MoeConfig parse_hf_config(std::string_view json_text, std::string_view source = "config.json");
MoeConfig load_hf_config(const std::string& path);

// Built-in presets: "qwen3-30b-a3b" (the default), "qwen3-235b-a22b", "deepseek-v3",
// "mixtral-8x7b", "olmoe-1b-7b", "qwen2-moe-a2.7b".
inline constexpr std::string_view kDefaultPreset = "qwen3-30b-a3b";
std::vector<std::string> preset_names();
MoeConfig preset_config(std::string_view name);  // throws moe::Error listing the presets
// A preset name, a path to a config.json, or a checkpoint folder holding one. Throws moe::Error
// listing the presets when it is none of these.
MoeConfig resolve_config(const std::string& preset_or_path);

// Throws moe::Error unless the layer sizes are usable (positive sizes, k <= E, groups divide E,
// topk_groups <= num_groups, k <= experts in the chosen groups).
void validate(const MoeConfig& config);

}  // namespace moe
