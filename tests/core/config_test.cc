// MoeConfig parsing: the presets, one real config.json per model family under
// tests/data/configs/, and malformed files that must each fail with a message naming the field.
#include "moe/config.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "moe/error.h"

namespace moe {
namespace {

using Json = nlohmann::json;
using QkNorm = AttentionConfig::QkNorm;

std::string config_path(std::string_view file) {
  return fmt::format("{}/configs/{}", MOE_TEST_DATA_DIR, file);
}

Json read_json(std::string_view file) {
  std::ifstream stream(config_path(file));
  EXPECT_TRUE(stream) << "cannot open " << config_path(file);
  return Json::parse(stream);
}

MoeConfig parse(const Json& json) { return parse_hf_config(json.dump(), "test.json"); }

// The message of the moe::Error `action` throws, or "" (and a test failure) when it throws none.
std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a moe::Error";
  return "";
}

// Every field of a config on one line, so two configs compare in one readable assertion.
std::string describe(const MoeConfig& c) {
  std::string layers;
  for (bool is_moe : c.is_moe_layer) layers += is_moe ? 'M' : 'D';
  const RoutingConfig& r = c.routing;
  const ExpertsConfig& x = c.experts;
  const AttentionConfig& a = c.attention;
  return fmt::format(
      "type={} E={} k={} {} renorm={} groups={}/{} bias={}/{} scale={} on_input={} | "
      "H={} I={} {} alpha={} limit={} expert_bias={} shared={} gate={} | "
      "attn={} heads={}/{} hd={} bias={}/{} qk_norm={} sinks={} mla={}/{}/{}/{}/{} | "
      "layers={} dense={} vocab={} tied={}",
      c.model_type, r.num_experts, r.top_k, scoring_name(r.scoring), r.renormalize, r.num_groups,
      r.topk_groups, r.has_correction_bias, r.has_router_bias, r.routed_scaling_factor,
      r.apply_weight_on_input, x.hidden_size, x.intermediate_size, activation_name(x.activation),
      x.swiglu_alpha, x.swiglu_limit, x.has_bias, x.shared_intermediate_size, x.shared_gate,
      static_cast<int>(a.kind), a.num_heads, a.num_kv_heads, a.head_dim, a.qkv_bias, a.o_bias,
      static_cast<int>(a.qk_norm), a.sinks, a.q_lora_rank, a.kv_lora_rank, a.qk_nope_head_dim,
      a.qk_rope_head_dim, a.v_head_dim, layers, c.dense_intermediate_size, c.vocab_size,
      c.tie_word_embeddings);
}

TEST(ConfigPresets, EveryPresetParsesAndValidates) {
  const std::vector<std::string> names = preset_names();
  ASSERT_EQ(names.size(), 6u);
  EXPECT_EQ(names.front(), kDefaultPreset);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const MoeConfig config = preset_config(name);
    EXPECT_EQ(config.name, name);
    EXPECT_NO_THROW(validate(config));
    EXPECT_EQ(static_cast<int64_t>(config.is_moe_layer.size()), config.num_layers);
    EXPECT_GT(config.num_moe_layers(), 0);
  }
}

TEST(ConfigPresets, UnknownNameListsEveryPreset) {
  const std::string message = error_of([] { preset_config("qwen3-31b"); });
  EXPECT_NE(message.find("qwen3-31b"), std::string::npos) << message;
  for (const std::string& name : preset_names()) {
    EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

TEST(ConfigPresets, Qwen3_30B_A3B) {
  const MoeConfig c = preset_config("qwen3-30b-a3b");
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.experts.hidden_size, 2048);
  EXPECT_EQ(c.experts.intermediate_size, 768);
  EXPECT_EQ(c.dense_intermediate_size, 6144);
  EXPECT_EQ(c.routing.num_experts, 128);
  EXPECT_EQ(c.routing.top_k, 8);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::kSoftmax);
  EXPECT_TRUE(c.routing.renormalize);
  EXPECT_EQ(c.num_layers, 48);
  EXPECT_EQ(c.num_moe_layers(), 48);
  EXPECT_EQ(c.attention.num_heads, 32);
  EXPECT_EQ(c.attention.num_kv_heads, 4);
  EXPECT_EQ(c.attention.head_dim, 128);
  EXPECT_EQ(c.attention.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(ConfigPresets, Qwen3_235B_A22B) {
  const MoeConfig c = preset_config("qwen3-235b-a22b");
  EXPECT_EQ(c.experts.hidden_size, 4096);
  EXPECT_EQ(c.experts.intermediate_size, 1536);
  EXPECT_EQ(c.num_layers, 94);
  EXPECT_EQ(c.attention.num_heads, 64);
  EXPECT_EQ(c.routing.num_experts, 128);
  EXPECT_EQ(c.routing.top_k, 8);
}

TEST(ConfigPresets, DeepSeekV3) {
  const MoeConfig c = preset_config("deepseek-v3");
  const RoutingConfig& r = c.routing;
  EXPECT_EQ(r.num_experts, 256);
  EXPECT_EQ(r.top_k, 8);
  EXPECT_EQ(r.scoring, ScoringFunc::kSigmoid);
  EXPECT_TRUE(r.renormalize);
  EXPECT_EQ(r.num_groups, 8);
  EXPECT_EQ(r.topk_groups, 4);
  EXPECT_TRUE(r.has_correction_bias);
  EXPECT_FLOAT_EQ(r.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.experts.intermediate_size, 2048);
  EXPECT_EQ(c.experts.shared_intermediate_size, 2048);
  EXPECT_FALSE(c.experts.shared_gate);
  EXPECT_EQ(c.num_layers, 61);
  EXPECT_EQ(c.num_moe_layers(), 58);
  EXPECT_FALSE(c.is_moe_layer[2]);
  EXPECT_TRUE(c.is_moe_layer[3]);
  EXPECT_EQ(c.dense_intermediate_size, 18432);
  EXPECT_EQ(c.attention.kind, AttentionKind::kMla);
  EXPECT_EQ(c.attention.q_lora_rank, 1536);
  EXPECT_EQ(c.attention.kv_lora_rank, 512);
  EXPECT_EQ(c.attention.head_dim, 128 + 64);
  EXPECT_EQ(c.vocab_size, 129280);
}

TEST(ConfigPresets, MixtralOlmoeQwen2) {
  const MoeConfig mixtral = preset_config("mixtral-8x7b");
  EXPECT_EQ(mixtral.routing.num_experts, 8);
  EXPECT_EQ(mixtral.routing.top_k, 2);
  EXPECT_TRUE(mixtral.routing.renormalize);
  EXPECT_EQ(mixtral.experts.intermediate_size, 14336);
  EXPECT_EQ(mixtral.attention.head_dim, 128);  // hidden / heads, no head_dim field

  const MoeConfig olmoe = preset_config("olmoe-1b-7b");
  EXPECT_EQ(olmoe.routing.num_experts, 64);
  EXPECT_FALSE(olmoe.routing.renormalize);
  EXPECT_EQ(olmoe.attention.qk_norm, QkNorm::kWhole);

  const MoeConfig qwen2 = preset_config("qwen2-moe-a2.7b");
  EXPECT_EQ(qwen2.routing.num_experts, 60);
  EXPECT_EQ(qwen2.routing.top_k, 4);
  EXPECT_FALSE(qwen2.routing.renormalize);
  EXPECT_EQ(qwen2.experts.intermediate_size, 1408);
  EXPECT_EQ(qwen2.experts.shared_intermediate_size, 5632);
  EXPECT_TRUE(qwen2.experts.shared_gate);
  EXPECT_TRUE(qwen2.attention.qkv_bias);
  EXPECT_FALSE(qwen2.attention.o_bias);
  EXPECT_EQ(qwen2.attention.qk_norm, QkNorm::kNone);
}

TEST(ConfigFiles, Qwen3FileMatchesPreset) {
  const MoeConfig file = load_hf_config(config_path("qwen3_moe_30b_a3b.json"));
  EXPECT_EQ(file.name, "qwen3_moe");
  EXPECT_EQ(describe(file), describe(preset_config("qwen3-30b-a3b")));
}

TEST(ConfigFiles, Transformers5NumLocalExpertsReadsAsNumExperts) {
  const MoeConfig v5 = load_hf_config(config_path("qwen3_moe_transformers5.json"));
  EXPECT_EQ(v5.routing.num_experts, 128);
  EXPECT_EQ(describe(v5), describe(load_hf_config(config_path("qwen3_moe_30b_a3b.json"))));

  Json both = read_json("qwen3_moe_transformers5.json");
  both["num_experts"] = 64;
  const std::string message = error_of([&] { parse(both); });
  EXPECT_NE(message.find("num_local_experts"), std::string::npos) << message;
}

TEST(ConfigFiles, Qwen2Moe57B) {
  const MoeConfig c = load_hf_config(config_path("qwen2_moe_57b_a14b.json"));
  EXPECT_EQ(c.routing.num_experts, 64);
  EXPECT_EQ(c.routing.top_k, 8);
  EXPECT_FALSE(c.routing.renormalize);
  EXPECT_EQ(c.experts.intermediate_size, 2560);
  EXPECT_EQ(c.experts.shared_intermediate_size, 20480);
  EXPECT_TRUE(c.experts.shared_gate);
  EXPECT_EQ(c.dense_intermediate_size, 18944);
  EXPECT_EQ(c.attention.num_kv_heads, 4);
  EXPECT_TRUE(c.attention.qkv_bias);
}

TEST(ConfigFiles, Mixtral8x22B) {
  const MoeConfig c = load_hf_config(config_path("mixtral_8x22b.json"));
  EXPECT_EQ(c.routing.num_experts, 8);
  EXPECT_EQ(c.routing.top_k, 2);
  EXPECT_TRUE(c.routing.renormalize);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::kSoftmax);
  EXPECT_EQ(c.experts.intermediate_size, 16384);
  EXPECT_EQ(c.attention.head_dim, 128);
  EXPECT_EQ(c.num_moe_layers(), 56);
}

TEST(ConfigFiles, Olmoe) {
  const MoeConfig c = load_hf_config(config_path("olmoe_1b_7b.json"));
  EXPECT_EQ(describe(c), describe(preset_config("olmoe-1b-7b")));
  EXPECT_EQ(c.experts.intermediate_size, 1024);
  EXPECT_EQ(c.attention.qk_norm, QkNorm::kWhole);
}

TEST(ConfigFiles, DeepSeekV3ShapedMoonlightWithoutQLora) {
  const MoeConfig c = load_hf_config(config_path("deepseek_v3_moonlight_16b_a3b.json"));
  EXPECT_EQ(c.routing.num_experts, 64);
  EXPECT_EQ(c.routing.top_k, 6);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::kSigmoid);
  EXPECT_EQ(c.routing.num_groups, 1);
  EXPECT_TRUE(c.routing.has_correction_bias);
  EXPECT_FLOAT_EQ(c.routing.routed_scaling_factor, 2.446f);
  EXPECT_EQ(c.experts.shared_intermediate_size, 2 * 1408);
  EXPECT_EQ(c.attention.q_lora_rank, 0);  // "q_lora_rank": null
  EXPECT_FALSE(c.is_moe_layer[0]);
  EXPECT_EQ(c.num_moe_layers(), 26);
}

TEST(ConfigFiles, Llama4ReadsTextConfig) {
  const MoeConfig c = load_hf_config(config_path("llama4_scout_17b_16e.json"));
  EXPECT_EQ(c.model_type, "llama4_text");
  EXPECT_EQ(c.experts.hidden_size, 5120);
  EXPECT_EQ(c.routing.num_experts, 16);
  EXPECT_EQ(c.routing.top_k, 1);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::kSigmoid);
  EXPECT_FALSE(c.routing.renormalize);
  EXPECT_TRUE(c.routing.apply_weight_on_input);
  EXPECT_EQ(c.experts.intermediate_size, 8192);
  EXPECT_EQ(c.experts.shared_intermediate_size, 8192);
  EXPECT_FALSE(c.experts.shared_gate);
  EXPECT_EQ(c.dense_intermediate_size, 16384);
  EXPECT_EQ(c.num_moe_layers(), 48);
  EXPECT_EQ(c.attention.qk_norm, QkNorm::kNone);  // use_qk_norm has no weights
  EXPECT_EQ(c.vocab_size, 202048);
}

TEST(ConfigFiles, Llama4InterleavedAndExplicitMoeLayers) {
  Json json = read_json("llama4_scout_17b_16e.json");
  json["text_config"]["num_hidden_layers"] = 6;
  json["text_config"]["interleave_moe_layer_step"] = 2;
  EXPECT_EQ(parse(json).is_moe_layer, std::vector<bool>({false, true, false, true, false, true}));

  json["text_config"]["moe_layers"] = Json::array({0, 4});
  EXPECT_EQ(parse(json).is_moe_layer, std::vector<bool>({true, false, false, false, true, false}));
}

TEST(ConfigFiles, GptOss) {
  const MoeConfig c = load_hf_config(config_path("gpt_oss_20b.json"));
  EXPECT_EQ(c.routing.num_experts, 32);
  EXPECT_EQ(c.routing.top_k, 4);
  EXPECT_EQ(c.routing.scoring, ScoringFunc::kSoftmax);
  EXPECT_TRUE(c.routing.renormalize);
  EXPECT_TRUE(c.routing.has_router_bias);
  EXPECT_EQ(c.experts.activation, Activation::kClampedSwiglu);
  EXPECT_FLOAT_EQ(c.experts.swiglu_alpha, 1.702f);
  EXPECT_FLOAT_EQ(c.experts.swiglu_limit, 7.0f);
  EXPECT_TRUE(c.experts.has_bias);
  EXPECT_EQ(c.attention.head_dim, 64);
  EXPECT_TRUE(c.attention.qkv_bias);
  EXPECT_TRUE(c.attention.o_bias);
  EXPECT_TRUE(c.attention.sinks);

  Json only_experts_per_token = read_json("gpt_oss_20b.json");
  only_experts_per_token.erase("num_experts_per_tok");
  EXPECT_EQ(parse(only_experts_per_token).routing.top_k, 4);
}

TEST(ConfigFiles, QwenSparseStepAndMlpOnlyLayers) {
  Json json = read_json("qwen3_moe_30b_a3b.json");
  json["num_hidden_layers"] = 6;
  json["decoder_sparse_step"] = 2;
  json["mlp_only_layers"] = Json::array({3});
  EXPECT_EQ(parse(json).is_moe_layer, std::vector<bool>({false, true, false, false, false, true}));
}

TEST(ConfigFiles, DeepSeekFirstDenseAndLayerFrequency) {
  Json json = read_json("deepseek_v3_moonlight_16b_a3b.json");
  json["num_hidden_layers"] = 6;
  json["first_k_dense_replace"] = 1;
  json["moe_layer_freq"] = 2;
  EXPECT_EQ(parse(json).is_moe_layer, std::vector<bool>({false, false, true, false, true, false}));
}

TEST(ConfigFiles, HiddenActNames) {
  Json json = read_json("mixtral_8x22b.json");
  const std::vector<std::pair<std::string, Activation>> names = {
      {"silu", Activation::kSilu},         {"swish", Activation::kSilu},
      {"gelu", Activation::kGelu},         {"gelu_pytorch_tanh", Activation::kGeluTanh},
      {"gelu_new", Activation::kGeluTanh}, {"gelu_tanh", Activation::kGeluTanh},
  };
  for (const auto& [name, activation] : names) {
    json["hidden_act"] = name;
    EXPECT_EQ(parse(json).experts.activation, activation) << name;
  }
  json["hidden_act"] = "relu";
  const std::string message = error_of([&] { parse(json); });
  EXPECT_NE(message.find("hidden_act"), std::string::npos) << message;
  EXPECT_NE(message.find("relu"), std::string::npos) << message;
}

TEST(ConfigFiles, UnknownModelTypeIsReadGenerically) {
  Json mixtral_like = read_json("mixtral_8x22b.json");
  mixtral_like["model_type"] = "some_new_moe";
  const MoeConfig generic = parse(mixtral_like);
  EXPECT_EQ(generic.name, "some_new_moe");
  EXPECT_EQ(generic.routing.num_experts, 8);
  EXPECT_EQ(generic.experts.intermediate_size, 16384);
  EXPECT_FALSE(generic.routing.renormalize);  // no norm_topk_prob: the generic default

  Json deepseek_like = read_json("deepseek_v3_moonlight_16b_a3b.json");
  deepseek_like["model_type"] = "kimi_text";
  const MoeConfig mla = parse(deepseek_like);
  EXPECT_EQ(mla.attention.kind, AttentionKind::kMla);
  EXPECT_EQ(mla.routing.num_experts, 64);

  const Json dense = {{"model_type", "llama"},     {"hidden_size", 4096},
                      {"num_hidden_layers", 32},   {"vocab_size", 32000},
                      {"num_attention_heads", 32}, {"intermediate_size", 11008}};
  EXPECT_EQ(
      error_of([&] { parse_hf_config(dense.dump()); }),
      "config.json: no MoE expert count (num_experts / num_local_experts / n_routed_experts)");
}

// One malformed file per case; each message must name the file, the field and the bad value.
struct BadConfig {
  std::string what;
  std::string file;
  std::function<void(Json&)> spoil;
  std::vector<std::string> message_parts;
};

TEST(ConfigErrors, MalformedConfigsNameTheField) {
  const std::vector<BadConfig> cases = {
      {"missing field",
       "qwen3_moe_30b_a3b.json",
       [](Json& j) { j.erase("hidden_size"); },
       {"missing required field \"hidden_size\"", "positive integer"}},
      {"string for an integer",
       "qwen3_moe_30b_a3b.json",
       [](Json& j) { j["hidden_size"] = "2048"; },
       {"\"hidden_size\"", "expected a positive integer", "string \"2048\""}},
      {"float for an integer",
       "mixtral_8x22b.json",
       [](Json& j) { j["intermediate_size"] = 1.5; },
       {"\"intermediate_size\"", "expected a positive integer", "number 1.5"}},
      {"negative size",
       "qwen3_moe_30b_a3b.json",
       [](Json& j) { j["moe_intermediate_size"] = -768; },
       {"\"moe_intermediate_size\"", "-768"}},
      {"zero size",
       "olmoe_1b_7b.json",
       [](Json& j) { j["vocab_size"] = 0; },
       {"\"vocab_size\"", "positive"}},
      {"integer past int64",
       "olmoe_1b_7b.json",
       [](Json& j) { j["hidden_size"] = uint64_t{18446744073709551615u}; },
       {"\"hidden_size\"", "fits in int64"}},
      {"k > E",
       "qwen3_moe_30b_a3b.json",
       [](Json& j) { j["num_experts_per_tok"] = 129; },
       {"num_experts_per_tok", "129", "128"}},
      {"n_group not dividing E",
       "deepseek_v3_moonlight_16b_a3b.json",
       [](Json& j) { j["n_group"] = 5; },
       {"n_group", "5"}},
      {"topk_group > n_group",
       "deepseek_v3_moonlight_16b_a3b.json",
       [](Json& j) {
         j["n_group"] = 8;
         j["topk_group"] = 9;
       },
       {"topk_group", "9"}},
      {"k beyond the chosen groups",
       "deepseek_v3_moonlight_16b_a3b.json",
       [](Json& j) {
         j["n_group"] = 32;
         j["topk_group"] = 1;
       },
       {"topk_group", "num_experts_per_tok"}},
      {"bool as string",
       "olmoe_1b_7b.json",
       [](Json& j) { j["norm_topk_prob"] = "false"; },
       {"\"norm_topk_prob\"", "true or false"}},
      {"unknown scoring",
       "deepseek_v3_moonlight_16b_a3b.json",
       [](Json& j) { j["scoring_func"] = "relu"; },
       {"\"scoring_func\"", "relu"}},
      {"unknown topk_method",
       "deepseek_v3_moonlight_16b_a3b.json",
       [](Json& j) { j["topk_method"] = "best"; },
       {"\"topk_method\"", "best"}},
      {"layer index out of range",
       "qwen3_moe_30b_a3b.json",
       [](Json& j) { j["mlp_only_layers"] = Json::array({48}); },
       {"\"mlp_only_layers\"", "48"}},
      {"zero sparse step",
       "qwen3_moe_30b_a3b.json",
       [](Json& j) { j["decoder_sparse_step"] = 0; },
       {"\"decoder_sparse_step\"", "0"}},
      {"too many layers",
       "qwen3_moe_30b_a3b.json",
       [](Json& j) { j["num_hidden_layers"] = 1000000000; },
       {"\"num_hidden_layers\"", "1000000000"}},
      {"no MoE layer",
       "deepseek_v3_moonlight_16b_a3b.json",
       [](Json& j) { j["first_k_dense_replace"] = 27; },
       {"first_k_dense_replace", "MoE"}},
      {"kv heads not dividing heads",
       "mixtral_8x22b.json",
       [](Json& j) { j["num_key_value_heads"] = 7; },
       {"num_key_value_heads", "7"}},
      {"nested field missing",
       "llama4_scout_17b_16e.json",
       [](Json& j) { j["text_config"].erase("num_local_experts"); },
       {"\"text_config.num_local_experts\""}},
      {"text_config not an object",
       "llama4_scout_17b_16e.json",
       [](Json& j) { j["text_config"] = "text"; },
       {"\"text_config\"", "object"}},
  };
  for (const BadConfig& bad : cases) {
    SCOPED_TRACE(bad.what);
    Json json = read_json(bad.file);
    bad.spoil(json);
    const std::string message = error_of([&] { parse_hf_config(json.dump(), "bad.json"); });
    EXPECT_EQ(message.rfind("bad.json: ", 0), 0u) << message;
    for (const std::string& part : bad.message_parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "missing \"" << part << "\" in: " << message;
    }
  }
}

TEST(ConfigErrors, NotJson) {
  for (const std::string_view text : {"", "{\"hidden_size\": 20", "hello", "[1, 2]", "null"}) {
    SCOPED_TRACE(text);
    const std::string message = error_of([&] { parse_hf_config(text, "bad.json"); });
    EXPECT_EQ(message.rfind("bad.json: ", 0), 0u) << message;
    EXPECT_TRUE(message.find("not valid JSON") != std::string::npos ||
                message.find("expected a JSON object") != std::string::npos)
        << message;
  }
}

TEST(ConfigErrors, ValidateChecksHandBuiltConfigs) {
  MoeConfig config = preset_config("deepseek-v3");
  config.routing.top_k = 300;
  EXPECT_NE(error_of([&] { validate(config); }).find("num_experts_per_tok"), std::string::npos);
  config = preset_config("deepseek-v3");
  config.is_moe_layer.pop_back();
  EXPECT_NE(error_of([&] { validate(config); }).find("is_moe_layer"), std::string::npos);
  config = preset_config("deepseek-v3");
  config.dense_intermediate_size = 0;
  EXPECT_NE(error_of([&] { validate(config); }).find("intermediate_size"), std::string::npos);
}

TEST(ConfigResolve, PresetFileFolderOrError) {
  EXPECT_EQ(resolve_config("mixtral-8x7b").name, "mixtral-8x7b");
  EXPECT_EQ(resolve_config(config_path("gpt_oss_20b.json")).model_type, "gpt_oss");

  const std::filesystem::path folder =
      std::filesystem::path(::testing::TempDir()) / "moe_config_test_checkpoint";
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(config_path("olmoe_1b_7b.json"), folder / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(resolve_config(folder.string()).model_type, "olmoe");
  std::filesystem::remove_all(folder);

  const std::string message = error_of([] { resolve_config("no/such/config.json"); });
  EXPECT_NE(message.find("no/such/config.json"), std::string::npos) << message;
  for (const std::string& name : preset_names()) {
    EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

TEST(ConfigResolve, LoadMissingFileOrFolderNamesIt) {
  const std::string message = error_of([] { load_hf_config("no/such/config.json"); });
  EXPECT_NE(message.find("no/such/config.json"), std::string::npos) << message;
  const std::string folder = fmt::format("{}/configs", MOE_TEST_DATA_DIR);
  EXPECT_NE(error_of([&] { load_hf_config(folder); }).find("is a folder"), std::string::npos);
}

TEST(ConfigNames, ScoringAndActivation) {
  EXPECT_EQ(scoring_name(ScoringFunc::kSoftmax), "softmax");
  EXPECT_EQ(scoring_name(ScoringFunc::kSigmoid), "sigmoid");
  EXPECT_EQ(activation_name(Activation::kSilu), "silu");
  EXPECT_EQ(activation_name(Activation::kGelu), "gelu");
  EXPECT_EQ(activation_name(Activation::kGeluTanh), "gelu_tanh");
  EXPECT_EQ(activation_name(Activation::kClampedSwiglu), "clamped_swiglu");
}

}  // namespace
}  // namespace moe
