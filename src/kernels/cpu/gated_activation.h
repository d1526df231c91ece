// The act stage on the CPU, fused into gemm1's epilogue: out[i] = act(gate[i], up[i]) for one row
// of one expert, with the activations of moe/config.h. SiLU and the clamped SwiGLU take their
// sigmoid from a vectorized exp (a few ulp from std::exp); GELU uses std::erf / std::tanh.
// Tested by tests/kernels/gated_activation_test.cc against the float64 reference formulas.
#pragma once

#include <cstdint>

#include "moe/config.h"

namespace moe::cpu {

struct ActivationParams {
  Activation activation = Activation::kSilu;
  float alpha = 1.702f;  // kClampedSwiglu
  float limit = 7.0f;    // kClampedSwiglu
};

// gate, up, out [width] f32.
void gated_activation(const ActivationParams& params, const float* gate, const float* up,
                      int64_t width, float* out);

}  // namespace moe::cpu
