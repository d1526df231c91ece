#include "tools/moe/batch_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "moe/error.h"
#include "tools/moe/ep_sample.h"
#include "tools/moe/routing_ties.h"

namespace moe::cli {

double run_error_bound(DType dtype, CpuIsa isa) {
  const bool bf16_inputs =
      dtype == DType::kBF16 && (isa == CpuIsa::kAmx || isa == CpuIsa::kAvx512Bf16);
  return (dtype == DType::kF32 ? 1e-5 : 1e-2) + (bf16_inputs ? 1e-2 : 0.0);
}

Tensor batch_tensor(int64_t tokens, int64_t hidden_size, DType dtype, const char* what) {
  try {
    return Tensor(dtype, {tokens, hidden_size});
  } catch (const Error& e) {
    fail("--tokens {}: no room for the batch's {} [{}, {}]: {}", tokens, what, tokens, hidden_size,
         e.what());
  }
}

Tensor synthetic_hidden(int64_t tokens, int64_t hidden_size, DType dtype, uint64_t seed) {
  Tensor hidden = batch_tensor(tokens, hidden_size, dtype, "hidden states");
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  fill_batch_rows(hidden, [&state] {
    // Sum of four uniforms: close enough to a Gaussian for activations, cheap, portable.
    float sum = 0;
    for (int i = 0; i < 4; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      sum += static_cast<float>(state >> 40) * 0x1.0p-24f - 0.5f;
    }
    return sum * std::sqrt(3.0f);
  });
  return hidden;
}

namespace {

void count_work(const MoeLayer& layer, BatchReport& report) {
  const MoeConfig& c = layer.config();
  const int64_t H = c.experts.hidden_size, I = c.experts.intermediate_size;
  const int64_t E = c.routing.num_experts, k = c.routing.top_k;
  const int64_t Is = c.experts.shared_intermediate_size;
  const TensorView counts = layer.last_expert_counts();
  report.rows_min = INT64_MAX;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = counts.as<int32_t>()[e];
    report.rows_min = std::min(report.rows_min, rows);
    report.rows_max = std::max(report.rows_max, rows);
    report.experts_touched += rows > 0;
  }
  const int64_t M = report.tokens;
  report.rows_mean = static_cast<double>(M * k) / static_cast<double>(E);
  const double bytes_per_weight = static_cast<double>(dtype_size(layer.weight_dtype()));
  const double expert_weights = 3.0 * static_cast<double>(H * I);
  const double shared_weights = 3.0 * static_cast<double>(H * Is) + (c.experts.shared_gate ? H : 0);
  report.weight_bytes =
      bytes_per_weight * (static_cast<double>(E * H) + report.experts_touched * expert_weights +
                          (M > 0 ? shared_weights : 0.0));
  report.flops =
      2.0 * static_cast<double>(M) *
      (static_cast<double>(E * H) + static_cast<double>(k) * expert_weights + shared_weights);
}

void check_against_reference(MoeLayer& layer, MoeLayer& reference, const Tensor& hidden,
                             const Tensor& out, int64_t sample, BatchReport& report) {
  const std::vector<int64_t> tokens = sampled_tokens(hidden.size(0), sample);
  if (tokens.empty()) return;
  const ReferenceOutput want = reference_output(
      reference, Tensor::copy_of(pick_rows(hidden, tokens), DType::kF32),
      pick_rows(layer.last_topk_ids(), tokens), pick_rows(layer.last_topk_weights(), tokens));
  report.checked_tokens = static_cast<int64_t>(tokens.size());
  report.max_rel_error = max_rel_error(pick_rows(out, tokens), want.expected);
  report.routing_mismatches = want.misrouted;
  report.routed_at_ties = want.routed_at_ties;
}

}  // namespace

BatchReport measure_batch(MoeLayer& layer, MoeLayer& reference, const BatchSettings& s) {
  if (s.tokens < 0) fail("--tokens: expected counts >= 0; got {}", s.tokens);
  if (s.repeats < 1) fail("--repeats: expected >= 1; got {}", s.repeats);
  BatchReport report;
  report.tokens = s.tokens;
  report.repeats = s.repeats;
  const Tensor hidden =
      synthetic_hidden(s.tokens, layer.config().experts.hidden_size, s.dtype, s.seed);
  Tensor out(s.dtype, hidden.shape());

  layer.forward(hidden, out);  // warm-up: sizes the workspace, faults in the pages
  std::vector<std::pair<double, StageTimes>> runs;
  for (int r = 0; r < s.repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    layer.forward(hidden, out);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    runs.emplace_back(us, layer.last_stage_times());
  }
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  report.total_us = runs[runs.size() / 2].first;
  report.stages = runs[runs.size() / 2].second;

  count_work(layer, report);
  check_against_reference(layer, reference, hidden, out, s.check_tokens, report);
  return report;
}

}  // namespace moe::cli
