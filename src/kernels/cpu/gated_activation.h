// The act stage on the CPU: out[p, i] = act(in[p, i], in[p, I + i]) for every row p, with the
// activations of moe/config.h. Rows are independent; tested by tests/experts against the
// reference backend and by hand-computed values.
#pragma once

#include <cstdint>

#include "moe/config.h"

namespace moe::cpu {

struct ActivationParams {
  Activation activation = Activation::kSilu;
  float alpha = 1.702f;  // kClampedSwiglu
  float limit = 7.0f;    // kClampedSwiglu
};

// in [rows, 2 * width] f32 -> out [rows, width] f32.
void gated_activation(const ActivationParams& params, const float* in, int64_t rows, int64_t width,
                      float* out, int num_threads);

}  // namespace moe::cpu
