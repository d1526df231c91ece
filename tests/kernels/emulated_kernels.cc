// Scalar emulations of the AVX512-BF16 and AMX-BF16 instructions, under the kernels' own loops.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/amx_bf16_tile.h"
#include "kernels/cpu/bf16_dot_tile.h"
#include "kernels/kernel_sets.h"
#include "moe/dtype.h"

namespace moe::testing {

namespace {

float bf16_value(uint16_t bits) { return to_f32(bf16{bits}); }

// vdpbf16ps: per lane, acc += a.odd * w.odd, then acc += a.even * w.even; each product of two
// bf16 values is exact in f32, each sum rounded once.
struct EmulatedDotOps {
  struct Acc {
    float lanes[16];
  };
  struct Weights {
    uint16_t halves[32];
  };
  struct Pair {
    uint16_t halves[2];
  };
  static void zero(Acc* acc) { std::memset(acc, 0, sizeof *acc); }
  static void load_acc(const float* in, Acc* acc) {
    std::memcpy(acc->lanes, in, sizeof acc->lanes);
  }
  static void load(const void* src, Weights* w) { std::memcpy(w, src, sizeof *w); }
  static void broadcast(const uint16_t* a, Pair* pair) { std::memcpy(pair, a, sizeof *pair); }
  static void dot(Acc* acc, const Pair& pair, const Weights& w) {
    for (int lane = 0; lane < 16; ++lane) {
      float sum = acc->lanes[lane];
      sum += bf16_value(pair.halves[1]) * bf16_value(w.halves[2 * lane + 1]);
      sum += bf16_value(pair.halves[0]) * bf16_value(w.halves[2 * lane]);
      acc->lanes[lane] = sum;
    }
  }
  static void store(const Acc& acc, float* out) { std::memcpy(out, acc.lanes, sizeof acc.lanes); }
};

// Eight tile registers of 16 rows x 64 bytes per thread. tdpbf16ps follows the SDM's order: for
// each row m, column n and k pair kk, c[m][n] += a[m][2kk] * b[kk][2n] + a[m][2kk + 1] * b[kk][2n +
// 1] (products exact in f32). Using a tile before begin() or after end() fails the test: it checks
// that the driver configures the tiles on every thread that runs the kernel. begin() checks the
// configuration the real kernel loads: palette 1, tiles 0-7 of 16 rows x 64 bytes, the rest off.
struct EmulatedTiles {
  static constexpr int kRows = 16, kRowBytes = 64;
  struct State {
    bool configured = false;
    uint8_t tiles[8][kRows][kRowBytes] = {};
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  static void check_configured() {
    if (!state().configured) ADD_FAILURE() << "AMX tile used without a loaded tile configuration";
  }
  static void begin() {
    const cpu::AmxTileConfig config = cpu::amx_tile_config();
    EXPECT_EQ(config.palette, 1);
    EXPECT_EQ(config.start_row, 0);
    for (int tile = 0; tile < 16; ++tile) {
      EXPECT_EQ(config.rows[tile], tile < 8 ? kRows : 0) << "tile " << tile;
      EXPECT_EQ(config.bytes_per_row[tile], tile < 8 ? kRowBytes : 0) << "tile " << tile;
    }
    state().configured = true;
  }
  static void end() { state().configured = false; }
  template <int kTile>
  static void zero() {
    check_configured();
    std::memset(state().tiles[kTile], 0, sizeof state().tiles[kTile]);
  }
  template <int kTile>
  static void load(const void* base, int64_t stride) {
    check_configured();
    for (int r = 0; r < kRows; ++r) {
      std::memcpy(state().tiles[kTile][r], static_cast<const char*>(base) + r * stride, kRowBytes);
    }
  }
  template <int kC, int kA, int kB>
  static void dot() {
    check_configured();
    State& s = state();
    for (int m = 0; m < kRows; ++m) {
      for (int n = 0; n < 16; ++n) {
        float c;
        std::memcpy(&c, &s.tiles[kC][m][4 * n], sizeof c);
        for (int kk = 0; kk < 16; ++kk) {
          uint16_t a[2], b[2];
          std::memcpy(a, &s.tiles[kA][m][4 * kk], sizeof a);
          std::memcpy(b, &s.tiles[kB][kk][4 * n], sizeof b);
          c += bf16_value(a[0]) * bf16_value(b[0]);
          c += bf16_value(a[1]) * bf16_value(b[1]);
        }
        std::memcpy(&s.tiles[kC][m][4 * n], &c, sizeof c);
      }
    }
  }
  template <int kTile>
  static void store(void* base, int64_t stride) {
    check_configured();
    for (int r = 0; r < kRows; ++r) {
      std::memcpy(static_cast<char*>(base) + r * stride, state().tiles[kTile][r], kRowBytes);
    }
  }
};

}  // namespace

cpu::ExpertKernels emulated_avx512bf16_kernels() {
  return cpu::bf16_dot_expert_kernels<EmulatedDotOps>();
}

cpu::ExpertKernels emulated_amx_kernels() { return cpu::amx_expert_kernel_set<EmulatedTiles>(); }

std::vector<KernelSet> runnable_kernel_sets(DType weight_dtype) {
  std::vector<KernelSet> sets;
  for (CpuIsa isa : supported_cpu_isas()) {
    const bool bf16_inputs =
        weight_dtype == DType::kBF16 && (isa == CpuIsa::kAvx512Bf16 || isa == CpuIsa::kAmx);
    sets.push_back(
        {std::string(cpu_isa_name(isa)), cpu::expert_kernels(isa, weight_dtype), bf16_inputs});
  }
  if (weight_dtype == DType::kBF16) {
    sets.push_back({"emulated-avx512bf16", emulated_avx512bf16_kernels(), true});
    sets.push_back({"emulated-amx", emulated_amx_kernels(), true});
  }
  if (cpu_isa_supported(CpuIsa::kAvx2)) {
    sets.push_back({"avx512-logic-on-avx2", avx512_logic_on_avx2_kernels(weight_dtype), false});
  }
  return sets;
}

}  // namespace moe::testing
