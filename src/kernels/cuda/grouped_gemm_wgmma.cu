// The prefill-size grouped GEMM on Hopper's warpgroup MMA (wgmma, sm_90a). Each warpgroup of
// 128 threads computes 64 pairs x 128 weight rows with m64n128k16 instructions that read both
// operands from shared memory through matrix descriptors. Tiles are K-major with the 128-byte
// swizzle (16-byte chunk c of row r stored at chunk c ^ (r % 8)), which is the layout those
// descriptors name; a multi-stage cp.async pipeline fills them, A rows gathered by pair id as in
// the mma.sync kernel. gemm1's B tile is 64 gate rows then the 64 matching up rows, so a thread
// holds gate and up of the same element and SiLU-and-multiply happens in registers.
#include <cuda_bf16.h>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/grouped_gemm_launch.h"
#include "kernels/cuda/tile_rows.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace moe::cuda {
namespace {

// kWarpGroups x 64 pairs by kTileN weight rows per block, kStages shared-memory stages. The
// constants live in the struct and are referenced by its static_asserts too, since the sm_80 pass
// compiles the kernel without its body.
template <int kWarpGroups, int kTileN, int kStages>
struct WgmmaTile {
  static constexpr int kTileK = kSwizzledTileK;
  static constexpr int kRowBytes = kSwizzledRowBytes;
  static constexpr int kWarpGroupRows = 64;
  static constexpr int kThreads = kWarpGroups * 128;
  static constexpr int kBM = kWarpGroups * kWarpGroupRows;
  static constexpr int kABytes = kBM * kRowBytes;     // per stage
  static constexpr int kBBytes = kTileN * kRowBytes;  // per stage
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr size_t kSharedBytes = size_t{kStages} * kStageBytes + 1024;  // + alignment
  static constexpr int kChunksA = kBM * 8 / kThreads;
  static constexpr int kChunksB = kTileN * 8 / kThreads;
  static constexpr int kAccumulators = kTileN / 2;  // f32 per thread of a 64 x kTileN tile
  static_assert(kStages >= 3, "one stage computing, one landing, one being filled");
  static_assert(kChunksA * kThreads == kBM * 8 && kChunksB * kThreads == kTileN * 8 &&
                    kAccumulators * 2 == kTileN && kTileK % 16 == 0,
                "whole 16-byte chunks per thread, whole k16 steps per stage");
};

template <int kWarpGroups, int kTileN, int kStages, bool kGated>
__global__ void __launch_bounds__(kWarpGroups * 128, 1) wgmma_kernel(GroupedGemmArgs a) {
#ifdef MOE_HAS_WGMMA
  using Tile = WgmmaTile<kWarpGroups, kTileN, kStages>;
  constexpr int kBM = Tile::kBM, kTileK = Tile::kTileK, kRowBytes = Tile::kRowBytes;
  constexpr int kWarpGroupRows = Tile::kWarpGroupRows;
  extern __shared__ unsigned char shared_raw[];
  __shared__ int32_t pair_of_row[kBM];
  __shared__ int32_t input_row[kBM];
  // The swizzle and the descriptors assume 1024-byte aligned tiles.
  const uint32_t base = (shared_address(shared_raw) + 1023) & ~1023u;

  const int64_t block = blockIdx.x;
  if (block * kBM >= *a.num_pairs_post_padded) return;
  const int32_t expert = a.expert_ids[block];
  if (expert < 0 || expert >= a.num_local_experts) return;

  const int64_t K = a.k_dim, columns = a.out_columns;
  load_block_rows<kBM, Tile::kThreads>(a, block, pair_of_row, input_row);

  const auto* input = static_cast<const __nv_bfloat16*>(a.input);
  const auto* expert_weights =
      static_cast<const __nv_bfloat16*>(a.weights) + expert * a.weight_rows * K;
  constexpr int kColumnsPerBlock = kGated ? kTileN / 2 : kTileN;
  const int64_t first_column = static_cast<int64_t>(blockIdx.y) * kColumnsPerBlock;

  const __nv_bfloat16* b_source[Tile::kChunksB];
  bool b_valid[Tile::kChunksB];
#pragma unroll
  for (int i = 0; i < Tile::kChunksB; ++i) {
    const int j = (threadIdx.x + i * Tile::kThreads) / 8;
    const int64_t column = first_column + (kGated ? j % (kTileN / 2) : j);
    const int64_t row = (kGated && j >= kTileN / 2) ? columns + column : column;
    b_valid[i] = column < columns;
    b_source[i] = expert_weights + (b_valid[i] ? row : 0) * K;
  }

  auto load_stage = [&](int stage, int64_t k0) {
    const uint32_t a_stage = base + stage * Tile::kStageBytes;
    const uint32_t b_stage = a_stage + Tile::kABytes;
#pragma unroll
    for (int i = 0; i < Tile::kChunksA; ++i) {
      const int chunk = threadIdx.x + i * Tile::kThreads;
      const int r = chunk / 8, c = chunk % 8;
      const int64_t k = k0 + c * 8;
      const int32_t source = input_row[r];
      const bool valid = source >= 0 && k < K;
      copy16_async(a_stage + swizzled_chunk_offset(r, c), valid ? input + source * K + k : input,
                   valid);
    }
#pragma unroll
    for (int i = 0; i < Tile::kChunksB; ++i) {
      const int chunk = threadIdx.x + i * Tile::kThreads;
      const int j = chunk / 8, c = chunk % 8;
      const int64_t k = k0 + c * 8;
      const bool valid = b_valid[i] && k < K;
      copy16_async(b_stage + swizzled_chunk_offset(j, c), valid ? b_source[i] + k : expert_weights,
                   valid);
    }
  };

  const int warp_group = threadIdx.x / 128;
  float acc[Tile::kAccumulators];
#pragma unroll
  for (int i = 0; i < Tile::kAccumulators; ++i) acc[i] = 0.0f;

  // Loads run kStages - 2 tiles ahead and one wgmma group stays in flight: the stage refilled in
  // iteration kt was last read by group kt - 2, which every warpgroup has waited for before
  // reaching this iteration's barrier.
  constexpr int kAhead = kStages - 2;
  const int64_t k_tiles = (K + kTileK - 1) / kTileK;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < k_tiles) load_stage(s, s * kTileK);
    commit_copies();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    wait_copies<kAhead - 1>();
    // cp.async wrote through the generic proxy; wgmma reads through the async proxy.
    fence_proxy_async_shared();
    __syncthreads();
    const int64_t next = kt + kAhead;
    if (next < k_tiles) load_stage(static_cast<int>(next % kStages), next * kTileK);
    commit_copies();

    const uint32_t a_stage = base + static_cast<int>(kt % kStages) * Tile::kStageBytes;
    const uint32_t a_tile = a_stage + warp_group * kWarpGroupRows * kRowBytes;
    const uint32_t b_tile = a_stage + Tile::kABytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      // Within the swizzled 128-byte row, step k16 is 32 bytes further.
      if constexpr (kTileN == 256) {
        wgmma_m64n256k16(acc, wgmma_descriptor(a_tile + kk * 32),
                         wgmma_descriptor(b_tile + kk * 32), true);
      } else {
        wgmma_m64n128k16(acc, wgmma_descriptor(a_tile + kk * 32),
                         wgmma_descriptor(b_tile + kk * 32), true);
      }
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  wait_copies<0>();

  // Accumulator i of a thread: row 16 * warp + lane / 4 (+ 8 for i % 4 >= 2), column
  // 8 * (i / 4) + 2 * (lane % 4) + i % 2, within this warpgroup's 64 x kTileN tile.
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const bool paired_stores = columns % 2 == 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = warp_group * kWarpGroupRows + warp * 16 + lane / 4 + half * 8;
    const int32_t pair = pair_of_row[row];
    if (pair < 0) continue;
    const float scale = (!kGated && a.topk_weights != nullptr) ? a.topk_weights[pair] : 1.0f;
    constexpr int kOutChunks = kGated ? kTileN / 16 : kTileN / 8;
#pragma unroll
    for (int n = 0; n < kOutChunks; ++n) {
      const int64_t column = first_column + n * 8 + (lane % 4) * 2;
      float v[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = acc[n * 4 + half * 2 + e];
        if constexpr (kGated) {
          v[e] = silu(x) * acc[(n + kOutChunks) * 4 + half * 2 + e];
        } else {
          v[e] = x * scale;
        }
      }
      store_bf16_pair(out + pair * columns, column, columns, paired_stores, v[0], v[1]);
    }
  }
#endif
}

template <int kWarpGroups, int kTileN, int kStages, bool kGated>
void launch(const GroupedGemmArgs& args, cudaStream_t stream) {
  using Tile = WgmmaTile<kWarpGroups, kTileN, kStages>;
  launch_block_grid<wgmma_kernel<kWarpGroups, kTileN, kStages, kGated>>(
      Tile::kThreads, Tile::kSharedBytes, kGated ? kTileN / 2 : kTileN, args, stream,
      "cudaFuncSetAttribute(wgmma_kernel)");
}

}  // namespace

// Asked on every call, not cached: a process may drive GPUs of different kinds.
bool wgmma_available() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major == 9 && minor == 0;
}

void wgmma_grouped_gemm(bool gated, const GroupedGemmArgs& args, cudaStream_t stream) {
  // 128 rows: wide tiles (half the A-tile traffic per flop); 64 rows, for experts with fewer
  // pairs: narrower tiles and two blocks per multiprocessor, for more blocks in flight.
  if (args.block_m == 128) {
    gated ? launch<2, 256, 4, true>(args, stream) : launch<2, 256, 4, false>(args, stream);
  } else {
    gated ? launch<1, 128, 4, true>(args, stream) : launch<1, 128, 4, false>(args, stream);
  }
  check_launch("grouped_gemm (wgmma)");
}

}  // namespace moe::cuda
