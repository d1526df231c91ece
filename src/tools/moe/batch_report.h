// Runs a MoeLayer on one synthetic batch, times it, and checks a sample of its tokens against
// the reference backend: the measurements behind `moe run`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "moe/cpu_isa.h"
#include "moe/dtype.h"
#include "moe/experts.h"
#include "moe/layer.h"

namespace moe::cli {

struct BatchReport {
  int64_t tokens = 0;
  StageTimes stages;    // of the run whose total is the median
  double total_us = 0;  // median over the timed runs
  int repeats = 0;
  // Work of one call.
  int64_t experts_touched = 0;  // experts with at least one pair
  int64_t rows_min = 0, rows_max = 0;
  double rows_mean = 0;     // pairs per expert over all experts
  double weight_bytes = 0;  // router + touched experts + shared experts, read once
  double flops = 0;         // router, routed experts and shared experts, 2 per multiply-add
  // Agreement with the reference backend on a sample of tokens.
  int64_t checked_tokens = 0;
  double max_rel_error = 0;  // max |out - ref| / max |ref| over the sample
  // Sampled tokens whose experts differ from the reference's beyond a tie of logits (a wrong
  // routing), and those whose experts differ only at such a tie (routing_ties.h): these are
  // checked against the reference's experts on the layer's own routing.
  int64_t routing_mismatches = 0;
  int64_t routed_at_ties = 0;
};

struct BatchSettings {
  int64_t tokens = 1;
  DType dtype = DType::kBF16;  // hidden states
  uint64_t seed = 0;
  int repeats = 5;
  int64_t check_tokens = 8;  // 0 = no reference check
};

// The largest normwise relative error a correct layer's output may show against the float64
// reference. bf16 output carries 8 significant bits: a rounding error of at most 2^-9 of each
// element, so the error stays well under 1e-2; f32 output is held to 1e-5. The amx and
// avx512bf16 paths also round the GEMM inputs of bf16 weights to bf16, which adds up to 1e-2 more
// (tests/experts/fused_experts_test.cc derives it).
double run_error_bound(DType dtype, CpuIsa isa);

// A [tokens, hidden_size] tensor of a batch (`what`: "hidden states", "output"), or a moe::Error
// naming --tokens when it does not fit in memory, rather than std::bad_alloc further on.
Tensor batch_tensor(int64_t tokens, int64_t hidden_size, DType dtype, const char* what);

// Fills a [tokens, H] batch with next() in row-major order, each row converted to the batch's
// dtype through a one-row float buffer, so no float copy of the whole batch is ever made.
template <typename Next>
void fill_batch_rows(const Tensor& batch, Next&& next) {
  const int64_t H = batch.size(1);
  std::vector<float> row(static_cast<size_t>(H));
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(batch.dtype());
  for (int64_t t = 0; t < batch.size(0); ++t) {
    for (float& v : row) v = next();
    convert_from_f32(row.data(), batch.dtype(),
                     batch.data<char>() + static_cast<size_t>(t) * row_bytes, row.size());
  }
}

// Hidden states like a post-norm residual stream: unit variance, deterministic in the seed.
Tensor synthetic_hidden(int64_t tokens, int64_t hidden_size, DType dtype, uint64_t seed);

// `reference` must hold the same config and weights as `layer`, on the reference backend.
BatchReport measure_batch(MoeLayer& layer, MoeLayer& reference, const BatchSettings& settings);

}  // namespace moe::cli
