// The AMX-BF16 tile kernel, written once over a small set of tile operations `Tiles` so that its
// blocking and addressing run on any machine: amx_bf16_tile_kernels.cc instantiates it with the
// AMX instructions, tests/kernels with a scalar emulation of the tile registers.
//
// One call computes up to 32 rows by the 32 columns of a panel pair in four accumulator tiles,
// each tile 16 rows x 16 f32, loaded from acc when the call continues earlier k ranges:
//   tmm0 = rows 0-15 x panel 0   tmm1 = rows 0-15 x panel 1      (C)
//   tmm2 = rows 16-31 x panel 0  tmm3 = rows 16-31 x panel 1
//   tmm4 = rows 0-15, tmm5 = rows 16-31: 32 bf16 of k each        (A, 64 bytes per row)
//   tmm6 = panel 0, tmm7 = panel 1: 16 k pairs x 16 columns       (B, 64 bytes per row)
// For each step of 32 along k, A rows are read at the rows' stride and B is 1 KiB of the packed
// panel read at a stride of 64 bytes: the packed bf16 layout (packed_weights.h) is the VNNI layout
// TDPBF16PS expects. A block of up to 16 rows uses only tmm0, tmm1, tmm4, tmm6, tmm7.
//
// Tiles provides (kTile, kA, kB are tile register numbers):
//   begin(), end()                per thread, around its calls: ldtilecfg (amx_tile_config()),
//                                 tilerelease
//   zero<kTile>()                 tilezero
//   load<kTile>(const void* base, int64_t stride)    tileloadd: 16 rows of 64 bytes
//   dot<kC, kA, kB>()             tdpbf16ps
//   store<kTile>(void* base, int64_t stride)         tilestored
//
// NOTE: internal linkage on purpose, as in fma_tile.h: each includer compiles its own copy.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/ahead_lines.h"
#include "kernels/cpu/epilogue_rows.h"
#include "kernels/cpu/tile_kernel.h"

namespace moe::cpu {
namespace {

constexpr int64_t kTileRows = 16;
constexpr int64_t kTileRowBytes = 64;
constexpr int64_t kTileK = 32;  // bf16 values per A tile row
constexpr int64_t kAmxMaxRows = 2 * kTileRows;
// How far ahead the B panels are prefetched, in steps of 32 along k (1 KiB per panel and step):
// decode blocks of one or two rows are bound by streaming the weights from memory.
constexpr int64_t kAmxPrefetchSteps = 4;
// About 2 TFLOP/s of AMX-BF16 against 25 GB/s of DRAM reads on two cores.
constexpr double kAmxFlopsPerByte = 80;

// The 64-byte operand of ldtilecfg (palette 1): every tile 16 rows x 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(AmxTileConfig) == 64, "ldtilecfg reads exactly 64 bytes");

AmxTileConfig amx_tile_config() {
  AmxTileConfig config;
  for (int tile = 0; tile < 8; ++tile) {
    config.bytes_per_row[tile] = static_cast<uint16_t>(kTileRowBytes);
    config.rows[tile] = static_cast<uint8_t>(kTileRows);
  }
  return config;
}

template <typename Tiles>
void amx_pair(const TileArgs& t) {
  const bool two_blocks = t.rows > kTileRows;
  const char* a = static_cast<const char*>(t.a);
  const int64_t a_stride_bytes = t.a_stride * 2;
  const char* panel0 = static_cast<const char*>(t.pair);
  const char* panel1 = panel0 + t.panel_bytes;
  constexpr int64_t kAccStride = kPairWidth * sizeof(float);
  if (t.accumulate) {
    Tiles::template load<0>(t.acc, kAccStride);
    Tiles::template load<1>(t.acc + kPanelWidth, kAccStride);
    if (two_blocks) {
      Tiles::template load<2>(t.acc + kTileRows * kPairWidth, kAccStride);
      Tiles::template load<3>(t.acc + kTileRows * kPairWidth + kPanelWidth, kAccStride);
    }
  } else {
    Tiles::template zero<0>();
    Tiles::template zero<1>();
    if (two_blocks) {
      Tiles::template zero<2>();
      Tiles::template zero<3>();
    }
  }
  AheadLines<true> ahead(t, kTileK);
  for (int64_t k0 = t.k_begin; k0 < t.k_end; k0 += kTileK) {
    ahead.step();
    // 32 k values are 16 k pairs: 16 rows of 64 bytes of each panel.
    const int64_t b_offset = k0 / 2 * kTileRowBytes;
    for (int64_t line = 0; t.prefetch && line < kTileRows * kTileRowBytes; line += 64) {
      __builtin_prefetch(panel0 + b_offset + kAmxPrefetchSteps * kTileRows * kTileRowBytes + line);
      __builtin_prefetch(panel1 + b_offset + kAmxPrefetchSteps * kTileRows * kTileRowBytes + line);
    }
    Tiles::template load<6>(panel0 + b_offset, kTileRowBytes);
    Tiles::template load<7>(panel1 + b_offset, kTileRowBytes);
    Tiles::template load<4>(a + k0 * 2, a_stride_bytes);
    Tiles::template dot<0, 4, 6>();
    Tiles::template dot<1, 4, 7>();
    if (two_blocks) {
      Tiles::template load<5>(a + kTileRows * a_stride_bytes + k0 * 2, a_stride_bytes);
      Tiles::template dot<2, 5, 6>();
      Tiles::template dot<3, 5, 7>();
    }
  }
  Tiles::template store<0>(t.acc, kAccStride);
  Tiles::template store<1>(t.acc + kPanelWidth, kAccStride);
  if (two_blocks) {
    Tiles::template store<2>(t.acc + kTileRows * kPairWidth, kAccStride);
    Tiles::template store<3>(t.acc + kTileRows * kPairWidth + kPanelWidth, kAccStride);
  }
}

// The amx path's kernel set (bf16 weights). Decode blocks run on tiles too, mostly zero rows:
// a tile multiplies 2 KiB of weights in the time memory delivers a few hundred bytes, and one
// kernel for every block size keeps each row's result independent of its batch.
template <typename Tiles>
ExpertKernels amx_expert_kernel_set() {
  ExpertKernels kernels;
  kernels.tile.a_dtype = DType::kBF16;
  kernels.tile.max_rows = kAmxMaxRows;
  kernels.tile.row_multiple = kTileRows;
  kernels.tile.whole_k_row_blocks = 2;
  kernels.tile.spreads_prefetch = true;
  kernels.tile.prefetch_blocks = 1;
  kernels.tile.prefill_prefetch_blocks = 2;
  kernels.tile.run = &amx_pair<Tiles>;
  kernels.tile.thread_begin = &Tiles::begin;
  kernels.tile.thread_end = &Tiles::end;
  kernels.flops_per_byte = kAmxFlopsPerByte;
  kernels.silu_rows = &silu_rows<16>;
  kernels.scale_rows = &scale_rows<16>;
  return kernels;
}

}  // namespace
}  // namespace moe::cpu
