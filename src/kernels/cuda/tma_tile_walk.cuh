// The order in which the persistent thread blocks of the warp-specialized grouped GEMM
// (grouped_gemm_tma.cu) take their (aligned block, column tile) tiles: block-major for the static
// walks, column tile first within an expert's run of blocks for the dynamic one, and which blocks
// are tails that the block before them takes along (GroupedGemmArgs::merge_tails).
#pragma once

#include <cstdint>

#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/hopper_primitives.cuh"

namespace moe::cuda {

#ifdef MOE_HAS_WGMMA
// One tile of a thread block's walk. rows: whether `block` holds rows of a local expert (in a
// cluster it may not while a partner's does; then the block only keeps step with the cluster).
struct TileWork {
  int64_t block;
  int32_t expert;
  bool rows;
  int64_t first_column;
  bool tail = false;  // merge_tails: block + 1 is a tail this tile multiplies too
};

enum class TileKind { kWork, kSkip, kEnd };

// The tiles of the walk. Static walks go block-major: tile q is column tile q % column_tiles of
// block group q / column_tiles. A cluster of kCluster thread blocks takes block groups [kCluster g,
// kCluster (g + 1)); its thread block r works on block kCluster g + r.
// kColumnsFirst (the dynamic walk, whose tiles start in order) orders the tiles of each run of
// blocks column tile first instead: all blocks of the run on column tile 0, then on column tile 1,
// and so on, so the thread blocks that read one weight tile start it within a few tiles of each
// other and all but the first find it in L2. A run is an expert's whole segment of blocks when it
// has at most kRunBlocks of them, else the segment's share of a kWindowBlocks-aligned window. Runs
// partition the blocks, so tiles [first block * column_tiles, end block * column_tiles) are still
// exactly the run's tiles and the walk ends at the same tile.
constexpr int kWindowBlocks = 16;
constexpr int kRunBlocks = kWindowBlocks - 1;  // a run one warp can see both ends of

template <int kBlockM, int kCluster, bool kColumnsFirst = false>
struct TileWalk {
  static_assert(!kColumnsFirst || kCluster == 1, "clusters take consecutive blocks");
  const GroupedGemmArgs& a;
  int64_t num_padded, column_tiles, columns_per_tile, num_blocks;

  __device__ TileWalk(const GroupedGemmArgs& args, int64_t columns_per_tile_)
      : a(args),
        num_padded(*args.num_pairs_post_padded),
        column_tiles((args.out_columns + columns_per_tile_ - 1) / columns_per_tile_),
        columns_per_tile(columns_per_tile_),
        num_blocks((num_padded + kBlockM - 1) / kBlockM) {
    if (num_blocks > args.max_blocks) num_blocks = args.max_blocks;
  }

  // A local expert's id, or -1: the block is past the end or serves another rank's expert.
  __device__ int32_t local_expert(int64_t block) const {
    if (block >= a.max_blocks || block * kBlockM >= num_padded) return -1;
    const int32_t expert = a.expert_ids[block];
    return expert >= 0 && expert < a.num_local_experts ? expert : -1;
  }

  // merge_tails: whether `block` is a tail, its expert's last block after a full one, with at most
  // kTmaTailRows rows (a block holds its pairs first, then padding). The block before must be
  // seen to be full, not only to serve the same local expert: an expert map may send two experts
  // to one local expert, whose blocks then follow each other with a short one between, and the
  // tile of a block of at most 64 rows leaves its upper warpgroup (and so half a tail's columns)
  // idle. The four words are asked for together, so that the check waits on one load's latency.
  __device__ bool is_tail(int64_t block) const {
    if (kBlockM != 128 || !a.merge_tails || block < 1 || block >= num_blocks) return false;
    const int32_t expert = a.expert_ids[block];
    const int32_t expert_before = a.expert_ids[block - 1];
    const int32_t last_row_before = a.sorted_pair_ids[block * kBlockM - 1];
    const int32_t first_row_past_a_tail = a.sorted_pair_ids[block * kBlockM + kTmaTailRows];
    const auto is_pair = [&](int32_t row) { return row >= 0 && row < a.num_pairs; };
    return expert >= 0 && expert < a.num_local_experts && expert_before == expert &&
           is_pair(last_row_before) && !is_pair(first_row_past_a_tail);
  }

  // A tail is no tile of its own; the block before it takes its rows.
  __device__ TileKind with_tail(TileWork& work) const {
    if (is_tail(work.block)) return TileKind::kSkip;
    work.tail = is_tail(work.block + 1);
    return TileKind::kWork;
  }

  // kEnd: `tile` and every later one lie past num_pairs_post_padded. kSkip: no block of its group
  // has rows of a local expert. Otherwise `work` describes this thread block's part.
  // kColumnsFirst: every lane of the warp must call it together (it votes).
  __device__ TileKind decode(int64_t tile, TileWork& work) const {
    if constexpr (kColumnsFirst) {
      return decode_columns_first(tile, work);
    } else {
      const int64_t first_block = tile / column_tiles * kCluster;
      if (first_block >= a.max_blocks || first_block * kBlockM >= num_padded) {
        return TileKind::kEnd;
      }
      const int64_t block = first_block + (kCluster > 1 ? cluster_rank() : 0);
      const int32_t expert = local_expert(block);
      bool any_rows = expert >= 0;
#pragma unroll
      for (int r = 0; r < kCluster && !any_rows; ++r) {
        any_rows = local_expert(first_block + r) >= 0;
      }
      if (!any_rows) return TileKind::kSkip;
      work = TileWork{block, expert, expert >= 0, (tile % column_tiles) * columns_per_tile};
      return TileKind::kWork;
    }
  }

  __device__ TileKind decode_columns_first(int64_t tile, TileWork& work) const {
    const int64_t some_block = tile / column_tiles;  // a block of the tile's run
    if (some_block >= num_blocks) return TileKind::kEnd;
    // Lane l looks at block some_block - 16 + l: bit 16 of `same` is some_block itself.
    const int32_t id = a.expert_ids[some_block];
    const int64_t seen = some_block - 16 + threadIdx.x % 32;
    const uint32_t same =
        __ballot_sync(0xffffffffu, seen >= 0 && seen < num_blocks && a.expert_ids[seen] == id);
    const uint32_t other_below = ~same & 0xffffu;              // bits 0-15
    const uint32_t other_above = ~same & ~uint32_t{0x1ffffu};  // bits 17-31
    const int64_t segment_begin =
        some_block - 16 + (other_below != 0 ? 32 - __clz(static_cast<int>(other_below)) : 0);
    const int64_t segment_end =
        some_block - 16 + (other_above != 0 ? __ffs(static_cast<int>(other_above)) - 1 : 32);
    int64_t begin = segment_begin, end = segment_end;
    if (other_below == 0 || other_above == 0 || end - begin > kRunBlocks) {
      const int64_t window = some_block / kWindowBlocks * kWindowBlocks;
      if (begin < window) begin = window;
      if (end > window + kWindowBlocks) end = window + kWindowBlocks;
    }
    const int64_t within = tile - begin * column_tiles;
    const int64_t block = begin + within % (end - begin);
    const int32_t expert = id >= 0 && id < a.num_local_experts ? id : -1;
    if (expert < 0) return TileKind::kSkip;
    work = TileWork{block, expert, true, within / (end - begin) * columns_per_tile};
    return with_tail(work);
  }
};

// Calls body(TileWork) for this thread block's tiles of the static walk: tiles blockIdx.x /
// kCluster, then a grid's worth of tiles further each time. Both sides (and every thread block of
// a cluster) run it and so see the same sequence.
template <int kBlockM, int kCluster, typename Body>
__device__ __forceinline__ void for_each_tile(const TileWalk<kBlockM, kCluster, false>& walk,
                                              Body&& body) {
  for (int64_t tile = blockIdx.x / kCluster;; tile += gridDim.x / kCluster) {
    TileWork work;
    const TileKind kind = walk.decode(tile, work);
    if (kind == TileKind::kEnd) return;
    if (kind == TileKind::kWork) body(work);
  }
}
#endif

}  // namespace moe::cuda
