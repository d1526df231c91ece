// `moe run`'s check against the float64 reference: a token whose experts differ from the
// reference's only at a tie of router logits is held to the reference's experts on the layer's
// own routing; any other difference is a wrong routing.
#include "tools/moe/routing_ties.h"

#include <gtest/gtest.h>

#include <vector>

#include "moe/cpu_isa.h"
#include "tools/moe/batch_report.h"

namespace moe::cli {
namespace {

// Qwen3-30B-A3B's routing (softmax, renormalized), 4 experts, top-1, small experts.
MoeConfig small_config() {
  MoeConfig c = preset_config("qwen3-30b-a3b");
  c.routing.num_experts = 4;
  c.routing.top_k = 1;
  c.experts.hidden_size = 32;
  c.experts.intermediate_size = 16;
  return c;
}

// Four experts, top-1, router rows r, r * second, -r and r * fourth. The reference's
// (second 1, fourth -1) has every token's best logit at an exact tie, 0 with 1 where r . x > 0
// and 2 with 3 elsewhere, which it breaks toward the lower id.
LayerWeights paired_router(const MoeConfig& c, float second, float fourth) {
  LayerWeights w = synthetic_layer_weights(c, DType::kF32, 7);
  const int64_t H = c.experts.hidden_size;
  float* router = w.router.data<float>();
  for (int64_t h = 0; h < H; ++h) {
    router[1 * H + h] = router[h] * second;
    router[2 * H + h] = -router[h];
    router[3 * H + h] = router[h] * fourth;
  }
  return w;
}

BatchReport check_paired(float layer_second, float layer_fourth) {
  const MoeConfig c = small_config();
  MoeLayer layer(c, paired_router(c, layer_second, layer_fourth), LayerOptions{Backend::kCpu, 1});
  MoeLayer reference(c, paired_router(c, 1.0f, -1.0f), LayerOptions{Backend::kReference, 1});
  BatchSettings settings;
  settings.tokens = 24;
  settings.dtype = DType::kF32;
  settings.repeats = 1;
  settings.check_tokens = 24;
  return measure_batch(layer, reference, settings);
}

TEST(RoutingTies, AnExpertPickedAtATieIsCheckedOnTheLayersOwnRouting) {
  // The layer's expert 1 leads expert 0 by one part in a million wherever r . x > 0: it picks 1
  // where the reference picks 0, whose expert weights give a different output.
  const BatchReport report = check_paired(1.000001f, -1.0f);
  EXPECT_GT(report.routed_at_ties, 0);
  EXPECT_EQ(report.routing_mismatches, 0);
  EXPECT_LE(report.max_rel_error, run_error_bound(DType::kF32, CpuIsa::kAuto));
}

TEST(RoutingTies, AnExpertPickedBeyondATieIsAWrongRouting) {
  // The layer's expert 3 has the row 2r: it wins wherever r . x > 0, where the reference ranks it
  // last.
  const BatchReport report = check_paired(1.0f, 2.0f);
  EXPECT_GT(report.routing_mismatches, 0);
  EXPECT_EQ(report.routed_at_ties, 0);
}

// DeepSeek-V3's routing (sigmoid scores, a correction bias, groups, scaling) on 8 experts in 4
// groups, 2 groups kept, top-2, with its shared expert.
TEST(RoutingTies, GroupedRoutingAcceptsOnlyItsOwnChoiceAwayFromTies) {
  MoeConfig c = preset_config("deepseek-v3");
  c.routing.num_experts = 8;
  c.routing.top_k = 2;
  c.routing.num_groups = 4;
  c.routing.topk_groups = 2;
  c.experts.hidden_size = 32;
  c.experts.intermediate_size = 16;
  c.experts.shared_intermediate_size = 16;
  MoeLayer reference(c, synthetic_layer_weights(c, DType::kF32, 3),
                     LayerOptions{Backend::kReference, 1});
  const int64_t H = c.experts.hidden_size;
  std::vector<float> hidden(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) hidden[h] = static_cast<float>((h * 37 % 11) - 5) * 0.3f;
  reference.forward(TensorView(hidden.data(), DType::kF32, {1, H}));
  const int32_t* picked = reference.last_topk_ids().as<int32_t>();
  const std::vector<int32_t> own = {picked[0], picked[1]};
  EXPECT_TRUE(routed_at_a_tie(reference, hidden.data(), own.data()));

  const std::vector<int32_t> swapped = {own[1], own[0]};
  EXPECT_FALSE(routed_at_a_tie(reference, hidden.data(), swapped.data()));
  for (int32_t other = 0; other < 8; ++other) {
    if (other == own[0] || other == own[1]) continue;
    const std::vector<int32_t> changed = {own[0], other};
    EXPECT_FALSE(routed_at_a_tie(reference, hidden.data(), changed.data())) << "expert " << other;
  }
  const std::vector<int32_t> out_of_range = {own[0], 8};
  EXPECT_FALSE(routed_at_a_tie(reference, hidden.data(), out_of_range.data()));
}

TEST(RoutingTies, TheNoteNamesOnlyWhatHappened) {
  EXPECT_EQ(routing_note(0, 0), "");
  EXPECT_EQ(routing_note(2, 0), "2 routed wrongly");
  EXPECT_EQ(routing_note(0, 1), "1 routed at a tie");
  EXPECT_EQ(routing_note(2, 1), "2 routed wrongly, 1 routed at a tie");
}

}  // namespace
}  // namespace moe::cli
