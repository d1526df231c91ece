// The innermost CPU experts kernel, one per instruction set: a block of input rows times one
// packed panel pair (packed_weights.h), over one range of k, into 32 f32 outputs per row.
//
//   acc[r, c] (+)= sum over k in [k_begin, k_end) of a[r, k] * w[column c of the pair, k]
//
// The driver (packed_gemm.cc) gathers and converts the input rows, walks experts, pairs, k blocks
// (a block of weights stays in L1 while every row block passes over it, the sums carried in acc
// from one k block to the next) and row blocks, and applies the epilogue; a TileKernel only
// multiplies. The f32 kernels (plain, avx2,
// avx512) add the products of each output in ascending k, one fused multiply-add at a time, so
// their results do not depend on how rows are blocked or split across threads. The bf16 kernels
// (avx512bf16, amx) take bf16 inputs and follow the hardware's pairwise order.
//
// Variants: plain_tile_kernels.cc, avx2_tile_kernels.cc, avx512_tile_kernels.cc,
// avx512bf16_tile_kernels.cc, amx_bf16_tile_kernels.cc. Tested one by one in
// tests/kernels/tile_kernels_test.cc and end to end in tests/experts.
#pragma once

#include <cstdint>

#include "kernels/cpu/packed_weights.h"
#include "moe/cpu_isa.h"
#include "moe/dtype.h"

namespace moe::cpu {

struct TileArgs {
  const void* a = nullptr;     // [rows (padded, see TileKernel::row_multiple), a_stride]
  int64_t a_stride = 0;        // elements between rows; >= PackedLayout::k_padded
  int64_t rows = 0;            // 1..TileKernel::max_rows
  const void* pair = nullptr;  // the two panels, panel_bytes apart
  int64_t panel_bytes = 0;
  // The range of k: bf16 panels take multiples of kBf16KMultiple up to k_padded (the inputs are
  // zero from the real k on); the other dtypes any range within k.
  int64_t k_begin = 0;
  int64_t k_end = 0;
  bool accumulate = false;  // add to acc (the sums of earlier k ranges) rather than overwrite it
  // The weights come from memory or L2 (the first row block over a k block): prefetch ahead of
  // the steps. Later row blocks find them in L1; the amx kernel, which prefetches 32 lines per
  // step, then skips its prefetches rather than take load slots from the tile loads.
  bool prefetch = true;
  // A later block of weights, the same bytes of both panels of a pair, that a kernel which
  // TileKernel::spreads_prefetch brings into L2 a few cache lines per k step.
  const void* ahead0 = nullptr;
  const void* ahead1 = nullptr;
  int64_t ahead_bytes = 0;  // of each panel, a multiple of 64
  float* acc = nullptr;     // [rows rounded up to TileKernel::row_multiple, 32]
};

struct TileKernel {
  DType a_dtype = DType::kF32;  // f32 rows, or bf16 rows for the bf16 kernels
  int64_t max_rows = 1;
  // The kernel reads rows up to the next multiple of this. A row's sums depend on that row alone;
  // the experts' driver zero-fills the extra rows, the router's (router_tiles.cc) leaves them.
  int64_t row_multiple = 1;
  // Chunks of at most this many row blocks take the whole of k in one call per row block. A kernel
  // whose sums stay in registers over any range of k (AMX: four accumulator tiles) then saves
  // their round trip through acc at every k block (a tile store and load per 256 k), and a pair
  // read by so few row blocks gains little from a block kept in L1 for them. Longer chunks, and
  // every chunk of the f32 kernels, take k blocks: each block's weights stay in L1 while every
  // row block passes over them, and only the rows come from L2. The amx kernel takes 2. On a
  // 2-core Sapphire-Rapids-class Xeon (Qwen3-30B-A3B, docs/perf.md): whole-k chunks of one row
  // block took 13-16% less time than 256-k blocks at 1 to 256 tokens; every chunk in 256-k blocks
  // took 68.2-68.8 ms at 1024 tokens (two or three row blocks an expert) against 62.1-62.5 with the
  // whole of k everywhere; this split against the whole of k everywhere (both with chunks of at
  // most 256 rows), 57.3-57.7 against 60.6-61.7 ms at 1024 tokens, 75.2-76.3 against 82.7-83.0 at
  // 2048, 131.4-132.7 against 150.1-151.2 at 4096, 487.7-489.1 against 558.6-562.9 at 16384 (3
  // instead of 2: level to 2% slower).
  int64_t whole_k_row_blocks = 0;
  // Chunks of at least this many row blocks take the whole of k as well (0: none). The avx512bf16
  // kernel takes 3: its sums then stay in registers over all of k, the later row blocks read the
  // pair from L2 as their dot products need it, and the next pair streams in meanwhile; in chunks
  // of one or two row blocks, paced by memory, it keeps the k blocks. On AMD's Zen 4
  // (Qwen3-30B-A3B, docs/perf.md), call by call against 256-k blocks in every chunk: 0.91-0.96 of
  // the time at 1024 tokens, 0.94-0.95 at 4096, 0.96-1.01 at 256 (the same kernel on both sides:
  // 0.97-1.02); whole k in every chunk lost up to 4% at 256 tokens.
  int64_t whole_k_from_row_blocks = 0;
  // run() brings TileArgs::ahead into L2 a few lines per k step, so the weights keep streaming from
  // memory while it computes; otherwise the driver asks for those lines in one burst before the
  // call, which the amx kernel's long k loops then wait behind (a standalone loop streamed 10-25%
  // faster spread: 25.7 against 22 GB/s at 64 rows of k = 2048).
  bool spreads_prefetch = false;
  // k blocks ahead that the driver prefetches into L2 (MOE_CPU_PREFETCH overrides both): in a short
  // chunk (one row block, or up to whole_k_row_blocks, whose block is the whole of k: then the next
  // pair), and in a longer one, in k blocks. The amx kernel takes 1 and 2, spread over its steps (2
  // against 1 in the long chunks: 133.8 against 143.6 ms at 4096 tokens and 247.2 against 270.5 at
  // 8192 in one round, level in a noisier second; a second pair ahead of the whole-k chunks took
  // 15-17% more time at 1024); avx512 1 in decode only and avx512bf16 1 in every chunk, both spread
  // too (fma_tile.h's kSpreadsPrefetch, bf16_dot_tile.h); the others 0, which the driver would
  // otherwise ask for in one burst before each call: on an AVX-512 Xeon without AMX the hardware
  // prefetcher (with the kernels' own prefetch a few steps ahead) streamed faster than such bursts
  // (call by call: 21-29% less time at 1 to 64 tokens of Qwen3-30B-A3B, 7-13% at 256, equal from
  // 1024 on; docs/perf.md).
  int64_t prefetch_blocks = 0;
  int64_t prefill_prefetch_blocks = 0;
  void (*run)(const TileArgs& args) = nullptr;
  // Called once per thread around a run of calls (AMX loads and releases its tile configuration).
  void (*thread_begin)() = nullptr;
  void (*thread_end)() = nullptr;
};

// The epilogue of one panel pair over the rows of a chunk (epilogue_rows.h), after its last k
// block:
//   silu_rows:  out[ids[r], c] = silu(acc[r, c] + bias[c]) * (acc[r, 16 + c] + bias[16 + c])
//   scale_rows: out[ids[r], c] = (acc[r, c] + bias[c]) * scale[ids[r]]
// each computed in f32 and, for a bf16 out_dtype, rounded once to bf16.
struct EpilogueArgs {
  const float* acc = nullptr;  // [rows, 32]
  int64_t rows = 0;
  const int32_t* ids = nullptr;  // [rows]: the output row of each
  const float* bias = nullptr;   // [32] (silu_rows: 16 gate, then 16 up) or null
  const float* scale = nullptr;  // scale_rows: [ids] or null
  int64_t width = 0;             // outputs per row: 1..16 (silu_rows) or 1..32 (scale_rows)
  void* out = nullptr;           // output row i at out + i * out_stride elements
  int64_t out_stride = 0;
  DType out_dtype = DType::kF32;  // f32 or bf16
  // scale_rows: write whole rows (width 32: 128 bytes of f32, 64 of bf16) with non-temporal
  // stores where a row is 16-byte aligned, for an output far larger than the caches that is read
  // once, later (cache3 of a prefill batch). Ordinary stores would first read every line they
  // write from memory; scattered over cache3's rows, those reads cost gemm2 on the amx path as
  // much time as its arithmetic.
  bool stream = false;
};
using EpilogueRows = void (*)(const EpilogueArgs& args);

// What one path runs for one weight dtype. A block of rows always goes through the same kernel
// whatever its size, and each row's result depends only on that row: an output does not change
// with the batch it is part of (nor with the replicas its expert is split over).
struct ExpertKernels {
  TileKernel tile;
  // Multiply-adds this path can do in the time it streams one byte of weights from memory (order
  // of magnitude): how the work split weighs a row of compute against a panel of bytes.
  double flops_per_byte = 10;
  // The epilogues compiled for this path's instruction set; null: the driver's own build of
  // epilogue_rows.h. Activations other than SiLU go through gated_activation().
  EpilogueRows silu_rows = nullptr;
  EpilogueRows scale_rows = nullptr;
};

// The kernels of a supported, resolved path (never kAuto) for f32, f16 or bf16 weights.
ExpertKernels expert_kernels(CpuIsa isa, DType weight_dtype);

// Per-path kernel sets, for expert_kernels and the tests of each variant.
ExpertKernels plain_expert_kernels(DType weight_dtype);
ExpertKernels avx2_expert_kernels(DType weight_dtype);
ExpertKernels avx512_expert_kernels(DType weight_dtype);
ExpertKernels avx512bf16_expert_kernels();  // bf16 weights
ExpertKernels amx_expert_kernels();         // bf16 weights

// The path's peak: runs its fused multiply-add (or dot-product, or tile) instruction with
// independent accumulators and no memory traffic for about `iterations` inner steps on the calling
// thread; returns the floating-point operations done (2 per multiply-add).
using PeakLoop = double (*)(int64_t iterations);
PeakLoop peak_loop(CpuIsa isa, DType weight_dtype);
double plain_peak_loop(int64_t iterations);
double avx2_peak_loop(int64_t iterations);
double avx512_peak_loop(int64_t iterations);
double avx512bf16_peak_loop(int64_t iterations);
double amx_peak_loop(int64_t iterations);

}  // namespace moe::cpu
