// The two grouped GEMMs of the experts on the GPU, bf16 in, f32 accumulation, bf16 out.
//
//   gemm1  cache2[p] = silu(x · w13[e][:I]^T) * (x · w13[e][I:]^T),  x = hidden[p / k]
//   gemm2  cache3[p] = topk_weights[p] * (cache2[p] · w2[e]^T)
//
// Both walk the blocks of align_block_size: block b holds up to block_m pair ids of the one
// expert expert_ids[b] (-1: not local, skipped). Input rows are read in place through the pair
// id; nothing is gathered into a per-expert copy. The exceptions are cache2 of the 128-row tma
// plans, which gemm1 writes in block order so that gemm2 loads a block's rows as one TMA box (the
// *_in_block_order flags below), and gemm1's input of tma_dynamic/128 at large I, copied into
// block order for the same reason (gather_block_rows.h). Blocks past num_pairs_post_padded exit at
// once, so the grid is sized once from the upper bound and no host synchronization is needed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

// GroupedGemmArgs::tile_counter of kTmaDynamic: the next tile to take, and how many thread blocks
// have taken their last.
inline constexpr int kNextTile = 0;
inline constexpr int kBlocksDone = 1;
inline constexpr int kTileCounterWords = 2;

struct GroupedGemmArgs {
  const void* input = nullptr;  // bf16 rows: hidden [M, K] (gemm1) or cache2 [P, K] (gemm2)
  int64_t row_divisor = 1;      // input row of pair p = p / row_divisor (k for gemm1, 1 for gemm2)
  const void* weights = nullptr;  // bf16 [E_local, weight_rows, K]
  int64_t weight_rows = 0;        // 2I (gemm1) or H (gemm2)
  int64_t num_local_experts = 0;
  int64_t k_dim = 0;                    // K: H (gemm1) or I (gemm2)
  int64_t out_columns = 0;              // I (gemm1) or H (gemm2)
  void* out = nullptr;                  // bf16 [P, out_columns], rows in pair order
  const float* topk_weights = nullptr;  // [P]: gemm2 scales row p by it; null = no scaling

  const int32_t* sorted_pair_ids = nullptr;
  const int32_t* expert_ids = nullptr;
  const int32_t* num_pairs_post_padded = nullptr;
  // Tiny batches (stream kernel, block_m 1) skip align: block b is pair b, its expert read from
  // topk_ids (ids outside [0, num_experts) and non-local experts are skipped).
  const int32_t* tiny_topk_ids = nullptr;
  const int32_t* expert_map = nullptr;  // [num_experts] or null, for tiny_topk_ids only
  int64_t num_experts = 0;
  int64_t num_pairs = 0;   // P = M * k: pair ids >= P are padding
  int64_t block_m = 0;     // rows per aligned block
  int64_t max_blocks = 0;  // upper bound of num_pairs_post_padded / block_m
  // The persistent (tma) grids take at most this many multiprocessors, leaving the others to
  // kernels of another stream (two-batch overlap); 0 = all. The other kernels launch one block
  // per tile, which hands multiprocessors over as tiles finish.
  int max_multiprocessors = 0;
  // kTmaDynamic: kTileCounterWords device ints, zero before the first launch; every launch leaves
  // them zero again (the last thread block to finish resets them), so none needs a memset first.
  int32_t* tile_counter = nullptr;
  // tma kernels only. out_in_block_order: row r of block b goes to out row b * block_m + r (padding
  // rows are not written) instead of its pair's row; out then has max_blocks * block_m rows.
  // input_in_block_order: the input is such an output, and each stage's rows of a block are one
  // TMA box instead of a cp.async gather.
  bool out_in_block_order = false;
  bool input_in_block_order = false;
  // tma kernels only: the kernel before this one on the stream is a tma kernel too, whose output
  // is this one's input (gemm2 after gemm1). This one is then launched to start as the other's
  // thread blocks leave (programmatic dependent launch): each thread block asks for its first
  // stages' weights at once and waits for the other kernel to end (with block_done, for the
  // block's rows only) before reading its rows. With tma_dynamic, tile_counter must not be the
  // other kernel's, which may still be taking tiles.
  bool after_previous_grid = false;
  // tma kernels only: gemm2 reads a block's rows as soon as gemm1 has written them, instead of
  // after all of gemm1, so that the multiprocessors gemm1's last tiles leave idle run gemm2's
  // tiles of finished blocks (rows in block order, read by TMA, are ordered for the async proxy on
  // both sides). gemm2 must write nothing gemm1 may still read. block_done holds
  // max_blocks + 1 device ints, zero before gemm1. gemm1 (block_done_target 0): each consumer warp
  // adds one to block_done[b] once its part of a tile of block b is stored (after its next
  // tile's mainloop). gemm2 (launched after_previous_grid, block_done_target = gemm1's tiles per
  // block * kTmaConsumerWarps): waits for block_done[b] >= block_done_target before it reads
  // block b's rows; its last thread block to finish sets block_done back to zero (word
  // max_blocks counts its finished thread blocks).
  int32_t* block_done = nullptr;
  int32_t block_done_target = 0;
  // tma_dynamic with block_m 128 (the other kernels ignore it): an expert's last block of at most
  // kTmaTailRows rows (a tail) is no tile of its own; the tile of the block before it (same
  // expert, so full) also multiplies the tail's rows, as the B operand of m64n32 wgmmas with the
  // stage's weight rows as A, so the tail's weights are not streamed a second time. Both GEMMs of
  // a layer must agree on it (gemm2 waiting per block counts on gemm1's merged tiles).
  bool merge_tails = false;
  // tma kernels only, for measurements: thread block b writes words [kTimelineWords * b, + 3):
  // %globaltimer (ns) at its start and at the end of its walk (after its last tile's stores were
  // issued), and its multiprocessor's id. Room for kMaxTimelineBlocks thread blocks; null = none.
  uint64_t* timeline = nullptr;
};

inline constexpr int kTimelineWords = 3;
inline constexpr int kMaxTimelineBlocks = 1024;

// Consumer warps per thread block of the tma kernels: the arrivals gemm1 makes per tile on
// GroupedGemmArgs::block_done.
inline constexpr int kTmaConsumerWarps = 8;
// Output columns per tile of a tma kernel's gemm1 (gated: half of its 256 weight rows).
inline constexpr int64_t kTmaGatedColumnsPerTile = 128;
// Rows of a tail GroupedGemmArgs::merge_tails merges into the block before it.
inline constexpr int kTmaTailRows = 32;

// Which kernel runs a grouped GEMM.
enum class GemmKernel : uint8_t {
  kStream,  // decode: few rows per expert; each expert's weights streamed once from HBM
  kMma,     // prefill: tensor-core tiles (mma.sync bf16), multi-stage cp.async pipeline
  kWgmma,   // prefill on Hopper (sm_90a): warpgroup MMA from swizzled shared-memory tiles
  kTma,     // prefill on Hopper: warp-specialized, TMA-fed weights, persistent grid
  // kTma whose consumers retire each stage's MMAs before the next stage's, freeing it a stage
  // earlier: one more stage loading at a time, no MMA overlap across stages
  kTmaEager,
  // kTma in clusters of two thread blocks on consecutive blocks that keep step, so the blocks of
  // one expert read each weight tile from DRAM once between them
  kTmaPair,
  // kTma whose thread blocks take tiles in order from a counter as they finish the last, so those
  // that share a weight tile start it together however far apart their earlier tiles took them
  kTmaDynamic,
  // Not a grouped GEMM: a tiny batch's whole call (gemm1, gemm2 and the sum) in one launch
  // (decode_experts.h)
  kDecode,
};

// The warp-specialized Hopper kernels: kTma and its variants.
constexpr bool is_tma_kernel(GemmKernel kernel) {
  return kernel == GemmKernel::kTma || kernel == GemmKernel::kTmaEager ||
         kernel == GemmKernel::kTmaPair || kernel == GemmKernel::kTmaDynamic;
}

// Rows per block each kernel accepts: the stream kernel any block_m up to kMaxStreamRows, the
// tensor-core kernel exactly one of its tile heights.
inline constexpr int64_t kMaxStreamRows = 16;
bool mma_supports_block_m(int64_t block_m);  // 16, 32, 64 or 128

// Whether the current device runs the wgmma kernel (compute capability 9.0, sm_90a code); its
// block_m is 64 (one warpgroup) or 128 (two).
bool wgmma_available();
bool wgmma_supports_block_m(int64_t block_m);  // 64 or 128
// The tma kernels' (kTma, kTmaEager, kTmaPair, kTmaDynamic): 64 or 128, as wgmma's, or 16.
bool tma_supports_block_m(int64_t block_m);

// The tensor-core kernels need 16-byte aligned rows: K % 8 == 0 and aligned base pointers.
bool mma_supports(const GroupedGemmArgs& args);

// gated = true: gemm1 with SiLU-and-multiply fused into the epilogue (weight_rows = 2 * columns).
void grouped_gemm(GemmKernel kernel, bool gated, const GroupedGemmArgs& args, cudaStream_t stream);

}  // namespace moe::cuda
