// MoeConfig from a Hugging Face config.json: one reader per model family, because the families
// name the same quantity differently (num_experts / num_local_experts / n_routed_experts) and
// give `intermediate_size` different meanings (expert size in Mixtral, dense FFN size in Qwen).
#include "moe/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/ranges.h>

#include "core/json_fields.h"
#include "core/text_file.h"
#include "moe/error.h"

namespace moe {

std::string_view scoring_name(ScoringFunc scoring) {
  switch (scoring) {
    case ScoringFunc::kSoftmax:
      return "softmax";
    case ScoringFunc::kSigmoid:
      return "sigmoid";
  }
  return "unknown";
}

std::string_view activation_name(Activation activation) {
  switch (activation) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kClampedSwiglu:
      return "clamped_swiglu";
  }
  return "unknown";
}

int64_t MoeConfig::num_moe_layers() const {
  return std::count(is_moe_layer.begin(), is_moe_layer.end(), true);
}

int64_t MoeConfig::first_moe_layer() const {
  const auto first = std::find(is_moe_layer.begin(), is_moe_layer.end(), true);
  return first == is_moe_layer.end() ? -1 : first - is_moe_layer.begin();
}

namespace {

using Json = nlohmann::json;
using QkNorm = AttentionConfig::QkNorm;

// Bounds the per-layer table built from an untrusted file; the deepest released MoE models
// have about a hundred layers.
constexpr int64_t kMaxLayers = int64_t{1} << 16;
// Expert ids travel as int32 (topk_ids), so E must fit.
constexpr int64_t kMaxExperts = std::numeric_limits<int32_t>::max();
// A config.json is a few kilobytes; refusing big files keeps a mistyped path (a safetensors
// shard) from being read into memory whole.
constexpr std::uintmax_t kMaxConfigBytes = 16u << 20;

Activation parse_activation(const JsonFields& fields) {
  const std::string name = fields.string_or("hidden_act", "silu");
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new" || name == "gelu_tanh") {
    return Activation::kGeluTanh;
  }
  fields.fail_field("hidden_act", "silu, swish, gelu, gelu_pytorch_tanh, gelu_new or gelu_tanh",
                    fmt::format("\"{}\"", name));
}

ScoringFunc parse_scoring(const JsonFields& fields, std::string_view fallback) {
  const std::string name = fields.string_or("scoring_func", fallback);
  if (name == "softmax") return ScoringFunc::kSoftmax;
  if (name == "sigmoid") return ScoringFunc::kSigmoid;
  fields.fail_field("scoring_func", "softmax or sigmoid", fmt::format("\"{}\"", name));
}

// A positive count that files spell two ways (transformers renamed some fields); when both are
// present they must agree.
int64_t positive_either(const JsonFields& fields, std::string_view name,
                        std::string_view other_name) {
  if (!fields.has(other_name)) return fields.positive(name);
  const int64_t other = fields.positive(other_name);
  if (!fields.has(name)) return other;
  const int64_t value = fields.positive(name);
  if (value != other) {
    fields.fail_field(other_name, fmt::format("the same value as \"{}\" ({})", name, value),
                      std::to_string(other));
  }
  return value;
}

int64_t read_top_k(const JsonFields& fields) {
  return positive_either(fields, "num_experts_per_tok", "experts_per_token");
}

// Families whose every decoder layer is MoE (Mixtral, OLMoE, gpt-oss).
std::vector<bool> all_moe(int64_t num_layers) {
  return std::vector<bool>(static_cast<size_t>(num_layers), true);
}

int64_t layer_index(const JsonFields& fields, std::string_view field, int64_t layer,
                    int64_t num_layers) {
  if (layer < 0 || layer >= num_layers) {
    fields.fail_field(field, fmt::format("layer indices in [0, {})", num_layers),
                      std::to_string(layer));
  }
  return layer;
}

// Qwen2/Qwen3-MoE: layer l is MoE iff l is not in mlp_only_layers and (l + 1) is a multiple of
// decoder_sparse_step.
std::vector<bool> sparse_step_layers(const JsonFields& fields, int64_t num_layers) {
  const int64_t step = fields.positive_or("decoder_sparse_step", 1);
  std::vector<bool> is_moe(static_cast<size_t>(num_layers));
  for (int64_t l = 0; l < num_layers; ++l) is_moe[l] = (l + 1) % step == 0;
  for (int64_t l : fields.integer_list_or_empty("mlp_only_layers")) {
    is_moe[layer_index(fields, "mlp_only_layers", l, num_layers)] = false;
  }
  return is_moe;
}

// Reads the dense FFN size only where the layer table has a dense layer: models that are MoE
// throughout may omit it or give a size that means something else.
void read_dense_size(const JsonFields& fields, std::string_view field, MoeConfig& config) {
  const bool has_dense = config.num_moe_layers() < config.num_layers;
  config.dense_intermediate_size =
      has_dense ? fields.positive(field) : fields.non_negative_or(field, 0);
}

void read_gqa(const JsonFields& fields, const MoeConfig& config, AttentionConfig& attention) {
  attention.kind = AttentionKind::kGqa;
  attention.num_heads = fields.positive("num_attention_heads");
  attention.num_kv_heads = fields.positive_or("num_key_value_heads", attention.num_heads);
  attention.head_dim =
      fields.positive_or("head_dim", config.experts.hidden_size / attention.num_heads);
}

// `attention_bias` puts biases on q, k, v and o alike in these families.
void read_attention_bias(const JsonFields& fields, bool fallback, AttentionConfig& attention) {
  attention.qkv_bias = attention.o_bias = fields.boolean_or("attention_bias", fallback);
}

void parse_qwen_moe(const JsonFields& fields, bool is_qwen2, MoeConfig& config) {
  config.routing.num_experts = positive_either(fields, "num_experts", "num_local_experts");
  config.routing.top_k = read_top_k(fields);
  config.routing.renormalize = fields.boolean_or("norm_topk_prob", false);
  config.experts.intermediate_size = fields.positive("moe_intermediate_size");
  config.experts.activation = parse_activation(fields);
  config.is_moe_layer = sparse_step_layers(fields, config.num_layers);
  read_dense_size(fields, "intermediate_size", config);
  read_gqa(fields, config, config.attention);
  if (is_qwen2) {
    // Qwen2-MoE: one shared expert scaled by sigmoid(hidden · w_gate); q, k, v always biased.
    config.experts.shared_intermediate_size =
        fields.non_negative_or("shared_expert_intermediate_size", 0);
    config.experts.shared_gate = config.experts.shared_intermediate_size > 0;
    config.attention.qkv_bias = true;
  } else {
    config.attention.qk_norm = QkNorm::kPerHead;
    read_attention_bias(fields, false, config.attention);
  }
}

void parse_mixtral(const JsonFields& fields, MoeConfig& config) {
  config.routing.num_experts = fields.positive("num_local_experts");
  config.routing.top_k = read_top_k(fields);
  config.routing.renormalize = true;  // Mixtral always renormalizes its top-k weights
  config.experts.intermediate_size = fields.positive("intermediate_size");
  config.experts.activation = parse_activation(fields);
  config.is_moe_layer = all_moe(config.num_layers);
  read_gqa(fields, config, config.attention);
}

void parse_olmoe(const JsonFields& fields, MoeConfig& config) {
  config.routing.num_experts = fields.positive("num_experts");
  config.routing.top_k = read_top_k(fields);
  config.routing.renormalize = fields.boolean_or("norm_topk_prob", false);
  config.experts.intermediate_size = fields.positive("intermediate_size");
  config.experts.activation = parse_activation(fields);
  config.is_moe_layer = all_moe(config.num_layers);
  read_gqa(fields, config, config.attention);
  config.attention.qk_norm = QkNorm::kWhole;
  read_attention_bias(fields, false, config.attention);
}

// DeepSeek-V2/V3 and their derivatives. V3 defaults (sigmoid, noaux_tc, renormalize) apply only
// when model_type says V3; the older softmax/greedy defaults otherwise. The multi-token
// prediction layers (num_nextn_predict_layers) are not part of the model we describe.
void parse_deepseek(const JsonFields& fields, bool is_v3, MoeConfig& config) {
  RoutingConfig& routing = config.routing;
  routing.num_experts = fields.positive("n_routed_experts");
  routing.top_k = read_top_k(fields);
  routing.scoring = parse_scoring(fields, is_v3 ? "sigmoid" : "softmax");
  routing.renormalize = fields.boolean_or("norm_topk_prob", is_v3);
  routing.routed_scaling_factor =
      static_cast<float>(fields.number_or("routed_scaling_factor", 1.0));
  const std::string topk_method = fields.string_or("topk_method", is_v3 ? "noaux_tc" : "greedy");
  if (topk_method == "noaux_tc" || topk_method == "group_limited_greedy") {
    routing.num_groups = fields.positive_or("n_group", 1);
    routing.topk_groups = fields.positive_or("topk_group", 1);
  } else if (topk_method != "greedy") {
    fields.fail_field("topk_method", "greedy, group_limited_greedy or noaux_tc",
                      fmt::format("\"{}\"", topk_method));
  }
  routing.has_correction_bias = topk_method == "noaux_tc";

  config.experts.intermediate_size = fields.positive("moe_intermediate_size");
  config.experts.activation = parse_activation(fields);
  // The shared experts run as one MLP of their summed width, ungated.
  const int64_t num_shared = fields.non_negative_or("n_shared_experts", 0);
  if (__builtin_mul_overflow(num_shared, config.experts.intermediate_size,
                             &config.experts.shared_intermediate_size)) {
    fields.fail_field("n_shared_experts",
                      "a count whose product with moe_intermediate_size fits int64",
                      std::to_string(num_shared));
  }

  // Layer l is MoE iff l >= first_k_dense_replace and l is a multiple of moe_layer_freq.
  const int64_t first_moe = fields.non_negative_or("first_k_dense_replace", 0);
  const int64_t frequency = fields.positive_or("moe_layer_freq", 1);
  config.is_moe_layer.assign(static_cast<size_t>(config.num_layers), false);
  for (int64_t l = first_moe; l < config.num_layers; ++l) {
    config.is_moe_layer[l] = l % frequency == 0;
  }
  read_dense_size(fields, "intermediate_size", config);

  AttentionConfig& attention = config.attention;
  attention.kind = AttentionKind::kMla;
  attention.num_heads = fields.positive("num_attention_heads");
  attention.num_kv_heads = fields.positive_or("num_key_value_heads", attention.num_heads);
  attention.q_lora_rank = fields.non_negative_or("q_lora_rank", 0);  // null: plain q_proj
  attention.kv_lora_rank = fields.positive("kv_lora_rank");
  attention.qk_nope_head_dim = fields.positive("qk_nope_head_dim");
  attention.qk_rope_head_dim = fields.positive("qk_rope_head_dim");
  attention.v_head_dim = fields.positive("v_head_dim");
  attention.head_dim = attention.qk_nope_head_dim + attention.qk_rope_head_dim;
}

// Llama-4 text model: top-1 sigmoid routing with the weight applied to the expert's input, and
// an ungated shared expert as wide as a routed one.
void parse_llama4_text(const JsonFields& fields, MoeConfig& config) {
  config.routing.num_experts = fields.positive("num_local_experts");
  config.routing.top_k = read_top_k(fields);
  config.routing.scoring = ScoringFunc::kSigmoid;
  config.routing.apply_weight_on_input = true;
  config.experts.intermediate_size = fields.positive("intermediate_size");
  config.experts.shared_intermediate_size = config.experts.intermediate_size;
  config.experts.activation = parse_activation(fields);
  if (fields.has("moe_layers")) {
    config.is_moe_layer.assign(static_cast<size_t>(config.num_layers), false);
    for (int64_t l : fields.integer_list_or_empty("moe_layers")) {
      config.is_moe_layer[layer_index(fields, "moe_layers", l, config.num_layers)] = true;
    }
  } else {
    const int64_t step = fields.positive_or("interleave_moe_layer_step", 1);
    config.is_moe_layer.resize(static_cast<size_t>(config.num_layers));
    for (int64_t l = 0; l < config.num_layers; ++l) config.is_moe_layer[l] = (l + 1) % step == 0;
  }
  read_dense_size(fields, "intermediate_size_mlp", config);
  read_gqa(fields, config, config.attention);
  // use_qk_norm is a weightless L2 norm: nothing to count, so qk_norm stays kNone.
  read_attention_bias(fields, false, config.attention);
}

void parse_gpt_oss(const JsonFields& fields, MoeConfig& config) {
  // Softmax over the k kept logits, which is softmax over all E renormalized over the top k.
  config.routing.num_experts = fields.positive("num_local_experts");
  config.routing.top_k = read_top_k(fields);
  config.routing.renormalize = true;
  config.routing.has_router_bias = true;
  config.experts.intermediate_size = fields.positive("intermediate_size");
  // hidden_act says "silu", but the model code clamps and uses alpha = 1.702, a constant there
  // rather than a config field.
  config.experts.activation = Activation::kClampedSwiglu;
  config.experts.swiglu_alpha = 1.702f;
  config.experts.swiglu_limit = static_cast<float>(fields.number_or("swiglu_limit", 7.0));
  config.experts.has_bias = true;
  config.is_moe_layer = all_moe(config.num_layers);
  read_gqa(fields, config, config.attention);
  read_attention_bias(fields, true, config.attention);
  config.attention.sinks = true;
}

// An unknown model_type: assume Qwen/Mixtral-shaped layers (GQA attention, SwiGLU experts, no
// shared expert) and read whichever of the known field names are present.
void parse_generic(const JsonFields& fields, std::string_view source, MoeConfig& config) {
  if (fields.has("n_routed_experts")) return parse_deepseek(fields, false, config);
  if (!fields.has("num_experts") && !fields.has("num_local_experts")) {
    fail("{}: no MoE expert count (num_experts / num_local_experts / n_routed_experts)", source);
  }
  config.routing.num_experts = positive_either(fields, "num_experts", "num_local_experts");
  config.routing.top_k = read_top_k(fields);
  config.routing.scoring = parse_scoring(fields, "softmax");
  config.routing.renormalize = fields.boolean_or("norm_topk_prob", false);
  config.experts.activation = parse_activation(fields);
  config.is_moe_layer = sparse_step_layers(fields, config.num_layers);
  // With a separate moe_intermediate_size, intermediate_size is the dense FFN (Qwen style);
  // without one, it is the expert size (Mixtral style) and no layer may be dense.
  if (fields.has("moe_intermediate_size")) {
    config.experts.intermediate_size = fields.positive("moe_intermediate_size");
    read_dense_size(fields, "intermediate_size", config);
  } else {
    config.experts.intermediate_size = fields.positive("intermediate_size");
  }
  read_gqa(fields, config, config.attention);
  read_attention_bias(fields, false, config.attention);
}

Json parse_json_object(std::string_view json_text, std::string_view source) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& error) {
    fail("{}: not valid JSON: {}", source, error.what());
  }
  if (!root.is_object()) {
    fail("{}: expected a JSON object at the top; got {}", source, describe_json(root));
  }
  return root;
}

std::string presets_list() { return fmt::format("{}", fmt::join(preset_names(), ", ")); }

bool is_preset(std::string_view name) {
  const std::vector<std::string> names = preset_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

MoeConfig parse_hf_config(std::string_view json_text, std::string_view source) {
  const Json root = parse_json_object(json_text, source);
  // Multimodal checkpoints (Llama-4) keep the language model's fields in "text_config".
  const auto text_config = root.find("text_config");
  const bool nested = text_config != root.end() && !text_config->is_null();
  if (nested && !text_config->is_object()) {
    fail("{}: field \"text_config\": expected an object; got {}", source,
         describe_json(*text_config));
  }
  const JsonFields root_fields(root, source);
  const JsonFields fields(nested ? *text_config : root, source, nested ? "text_config." : "");

  MoeConfig config;
  config.model_type = fields.string_or("model_type", root_fields.string_or("model_type", ""));
  config.name = config.model_type;
  config.experts.hidden_size = fields.positive("hidden_size");
  config.num_layers = fields.positive("num_hidden_layers");
  if (config.num_layers > kMaxLayers) {
    fields.fail_field("num_hidden_layers", fmt::format("at most {}", kMaxLayers),
                      std::to_string(config.num_layers));
  }
  config.vocab_size = fields.positive("vocab_size");
  config.tie_word_embeddings = fields.boolean_or(
      "tie_word_embeddings", root_fields.boolean_or("tie_word_embeddings", false));

  const std::string& type = config.model_type;
  if (type == "qwen3_moe" || type == "qwen2_moe") {
    parse_qwen_moe(fields, type == "qwen2_moe", config);
  } else if (type == "mixtral") {
    parse_mixtral(fields, config);
  } else if (type == "olmoe") {
    parse_olmoe(fields, config);
  } else if (type == "deepseek_v3" || type == "deepseek_v2") {
    parse_deepseek(fields, type == "deepseek_v3", config);
  } else if (type == "llama4_text" || type == "llama4") {
    parse_llama4_text(fields, config);
  } else if (type == "gpt_oss") {
    parse_gpt_oss(fields, config);
  } else {
    parse_generic(fields, source, config);
  }

  try {
    validate(config);
  } catch (const Error& error) {
    fail("{}: {}", source, error.what());
  }
  return config;
}

MoeConfig load_hf_config(const std::string& path) {
  return parse_hf_config(read_small_text_file(path, kMaxConfigBytes, "a config.json file"), path);
}

MoeConfig resolve_config(const std::string& preset_or_path) {
  if (is_preset(preset_or_path)) return preset_config(preset_or_path);
  std::error_code error;
  const std::filesystem::path path(preset_or_path);
  if (std::filesystem::is_directory(path, error)) {
    return load_hf_config((path / "config.json").string());
  }
  if (std::filesystem::exists(path, error)) return load_hf_config(preset_or_path);
  fail(
      "config \"{}\": expected a preset ({}), a config.json file or a checkpoint folder "
      "holding one; no such preset or file",
      preset_or_path, presets_list());
}

void validate(const MoeConfig& config) {
  const RoutingConfig& routing = config.routing;
  const ExpertsConfig& experts = config.experts;
  const AttentionConfig& attention = config.attention;
  const auto check = [&](bool ok, std::string_view what, auto given) {
    if (!ok) fail("config \"{}\": {}; got {}", config.name, what, given);
  };

  check(experts.hidden_size > 0, "experts.hidden_size (hidden_size) must be positive",
        experts.hidden_size);
  check(experts.intermediate_size > 0,
        "experts.intermediate_size (moe_intermediate_size / intermediate_size) must be positive",
        experts.intermediate_size);
  check(experts.shared_intermediate_size >= 0,
        "experts.shared_intermediate_size (shared_expert_intermediate_size / n_shared_experts) "
        "must be >= 0",
        experts.shared_intermediate_size);
  if (experts.activation == Activation::kClampedSwiglu) {
    check(experts.swiglu_limit > 0 && std::isfinite(experts.swiglu_limit),
          "experts.swiglu_limit (swiglu_limit) must be a positive number", experts.swiglu_limit);
    check(std::isfinite(experts.swiglu_alpha), "experts.swiglu_alpha must be finite",
          experts.swiglu_alpha);
  }

  check(routing.num_experts > 0 && routing.num_experts <= kMaxExperts,
        fmt::format("routing.num_experts (num_experts / num_local_experts / n_routed_experts) "
                    "must be in 1..{}",
                    kMaxExperts),
        routing.num_experts);
  check(routing.top_k > 0 && routing.top_k <= routing.num_experts,
        fmt::format("routing.top_k (num_experts_per_tok) must be in 1..num_experts ({})",
                    routing.num_experts),
        routing.top_k);
  check(
      routing.num_groups > 0 && routing.num_experts % routing.num_groups == 0,
      fmt::format("routing.num_groups (n_group) must divide num_experts ({})", routing.num_experts),
      routing.num_groups);
  check(routing.topk_groups > 0 && routing.topk_groups <= routing.num_groups,
        fmt::format("routing.topk_groups (topk_group) must be in 1..n_group ({})",
                    routing.num_groups),
        routing.topk_groups);
  const int64_t selectable = routing.topk_groups * (routing.num_experts / routing.num_groups);
  check(routing.top_k <= selectable,
        fmt::format("routing.top_k (num_experts_per_tok) must be <= the {} experts in topk_group "
                    "({}) groups",
                    selectable, routing.topk_groups),
        routing.top_k);
  check(routing.routed_scaling_factor > 0 && std::isfinite(routing.routed_scaling_factor),
        "routing.routed_scaling_factor (routed_scaling_factor) must be a positive number",
        routing.routed_scaling_factor);

  check(config.num_layers > 0 && config.num_layers <= kMaxLayers,
        fmt::format("num_layers (num_hidden_layers) must be in 1..{}", kMaxLayers),
        config.num_layers);
  check(static_cast<int64_t>(config.is_moe_layer.size()) == config.num_layers,
        fmt::format("is_moe_layer must have num_layers ({}) entries", config.num_layers),
        config.is_moe_layer.size());
  const int64_t num_moe = config.num_moe_layers();
  check(num_moe > 0,
        "at least one layer must be MoE (see first_k_dense_replace, moe_layer_freq, "
        "decoder_sparse_step, mlp_only_layers, moe_layers)",
        "none");
  if (num_moe < config.num_layers) {
    check(config.dense_intermediate_size > 0,
          "dense_intermediate_size (intermediate_size / intermediate_size_mlp) must be positive "
          "when a layer is dense",
          config.dense_intermediate_size);
  }
  check(config.vocab_size > 0, "vocab_size must be positive", config.vocab_size);

  check(attention.num_heads > 0, "attention.num_heads (num_attention_heads) must be positive",
        attention.num_heads);
  if (attention.kind == AttentionKind::kGqa) {
    check(attention.num_kv_heads > 0 && attention.num_heads % attention.num_kv_heads == 0,
          fmt::format("attention.num_kv_heads (num_key_value_heads) must divide "
                      "num_attention_heads ({})",
                      attention.num_heads),
          attention.num_kv_heads);
    check(attention.head_dim > 0, "attention.head_dim (head_dim) must be positive",
          attention.head_dim);
  } else {
    check(attention.q_lora_rank >= 0, "attention.q_lora_rank (q_lora_rank) must be >= 0",
          attention.q_lora_rank);
    check(attention.kv_lora_rank > 0, "attention.kv_lora_rank (kv_lora_rank) must be positive",
          attention.kv_lora_rank);
    check(attention.qk_nope_head_dim > 0 && attention.qk_rope_head_dim > 0 &&
              attention.v_head_dim > 0,
          "attention qk_nope_head_dim, qk_rope_head_dim and v_head_dim must be positive",
          fmt::format("{}, {}, {}", attention.qk_nope_head_dim, attention.qk_rope_head_dim,
                      attention.v_head_dim));
  }
}

}  // namespace moe
