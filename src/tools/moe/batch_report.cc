#include "tools/moe/batch_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "moe/error.h"
#include "tools/moe/routing_ties.h"

namespace moe::cli {

double run_error_bound(DType dtype, CpuIsa isa) {
  const bool bf16_inputs =
      dtype == DType::kBF16 && (isa == CpuIsa::kAmx || isa == CpuIsa::kAvx512Bf16);
  return (dtype == DType::kF32 ? 1e-5 : 1e-2) + (bf16_inputs ? 1e-2 : 0.0);
}

Tensor synthetic_hidden(int64_t tokens, int64_t hidden_size, DType dtype, uint64_t seed) {
  std::vector<float> values(static_cast<size_t>(tokens * hidden_size));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (float& v : values) {
    // Sum of four uniforms: close enough to a Gaussian for activations, cheap, portable.
    float sum = 0;
    for (int i = 0; i < 4; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      sum += static_cast<float>(state >> 40) * 0x1.0p-24f - 0.5f;
    }
    v = sum * std::sqrt(3.0f);
  }
  Tensor hidden(dtype, {tokens, hidden_size});
  convert_from_f32(values.data(), dtype, hidden.data<void>(), values.size());
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
  const int64_t M = hidden.size(0), H = hidden.size(1), k = layer.config().routing.top_k;
  sample = std::min(sample, M);
  if (sample == 0) return;
  // Evenly spaced tokens, first and last included.
  std::vector<int64_t> tokens(static_cast<size_t>(sample));
  for (int64_t i = 0; i < sample; ++i) {
    tokens[i] = sample == 1 ? 0 : i * (M - 1) / (sample - 1);
  }
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(hidden.dtype());
  Tensor picked(hidden.dtype(), {sample, H});
  for (int64_t i = 0; i < sample; ++i) {
    std::memcpy(picked.data<char>() + i * row_bytes, hidden.data<char>() + tokens[i] * row_bytes,
                row_bytes);
  }
  const Tensor layer_ids = Tensor::copy_of(layer.last_topk_ids(), DType::kI32);
  const Tensor layer_weights = Tensor::copy_of(layer.last_topk_weights(), DType::kF32);
  const Tensor picked_f32 = Tensor::copy_of(picked, DType::kF32);
  const Tensor expected = reference.forward(picked_f32);
  const Tensor ref_ids = Tensor::copy_of(reference.last_topk_ids(), DType::kI32);

  double max_error = 0, max_expected = 0;
  std::vector<float> got(static_cast<size_t>(H));
  Tensor expected_at_tie(DType::kF32, {1, H});
  for (int64_t i = 0; i < sample; ++i) {
    const float* hidden_row = picked_f32.data<float>() + i * H;
    int32_t* ids = layer_ids.data<int32_t>() + tokens[i] * k;
    float* weights = layer_weights.data<float>() + tokens[i] * k;
    const float* want = expected.data<float>() + i * H;
    if (!std::equal(ids, ids + k, ref_ids.data<int32_t>() + i * k)) {
      if (routed_at_a_tie(reference, hidden_row, ids)) {
        // Either routing is right: hold the layer's experts to the reference's on its own.
        reference.forward_experts(TensorView(const_cast<float*>(hidden_row), DType::kF32, {1, H}),
                                  TensorView(ids, DType::kI32, {1, k}),
                                  TensorView(weights, DType::kF32, {1, k}), expected_at_tie);
        want = expected_at_tie.data<float>();
        ++report.routed_at_ties;
      } else {
        ++report.routing_mismatches;
      }
    }
    convert_to_f32(out.data<char>() + tokens[i] * row_bytes, out.dtype(), got.data(), got.size());
    for (int64_t h = 0; h < H; ++h) {
      const double e = want[h];
      max_expected = std::max(max_expected, std::abs(e));
      const double error = std::abs(static_cast<double>(got[h]) - e);
      max_error = std::isnan(error) ? INFINITY : std::max(max_error, error);
    }
  }
  report.checked_tokens = sample;
  report.max_rel_error = max_error / std::max(max_expected, 1e-30);
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
