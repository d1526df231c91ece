// The experts GEMMs' epilogues on a block of rows of one panel pair (EpilogueArgs in
// tile_kernel.h), written once with GCC vector extensions, 16 lanes, and compiled by each includer
// for its own instruction set: amx_bf16_tile.h and bf16_dot_tile.h (AVX-512 inside the bf16 paths'
// translation units) and packed_gemm.cc (the library's baseline, for the other paths). Each row
// is a few vector operations: the epilogue runs once per row and pair, as often as a 32-row AMX
// block runs 32 k steps of tdpbf16ps, so scalar code there would cost as much as the GEMM.
//
// The arithmetic is the driver's reference order: gate + bias, up + bias, gate * sigmoid(gate) *
// up (vector_sigmoid.h, as gated_activation() does), rounded to bf16 to nearest even (NaN stays a
// quiet NaN, as moe::to_bf16). Each output depends only on its own row, so results do not depend on
// how rows are blocked. With -ffp-contract=fast a translation unit whose target has FMA fuses
// some of these multiply-adds: a path's results are its own, not another path's bits.
// Tested by tests/kernels/epilogue_rows_test.cc against gated_activation() and moe::to_bf16.
//
// NOTE: internal linkage on purpose, as in fma_tile.h: each includer compiles its own copy.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile_kernel.h"
#include "kernels/cpu/vector_sigmoid.h"

namespace moe::cpu {
namespace {

typedef uint32_t EpilogueBits __attribute__((vector_size(16 * sizeof(uint32_t))));
typedef uint16_t EpilogueHalves __attribute__((vector_size(16 * sizeof(uint16_t))));

// f32 -> bf16 bits, rounded to nearest even; a NaN keeps its sign and top bits and becomes quiet.
void round_to_bf16(const SigmoidFloats& values, EpilogueHalves& out) {
  EpilogueBits bits;
  std::memcpy(&bits, &values, sizeof bits);
  const EpilogueBits rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const EpilogueBits quiet_nan = (bits >> 16) | 0x0040u;
  const EpilogueBits is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  out = __builtin_convertvector(is_nan ? quiet_nan : rounded, EpilogueHalves);
}

void silu_rows(const EpilogueArgs& e) {
  SigmoidFloats bias_gate{}, bias_up{};
  if (e.bias) {
    std::memcpy(&bias_gate, e.bias, sizeof bias_gate);
    std::memcpy(&bias_up, e.bias + kPanelWidth, sizeof bias_up);
  }
  const bool bf16_out = e.out_dtype == DType::kBF16;
  const size_t out_bytes = static_cast<size_t>(e.width) * (bf16_out ? 2 : 4);
  const bool full = e.width == kPanelWidth;
  for (int64_t r = 0; r < e.rows; ++r) {
    SigmoidFloats gate, up;
    std::memcpy(&gate, e.acc + r * kPairWidth, sizeof gate);
    std::memcpy(&up, e.acc + r * kPairWidth + kPanelWidth, sizeof up);
    gate = gate + bias_gate;
    up = up + bias_up;
    SigmoidFloats sigmoid;
    vector_sigmoid(gate, sigmoid);
    const SigmoidFloats activated = gate * sigmoid * up;
    const int64_t row = e.ids[r] * e.out_stride;
    // Whole panels (every row but a ragged last pair's) store with a fixed size: no call.
    if (bf16_out) {
      EpilogueHalves halves;
      round_to_bf16(activated, halves);
      uint16_t* out = static_cast<uint16_t*>(e.out) + row;
      full ? std::memcpy(out, &halves, sizeof halves) : std::memcpy(out, &halves, out_bytes);
    } else {
      float* out = static_cast<float*>(e.out) + row;
      full ? std::memcpy(out, &activated, sizeof activated)
           : std::memcpy(out, &activated, out_bytes);
    }
  }
}

void scale_rows(const EpilogueArgs& e) {
  SigmoidFloats bias0{}, bias1{};
  if (e.bias) {
    std::memcpy(&bias0, e.bias, sizeof bias0);
    std::memcpy(&bias1, e.bias + kPanelWidth, sizeof bias1);
  }
  const int64_t width0 = e.width < kPanelWidth ? e.width : kPanelWidth;
  const int64_t width1 = e.width - width0;
  for (int64_t r = 0; r < e.rows; ++r) {
    const int32_t id = e.ids[r];
    const float scale = e.scale ? e.scale[id] : 1.0f;
    SigmoidFloats v0, v1;
    std::memcpy(&v0, e.acc + r * kPairWidth, sizeof v0);
    std::memcpy(&v1, e.acc + r * kPairWidth + kPanelWidth, sizeof v1);
    v0 = (v0 + bias0) * scale;
    v1 = (v1 + bias1) * scale;
    float* out = static_cast<float*>(e.out) + id * e.out_stride;
    if (e.width == kPairWidth) {
      std::memcpy(out, &v0, sizeof v0);
      std::memcpy(out + kPanelWidth, &v1, sizeof v1);
      continue;
    }
    std::memcpy(out, &v0, static_cast<size_t>(width0) * sizeof(float));
    if (width1 > 0)
      std::memcpy(out + kPanelWidth, &v1, static_cast<size_t>(width1) * sizeof(float));
  }
}

}  // namespace
}  // namespace moe::cpu
