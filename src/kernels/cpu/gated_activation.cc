#include "kernels/cpu/gated_activation.h"

#include <cmath>

namespace moe::cpu {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

template <Activation kActivation>
void activate_row(const ActivationParams& params, const float* gate, const float* up, int64_t width,
                  float* out) {
  for (int64_t i = 0; i < width; ++i) {
    const float g = gate[i], u = up[i];
    if constexpr (kActivation == Activation::kSilu) {
      out[i] = g * sigmoid(g) * u;
    } else if constexpr (kActivation == Activation::kGelu) {
      out[i] = 0.5f * g * (1.0f + std::erf(g * 0.70710678118654752f)) * u;
    } else if constexpr (kActivation == Activation::kGeluTanh) {
      const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
      out[i] = 0.5f * g * (1.0f + std::tanh(inner)) * u;
    } else {
      const float clamped_gate = std::fmin(g, params.limit);
      const float clamped_up = std::fmax(std::fmin(u, params.limit), -params.limit);
      out[i] = (clamped_up + 1.0f) * clamped_gate * sigmoid(params.alpha * clamped_gate);
    }
  }
}

template <Activation kActivation>
void activate(const ActivationParams& params, const float* in, int64_t rows, int64_t width,
              float* out, int num_threads) {
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = in + r * 2 * width;
    activate_row<kActivation>(params, row, row + width, width, out + r * width);
  }
}

}  // namespace

void gated_activation(const ActivationParams& params, const float* in, int64_t rows, int64_t width,
                      float* out, int num_threads) {
  switch (params.activation) {
    case Activation::kSilu:
      return activate<Activation::kSilu>(params, in, rows, width, out, num_threads);
    case Activation::kGelu:
      return activate<Activation::kGelu>(params, in, rows, width, out, num_threads);
    case Activation::kGeluTanh:
      return activate<Activation::kGeluTanh>(params, in, rows, width, out, num_threads);
    case Activation::kClampedSwiglu:
      return activate<Activation::kClampedSwiglu>(params, in, rows, width, out, num_threads);
  }
}

}  // namespace moe::cpu
