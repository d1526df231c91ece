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
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

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
void round_to_bf16(const typename Lanes<kLanes>::Floats& values,
                   typename EpilogueLanes<kLanes>::Halves& out) {
  using Bits = typename EpilogueLanes<kLanes>::Bits;
  Bits bits;
  std::memcpy(&bits, &values, sizeof bits);
#if defined(__AVX512BF16__)
  if constexpr (kLanes == 16) {
    // vcvtneps2bf16 rounds to nearest even and quiets a NaN as below, in one instruction instead
    // of about ten, but takes a denormal input as zero: a vector with one keeps the integer path.
    __m512i lanes;
    std::memcpy(&lanes, &bits, sizeof lanes);
    const __mmask16 denormal = _mm512_testn_epi32_mask(lanes, _mm512_set1_epi32(0x7f800000)) &
                               _mm512_test_epi32_mask(lanes, _mm512_set1_epi32(0x7fffffff));
    if (denormal == 0) {
      const __m256bh halves = _mm512_cvtneps_pbh(_mm512_castsi512_ps(lanes));
      std::memcpy(&out, &halves, sizeof out);
      return;
    }
  }
#endif
  const Bits rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const Bits quiet_nan = (bits >> 16) | 0x0040u;
  const auto magnitude = reinterpret_cast<typename Lanes<kLanes>::Ints>(bits & 0x7fffffffu);
  const Bits is_nan = reinterpret_cast<Bits>(magnitude > 0x7f800000);
  out = __builtin_convertvector((is_nan & quiet_nan) | (~is_nan & rounded),
                                typename EpilogueLanes<kLanes>::Halves);
}

template <int kLanes>
void round_to_bf16(const typename Lanes<kLanes>::Floats& values, uint16_t* out) {
  typename EpilogueLanes<kLanes>::Halves halves;
  round_to_bf16<kLanes>(values, halves);
  std::memcpy(out, &halves, sizeof halves);
}

// A vector's bytes to out past the caches, with SSE2's non-temporal stores (which every x86-64
// has): 16 bytes at a time, or 8 for the 4 bf16 lanes of the SSE2 build. out is aligned to the
// store's size.
template <typename Vector>
void stream_bytes(void* out, const Vector& values) {
  if constexpr (sizeof(Vector) % 16 == 0) {
    for (size_t i = 0; i < sizeof(Vector); i += 16) {
      __m128i chunk;
      std::memcpy(&chunk, reinterpret_cast<const char*>(&values) + i, sizeof chunk);
      _mm_stream_si128(reinterpret_cast<__m128i*>(static_cast<char*>(out) + i), chunk);
    }
  } else {
    static_assert(sizeof(Vector) == 8, "whole 8-byte stores");
    long long chunk;
    std::memcpy(&chunk, &values, sizeof chunk);
    _mm_stream_si64(static_cast<long long*>(out), chunk);
  }
}

// Vector v of a row's results at out, which holds the row's first `width` (kPairWidth for
// scale_rows, kPanelWidth for silu_rows): a whole vector goes straight from its register, a
// ragged last one through a local copy, only up to the width (a copy of a variable size straight
// from `values` would give the vector an address, and GCC 12 a stack slot in every row).
template <typename Vector, typename T>
void store_vector(T* out, int v, const Vector& values, int64_t width) {
  constexpr int64_t kCount = sizeof(Vector) / sizeof(T);
  T* to = out + v * kCount;
  const int64_t left = width - v * kCount;
  if (left >= kCount) {
    std::memcpy(to, &values, sizeof values);
  } else if (left > 0) {
    T spilled[kCount];
    std::memcpy(spilled, &values, sizeof values);
    std::memcpy(to, spilled, static_cast<size_t>(left) * sizeof(T));
  }
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
  // Locals: the stores below go through memcpy, which may alias anything, e's fields included.
  const float* const acc = e.acc;
  const int32_t* const ids = e.ids;
  const int64_t rows = e.rows, width = e.width, out_stride = e.out_stride;
  const bool bf16_out = e.out_dtype == DType::kBF16;
  for (int64_t r = 0; r < rows; ++r) {
    const float* sums = acc + r * kPairWidth;
    const int64_t row = ids[r] * out_stride;
    for (int v = 0; v < kVectors; ++v) {
      Floats gate, up, sigmoid;
      std::memcpy(&gate, sums + v * kLanes, sizeof gate);
      std::memcpy(&up, sums + kPanelWidth + v * kLanes, sizeof up);
      gate = gate + bias_gate[v];
      up = up + bias_up[v];
      vector_sigmoid<kLanes>(gate, sigmoid);
      const Floats value = gate * sigmoid * up;
      if (bf16_out) {
        typename EpilogueLanes<kLanes>::Halves halves;
        round_to_bf16<kLanes>(value, halves);
        store_vector(static_cast<uint16_t*>(e.out) + row, v, halves, width);
      } else {
        store_vector(static_cast<float*>(e.out) + row, v, value, width);
      }
    }
  }
}

// scale_rows' loop: vector v of each row's results (T: float, or uint16_t for bf16 bits) goes to
// store(row, v, vector, streamed), streamed when `stream` holds and the row is 16-byte aligned.
template <int kLanes, typename T, typename Store>
void scale_each_row(const EpilogueArgs& e, bool stream, Store store) {
  using Floats = typename Lanes<kLanes>::Floats;
  constexpr int kVectors = kPairWidth / kLanes;
  Floats bias[kVectors] = {};
  if (e.bias) std::memcpy(bias, e.bias, sizeof bias);
  // Locals: the stores below may alias anything, e's fields included.
  const float* const acc = e.acc;
  const float* const scales = e.scale;
  const int32_t* const ids = e.ids;
  T* const out = static_cast<T*>(e.out);
  const int64_t rows = e.rows, out_stride = e.out_stride;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = ids[r];
    const float scale = scales ? scales[id] : 1.0f;
    T* const row = out + id * out_stride;
    const bool streamed = stream && reinterpret_cast<uintptr_t>(row) % 16 == 0;
    for (int v = 0; v < kVectors; ++v) {
      Floats sum;
      std::memcpy(&sum, acc + r * kPairWidth + v * kLanes, sizeof sum);
      sum = (sum + bias[v]) * scale;
      if constexpr (sizeof(T) == sizeof(uint16_t)) {
        typename EpilogueLanes<kLanes>::Halves halves;
        round_to_bf16<kLanes>(sum, halves);
        store(row, v, halves, streamed);
      } else {
        store(row, v, sum, streamed);
      }
    }
  }
}

// bf16 out (cache3 of a bf16 layer, fused_experts.h) rounds each f32 value once, as moe::to_bf16.
// With EpilogueArgs::stream, whole rows go past the caches where they are 16-byte aligned (the
// vectors of a row one after another, so the write-combining buffers send whole lines); a ragged
// last pair's rows take ordinary stores up to the width.
template <int kLanes>
void scale_rows(const EpilogueArgs& e) {
  const int64_t width = e.width;
  const auto store = [width](auto* row, int v, const auto& values, bool streamed) {
    if (streamed) {
      stream_bytes(row + v * (sizeof values / sizeof *row), values);
    } else {
      store_vector(row, v, values, width);
    }
  };
  const bool stream = e.stream && width == kPairWidth;
  e.out_dtype == DType::kBF16 ? scale_each_row<kLanes, uint16_t>(e, stream, store)
                              : scale_each_row<kLanes, float>(e, stream, store);
  // Non-temporal stores are weakly ordered: fence them before another thread (the sum) reads.
  if (e.stream) _mm_sfence();
}

}  // namespace
}  // namespace moe::cpu
