// Routing trace files and synthetic traces.
#include "moe/trace.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/expect_error.h"

#include "moe/error.h"
#include "moe/safetensors.h"

namespace moe {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("moe_trace_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

MoeConfig small_config() {
  MoeConfig c = preset_config("qwen3-30b-a3b");
  c.routing.num_experts = 32;
  c.routing.top_k = 4;
  return c;
}

TEST(Trace, FileRoundTripKeepsEveryField) {
  RoutingTrace trace;
  trace.num_layers = 2;
  trace.num_experts = 6;
  trace.top_k = 2;
  trace.layers.resize(2);
  trace.layers[0] = {{0, 1, 2, 3, 4, 5}, {0, 1, 1}, {0, 1, 3}};
  trace.layers[1] = {{5, 4}, {}, {0, 1}};
  const std::string path = temp_path("round_trip.safetensors");
  write_trace(path, trace, "tiny");
  const RoutingTrace back = read_trace(path);
  EXPECT_EQ(back.num_layers, 2);
  EXPECT_EQ(back.num_experts, 6);
  EXPECT_EQ(back.top_k, 2);
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(back.layers[l].topk_ids, trace.layers[l].topk_ids) << l;
    EXPECT_EQ(back.layers[l].source_gpu, trace.layers[l].source_gpu) << l;
    EXPECT_EQ(back.layers[l].step_offsets, trace.layers[l].step_offsets) << l;
  }
  EXPECT_EQ(SafetensorsFile::open(path).metadata().at("model"), "tiny");
  std::filesystem::remove(path);
}

TEST(Trace, RejectsInconsistentTracesAndForeignFiles) {
  RoutingTrace trace;
  trace.num_layers = 1;
  trace.num_experts = 4;
  trace.top_k = 2;
  trace.layers.resize(1);
  trace.layers[0].topk_ids = {0, 4};  // id 4 of 4 experts
  const std::string path = temp_path("bad.safetensors");
  testing::expect_error([&] { write_trace(path, trace); }, {"topk_ids"});
  trace.layers[0].topk_ids = {0, 1, 2};  // not whole tokens
  EXPECT_THROW(write_trace(path, trace), Error);
  trace.layers[0].topk_ids = {0, 1};
  trace.layers[0].step_offsets = {0, 2};  // 1 token, offsets say 2
  EXPECT_THROW(write_trace(path, trace), Error);

  // A safetensors file that is not a trace.
  int32_t value = 1;
  write_safetensors(path, {{"x", TensorView(&value, DType::kI32, {1})}});
  testing::expect_error([&] { read_trace(path); }, {"not a routing trace"});
  std::filesystem::remove(path);
}

TEST(Trace, SynthesisIsDeterministicAndValid) {
  SyntheticTraceOptions o;
  o.num_layers = 3;
  o.num_steps = 4;
  o.tokens_per_step = 50;
  o.num_gpus = 4;
  o.seed = 7;
  const RoutingTrace a = synthesize_trace(small_config(), o);
  const RoutingTrace b = synthesize_trace(small_config(), o);
  ASSERT_EQ(a.layers.size(), 3u);
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_EQ(a.layers[l].topk_ids, b.layers[l].topk_ids);
    ASSERT_EQ(a.layers[l].topk_ids.size(), 4u * 50 * 4);
    EXPECT_EQ(a.layers[l].step_offsets, (std::vector<int64_t>{0, 50, 100, 150, 200}));
    for (size_t t = 0; t < 200; ++t) {
      std::set<int32_t> distinct(a.layers[l].topk_ids.begin() + t * 4,
                                 a.layers[l].topk_ids.begin() + t * 4 + 4);
      EXPECT_EQ(distinct.size(), 4u) << "token " << t << " repeats an expert";
      EXPECT_EQ(a.layers[l].source_gpu[t],
                static_cast<int32_t>(t % 50 % 4));  // t % 50: in its step
    }
  }
  o.seed = 8;
  EXPECT_NE(synthesize_trace(small_config(), o).layers[0].topk_ids, a.layers[0].topk_ids);
}

// Share of all pairs taken by the most popular expert of a layer's step range.
double top_share(const TraceLayer& layer, int64_t first_token, int64_t last_token, int64_t k) {
  std::map<int32_t, int64_t> counts;
  for (int64_t i = first_token * k; i < last_token * k; ++i) ++counts[layer.topk_ids[i]];
  int64_t top = 0;
  for (const auto& [expert, count] : counts) top = std::max(top, count);
  return static_cast<double>(top) / static_cast<double>((last_token - first_token) * k);
}

TEST(Trace, ZipfSkewsAndDriftMovesTheHotExperts) {
  SyntheticTraceOptions o;
  o.num_layers = 1;
  o.num_steps = 2;
  o.tokens_per_step = 2000;
  o.co_selection = 0;
  o.drift_per_step = 0;
  o.zipf_exponent = 0;
  const double uniform = top_share(synthesize_trace(small_config(), o).layers[0], 0, 4000, 4);
  o.zipf_exponent = 1.2;
  const RoutingTrace skewed = synthesize_trace(small_config(), o);
  const double zipf = top_share(skewed.layers[0], 0, 4000, 4);
  EXPECT_GT(zipf, 2 * uniform) << "zipf " << zipf << " uniform " << uniform;

  // With a drift of 16 ranks per step, step 1's hottest expert differs from step 0's.
  o.drift_per_step = 16;
  const TraceLayer drifted = synthesize_trace(small_config(), o).layers[0];
  std::map<int32_t, int64_t> first, second;
  for (int64_t i = 0; i < 8000; ++i) ++first[drifted.topk_ids[i]];
  for (int64_t i = 8000; i < 16000; ++i) ++second[drifted.topk_ids[i]];
  const auto hottest = [](const std::map<int32_t, int64_t>& m) {
    return std::max_element(m.begin(), m.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; })
        ->first;
  };
  EXPECT_NE(hottest(first), hottest(second));
}

TEST(Trace, CoSelectionKeepsATokensExpertsTogether) {
  // Clusters are 2k = 8 experts wide; count tokens whose 4 experts share one cluster.
  const auto together = [](double co_selection) {
    SyntheticTraceOptions o;
    o.num_layers = 1;
    o.num_steps = 1;
    o.tokens_per_step = 1000;
    o.co_selection = co_selection;
    o.zipf_exponent = 0;
    const TraceLayer layer = synthesize_trace(small_config(), o).layers[0];
    int64_t count = 0;
    for (int64_t t = 0; t < 1000; ++t) {
      bool same = true;
      for (int64_t j = 1; j < 4; ++j)
        same = same && layer.topk_ids[t * 4 + j] / 8 == layer.topk_ids[t * 4] / 8;
      count += same;
    }
    return count;
  };
  EXPECT_GT(together(0.9), 5 * std::max<int64_t>(together(0.0), 1));
}

TEST(Trace, SynthesisRejectsBadOptions) {
  SyntheticTraceOptions o;
  o.num_steps = 0;
  EXPECT_THROW(synthesize_trace(small_config(), o), Error);
  o = {};
  o.co_selection = 1.5;
  EXPECT_THROW(synthesize_trace(small_config(), o), Error);
  o = {};
  o.zipf_exponent = -1;
  EXPECT_THROW(synthesize_trace(small_config(), o), Error);
}

}  // namespace
}  // namespace moe
