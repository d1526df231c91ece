#include "checkpoint/checkpoint_fixture.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "moe/error.h"
#include "moe/safetensors.h"

namespace moe::testing {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Element (a, b, c) of a rank-3 tensor is base + 10000 a + 100 b + c; rank 1 and 2 drop the
// leading terms. Distinct while every dimension is below 100, and exact in f32 below 2^21.
Tensor numbered(const Shape& shape, float base) {
  for (int64_t size : shape) {
    if (size >= 100) fail("numbered: dimensions must stay below 100; got {}", shape_string(shape));
  }
  Tensor t(DType::kF32, shape);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, value = 0, weight = 1;
    for (auto d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      value += (rest % shape[d]) * weight;
      rest /= shape[d];
      weight *= 100;
    }
    t.data<float>()[i] = base + static_cast<float>(value);
  }
  return t;
}

Tensor copy(const Tensor& t) { return Tensor::copy_of(t, t.dtype()); }

// Rows [first, first + count) of matrix `e` of a stacked f32 [E, R, C] tensor.
Tensor rows_of(const Tensor& stacked, int64_t e, int64_t first, int64_t count) {
  const int64_t R = stacked.size(1), C = stacked.size(2);
  Tensor rows(DType::kF32, {count, C});
  std::memcpy(rows.data<float>(), stacked.data<float>() + (e * R + first) * C,
              static_cast<size_t>(count * C) * sizeof(float));
  return rows;
}

// Llama-4 and gpt-oss store x @ W: element [e][h][column] where the engine has [e][row][h].
// `column_of_row` says where engine row r lands among the stored columns.
template <typename ColumnOfRow>
Tensor transposed_experts(const Tensor& stacked, ColumnOfRow column_of_row) {
  const int64_t E = stacked.size(0), R = stacked.size(1), C = stacked.size(2);
  Tensor out(DType::kF32, {E, C, R});
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        out.data<float>()[(e * C + c) * R + column_of_row(r)] =
            stacked.data<float>()[(e * R + r) * C + c];
      }
    }
  }
  return out;
}

Json tiny_attention() {
  return {{"num_hidden_layers", 2},
          {"vocab_size", 32},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"head_dim", 4}};
}

}  // namespace

TestCheckpoint::TestCheckpoint(const std::string& name) {
  static std::atomic<int> counter{0};
  dir_ = (fs::temp_directory_path() /
          fmt::format("moe_checkpoint_test_{}_{}_{}", ::getpid(), name, counter++))
             .string();
  fs::remove_all(dir_);
  fs::create_directories(dir_);
}

TestCheckpoint::~TestCheckpoint() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

void TestCheckpoint::write_config(const Json& config) const {
  std::ofstream(path("config.json")) << config.dump(2);
}

void TestCheckpoint::add(const std::string& name, Tensor tensor) {
  tensors_.emplace_back(name, std::move(tensor));
}

bool TestCheckpoint::remove(const std::string& name) {
  const auto found = std::find_if(tensors_.begin(), tensors_.end(),
                                  [&](const auto& entry) { return entry.first == name; });
  if (found == tensors_.end()) return false;
  tensors_.erase(found);
  return true;
}

void TestCheckpoint::write_single_file() const {
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, tensor] : tensors_) views.emplace_back(name, tensor.view());
  write_safetensors(path("model.safetensors"), views);
}

void TestCheckpoint::write_shards(int num_shards) const {
  std::vector<std::vector<std::pair<std::string, TensorView>>> shards(
      static_cast<size_t>(num_shards));
  Json weight_map = Json::object();
  size_t total_size = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const size_t shard = i % static_cast<size_t>(num_shards);
    const std::string file =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", shard + 1, num_shards);
    shards[shard].emplace_back(tensors_[i].first, tensors_[i].second.view());
    weight_map[tensors_[i].first] = file;
    total_size += tensors_[i].second.nbytes();
  }
  for (int s = 0; s < num_shards; ++s) {
    write_safetensors(path(fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, num_shards)),
                      shards[static_cast<size_t>(s)]);
  }
  const Json index = {{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  std::ofstream(path("model.safetensors.index.json")) << index.dump(2);
}

Json qwen3_config(int64_t E, int64_t H, int64_t I) {
  Json c = tiny_attention();
  c.update({{"model_type", "qwen3_moe"},
            {"hidden_size", H},
            {"num_experts", E},
            {"num_experts_per_tok", 2},
            {"moe_intermediate_size", I},
            {"intermediate_size", 16},
            {"mlp_only_layers", {0}},
            {"norm_topk_prob", true}});
  return c;
}

Json qwen2_config(int64_t E, int64_t H, int64_t I, int64_t shared_I) {
  Json c = qwen3_config(E, H, I);
  c.update({{"model_type", "qwen2_moe"},
            {"shared_expert_intermediate_size", shared_I},
            {"norm_topk_prob", false}});
  return c;
}

Json mixtral_config(int64_t E, int64_t H, int64_t I) {
  Json c = tiny_attention();
  c.update({{"model_type", "mixtral"},
            {"hidden_size", H},
            {"num_local_experts", E},
            {"num_experts_per_tok", 2},
            {"intermediate_size", I}});
  return c;
}

Json deepseek_config(int64_t E, int64_t H, int64_t I) {
  Json c = tiny_attention();
  c.update({{"model_type", "deepseek_v3"},
            {"hidden_size", H},
            {"n_routed_experts", E},
            {"num_experts_per_tok", 2},
            {"n_group", 2},
            {"topk_group", 1},
            {"moe_intermediate_size", I},
            {"intermediate_size", 16},
            {"n_shared_experts", 1},
            {"first_k_dense_replace", 1},
            {"routed_scaling_factor", 2.5},
            {"q_lora_rank", nullptr},
            {"kv_lora_rank", 4},
            {"qk_nope_head_dim", 2},
            {"qk_rope_head_dim", 2},
            {"v_head_dim", 2}});
  return c;
}

Json llama4_config(int64_t E, int64_t H, int64_t I) {
  Json text = tiny_attention();
  text.update({{"model_type", "llama4_text"},
               {"hidden_size", H},
               {"num_local_experts", E},
               {"num_experts_per_tok", 1},
               {"intermediate_size", I},
               {"intermediate_size_mlp", 16},
               {"interleave_moe_layer_step", 2}});
  return {{"model_type", "llama4"}, {"text_config", text}};
}

Json gpt_oss_config(int64_t E, int64_t H, int64_t I) {
  Json c = tiny_attention();
  c.update({{"model_type", "gpt_oss"},
            {"hidden_size", H},
            {"num_local_experts", E},
            {"num_experts_per_tok", 2},
            {"intermediate_size", I}});
  return c;
}

LayerWeights hand_placed_weights(const MoeConfig& config) {
  const int64_t E = config.routing.num_experts, H = config.experts.hidden_size;
  const int64_t I = config.experts.intermediate_size;
  const int64_t Is = config.experts.shared_intermediate_size;
  LayerWeights w;
  w.router = numbered({E, H}, 0.25f);
  if (config.routing.has_router_bias) w.router_bias = numbered({E}, 0.5f);
  if (config.routing.has_correction_bias) w.correction_bias = numbered({E}, 0.75f);
  w.w13 = numbered({E, 2 * I, H}, 100000.5f);
  w.w2 = numbered({E, H, I}, 200000.25f);
  if (config.experts.has_bias) {
    w.w13_bias = numbered({E, 2 * I}, 300000.75f);
    w.w2_bias = numbered({E, H}, 400000.5f);
  }
  if (Is > 0) {
    w.shared_w13 = numbered({2 * Is, H}, 500000.25f);
    w.shared_w2 = numbered({H, Is}, 600000.75f);
    if (config.experts.shared_gate) w.shared_gate = numbered({1, H}, 700000.5f);
  }
  return w;
}

void add_router(TestCheckpoint& checkpoint, const std::string& block, const std::string& router,
                const LayerWeights& w) {
  checkpoint.add(block + router + "weight", copy(w.router));
  if (w.router_bias.defined()) checkpoint.add(block + router + "bias", copy(w.router_bias));
  if (w.correction_bias.defined()) {
    checkpoint.add(block + router + "e_score_correction_bias", copy(w.correction_bias));
  }
}

void add_per_expert(TestCheckpoint& checkpoint, const std::string& block, const LayerWeights& w,
                    const std::string& gate, const std::string& up, const std::string& down) {
  const int64_t E = w.w13.size(0), I = w.w13.size(1) / 2, H = w.w2.size(1);
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = fmt::format("{}experts.{}.", block, e);
    checkpoint.add(expert + gate + ".weight", rows_of(w.w13, e, 0, I));
    checkpoint.add(expert + up + ".weight", rows_of(w.w13, e, I, I));
    checkpoint.add(expert + down + ".weight", rows_of(w.w2, e, 0, H));
  }
}

void add_fused(TestCheckpoint& checkpoint, const std::string& block, const LayerWeights& w) {
  checkpoint.add(block + "experts.gate_up_proj", copy(w.w13));
  checkpoint.add(block + "experts.down_proj", copy(w.w2));
}

void add_fused_llama4(TestCheckpoint& checkpoint, const std::string& block, const LayerWeights& w) {
  // x @ gate_up_proj[e] followed by chunk(2): gate columns first, then up columns.
  checkpoint.add(block + "experts.gate_up_proj",
                 transposed_experts(w.w13, [](int64_t row) { return row; }));
  checkpoint.add(block + "experts.down_proj",
                 transposed_experts(w.w2, [](int64_t row) { return row; }));
}

void add_fused_gpt_oss(TestCheckpoint& checkpoint, const std::string& block,
                       const LayerWeights& w) {
  // gate = gate_up[..., ::2], up = gate_up[..., 1::2]: gate row j is column 2j, up row j 2j + 1.
  const int64_t E = w.w13.size(0), two_i = w.w13.size(1), I = two_i / 2;
  const auto interleaved = [I](int64_t row) { return row < I ? 2 * row : 2 * (row - I) + 1; };
  checkpoint.add(block + "experts.gate_up_proj", transposed_experts(w.w13, interleaved));
  checkpoint.add(block + "experts.down_proj",
                 transposed_experts(w.w2, [](int64_t row) { return row; }));
  Tensor bias(DType::kF32, {E, two_i});
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = 0; r < two_i; ++r) {
      bias.data<float>()[e * two_i + interleaved(r)] = w.w13_bias.data<float>()[e * two_i + r];
    }
  }
  checkpoint.add(block + "experts.gate_up_proj_bias", std::move(bias));
  checkpoint.add(block + "experts.down_proj_bias", copy(w.w2_bias));
}

void add_shared(TestCheckpoint& checkpoint, const std::string& block, const std::string& module,
                const LayerWeights& w) {
  const int64_t Is = w.shared_w2.size(1), H = w.shared_w2.size(0);
  Tensor gate(DType::kF32, {Is, H}), up(DType::kF32, {Is, H});
  std::memcpy(gate.data<float>(), w.shared_w13.data<float>(), gate.nbytes());
  std::memcpy(up.data<float>(), w.shared_w13.data<float>() + Is * H, up.nbytes());
  checkpoint.add(block + module + "gate_proj.weight", std::move(gate));
  checkpoint.add(block + module + "up_proj.weight", std::move(up));
  checkpoint.add(block + module + "down_proj.weight", copy(w.shared_w2));
  if (w.shared_gate.defined()) {
    checkpoint.add(block + "shared_expert_gate.weight", copy(w.shared_gate));
  }
}

void expect_same_weights(const LayerWeights& got, const LayerWeights& expected) {
  const std::pair<const char*, const Tensor LayerWeights::*> fields[] = {
      {"router", &LayerWeights::router},
      {"router_bias", &LayerWeights::router_bias},
      {"correction_bias", &LayerWeights::correction_bias},
      {"w13", &LayerWeights::w13},
      {"w2", &LayerWeights::w2},
      {"w13_bias", &LayerWeights::w13_bias},
      {"w2_bias", &LayerWeights::w2_bias},
      {"shared_w13", &LayerWeights::shared_w13},
      {"shared_w2", &LayerWeights::shared_w2},
      {"shared_gate", &LayerWeights::shared_gate}};
  for (const auto& [name, field] : fields) {
    const Tensor& g = got.*field;
    const Tensor& e = expected.*field;
    ASSERT_EQ(g.defined(), e.defined()) << name;
    if (!e.defined()) continue;
    ASSERT_EQ(dtype_name(g.dtype()), dtype_name(e.dtype())) << name;
    ASSERT_EQ(shape_string(g.shape()), shape_string(e.shape())) << name;
    const size_t size = dtype_size(e.dtype());
    for (int64_t i = 0; i < e.numel(); ++i) {
      if (std::memcmp(g.data<char>() + i * size, e.data<char>() + i * size, size) != 0) {
        ADD_FAILURE() << name << ": first difference at flat index " << i << " of "
                      << shape_string(e.shape()) << ": expected " << element(e, i) << ", got "
                      << element(g, i);
        break;
      }
    }
  }
}

}  // namespace moe::testing
