// The prefill-size grouped GEMM on Hopper, warp-specialized (sm_90a): plan kernel "tma".
//
// A persistent grid, one thread block per multiprocessor, walks the (aligned block, column tile)
// tiles in block-major order, so the column tiles of one block (same input rows) and the blocks
// of one expert (same weight tiles) run side by side and share L2. Each thread block has three
// warpgroups around a ring of shared-memory stages (64 of K each):
//   producer   one thread loads the stage's 256 weight rows by TMA (cp.async.bulk.tensor, 128-byte
//              swizzle); all 128 threads gather the block's input rows (hidden[p / k] or cache2[p],
//              by pair id) with cp.async, and the stage's `full` mbarrier completes when both
//              have landed. With input_in_block_order (gemm2 of the 128-row plans, whose gemm1
//              wrote cache2 in block order; gemm1 of tma_dynamic/128 at large I, whose rows were
//              copied into block order first) the block's rows are one more TMA box instead: on
//              the H200 the gather cost more per byte than TMA (docs/cuda.md, "Rows in block
//              order").
//              The producer runs up to kStages stages ahead, across tiles.
//   consumers  two warpgroups run wgmma on the stage, keep one MMA group in flight while the next
//              stage lands, and free a stage (its `empty` mbarrier) once the group that read it
//              retired. After the last stage of a tile they apply the fused epilogue (gemm1:
//              SiLU(gate) * up; gemm2: times the router weight) and store bf16 rows in pair order
//              in whole 16-byte chunks (accumulator_chunks.cuh), while the producer already fills
//              the next tile's stages.
// Plan kernel "tma_eager" is the same but for the consumers' stage release: they retire each
// stage's MMAs (wgmma.wait_group 0) before waiting for the next stage and free it at once, so
// the consumers hold one stage instead of two and one more stage is loading at any time, at the
// cost of the MMA overlap across stages. On the H200 both tma plans took about 1.1 us per stage at
// long K whatever the stage's work (64 or 128 rows: 512 or 1024 tensor-core clocks).
// Plan kernel "tma_pair" runs the tma kernel in clusters of two thread blocks that take
// consecutive aligned blocks and the same column tile, and hold each other to the same stage.
// Nsight Compute showed why a stage takes that long at large M: L2 throughput at 83-95% and, at
// DeepSeek-V3's 16384 tokens, DRAM at 80% carrying about four times the distinct weight bytes: the
// thread blocks that read one weight tile for the blocks of an expert drift apart by more than L2
// holds, so each reads it from DRAM again. In a cluster a stage is refilled only once the consumers
// of every thread block of it freed it (each consumer warp arrives on every `empty` barrier of the
// cluster), so the blocks of one expert ask for each weight box within a stage of each other and
// all but the first find it in L2. (Multicasting the boxes instead, each thread block loading a
// share for all, measured slower on the H200 than this, and so were clusters of four.) A thread
// block whose block has no rows (past the end, or another rank's expert) walks its partner's stages
// without loading or computing anything. Plan kernel "tma_dynamic" keeps the tiles' order in time
// instead: rather than each thread block taking every grid's-worth tile from its first, the
// producers take the next tile from a counter (one atomicAdd per tile; the launch leaves it zero)
// when they start one, and pass it to their consumers with the stage, and its walk orders each
// expert's blocks column tile first (tma_tile_walk.cuh), so the thread blocks that share a weight
// tile start it together however far apart their earlier tiles took them. On the H200 it is the
// fastest plan at most of DeepSeek-V3's sizes from 16 tokens on (0.5-1.5% ahead of tma_pair/128 at
// 4096 and 16384), loses at Qwen3-30B-A3B's. Tiles: block_m 128: each consumer warpgroup takes 64
// of the rows and all 256 weight rows (m64n256k16); block_m 64: both take the 64 rows and 128 of
// the weight rows (m64n128k16); block_m 16 (short blocks, for decode sizes) as 64, with a stage of
// 16 rows (TmaTile). gemm1's weight rows are, per consumer warpgroup, gate rows then the matching
// up rows, so each thread holds gate and up of the same output element.
//
// Tested by tests/cuda/fused_experts_test.cc (plans tma, tma_eager, tma_pair and tma_dynamic at
// 16, 64 and 128) against the reference.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/accumulator_chunks.cuh"
#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/global_timer.cuh"
#include "kernels/cuda/grouped_gemm_launch.h"
#include "kernels/cuda/hopper_primitives.cuh"
#include "kernels/cuda/tile_rows.cuh"
#include "kernels/cuda/tma_tile_walk.cuh"
#include "kernels/cuda/wgmma.cuh"
#include "moe/error.h"

namespace moe::cuda {
namespace {

constexpr int kTileK = kSwizzledTileK;
constexpr int kRowBytes = kSwizzledRowBytes;
constexpr int kTileN = 256;  // weight rows per tile (gemm1: 128 output columns, gemm2: 256)
// The host counts gemm1's tiles per block from this (GroupedGemmArgs::block_done_target).
static_assert(kTileN / 2 == kTmaGatedColumnsPerTile, "gemm1's output columns per tile");
constexpr int kBoxRows = 64;  // weight rows per TMA box: 8 KiB, four per stage
constexpr int kProducerThreads = 128;

// kMerges: the kernel takes GroupedGemmArgs::merge_tails (tma_dynamic/128).
template <int kBlockM, bool kMerges = false>
struct TmaTile {
  static constexpr int kWarpGroupRows = 64;
  // block_m 16: a short block for decode sizes, where an expert sees a few pairs. Its wgmma
  // still reads 64 rows of A: the block's 16, then 48 rows' worth of the stage's weight tile right
  // behind them, whose products land in accumulator rows the epilogue never stores. The stage
  // keeps 2 KiB of rows instead of 8, so six stages of weights fit where five did (five measured
  // the same on the H200).
  static_assert(kBlockM == 16 || kBlockM == kWarpGroupRows || kBlockM == 2 * kWarpGroupRows,
                "a short block, or one or two 64-row wgmma tiles");
  static constexpr int kConsumerWarps = kTmaConsumerWarps;  // two warpgroups
  static constexpr int kThreads = kProducerThreads + kConsumerWarps * 32;
  // The producer needs few registers; the consumers hold up to 128 f32 accumulators each. The
  // launch gives every thread 168 (65536 / 384, rounded down to 8); 128 * 64 + 256 * 216 fits too.
  // Neither side spills at 56/224 to 96/192; on the H200 64/216 was the fastest (DeepSeek-V3 at
  // 16384 tokens 3% faster than 56/224, 72/208 and 96/192 in between; docs/cuda.md).
  static constexpr int kProducerRegisters = 64;
  static constexpr int kConsumerRegisters = 216;
  // block_m 128: the warpgroups split the rows; 64 and 16: they split the weight rows.
  static constexpr int kSplitN = kBlockM == 128 ? 1 : 2;
  static constexpr int kWarpGroupN = kTileN / kSplitN;  // weight rows per consumer warpgroup
  static constexpr int kStages = kBlockM == 128 ? 4 : (kBlockM == 64 ? 5 : 6);
  static constexpr int kABytes = kBlockM * kRowBytes;
  static constexpr int kBBytes = kTileN * kRowBytes;
  // The rows of a merged tail, behind the weights.
  static constexpr bool kMergesTails = kMerges;
  static_assert(!kMergesTails || kBlockM == 128, "tails merge into 128-row blocks");
  static constexpr int kTailBytes = kMergesTails ? kTmaTailRows * kRowBytes : 0;
  static constexpr int kTailRowsPerProducer = kTmaTailRows * 8 / kProducerThreads;
  // A multiple of 1024: tiles stay aligned.
  static constexpr int kStageBytes = kABytes + kBBytes + kTailBytes;
  static_assert(kStageBytes >= kWarpGroupRows * kRowBytes, "a wgmma's A stays in its stage");
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageBytes + 1024;  // + alignment
  static constexpr int kRowsPerProducer = kBlockM * 8 / kProducerThreads;  // 16-byte copies each
  static_assert(kStageBytes % 1024 == 0, "the 128-byte swizzle repeats every 1024 bytes");
  // Referenced here too, since the sm_80 pass compiles the kernel without its body.
  static_assert(kWarpGroupN * kSplitN == kTileN &&
                    kRowsPerProducer * kProducerThreads == kBlockM * 8 &&
                    kTailRowsPerProducer * kProducerThreads == kTmaTailRows * 8,
                "whole weight and input rows per thread");
  // setmaxnreg moves registers within what the launch gave the thread block: a consumer's
  // increase waits until the producers' decrease has freed enough, forever if it never does (a
  // producer at 64 registers beside consumers at 224 hung every tma kernel on the H200).
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(kProducerThreads * kProducerRegisters + kConsumerWarps * 32 * kConsumerRegisters <=
                    kThreads * kLaunchRegisters,
                "both sides fit in the registers of the launch");
};

// The ring position shared by both sides: stage index and the parity of its current use.
template <int kStages>
struct Ring {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

#ifdef MOE_HAS_WGMMA
// Synchronizes the producer warps only (named barrier 1; 0 is __syncthreads').
__device__ __forceinline__ void producer_sync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kProducerThreads) : "memory");
}
#endif

// The tile of a kernel: only tma_dynamic/128 merges tails (fused_experts.cc, merges_tails, says
// why), so only it spends stage bytes and code on them.
template <int kBlockM, bool kDynamic>
using KernelTile = TmaTile<kBlockM, kBlockM == 128 && kDynamic>;

// kEager: plan kernel "tma_eager"; kCluster 2: "tma_pair"; kDynamic: "tma_dynamic" (above).
template <int kBlockM, bool kGated, bool kEager, int kCluster, bool kDynamic>
__global__ void __launch_bounds__(TmaTile<kBlockM>::kThreads, 1)
    tma_kernel(const __grid_constant__ CUtensorMap weight_map,
               const __grid_constant__ CUtensorMap input_map, GroupedGemmArgs a) {
#ifdef MOE_HAS_WGMMA
  using Tile = KernelTile<kBlockM, kDynamic>;
  // Whether `work`'s tile also takes the tail after it; a constant false where the kernel merges
  // none, so that the tail's code is compiled out there.
  const auto takes_tail = [](const TileWork& work) { return Tile::kMergesTails && work.tail; };
  static_assert(!kEager || kCluster == 1, "clusters release stages as tma does");
  static_assert(!kDynamic || kCluster == 1,
                "the thread blocks of a cluster would each take a tile");
  constexpr int kStages = Tile::kStages;
  constexpr bool kSplitRows = Tile::kSplitN == 1;  // block_m 128: each warpgroup takes 64 rows
  constexpr int64_t kColumnsPerTile = kGated ? kTileN / 2 : kTileN;
  extern __shared__ unsigned char shared_raw[];
  __shared__ __align__(8) uint64_t full[kStages];   // stage landed: A copies and B bytes
  __shared__ __align__(8) uint64_t empty[kStages];  // stage read by every consumer warp (of all)
  // kDynamic: the tile whose first stage a stage holds, -1 once the walk ended; and the tile the
  // producer's thread 0 took last, for the other producer threads.
  __shared__ int32_t stage_tile[kStages];
  __shared__ int32_t taken_tile;
  __shared__ bool block_rows_ready;  // block_done: the producer's thread 0 found the block done
  // tma_dynamic, block_m 128: whether the tile whose first stage a stage holds has no rows past
  // its first 64.
  __shared__ bool stage_upper_rows_empty[kStages];
  // TMA's swizzle and the wgmma descriptors both assume 1024-byte aligned tiles.
  const uint32_t base = (shared_address(shared_raw) + 1023) & ~1023u;
  const uint32_t full_base = shared_address(full), empty_base = shared_address(empty);
  auto full_barrier = [&](int stage) { return full_base + stage * 8; };
  auto empty_barrier = [&](int stage) { return empty_base + stage * 8; };

  if (threadIdx.x == 0 && a.timeline != nullptr) {
    a.timeline[kTimelineWords * blockIdx.x] = global_timer_ns();
    a.timeline[kTimelineWords * blockIdx.x + 2] = multiprocessor_id();
  }
  if (threadIdx.x == 0) {
    // A kernel launched after_previous_grid behind this one may start its thread blocks as this
    // one's leave multiprocessors (they wait for its end before reading what it wrote).
    allow_dependent_launch();
    for (int s = 0; s < kStages; ++s) {
      // Every producer thread's cp.async arrival, plus the arrival carrying the TMA bytes.
      barrier_init(full_barrier(s), kProducerThreads + 1);
      barrier_init(empty_barrier(s), Tile::kConsumerWarps * kCluster);
    }
    // The barriers are written through the generic proxy; TMA completes them through the async
    // proxy.
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_proxy_async_shared();
  }
  // Arrivals reach the other thread blocks' barriers, so all must have initialized theirs first
  // (and, at the end, none may exit while another can still reach it).
  if constexpr (kCluster > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  const int64_t K = a.k_dim, columns = a.out_columns;
  const int k_tiles = static_cast<int>((K + kTileK - 1) / kTileK);
  Ring<kStages> ring;
  const TileWalk<kBlockM, kCluster, kDynamic> walk(a, kColumnsPerTile);

  if (threadIdx.x < kProducerThreads) {
    // ---- Producer: weight boxes by TMA (thread 0), input rows by cp.async (all 128). ----
    shrink_registers<Tile::kProducerRegisters>();
    const int t = threadIdx.x;
    if (t == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&weight_map))
                   : "memory");
      if (a.input_in_block_order) {
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&input_map))
                     : "memory");
      }
    }
    const auto* input = static_cast<const __nv_bfloat16*>(a.input);
    bool previous_grid_done = false;  // after_previous_grid: this thread block has waited for it
    // Eight threads per row, one 16-byte chunk each: a warp copies four whole 128-byte rows.
    const int chunk = t % 8;
    auto produce = [&](const TileWork& work, int64_t tile) {
      if (!work.rows) {
        // Keep step: complete each stage with the arrivals it expects and no bytes.
        for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {
          barrier_wait(empty_barrier(ring.stage), ring.phase ^ 1);
          barrier_arrive(full_barrier(ring.stage));
          if (t == 0) barrier_arrive(full_barrier(ring.stage));
        }
        return;
      }
      int32_t source_row[Tile::kRowsPerProducer];  // input row of tile row t / 8 + 16 i, or -1
#pragma unroll
      for (int i = 0; i < Tile::kRowsPerProducer; ++i) {
        const int64_t pair = a.sorted_pair_ids[work.block * kBlockM + t / 8 + 16 * i];
        source_row[i] =
            pair >= 0 && pair < a.num_pairs ? static_cast<int32_t>(pair / a.row_divisor) : -1;
      }
      // A merged tail's rows: tail row t / 8 + 16 i comes from input row tail_source_row[i] (its
      // row in block order, or by pair id), -1 for none.
      int32_t tail_source_row[Tile::kTailRowsPerProducer];
#pragma unroll
      for (int i = 0; i < Tile::kTailRowsPerProducer; ++i) {
        tail_source_row[i] = -1;
        if (!takes_tail(work)) continue;
        const int64_t row = (work.block + 1) * kBlockM + t / 8 + 16 * i;
        const int64_t pair = a.sorted_pair_ids[row];
        if (pair >= 0 && pair < a.num_pairs) {
          tail_source_row[i] =
              static_cast<int32_t>(a.input_in_block_order ? row : pair / a.row_divisor);
        }
      }
      // Thread 0: the stage's expected bytes and its weight boxes; with a tile's first stage, the
      // tile for the consumers (tma_dynamic).
      auto request_weights = [&](int stage, int kt) {
        const uint32_t b_stage = base + stage * Tile::kStageBytes + Tile::kABytes;
        if (kDynamic && kt == 0) stage_tile[stage] = static_cast<int32_t>(tile);
        if constexpr (kSplitRows && kDynamic) {
          // Row 64 is this thread's source_row[4]; a block holds its expert's pairs first, then
          // padding, so that row tells whether the upper half holds any.
          static_assert(Tile::kWarpGroupRows == 16 * 4, "row 64 is thread 0's fifth row");
          if (kt == 0) stage_upper_rows_empty[stage] = source_row[4] < 0;
        }
        barrier_arrive_expect_bytes(full_barrier(stage),
                                    Tile::kBBytes + (a.input_in_block_order ? Tile::kABytes : 0));
#pragma unroll
        for (int j = 0; j < kTileN; j += kBoxRows) {
          // Tile row j of consumer warpgroup j / kWarpGroupN; gated: its first half are gate
          // rows (row = column), its second half the matching up rows (I + column).
          int64_t row = work.first_column + j;
          if constexpr (kGated) {
            constexpr int kHalf = Tile::kWarpGroupN / 2;
            const int within = j % Tile::kWarpGroupN;
            row = work.first_column + (j / Tile::kWarpGroupN) * kHalf + within % kHalf +
                  (within >= kHalf ? columns : 0);
          }
          load_weight_box(b_stage + j * kRowBytes, &weight_map, kt * kTileK, static_cast<int>(row),
                          work.expert, full_barrier(stage));
        }
      };
      // This thread's 16-byte chunks of step k0 of the rows from `sources` (tile row t / 8 + 16 i
      // from input row sources[i], zeros for -1) into the swizzled tile at `tile`.
      auto gather_rows = [&](uint32_t tile, const auto& sources, int k0) {
        constexpr int kRows = sizeof(sources) / sizeof(sources[0]);
        const int64_t k = k0 + chunk * 8;
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          const bool valid = sources[i] >= 0 && k < K;
          copy16_async(tile + swizzled_chunk_offset(t / 8 + 16 * i, chunk),
                       valid ? input + sources[i] * K + k : input, valid);
        }
      };
      // Every producer thread: the stage's input rows (one TMA box from thread 0, or the
      // gather) and its arrival.
      auto load_rows = [&](int stage, int kt) {
        const uint32_t a_stage = base + stage * Tile::kStageBytes;
        const int k0 = kt * kTileK;
        if (takes_tail(work))
          gather_rows(a_stage + Tile::kABytes + Tile::kBBytes, tail_source_row, k0);
        if (a.input_in_block_order) {
          if (t == 0) {
            load_input_box(a_stage, &input_map, k0, static_cast<int>(work.block * kBlockM),
                           full_barrier(stage));
          }
          if (takes_tail(work)) {
            barrier_arrive_after_copies(full_barrier(stage));
          } else {
            barrier_arrive(full_barrier(stage));
          }
          return;
        }
        gather_rows(a_stage, source_row, k0);
        barrier_arrive_after_copies(full_barrier(stage));
      };
      int kt = 0;
      // block_done: a block whose rows are all written flows on as any tile does, its rows and
      // weights stage by stage; only one not done yet breaks the ring to ask for its weights
      // ahead and wait.
      bool wait_block = false;
      if (a.block_done_target > 0) {
        producer_sync();  // every producer thread has read the previous tile's flag
        if (t == 0) {
          block_rows_ready = load_acquire(a.block_done + work.block) >= a.block_done_target &&
                             (!takes_tail(work) ||
                              load_acquire(a.block_done + work.block + 1) >= a.block_done_target);
          if (block_rows_ready && a.input_in_block_order) fence_proxy_async_global();
        }
        producer_sync();
        wait_block = !block_rows_ready;
      }
      if (wait_block ||
          (a.after_previous_grid && !previous_grid_done && a.block_done_target == 0)) {
        // The weights do not depend on the previous kernel, its output (the rows) does: ask for
        // the first stages' weight boxes while it may still run, then wait for it to finish.
        const int ahead = k_tiles < kStages ? k_tiles : kStages;
        Ring<kStages> first = ring;
        for (; kt < ahead; ++kt, first.advance()) {
          barrier_wait(empty_barrier(first.stage), first.phase ^ 1);
          if (t == 0) request_weights(first.stage, kt);
        }
        if (wait_block) {
          if (t == 0) {
            for (int64_t b = work.block; b <= work.block + (takes_tail(work) ? 1 : 0); ++b) {
              while (load_acquire(a.block_done + b) < a.block_done_target) __nanosleep(64);
            }
            if (a.input_in_block_order) fence_proxy_async_global();
          }
          producer_sync();
        } else {
          wait_for_previous_grid();
          previous_grid_done = true;
        }
        for (int i = 0; i < ahead; ++i, ring.advance()) load_rows(ring.stage, i);
      }
      for (; kt < k_tiles; ++kt, ring.advance()) {
        // First use of each stage: parity 1 names the phase before the barrier's first, which
        // counts as complete, so the wait returns at once.
        barrier_wait(empty_barrier(ring.stage), ring.phase ^ 1);
        if (t == 0) request_weights(ring.stage, kt);
        load_rows(ring.stage, kt);
      }
    };
    if constexpr (kDynamic) {
      // Tiles in the order thread blocks ask for them: the thread blocks that share a weight tile
      // (the blocks of one expert) start it close together, however far apart their earlier
      // tiles took them.
      for (;;) {
        producer_sync();  // every producer thread has read the tile taken before
        if (t == 0) taken_tile = atomicAdd(a.tile_counter + kNextTile, 1);
        producer_sync();
        const int64_t tile = taken_tile;
        TileWork work;
        const TileKind kind = walk.decode(tile, work);
        if (kind == TileKind::kEnd) break;
        if (kind == TileKind::kWork) produce(work, tile);
      }
      // The last thread block to take its final tile sets the counters back to zero for the
      // next launch, so no memset runs before each (the runner zeroes a fresh buffer once).
      if (t == 0 && atomicAdd(a.tile_counter + kBlocksDone, 1) == gridDim.x - 1) {
        // Every other thread block's last atomicAdd on the tile counter has returned.
        a.tile_counter[kNextTile] = 0;
        a.tile_counter[kBlocksDone] = 0;
      }
      // The end, for the consumers: a stage with no data and tile -1.
      barrier_wait(empty_barrier(ring.stage), ring.phase ^ 1);
      if (t == 0) stage_tile[ring.stage] = -1;
      barrier_arrive(full_barrier(ring.stage));
      if (t == 0) barrier_arrive(full_barrier(ring.stage));
    } else {
      for_each_tile(walk, [&](const TileWork& work) { produce(work, 0); });
    }
    if (a.block_done_target > 0 && t == 0 &&
        atomicAdd(a.block_done + a.max_blocks, 1) == gridDim.x - 1) {
      // Every thread block has passed its waits, so gemm1's last arrival has landed: the next
      // call's gemm1 counts from zero.
      for (int64_t b = 0; b <= a.max_blocks; ++b) a.block_done[b] = 0;
    }
    if constexpr (kCluster > 1) cluster_sync();
    return;
  }

  // ---- Consumers: wgmma on each landed stage, then the epilogue of the tile. ----
  grow_registers<Tile::kConsumerRegisters>();
  const int warp_group = (threadIdx.x - kProducerThreads) / 128;  // 0 or 1
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const uint32_t a_offset = kSplitRows ? warp_group * Tile::kWarpGroupRows * kRowBytes : 0;
  const uint32_t b_offset = kSplitRows ? 0 : warp_group * Tile::kWarpGroupN * kRowBytes;
  // Accumulator i of a thread: row 16 * warp + lane / 4 (+ 8 for i % 4 >= 2), column
  // 8 * (i / 4) + 2 * (lane % 4) + i % 2, within this warpgroup's 64 x kWarpGroupN tile.
  const int first_row = (kSplitRows ? warp_group * Tile::kWarpGroupRows : 0) + warp * 16 + lane / 4;
  constexpr int kWarpGroupColumns = kGated ? Tile::kWarpGroupN / 2 : Tile::kWarpGroupN;
  // After the quad's trade a lane stores chunk lane % 4 of each four (accumulator_chunks.cuh).
  const int64_t chunk_offset = (kSplitRows ? 0 : warp_group * kWarpGroupColumns) + (lane % 4) * 8;
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  float acc[Tile::kWarpGroupN / 2];

  // Frees a stage: one arrival per consumer warp, on the `empty` barrier of every thread block of
  // the cluster, so that no producer of it runs more than the ring ahead of any consumer.
  auto free_stage = [&](int stage) {
    if (lane != 0) return;
    if constexpr (kCluster > 1) {
#pragma unroll
      for (int rank = 0; rank < kCluster; ++rank) barrier_arrive_in(empty_barrier(stage), rank);
    } else {
      barrier_arrive(empty_barrier(stage));
    }
  };

  // A per-stage word the producer rewrites once the stage is freed. Only lane 0 arrives on
  // `empty`, so only lane 0's read is ordered before that rewrite; the other lanes take its value.
  auto read_by_lane0 = [&](const auto& word) {
    auto value = lane == 0 ? word : decltype(+word){};
    return __shfl_sync(0xffffffffu, value, 0);
  };

  // gemm1 under block_done: each warp counts its part of a tile as done on block_done once the
  // next tile's mainloop has run (or the walk has ended), when its stores have long landed. A
  // count right behind the stores (a fence there waits for them) gained less over gemm2's wait
  // for all of gemm1 on the H200 (docs/cuda.md, "gemm2 waiting per block").
  const bool counts_blocks = a.block_done != nullptr && a.block_done_target == 0;
  int64_t uncounted_block = -1;  // the block of this warp's last tile, not counted yet
  bool uncounted_tail = false;   // and whether that tile took the tail after it
  auto count_stored_block = [&] {
    if (uncounted_block < 0) return;
    // Rows in block order reach gemm2 by TMA: each lane orders its stores before the async
    // proxy's reads as well (gemm2's producer fences on its side after the acquire).
    if (a.out_in_block_order) fence_proxy_async_global();
    __syncwarp();
    if (lane == 0) {
      // A release: the warp's stores (ordered before lane 0's by __syncwarp) are visible to
      // whoever reads the new count with an acquire.
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(a.block_done + uncounted_block)
                   : "memory");
      if (Tile::kMergesTails && uncounted_tail) {
        asm volatile(
            "red.release.gpu.global.add.s32 [%0], 1;" ::"l"(a.block_done + uncounted_block + 1)
            : "memory");
      }
    }
    uncounted_block = -1;
  };

  // A merged tail's outputs. Accumulator i of tail_acc[h]: weight row 16 * warp + lane / 4 (+ 8 for
  // i % 4 >= 2) of A operand h, tail row 8 * (i / 4) + 2 * (lane % 4) + i % 2. Two-byte stores:
  // a tail holds at most a quarter of a block's rows.
  auto store_tail = [&](const TileWork& work, const float(&tail_acc)[2][16]) {
    const int64_t tail_block = work.block + 1;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = 8 * g + 2 * (lane % 4) + e;
        const int32_t p = a.sorted_pair_ids[tail_block * kBlockM + row];
        if (p < 0 || p >= a.num_pairs) continue;
        const float scale = (!kGated && a.topk_weights != nullptr) ? a.topk_weights[p] : 1.0f;
        const int64_t out_index = a.out_in_block_order ? tail_block * kBlockM + row : p;
        __nv_bfloat16* out_row = out + out_index * columns;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = g * 4 + half * 2 + e;
          const int weight_row = warp * 16 + lane / 4 + half * 8;
          if constexpr (kGated) {
            const int64_t column = work.first_column + warp_group * 64 + weight_row;
            if (column < columns) {
              out_row[column] = __float2bfloat16(silu(tail_acc[0][i]) * tail_acc[1][i]);
            }
          } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int64_t column = work.first_column + warp_group * 128 + h * 64 + weight_row;
              if (column < columns) out_row[column] = __float2bfloat16(tail_acc[h][i] * scale);
            }
          }
        }
      }
    }
  };

  auto consume = [&](const TileWork& work) {
    // tma_dynamic, block_m 128: the upper warpgroup of a block with at most 64 rows (often the last
    // block of an expert) has nothing to compute; it only takes and frees the stages, and the lower
    // one has the tensor cores to itself. The producer's flag arrives with the first stage, so the
    // wait for it is the one the mainloop would start with (decided here, before the mainloop: a
    // branch inside it makes ptxas serialize the wgmma instructions). On the H200 this took
    // tma_dynamic/128 1-4% faster but tma/128 and tma_pair/128 1-9% slower at 4096 and more
    // tokens (tma/128 level at 1024), so only the dynamic walk does it. There Qwen3-30B-A3B's
    // loads take as long as its MMAs (docs/cuda.md, "A stage taken apart"), so saving MMAs alone
    // cannot pay; why it costs was not found.
    bool idle = !work.rows;
    if (kSplitRows && kDynamic && !idle && k_tiles > 0) {
      barrier_wait(full_barrier(ring.stage), ring.phase);
      idle = warp_group == 1 && read_by_lane0(stage_upper_rows_empty[ring.stage]);
    }
    if (idle) {
      // No rows here: take each stage and free it, so every consumer warp (and every thread block
      // of a cluster) uses every stage equally often.
      for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {
        barrier_wait(full_barrier(ring.stage), ring.phase);
        free_stage(ring.stage);
      }
      if (counts_blocks && work.rows) {
        count_stored_block();
        uncounted_block = work.block;
        uncounted_tail = work.tail;
      }
      return;
    }
    // The epilogue's rows, read now so the loads hide behind the mainloop.
    int32_t pair[2];
    float scale[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + half * 8;  // past kBlockM in a short block: not the block's
      const int32_t p = row < kBlockM ? a.sorted_pair_ids[work.block * kBlockM + row] : -1;
      pair[half] = p >= 0 && p < a.num_pairs ? p : -1;
      scale[half] =
          (!kGated && a.topk_weights != nullptr && pair[half] >= 0) ? a.topk_weights[p] : 1.0f;
    }

    // A merged tail: this warpgroup's share of the stage's weight rows (gemm1: 64 gate rows and
    // their 64 up rows; gemm2: 128 rows) as two m64 A operands, the tail's rows as B.
    float tail_acc[2][16];
    const uint32_t tail_weight_row[2] = {
        static_cast<uint32_t>(kGated ? warp_group * 64 : warp_group * 128),
        static_cast<uint32_t>(kGated ? 128 + warp_group * 64 : warp_group * 128 + 64)};
    // One mainloop with the tail's MMAs and one without, chosen before it: a branch inside makes
    // ptxas serialize the wgmma instructions.
    auto mainloop = [&](auto with_tail) {
      constexpr bool kTail = decltype(with_tail)::value && Tile::kMergesTails;
      [[maybe_unused]] int previous_stage = 0;
      for (int kt = 0; kt < k_tiles; ++kt, ring.advance()) {
        barrier_wait(full_barrier(ring.stage), ring.phase);
        // The A rows came through cp.async (generic proxy); wgmma reads through the async proxy.
        fence_proxy_async_shared();
        const uint32_t stage_base = base + ring.stage * Tile::kStageBytes;
        const uint32_t a_tile = stage_base + a_offset;
        const uint32_t b_tile = stage_base + Tile::kABytes + b_offset;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk) {
          // Within the swizzled 128-byte row, step k16 is 32 bytes further. The first step of a
          // tile overwrites the accumulators.
          const bool accumulate = kt > 0 || kk > 0;
          if constexpr (Tile::kWarpGroupN == 256) {
            wgmma_m64n256k16(acc, wgmma_descriptor(a_tile + kk * 32),
                             wgmma_descriptor(b_tile + kk * 32), accumulate);
          } else {
            wgmma_m64n128k16(acc, wgmma_descriptor(a_tile + kk * 32),
                             wgmma_descriptor(b_tile + kk * 32), accumulate);
          }
          if constexpr (kTail) {
            const uint32_t weights = stage_base + Tile::kABytes;
            const uint64_t tail_rows =
                wgmma_descriptor(stage_base + Tile::kABytes + Tile::kBBytes + kk * 32);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              wgmma_m64n32k16(tail_acc[h],
                              wgmma_descriptor(weights + tail_weight_row[h] * kRowBytes + kk * 32),
                              tail_rows, accumulate);
            }
          }
        }
        wgmma_commit();
        if constexpr (kEager) {
          wgmma_wait<0>();
          free_stage(ring.stage);
        } else {
          // The group of the previous stage has retired once at most this one is running: free
          // it.
          wgmma_wait<1>();
          if (kt > 0) free_stage(previous_stage);
          previous_stage = ring.stage;
        }
      }
      if constexpr (!kEager) {
        wgmma_wait<0>();
        free_stage(previous_stage);
      }
    };
    if (takes_tail(work)) {
      mainloop(std::true_type{});
    } else {
      mainloop(std::false_type{});
    }
    count_stored_block();  // the previous tile's

    // Four chunks of 8 columns at a time: the quad trades them so each lane stores one whole
    // (accumulator_chunks.cuh). A warp whose eight rows are all padding (the end of a block) skips
    // them; in one that has some, the padding rows trade too (every lane must) but store nothing.
    constexpr int kOutChunks = kWarpGroupColumns / 8;
    const int64_t chunk_column = work.first_column + chunk_offset;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (__all_sync(0xffffffffu, pair[half] < 0)) continue;
      const int64_t out_index = a.out_in_block_order ? work.block * kBlockM + first_row + half * 8
                                                     : (pair[half] < 0 ? 0 : pair[half]);
      __nv_bfloat16* out_row = out + out_index * columns;
#pragma unroll
      for (int group = 0; group < kOutChunks / 4; ++group) {
        uint32_t packed[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int n = group * 4 + j;
          float v[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = acc[n * 4 + half * 2 + e];
            if constexpr (kGated) {
              v[e] = silu(x) * acc[(n + kOutChunks) * 4 + half * 2 + e];
            } else {
              v[e] = x * scale[half];
            }
          }
          packed[j] = pack_bf16_pair(v[0], v[1]);
        }
        const uint4 chunk = transpose_quad(packed);
        const int64_t column = chunk_column + group * 32;
        if (pair[half] >= 0 && column < columns) {
          *reinterpret_cast<uint4*>(out_row + column) = chunk;
        }
      }
    }
    if (takes_tail(work)) store_tail(work, tail_acc);
    if (counts_blocks) {
      uncounted_block = work.block;
      uncounted_tail = work.tail;
    }
  };
  if constexpr (kDynamic) {
    for (;;) {
      barrier_wait(full_barrier(ring.stage), ring.phase);
      const int32_t tile = read_by_lane0(stage_tile[ring.stage]);
      if (tile < 0) break;
      TileWork work;
      walk.decode(tile, work);  // a tile the producer found work in
      consume(work);
    }
  } else {
    for_each_tile(walk, consume);
  }
  count_stored_block();
  if (threadIdx.x == kProducerThreads && a.timeline != nullptr) {
    a.timeline[kTimelineWords * blockIdx.x + 1] = global_timer_ns();
  }
  if constexpr (kCluster > 1) cluster_sync();
#endif
}

// cuTensorMapEncodeTiled from the driver the runtime loaded, so the library links no libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                           cudaEnableDefault, &found),
          "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (found != cudaDriverEntryPointSuccess || function == nullptr) {
      fail("grouped_gemm (tma): the CUDA driver has no cuTensorMapEncodeTiled (needs 12.0+)");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// A bf16 tensor of `rank` (2 or 3) dimensions, innermost first, with the byte strides of the outer
// ones, read in `box` boxes with the 128-byte swizzle the wgmma descriptors assume.
CUresult encode_swizzled_map(CUtensorMap& map, const void* base, int rank, const cuuint64_t* dims,
                             const cuuint64_t* strides, const cuuint32_t* box) {
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base),
                              dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The weights as a 3-D tensor [E_local, weight_rows, K] read in {64 k, 64 rows, 1 expert} boxes
// with the 128-byte swizzle. Encoded on the host for every launch and passed by value
// (__grid_constant__), so a captured graph holds its own copy and nothing touches the device.
CUtensorMap weight_tensor_map(const GroupedGemmArgs& a) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.k_dim),
                              static_cast<cuuint64_t>(a.weight_rows),
                              static_cast<cuuint64_t>(a.num_local_experts)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.k_dim) * 2,
                                 static_cast<cuuint64_t>(a.weight_rows * a.k_dim) * 2};
  const cuuint32_t box[3] = {kTileK, kBoxRows, 1};
  CUtensorMap map;
  const CUresult result = encode_swizzled_map(map, a.weights, 3, dims, strides, box);
  if (result != CUDA_SUCCESS) {
    fail(
        "grouped_gemm (tma): cuTensorMapEncodeTiled failed (CUresult {}) for weights of {} "
        "experts x {} rows x K {}; expected 16-byte aligned weights and K % 8 == 0",
        static_cast<int>(result), a.num_local_experts, a.weight_rows, a.k_dim);
  }
  return map;
}

// input_in_block_order: the input as a 2-D tensor [max_blocks * block_m, K] read in {64 k, block_m
// rows} boxes, one per stage. Otherwise the kernel never reads the map.
CUtensorMap input_tensor_map(const GroupedGemmArgs& a) {
  CUtensorMap map = {};
  if (!a.input_in_block_order) return map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.k_dim),
                              static_cast<cuuint64_t>(a.max_blocks * a.block_m)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.k_dim) * 2};
  const cuuint32_t box[2] = {kTileK, static_cast<cuuint32_t>(a.block_m)};
  const CUresult result = encode_swizzled_map(map, a.input, 2, dims, strides, box);
  if (result != CUDA_SUCCESS) {
    fail(
        "grouped_gemm (tma): cuTensorMapEncodeTiled failed (CUresult {}) for input rows of {} "
        "blocks x {} rows x K {}; expected 16-byte aligned rows and K % 8 == 0",
        static_cast<int>(result), a.max_blocks, a.block_m, a.k_dim);
  }
  return map;
}

// One thread block per multiprocessor (at most args.max_multiprocessors of them); clusters: as many
// as fit at once (not every multiprocessor can join one), times their size.
// kDynamic: the tiles are taken from args.tile_counter, which the launch leaves zero.
template <int kBlockM, bool kGated, bool kEager, int kCluster, bool kDynamic>
void launch(const GroupedGemmArgs& args, cudaStream_t stream) {
  using Tile = KernelTile<kBlockM, kDynamic>;
  constexpr auto kernel = tma_kernel<kBlockM, kGated, kEager, kCluster, kDynamic>;
  allow_shared_bytes<kernel>(Tile::kSharedBytes, "cudaFuncSetAttribute(tma_kernel)");
  int device = 0, multiprocessors = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute(multiprocessors)");
  if (args.max_multiprocessors > 0) {
    multiprocessors = std::min(multiprocessors, args.max_multiprocessors);
  }
  const int64_t columns_per_tile = kGated ? kTileN / 2 : kTileN;
  const int64_t tiles = (args.max_blocks + kCluster - 1) / kCluster *
                        ((args.out_columns + columns_per_tile - 1) / columns_per_tile);

  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kCluster;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(Tile::kThreads);
  config.dynamicSmemBytes = Tile::kSharedBytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 1;
  int64_t groups = multiprocessors / kCluster;
  if constexpr (kCluster > 1) {
    config.gridDim = dim3(static_cast<unsigned>(groups * kCluster));
    int active = 0;
    check(cudaOccupancyMaxActiveClusters(&active, kernel, &config),
          "cudaOccupancyMaxActiveClusters(tma_kernel)");
    if (active > 0) groups = std::min<int64_t>(groups, active);
  }
  groups = std::max<int64_t>(1, std::min(tiles, groups));
  config.gridDim = dim3(static_cast<unsigned>(groups * kCluster));
  if (kDynamic && args.tile_counter == nullptr) {
    fail("grouped_gemm (tma_dynamic): no tile counter given");
  }
  if (args.timeline != nullptr && config.gridDim.x > kMaxTimelineBlocks) {
    fail("grouped_gemm: a timeline holds {} thread blocks; the grid has {}", kMaxTimelineBlocks,
         config.gridDim.x);
  }
  if (args.after_previous_grid) config.numAttrs = 2;
  check(cudaLaunchKernelEx(&config, kernel, weight_tensor_map(args), input_tensor_map(args), args),
        "cudaLaunchKernelEx(tma_kernel)");
}

template <int kBlockM, bool kEager, int kCluster, bool kDynamic = false>
void launch_gated_or_not(bool gated, const GroupedGemmArgs& args, cudaStream_t stream) {
  gated ? launch<kBlockM, true, kEager, kCluster, kDynamic>(args, stream)
        : launch<kBlockM, false, kEager, kCluster, kDynamic>(args, stream);
}

template <int kBlockM>
void launch_variant(GemmKernel kernel, bool gated, const GroupedGemmArgs& args,
                    cudaStream_t stream) {
  switch (kernel) {
    case GemmKernel::kTmaEager:
      return launch_gated_or_not<kBlockM, true, 1>(gated, args, stream);
    case GemmKernel::kTmaPair:
      return launch_gated_or_not<kBlockM, false, 2>(gated, args, stream);
    case GemmKernel::kTmaDynamic:
      return launch_gated_or_not<kBlockM, false, 1, true>(gated, args, stream);
    default:
      return launch_gated_or_not<kBlockM, false, 1>(gated, args, stream);
  }
}

}  // namespace

void tma_grouped_gemm(GemmKernel kernel, bool gated, const GroupedGemmArgs& args,
                      cudaStream_t stream) {
  // 128 rows: half the input traffic per flop; 64 rows, for experts with fewer pairs: less padding
  // computed; 16 rows (decode sizes): more of each stage left to the weights.
  if (args.block_m == 16) {
    launch_variant<16>(kernel, gated, args, stream);
  } else if (args.block_m == 64) {
    launch_variant<64>(kernel, gated, args, stream);
  } else {
    launch_variant<128>(kernel, gated, args, stream);
  }
  check_launch("grouped_gemm (tma)");
}

}  // namespace moe::cuda
