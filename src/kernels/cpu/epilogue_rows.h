// The experts GEMMs' epilogues on a block of rows of one panel pair (EpilogueArgs in
// tile_kernel.h), written once with GCC vector extensions and compiled by each includer for its
// own instruction set and width (vector_sigmoid.h says why the width is the target's):
// amx_bf16_tile.h and bf16_dot_tile.h (16 lanes of AVX-512 inside the bf16 paths' translation
// units) and packed_gemm.cc (the library's baseline, kBaselineLanes, for the other paths). Each row
// is a few vector operations: the epilogue runs once per row and pair, as often as a 32-row AMX
// block runs 32 k steps of tdpbf16ps, so scalar code there would cost as much as the GEMM.
//
// The arithmetic is the driver's reference order: gate + bias, up + bias, gate * sigmoid(gate) *
// up (vector_sigmoid.h, as gated_activation() does) for silu_rows, (acc + bias) * scale for
// scale_rows; with a bf16 out_dtype each f32 result is rounded once to bf16, to nearest even (NaN
// stays a quiet NaN, as moe::to_bf16). Each output depends only on its own row, so results do not
// depend on how rows are blocked. With -ffp-contract=fast a translation unit whose target has FMA
// fuses some of these multiply-adds: a path's results are its own, not another path's bits. Tested
// by tests/kernels/epilogue_rows_test.cc against gated_activation(), the f32 product and
// moe::to_bf16.
//
// NOTE: internal linkage on purpose, as in fma_tile.h: each includer compiles its own copy.
#pragma once

#include <emmintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile_kernel.h"
#include "kernels/cpu/vector_sigmoid.h"

namespace moe::cpu {
namespace {

template <int kLanes>
struct EpilogueLanes {
  typedef uint32_t Bits __attribute__((vector_size(kLanes * sizeof(uint32_t))));
  typedef uint16_t Halves __attribute__((vector_size(kLanes * sizeof(uint16_t))));
};

// kLanes f32 -> bf16 bits, rounded to nearest even; a NaN keeps its sign and top bits and becomes
// quiet. The NaN test compares as signed (both sides are below 2^31): x86 before AVX-512 has no
// unsigned vector comparison.
template <int kLanes>
void round_to_bf16(const typename Lanes<kLanes>::Floats& values, uint16_t* out) {
  using Bits = typename EpilogueLanes<kLanes>::Bits;
  Bits bits;
  std::memcpy(&bits, &values, sizeof bits);
  const Bits rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const Bits quiet_nan = (bits >> 16) | 0x0040u;
  const auto magnitude = reinterpret_cast<typename Lanes<kLanes>::Ints>(bits & 0x7fffffffu);
  const Bits is_nan = reinterpret_cast<Bits>(magnitude > 0x7f800000);
  const auto halves = __builtin_convertvector((is_nan & quiet_nan) | (~is_nan & rounded),
                                              typename EpilogueLanes<kLanes>::Halves);
  std::memcpy(out, &halves, sizeof halves);
}

template <int kLanes>
void silu_rows(const EpilogueArgs& e) {
  using Floats = typename Lanes<kLanes>::Floats;
  constexpr int kVectors = kPanelWidth / kLanes;
  Floats bias_gate[kVectors] = {}, bias_up[kVectors] = {};
  if (e.bias) {
    std::memcpy(bias_gate, e.bias, sizeof bias_gate);
    std::memcpy(bias_up, e.bias + kPanelWidth, sizeof bias_up);
  }
  const bool bf16_out = e.out_dtype == DType::kBF16;
  const bool full = e.width == kPanelWidth;
  for (int64_t r = 0; r < e.rows; ++r) {
    const float* acc = e.acc + r * kPairWidth;
    float activated[kPanelWidth];
    uint16_t halves[kPanelWidth];
    for (int v = 0; v < kVectors; ++v) {
      Floats gate, up, sigmoid;
      std::memcpy(&gate, acc + v * kLanes, sizeof gate);
      std::memcpy(&up, acc + kPanelWidth + v * kLanes, sizeof up);
      gate = gate + bias_gate[v];
      up = up + bias_up[v];
      vector_sigmoid<kLanes>(gate, sigmoid);
      const Floats value = gate * sigmoid * up;
      if (bf16_out) {
        round_to_bf16<kLanes>(value, halves + v * kLanes);
      } else {
        std::memcpy(activated + v * kLanes, &value, sizeof value);
      }
    }
    // Whole panels (every row but a ragged last pair's) store with a fixed size: no call.
    const int64_t row = e.ids[r] * e.out_stride;
    if (bf16_out) {
      uint16_t* out = static_cast<uint16_t*>(e.out) + row;
      full ? std::memcpy(out, halves, sizeof halves)
           : std::memcpy(out, halves, static_cast<size_t>(e.width) * sizeof(uint16_t));
    } else {
      float* out = static_cast<float*>(e.out) + row;
      full ? std::memcpy(out, activated, sizeof activated)
           : std::memcpy(out, activated, static_cast<size_t>(e.width) * sizeof(float));
    }
  }
}

// One output row of a panel pair (32 values: 128 bytes of f32, 64 of bf16), past the caches
// (EpilogueArgs::stream) where the row is 16-byte aligned (SSE2's non-temporal store, which every
// x86-64 has), else an ordinary copy. The row's bytes are written one after another, so the
// write-combining buffers send whole lines.
template <size_t kBytes>
void stream_row(void* out, const void* values) {
  if (reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    std::memcpy(out, values, kBytes);
    return;
  }
  for (size_t i = 0; i < kBytes; i += 16) {
    _mm_stream_si128(
        reinterpret_cast<__m128i*>(static_cast<char*>(out) + i),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const char*>(values) + i)));
  }
}

// The first `width` of a row's 32 values at `out`: a whole row (every row but a ragged last
// pair's) with a fixed size, no call, or past the caches with `stream`.
template <typename T>
void store_row(T* out, const T (&values)[kPairWidth], int64_t width, bool stream) {
  if (width != kPairWidth) {
    std::memcpy(out, values, static_cast<size_t>(width) * sizeof(T));
  } else if (stream) {
    stream_row<sizeof values>(out, values);
  } else {
    std::memcpy(out, values, sizeof values);
  }
}

// bf16 out (cache3 of a bf16 layer, fused_experts.h) rounds each f32 value once, as moe::to_bf16.
template <int kLanes>
void scale_rows(const EpilogueArgs& e) {
  using Floats = typename Lanes<kLanes>::Floats;
  constexpr int kVectors = kPairWidth / kLanes;
  Floats bias[kVectors] = {};
  if (e.bias) std::memcpy(bias, e.bias, sizeof bias);
  const bool bf16_out = e.out_dtype == DType::kBF16;
  for (int64_t r = 0; r < e.rows; ++r) {
    const int32_t id = e.ids[r];
    const float scale = e.scale ? e.scale[id] : 1.0f;
    float values[kPairWidth];
    uint16_t halves[kPairWidth];
    for (int v = 0; v < kVectors; ++v) {
      Floats sum;
      std::memcpy(&sum, e.acc + r * kPairWidth + v * kLanes, sizeof sum);
      sum = (sum + bias[v]) * scale;
      if (bf16_out) {
        round_to_bf16<kLanes>(sum, halves + v * kLanes);
      } else {
        std::memcpy(values + v * kLanes, &sum, sizeof sum);
      }
    }
    const int64_t row = id * e.out_stride;
    if (bf16_out) {
      store_row(static_cast<uint16_t*>(e.out) + row, halves, e.width, e.stream);
    } else {
      store_row(static_cast<float*>(e.out) + row, values, e.width, e.stream);
    }
  }
  // Non-temporal stores are weakly ordered: fence them before another thread (the sum) reads.
  if (e.stream) _mm_sfence();
}

}  // namespace
}  // namespace moe::cpu
