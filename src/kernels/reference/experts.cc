// Reference experts: for each expert, for each of its pairs in ascending pair order, run the
// expert MLP on the token's row in double; then sum each token's k results in slot order.
// Tested through tests/experts (every backend against this one) and against hand-computed
// values in tests/experts/reference_experts_test.cc.
#include "kernels/reference/experts.h"

#include <cmath>
#include <vector>

namespace moe::reference {

namespace {

std::vector<double> load_row(const void* base, DType dtype, int64_t row, int64_t width) {
  std::vector<float> f32(static_cast<size_t>(width));
  const size_t bytes = dtype_size(dtype);
  convert_to_f32(static_cast<const char*>(base) + row * width * bytes, dtype, f32.data(),
                 f32.size());
  return std::vector<double>(f32.begin(), f32.end());
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// y[n] = sum_i weight[n, i] * x[i] (+ bias[n]) for a [rows, x.size()] matrix.
std::vector<double> matvec(const void* weight, DType dtype, int64_t rows,
                           const std::vector<double>& x, const float* bias) {
  std::vector<double> y(static_cast<size_t>(rows));
  const int64_t width = static_cast<int64_t>(x.size());
  for (int64_t n = 0; n < rows; ++n) {
    const std::vector<double> w = load_row(weight, dtype, n, width);
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += w[i] * x[i];
    y[n] = sum + (bias ? bias[n] : 0.0);
  }
  return y;
}

// One gated MLP: w2 · act(w13 · x + b13) + b2.
std::vector<double> mlp(const ExpertsProblem& pb, const void* w13, const void* w2,
                        int64_t intermediate, const float* b13, const float* b2,
                        const std::vector<double>& x) {
  const std::vector<double> h = matvec(w13, pb.weight_dtype, 2 * intermediate, x, b13);
  std::vector<double> a(static_cast<size_t>(intermediate));
  for (int64_t i = 0; i < intermediate; ++i) {
    a[i] = gated_activation(pb.activation, h[i], h[intermediate + i], pb.swiglu_alpha,
                            pb.swiglu_limit);
  }
  return matvec(w2, pb.weight_dtype, pb.hidden_size, a, b2);
}

}  // namespace

double gated_activation(Activation activation, double gate, double up, double alpha, double limit) {
  switch (activation) {
    case Activation::kSilu:
      return gate * sigmoid(gate) * up;
    case Activation::kGelu:
      return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0))) * up;
    case Activation::kGeluTanh: {
      const double inner = std::sqrt(2.0 / M_PI) * (gate + 0.044715 * gate * gate * gate);
      return 0.5 * gate * (1.0 + std::tanh(inner)) * up;
    }
    case Activation::kClampedSwiglu: {
      const double g = std::fmin(gate, limit);
      const double u = std::fmax(std::fmin(up, limit), -limit);
      return (u + 1.0) * g * sigmoid(alpha * g);
    }
  }
  return NAN;
}

void fused_experts(const ExpertsProblem& pb) {
  const int64_t M = pb.num_tokens, H = pb.hidden_size, I = pb.intermediate_size, k = pb.top_k;
  const size_t weight_bytes = dtype_size(pb.weight_dtype);
  // results[p] stays empty for pairs whose expert is not local: they contribute zero.
  std::vector<std::vector<double>> results(static_cast<size_t>(M * k));

  for (int64_t e = 0; e < pb.num_experts; ++e) {
    const int64_t local = pb.expert_map ? pb.expert_map[e] : e;
    if (local < 0) continue;
    const char* w13 = static_cast<const char*>(pb.w13) + local * 2 * I * H * weight_bytes;
    const char* w2 = static_cast<const char*>(pb.w2) + local * H * I * weight_bytes;
    const float* b13 = pb.w13_bias ? pb.w13_bias + local * 2 * I : nullptr;
    const float* b2 = pb.w2_bias ? pb.w2_bias + local * H : nullptr;
    for (int64_t p = 0; p < M * k; ++p) {
      if (pb.topk_ids[p] != e) continue;
      const double weight = pb.topk_weights[p];
      std::vector<double> x = pb.hidden_row_ptrs
                                  ? load_row(pb.hidden_row_ptrs[p], pb.hidden_dtype, 0, H)
                                  : load_row(pb.hidden, pb.hidden_dtype, p / k, H);
      if (pb.weight_on_input) {
        for (double& v : x) v *= weight;
      }
      std::vector<double> y = mlp(pb, w13, w2, I, b13, b2, x);
      if (!pb.weight_on_input) {
        for (double& v : y) v *= weight;
      }
      results[p] = std::move(y);
    }
  }

  std::vector<float> out_row(static_cast<size_t>(H));
  const size_t out_bytes = dtype_size(pb.hidden_dtype);
  for (int64_t t = 0; t < M; ++t) {
    std::vector<double> sum(static_cast<size_t>(H), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const std::vector<double>& y = results[t * k + j];
      for (size_t h = 0; h < y.size(); ++h) sum[h] += y[h];
    }
    if (pb.shared_intermediate_size > 0) {
      const std::vector<double> x = load_row(pb.hidden, pb.hidden_dtype, t, H);
      const std::vector<double> y =
          mlp(pb, pb.shared_w13, pb.shared_w2, pb.shared_intermediate_size, nullptr, nullptr, x);
      double scale = 1.0;
      if (pb.shared_gate) {
        const std::vector<double> gate = load_row(pb.shared_gate, pb.weight_dtype, 0, H);
        double logit = 0;
        for (int64_t h = 0; h < H; ++h) logit += gate[h] * x[h];
        scale = sigmoid(logit);
      }
      for (int64_t h = 0; h < H; ++h) sum[h] += scale * y[h];
    }
    for (int64_t h = 0; h < H; ++h) out_row[h] = static_cast<float>(sum[h]);
    convert_from_f32(out_row.data(), pb.hidden_dtype,
                     static_cast<char*>(pb.out) + t * H * out_bytes, out_row.size());
  }
}

}  // namespace moe::reference
