#include "kernels/cpu/gated_activation.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace moe::cpu {

namespace {

// Values per vector step: one gemm1 epilogue panel.
constexpr int kLanes = 16;
typedef float Floats __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t Ints __attribute__((vector_size(kLanes * sizeof(int32_t))));

// sigmoid(x) = 1 / (1 + exp(-x)) for kLanes values. exp(t) = 2^n * e^r with n = round(t / ln 2)
// and |r| <= ln(2) / 2, e^r by its degree-6 Taylor polynomial (truncation below 2e-7 relative);
// t is clamped to where 2^n stays a normal float. NaN stays NaN (it passes through r).
void sigmoid_lanes(const float* x, float* out) {
  Floats t;
  std::memcpy(&t, x, sizeof t);
  t = -t;
  t = t < -87.3f ? Floats{} - 87.3f : t;
  t = t > 88.7f ? Floats{} + 88.7f : t;
  // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
  constexpr float kRound = 12582912.0f;
  const Floats shifted = t * 1.44269504088896341f + kRound;
  const Floats n = shifted - kRound;
  const Floats r = t - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  Floats p = Floats{} + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  Ints n_bits, shifted_bits, round_bits = Ints{} + 0x4b400000;  // bits of kRound
  std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  n_bits = ((shifted_bits - round_bits) + 127) << 23;
  Floats scale;
  std::memcpy(&scale, &n_bits, sizeof scale);
  const Floats result = 1.0f / (1.0f + p * scale);
  std::memcpy(out, &result, sizeof result);
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
