#include "kernels/cpu/gated_activation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/vector_sigmoid.h"

namespace moe::cpu {

namespace {

// Values per vector step: one gemm1 epilogue panel.
constexpr int kLanes = 16;

// sigmoid of kLanes values, kBaselineLanes at a time.
void sigmoid_lanes(const float* x, float* out) {
  using Floats = Lanes<kBaselineLanes>::Floats;
  for (int i = 0; i < kLanes; i += kBaselineLanes) {
    Floats values, result;
    std::memcpy(&values, x + i, sizeof values);
    vector_sigmoid<kBaselineLanes>(values, result);
    std::memcpy(out + i, &result, sizeof result);
  }
}

void silu_gate(const ActivationParams&, const float* gate, const float* up, int width, float* out) {
  float sigmoid[kLanes];
  sigmoid_lanes(gate, sigmoid);
  for (int i = 0; i < width; ++i) out[i] = gate[i] * sigmoid[i] * up[i];
}

void clamped_swiglu(const ActivationParams& params, const float* gate, const float* up, int width,
                    float* out) {
  float clamped_gate[kLanes], scaled[kLanes], sigmoid[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    clamped_gate[i] = std::fmin(gate[i], params.limit);
    scaled[i] = params.alpha * clamped_gate[i];
  }
  sigmoid_lanes(scaled, sigmoid);
  for (int i = 0; i < width; ++i) {
    const float clamped_up = std::fmax(std::fmin(up[i], params.limit), -params.limit);
    out[i] = (clamped_up + 1.0f) * clamped_gate[i] * sigmoid[i];
  }
}

void gelu(const ActivationParams&, const float* gate, const float* up, int width, float* out) {
  for (int i = 0; i < width; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::erf(g * 0.70710678118654752f)) * up[i];
  }
}

void gelu_tanh(const ActivationParams&, const float* gate, const float* up, int width, float* out) {
  for (int i = 0; i < width; ++i) {
    const float g = gate[i];
    const float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
    out[i] = 0.5f * g * (1.0f + std::tanh(inner)) * up[i];
  }
}

}  // namespace

void gated_activation(const ActivationParams& params, const float* gate, const float* up,
                      int64_t width, float* out) {
  using Step = void (*)(const ActivationParams&, const float*, const float*, int, float*);
  Step step = nullptr;
  switch (params.activation) {
    case Activation::kSilu:
      step = &silu_gate;
      break;
    case Activation::kGelu:
      step = &gelu;
      break;
    case Activation::kGeluTanh:
      step = &gelu_tanh;
      break;
    case Activation::kClampedSwiglu:
      step = &clamped_swiglu;
      break;
  }
  for (int64_t i = 0; i < width; i += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, width - i));
    if (n == kLanes) {
      step(params, gate + i, up + i, n, out + i);
      continue;
    }
    // A short tail goes through zero-padded copies, so the vector steps never read past the row.
    float gate_tail[kLanes] = {}, up_tail[kLanes] = {};
    std::copy(gate + i, gate + i + n, gate_tail);
    std::copy(up + i, up + i + n, up_tail);
    step(params, gate_tail, up_tail, n, out + i);
  }
}

}  // namespace moe::cpu
