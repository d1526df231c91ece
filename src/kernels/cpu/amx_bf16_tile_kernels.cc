// The amx path: amx_bf16_tile.h on the AMX instructions. bf16 weights only; the path runs the
// avx512 kernels for other weight dtypes (expert_kernels.cc).
//
// The tile instructions are written as inline assembly with a "memory" clobber: the compiler
// must see that tileloadd reads the rows the driver just packed and that tilestored writes the
// accumulators the epilogue reads next (GCC's own _tile_* macros declare neither). Linux grants
// the tile state per process (cpu_features.cc asks before any kernel runs). The blocking and
// addressing run on any machine through an emulation of these operations in
// tests/kernels/tile_kernels_test.cc; only this file's instructions need the real CPU.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/tile_kernel.h"

// Everything below is compiled for AMX; fma_tile.h explains why nothing is included after this.
#pragma GCC push_options
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), deliberately uninitialized values
// that its own warnings then flag inside the intrinsic headers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")

#include "kernels/cpu/amx_bf16_tile.h"

namespace moe::cpu {

namespace {

struct AmxTiles {
  static void begin() {
    const AmxTileConfig config = amx_tile_config();
    __asm__ volatile("ldtilecfg %0" ::"m"(config));
  }
  static void end() { __asm__ volatile("tilerelease" ::: "memory"); }
  template <int kTile>
  static void zero() {
    __asm__ volatile("tilezero %%tmm%c0" ::"i"(kTile));
  }
  template <int kTile>
  static void load(const void* base, int64_t stride) {
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(kTile)
                     : "memory");
  }
  template <int kC, int kA, int kB>
  static void dot() {
    __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(kC), "i"(kA), "i"(kB));
  }
  template <int kTile>
  static void store(void* base, int64_t stride) {
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(kTile)
                     : "memory");
  }
};

}  // namespace

ExpertKernels amx_expert_kernels() { return amx_expert_kernel_set<AmxTiles>(); }

double amx_peak_loop(int64_t iterations) {
  // Four independent accumulator tiles fed from two A and two B tiles that stay in registers.
  alignas(64) static const uint8_t kZeros[kTileRows * kTileRowBytes] = {};
  AmxTiles::begin();
  AmxTiles::zero<0>();
  AmxTiles::zero<1>();
  AmxTiles::zero<2>();
  AmxTiles::zero<3>();
  AmxTiles::load<4>(kZeros, kTileRowBytes);
  AmxTiles::load<5>(kZeros, kTileRowBytes);
  AmxTiles::load<6>(kZeros, kTileRowBytes);
  AmxTiles::load<7>(kZeros, kTileRowBytes);
  for (int64_t i = 0; i < iterations; ++i) {
    AmxTiles::dot<0, 4, 6>();
    AmxTiles::dot<1, 4, 7>();
    AmxTiles::dot<2, 5, 6>();
    AmxTiles::dot<3, 5, 7>();
  }
  AmxTiles::end();
  // Each tdpbf16ps: 16 rows x 16 columns x 32 multiply-adds.
  return 2.0 * 4 * kTileRows * kPanelWidth * kTileK * static_cast<double>(iterations);
}

}  // namespace moe::cpu

#pragma GCC diagnostic pop
#pragma GCC pop_options
