// Agreement with Hugging Face transformers. scripts/make-hf-agreement-data builds a tiny random
// model of each family with transformers, saves it under tests/data/hf/<family>/ and runs the
// MoE block of one layer on random hidden states, saving input, output and expert ids in
// io.safetensors. Here the engine loads the same checkpoint and must reproduce them.
//
// The quantized families (deepseek_v3_fp8: fp8 weights with 128 x 128 block scales;
// gpt_oss_mxfp4: MXFP4 experts) are checkpoints in the published layout that transformers loads
// with dequantize=True; both sides decode the weights exactly to f32 and compute in f32 from there.
//
// Tolerance: both sides compute in f32 from the same f32 weights; the engine's f32 kernels and
// its f64 reference differ from PyTorch's f32 only by rounding of sums of H or I products of
// unit-scale values, a few 1e-7 relative, so 1e-5 of the output's largest magnitude leaves a wide
// margin while any layout or routing mistake shows as an error of order one.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moe/checkpoint.h"
#include "moe/layer.h"
#include "moe/safetensors.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelError = 1e-5;
// Two experts whose selection scores differ by less than this fraction of the token's largest
// score may come out in either order: f32 logits carry a few 1e-7 of relative rounding.
constexpr double kTieFraction = 1e-6;

// Each token's selection scores (what top-k ranks) in f64 from the loaded router: logits,
// softmax or sigmoid, plus the correction bias. [M, E] row-major.
std::vector<double> selection_scores(const MoeConfig& config, const LayerWeights& w,
                                     const TensorView& hidden) {
  const int64_t M = hidden.size(0), H = hidden.size(1), E = config.routing.num_experts;
  const float* x = hidden.as<float>();
  const float* router = w.router.data<float>();
  std::vector<double> scores(static_cast<size_t>(M * E));
  for (int64_t t = 0; t < M; ++t) {
    double* row = scores.data() + t * E;
    for (int64_t e = 0; e < E; ++e) {
      double logit = w.router_bias.defined() ? w.router_bias.data<float>()[e] : 0.0;
      for (int64_t h = 0; h < H; ++h) logit += double{x[t * H + h]} * router[e * H + h];
      row[e] = logit;
    }
    if (config.routing.scoring == ScoringFunc::kSoftmax) {
      const double top = *std::max_element(row, row + E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += row[e] = std::exp(row[e] - top);
      for (int64_t e = 0; e < E; ++e) row[e] /= sum;
    } else {
      for (int64_t e = 0; e < E; ++e) row[e] = 1.0 / (1.0 + std::exp(-row[e]));
    }
    if (w.correction_bias.defined()) {
      for (int64_t e = 0; e < E; ++e) row[e] += w.correction_bias.data<float>()[e];
    }
  }
  return scores;
}

struct Case {
  std::string family;
  Backend backend;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.family << " on the " << backend_name(c.backend) << " backend";
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.family + "_" + std::string(backend_name(info.param.backend));
}

class HfAgreement : public ::testing::TestWithParam<Case> {};

TEST_P(HfAgreement, MoeBlockMatchesTransformers) {
  const fs::path root = fs::path(MOE_TEST_DATA_DIR) / "hf";
  if (!fs::is_directory(root)) {
    GTEST_SKIP() << root.string()
                 << " is absent: run scripts/make-hf-agreement-data where torch and transformers "
                    "are installed, and commit its output";
  }
  const fs::path dir = root / GetParam().family;
  if (!fs::exists(dir / "io.safetensors")) {
    GTEST_SKIP() << (dir / "io.safetensors").string() << " is absent: the data script made no "
                 << GetParam().family
                 << " case; make it with scripts/make-hf-agreement-data --only "
                 << GetParam().family << " where torch and transformers are installed";
  }
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  const MoeConfig& config = checkpoint.config();
  const SafetensorsFile io = SafetensorsFile::open((dir / "io.safetensors").string());
  const auto layer_entry = io.metadata().find("layer");
  const int64_t layer = layer_entry != io.metadata().end() ? std::stoll(layer_entry->second)
                                                           : config.first_moe_layer();
  const TensorView hidden = io.tensor("hidden_states");
  const TensorView expected = io.tensor("expected");
  const TensorView expected_ids = io.tensor("topk_ids");
  ASSERT_EQ(dtype_name(hidden.dtype), "f32");
  ASSERT_EQ(dtype_name(expected.dtype), "f32");
  ASSERT_EQ(dtype_name(expected_ids.dtype), "i32");
  const int64_t M = hidden.size(0), H = config.experts.hidden_size, k = config.routing.top_k;
  ASSERT_EQ(shape_string(expected.shape), shape_string(hidden.shape));
  ASSERT_EQ(shape_string(expected_ids.shape), shape_string(Shape{M, k}));

  MoeLayer moe_layer(config, load_moe_layer(checkpoint, layer, DType::kF32),
                     LayerOptions{GetParam().backend, 2, 0});
  const Tensor out = moe_layer.forward(hidden);
  const TensorView ids = moe_layer.last_topk_ids();
  const std::vector<double> scores = selection_scores(config, moe_layer.weights(), hidden);

  // Routing: the same experts in the same order, except where two scores tie within rounding.
  // A token whose expert set changes at such a tie cannot match transformers' output and is left
  // out of the output comparison.
  std::vector<bool> compare_token(static_cast<size_t>(M), true);
  const int64_t E = config.routing.num_experts;
  for (int64_t t = 0; t < M; ++t) {
    const double* row = scores.data() + t * E;
    const double scale = *std::max_element(
        row, row + E, [](double a, double b) { return std::abs(a) < std::abs(b); });
    std::vector<int32_t> got_set(ids.as<int32_t>() + t * k, ids.as<int32_t>() + (t + 1) * k);
    std::vector<int32_t> want_set(expected_ids.as<int32_t>() + t * k,
                                  expected_ids.as<int32_t>() + (t + 1) * k);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t got = got_set[j], want = want_set[j];
      if (got == want) continue;
      ASSERT_TRUE(got >= 0 && got < E && want >= 0 && want < E) << "token " << t;
      EXPECT_LE(std::abs(row[got] - row[want]), kTieFraction * std::abs(scale))
          << "token " << t << " slot " << j << ": engine chose expert " << got << " (score "
          << row[got] << "), transformers " << want << " (score " << row[want] << ")";
    }
    std::sort(got_set.begin(), got_set.end());
    std::sort(want_set.begin(), want_set.end());
    if (got_set != want_set) {
      compare_token[static_cast<size_t>(t)] = false;
      std::cout << "  token " << t << ": expert sets differ at a tie; output not compared\n";
    }
  }

  double max_error = 0, max_expected = 0;
  int64_t worst = -1;
  for (int64_t t = 0; t < M; ++t) {
    if (!compare_token[static_cast<size_t>(t)]) continue;
    for (int64_t h = 0; h < H; ++h) {
      const double want = expected.as<float>()[t * H + h];
      const double error = std::abs(double{out.data<float>()[t * H + h]} - want);
      max_expected = std::max(max_expected, std::abs(want));
      if (!(error <= max_error)) {
        max_error = error;
        worst = t * H + h;
      }
    }
  }
  ASSERT_GT(max_expected, 0.0) << "transformers' output is all zero: the data says nothing";
  EXPECT_LE(max_error / max_expected, kMaxRelError)
      << "worst element " << worst << " (token " << worst / H << "): expected "
      << expected.as<float>()[worst] << ", got " << out.data<float>()[worst] << "; max |expected| "
      << max_expected;
}

// The families the data script makes; the _fused ones exist when it ran with transformers 5.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* family :
       {"qwen3_moe", "qwen3_moe_fused", "qwen2_moe", "mixtral", "mixtral_fused", "olmoe",
        "deepseek_v3", "deepseek_v3_fp8", "llama4", "gpt_oss", "gpt_oss_mxfp4"}) {
    for (Backend backend : {Backend::kReference, Backend::kCpu}) cases.push_back({family, backend});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Families, HfAgreement, ::testing::ValuesIn(all_cases()), case_name);

}  // namespace
}  // namespace moe
