// The prefill-size grouped GEMM on tensor cores: mma.sync m16n8k16 (bf16 in, f32 accumulate),
// tiles of BM pairs x BN weight rows x 32, fed by a multi-stage cp.async pipeline. A-tile rows are
// fetched straight from hidden[p / k] (gemm1) or cache2[p] (gemm2) by pair id, zero-filled for
// padding. For gemm1 each warp's B rows are half gate rows and half the matching up rows, so one
// thread holds gate and up of the same output element and SiLU-and-multiply happens in registers:
// cache1 is never written. gemm2 scales by the router weight in its epilogue.
//
// This runs on sm_80 and later; Hopper has its own (grouped_gemm_wgmma.cu, grouped_gemm_tma.cu).
#include <cuda_bf16.h>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/grouped_gemm_launch.h"
#include "kernels/cuda/tile_rows.cuh"

namespace moe::cuda {
namespace {

constexpr int kTileK = 32;
constexpr int kRowStride = kTileK + 8;  // padding keeps ldmatrix free of bank conflicts

__device__ __forceinline__ void load_matrix_x4(uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared)));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int kBM, int kBN, int kWarpsM, int kWarpsN, int kStages>
struct MmaTile {
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kWarpM = kBM / kWarpsM, kWarpN = kBN / kWarpsN;
  static constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;
  // 16-byte copies per thread and stage (the last round may leave some threads idle).
  static constexpr int kChunksA = (kBM * kTileK / 8 + kThreads - 1) / kThreads;
  static constexpr int kChunksB = (kBN * kTileK / 8 + kThreads - 1) / kThreads;
  static constexpr size_t kSharedBytes =
      static_cast<size_t>(kStages) * (kBM + kBN) * kRowStride * sizeof(__nv_bfloat16);
  static_assert(kFragsN % 4 == 0, "gate and up halves need pairs of 8-column fragments");
  static_assert(kBN * kTileK / 8 % kThreads == 0, "every thread copies the same B chunks");
};

template <int kBM, int kBN, int kWarpsM, int kWarpsN, int kStages, bool kGated>
__global__ void __launch_bounds__(kWarpsM* kWarpsN * 32) mma_kernel(GroupedGemmArgs a) {
  using Tile = MmaTile<kBM, kBN, kWarpsM, kWarpsN, kStages>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  auto* tile_a = reinterpret_cast<__nv_bfloat16*>(shared_bytes);  // [kStages][kBM][kRowStride]
  auto* tile_b = tile_a + kStages * kBM * kRowStride;             // [kStages][kBN][kRowStride]
  __shared__ int32_t pair_of_row[kBM];
  __shared__ int32_t input_row[kBM];

  const int64_t block = blockIdx.x;
  if (block * kBM >= *a.num_pairs_post_padded) return;
  const int32_t expert = a.expert_ids[block];
  if (expert < 0 || expert >= a.num_local_experts) return;

  const int64_t K = a.k_dim, columns = a.out_columns;
  load_block_rows<kBM, Tile::kThreads>(a, block, pair_of_row, input_row);

  const auto* input = static_cast<const __nv_bfloat16*>(a.input);
  const auto* expert_weights =
      static_cast<const __nv_bfloat16*>(a.weights) + expert * a.weight_rows * K;
  // Output columns of this block: kBN of them, or kBN / 2 for gemm1 (gate and up rows).
  const int64_t first_column = static_cast<int64_t>(blockIdx.y) * (kGated ? kBN / 2 : kBN);

  // The weight row each of this thread's B copies reads; fixed over the K loop.
  const __nv_bfloat16* b_source[Tile::kChunksB];
  bool b_valid[Tile::kChunksB];
#pragma unroll
  for (int i = 0; i < Tile::kChunksB; ++i) {
    const int chunk = threadIdx.x + i * Tile::kThreads;
    const int j = chunk / (kTileK / 8);
    int64_t column, row;
    if constexpr (kGated) {
      constexpr int kHalf = Tile::kWarpN / 2;
      const int warp_column = j / Tile::kWarpN, r = j % Tile::kWarpN;
      column = first_column + warp_column * kHalf + r % kHalf;
      row = r < kHalf ? column : columns + column;
    } else {
      column = first_column + j;
      row = column;
    }
    b_valid[i] = column < columns;
    b_source[i] = expert_weights + (b_valid[i] ? row : 0) * K + (chunk % (kTileK / 8)) * 8;
  }

  auto load_stage = [&](int stage, int64_t k0) {
    __nv_bfloat16* a_stage = tile_a + stage * kBM * kRowStride;
    __nv_bfloat16* b_stage = tile_b + stage * kBN * kRowStride;
#pragma unroll
    for (int i = 0; i < Tile::kChunksA; ++i) {
      const int chunk = threadIdx.x + i * Tile::kThreads;
      if (chunk >= kBM * kTileK / 8) break;
      const int r = chunk / (kTileK / 8), c = chunk % (kTileK / 8);
      const int64_t k = k0 + c * 8;
      const int32_t source_row = input_row[r];
      const bool valid = source_row >= 0 && k < K;
      copy16_async(shared_address(a_stage + r * kRowStride + c * 8),
                   valid ? input + source_row * K + k : input, valid);
    }
#pragma unroll
    for (int i = 0; i < Tile::kChunksB; ++i) {
      const int chunk = threadIdx.x + i * Tile::kThreads;
      const int j = chunk / (kTileK / 8), c = chunk % (kTileK / 8);
      const bool valid = b_valid[i] && k0 + c * 8 < K;
      copy16_async(shared_address(b_stage + j * kRowStride + c * 8),
                   valid ? b_source[i] + k0 : expert_weights, valid);
    }
  };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  float acc[Tile::kFragsM][Tile::kFragsN][4] = {};

  const int64_t k_tiles = (K + kTileK - 1) / kTileK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s, s * kTileK);
    commit_copies();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    wait_copies<kStages - 2>();
    __syncthreads();
    const int64_t next = kt + kStages - 1;
    if (next < k_tiles) load_stage(static_cast<int>(next % kStages), next * kTileK);
    commit_copies();

    const int stage = static_cast<int>(kt % kStages);
    const __nv_bfloat16* a_stage = tile_a + stage * kBM * kRowStride;
    const __nv_bfloat16* b_stage = tile_b + stage * kBN * kRowStride;
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      uint32_t a_frag[Tile::kFragsM][4];
#pragma unroll
      for (int m = 0; m < Tile::kFragsM; ++m) {
        const int row = warp_m * Tile::kWarpM + m * 16 + lane % 16;
        load_matrix_x4(a_frag[m], a_stage + row * kRowStride + kk + (lane / 16) * 8);
      }
      uint32_t b_frag[Tile::kFragsN][2];
#pragma unroll
      for (int n = 0; n < Tile::kFragsN; n += 2) {
        const int row = warp_n * Tile::kWarpN + n * 8 + (lane / 16) * 8 + lane % 8;
        uint32_t r[4];
        load_matrix_x4(r, b_stage + row * kRowStride + kk + ((lane / 8) % 2) * 8);
        b_frag[n][0] = r[0];
        b_frag[n][1] = r[1];
        b_frag[n + 1][0] = r[2];
        b_frag[n + 1][1] = r[3];
      }
#pragma unroll
      for (int m = 0; m < Tile::kFragsM; ++m) {
#pragma unroll
        for (int n = 0; n < Tile::kFragsN; ++n) {
          mma_bf16(acc[m][n], a_frag[m], b_frag[n][0], b_frag[n][1]);
        }
      }
    }
  }
  wait_copies<0>();

  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const bool paired_stores = columns % 2 == 0;
#pragma unroll
  for (int m = 0; m < Tile::kFragsM; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp_m * Tile::kWarpM + m * 16 + lane / 4 + half * 8;
      const int32_t pair = pair_of_row[row];
      if (pair < 0) continue;
      const float scale = (!kGated && a.topk_weights != nullptr) ? a.topk_weights[pair] : 1.0f;
      constexpr int kOutFrags = kGated ? Tile::kFragsN / 2 : Tile::kFragsN;
#pragma unroll
      for (int n = 0; n < kOutFrags; ++n) {
        const int warp_column = kGated ? Tile::kWarpN / 2 : Tile::kWarpN;
        const int64_t column = first_column + warp_n * warp_column + n * 8 + (lane % 4) * 2;
        float v[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = acc[m][n][half * 2 + e];
          if constexpr (kGated) {
            v[e] = silu(x) * acc[m][n + kOutFrags][half * 2 + e];
          } else {
            v[e] = x * scale;
          }
        }
        store_bf16_pair(out + pair * columns, column, columns, paired_stores, v[0], v[1]);
      }
    }
  }
}

template <int kBM, int kBN, int kWarpsM, int kWarpsN, int kStages, bool kGated>
void launch(const GroupedGemmArgs& args, cudaStream_t stream) {
  using Tile = MmaTile<kBM, kBN, kWarpsM, kWarpsN, kStages>;
  launch_block_grid<mma_kernel<kBM, kBN, kWarpsM, kWarpsN, kStages, kGated>>(
      Tile::kThreads, Tile::kSharedBytes, kGated ? kBN / 2 : kBN, args, stream,
      "cudaFuncSetAttribute(mma_kernel)");
}

}  // namespace

void mma_grouped_gemm(bool gated, const GroupedGemmArgs& args, cudaStream_t stream) {
  // Short tiles for experts with few rows: less padding computed, weights still read once per
  // block (and blocks of one expert run side by side, so a re-read mostly hits L2).
  switch (args.block_m) {
    case 16:
      gated ? launch<16, 128, 1, 4, 6, true>(args, stream)
            : launch<16, 128, 1, 4, 6, false>(args, stream);
      break;
    case 32:
      gated ? launch<32, 128, 1, 4, 6, true>(args, stream)
            : launch<32, 128, 1, 4, 6, false>(args, stream);
      break;
    case 64:
      gated ? launch<64, 128, 2, 4, 4, true>(args, stream)
            : launch<64, 128, 2, 4, 4, false>(args, stream);
      break;
    default:
      gated ? launch<128, 128, 2, 4, 4, true>(args, stream)
            : launch<128, 128, 2, 4, 4, false>(args, stream);
  }
  check_launch("grouped_gemm (mma)");
}

}  // namespace moe::cuda
