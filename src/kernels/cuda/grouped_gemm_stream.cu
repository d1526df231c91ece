// The decode-size grouped GEMM: few rows per expert, so the weights are the bytes that matter.
// Each warp owns a few weight rows (output columns) of one expert and streams them once, 16 bytes
// per lane per load, multiplying every loaded chunk into all rows of the block before moving on:
// a second row of the same expert never re-reads the weights. Lane sums are reduced across the
// warp at the end; SiLU-and-multiply (gemm1) or the router weight (gemm2) is applied on the way
// out. Input rows are read in place through the pair id (they are small and stay in L2).
#include <cuda_bf16.h>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/grouped_gemm_launch.h"

namespace moe::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// kRows: most rows per block; kColumns: output columns per warp (gemm1 reads a gate and an up
// row for each); kAligned: 16-byte vector loads are legal (K % 8 == 0, aligned pointers);
// kUnroll: steps of the K loop whose loads the compiler may issue together.
template <int kRows, int kColumns, bool kGated, bool kAligned, int kUnroll>
__global__ void __launch_bounds__(kThreads) stream_kernel(GroupedGemmArgs a) {
  constexpr int kWeightRows = kGated ? 2 * kColumns : kColumns;
  __shared__ int32_t pair_of_row[kRows];
  __shared__ int32_t input_row[kRows];

  const int64_t block = blockIdx.x;
  int32_t expert;
  if (a.tiny_topk_ids != nullptr) {
    if (block >= a.num_pairs) return;
    const int32_t id = a.tiny_topk_ids[block];
    expert = (id >= 0 && id < a.num_experts) ? id : -1;
    if (expert >= 0 && a.expert_map != nullptr) expert = a.expert_map[expert];
  } else {
    if (block * a.block_m >= *a.num_pairs_post_padded) return;
    expert = a.expert_ids[block];
  }
  if (expert < 0 || expert >= a.num_local_experts) return;

  if (threadIdx.x < kRows) {
    int64_t pair = -1;
    if (a.tiny_topk_ids != nullptr) {
      if (threadIdx.x == 0) pair = block;
    } else if (threadIdx.x < a.block_m) {
      pair = a.sorted_pair_ids[block * a.block_m + threadIdx.x];
    }
    const bool valid = pair >= 0 && pair < a.num_pairs;
    pair_of_row[threadIdx.x] = valid ? static_cast<int32_t>(pair) : -1;
    input_row[threadIdx.x] = valid ? static_cast<int32_t>(pair / a.row_divisor) : 0;
  }
  __syncthreads();
  uint32_t valid_rows = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) valid_rows |= (pair_of_row[r] >= 0 ? 1u : 0u) << r;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t K = a.k_dim, columns = a.out_columns;
  const int64_t first_column = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * kColumns;
  if (first_column >= columns) return;

  const auto* input = static_cast<const __nv_bfloat16*>(a.input);
  const auto* expert_weights =
      static_cast<const __nv_bfloat16*>(a.weights) + expert * a.weight_rows * K;
  const __nv_bfloat16* weight_row[kWeightRows];
#pragma unroll
  for (int i = 0; i < kWeightRows; ++i) {
    const int64_t column = first_column + i % kColumns;
    const int64_t row = (kGated && i >= kColumns) ? columns + column : column;
    // Columns past the end re-read the first row; their sums are never stored.
    weight_row[i] = expert_weights + (column < columns ? row : 0) * K;
  }

  float acc[kWeightRows][kRows] = {};
#pragma unroll kUnroll
  for (int64_t k = lane * 8; k < K; k += 32 * 8) {
    uint4 packed[kWeightRows];
#pragma unroll
    for (int i = 0; i < kWeightRows; ++i) {
      packed[i] = load_bf16x8<kAligned, true>(weight_row[i], k, K);
    }
    float w[kWeightRows][8];
#pragma unroll
    for (int i = 0; i < kWeightRows; ++i) bf16x8_to_float(packed[i], w[i]);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (!(valid_rows >> r & 1)) continue;
      float x[8];
      bf16x8_to_float(load_bf16x8<kAligned, false>(input + input_row[r] * K, k, K), x);
#pragma unroll
      for (int i = 0; i < kWeightRows; ++i) {
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[i][r] = fmaf(w[i][e], x[e], acc[i][r]);
      }
    }
  }

  auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!(valid_rows >> r & 1)) continue;
#pragma unroll
    for (int i = 0; i < kWeightRows; ++i) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        acc[i][r] += __shfl_xor_sync(0xffffffff, acc[i][r], offset);
      }
    }
    const int64_t pair = pair_of_row[r];
    const float scale = a.topk_weights != nullptr ? a.topk_weights[pair] : 1.0f;
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      if (lane != (c + r * kColumns) % 32 || first_column + c >= columns) continue;
      const float value = kGated ? silu(acc[c][r]) * acc[kColumns + c][r] : acc[c][r] * scale;
      out[pair * columns + first_column + c] = __float2bfloat16(value);
    }
  }
}

template <int kRows, int kColumns, bool kGated, int kUnroll>
void launch(const GroupedGemmArgs& args, bool aligned, cudaStream_t stream) {
  constexpr int64_t kColumnsPerBlock = kWarps * kColumns;
  const dim3 grid(
      static_cast<unsigned>(args.max_blocks),
      static_cast<unsigned>((args.out_columns + kColumnsPerBlock - 1) / kColumnsPerBlock));
  if (aligned) {
    stream_kernel<kRows, kColumns, kGated, true, kUnroll><<<grid, kThreads, 0, stream>>>(args);
  } else {
    stream_kernel<kRows, kColumns, kGated, false, kUnroll><<<grid, kThreads, 0, stream>>>(args);
  }
}

}  // namespace

void stream_grouped_gemm(bool gated, const GroupedGemmArgs& args, bool aligned,
                         cudaStream_t stream) {
  // Few columns per warp (4 weight rows) keep the registers low, so that many warps fit on a
  // multiprocessor and keep their loads in flight: the kernel waits on memory, not arithmetic.
  // On the H200 against 4 (gemm1) and 8 (gemm2) columns per warp (docs/perf.md): Qwen3-30B-A3B's
  // tiny batch at 4 tokens 76.3-76.4 against 88.8-89.9 us, DeepSeek-V3's stream/4 at 64 tokens
  // 5.08 against 5.20 ms. The tiny batch has one row per block and unrolls two steps of K
  // (one: 88.4 us); four rows unroll none (two: 5.32 ms). Sixteen rows already had two columns per
  // warp.
  if (args.tiny_topk_ids != nullptr) {
    gated ? launch<1, 2, true, 2>(args, aligned, stream)
          : launch<1, 4, false, 2>(args, aligned, stream);
  } else if (args.block_m <= 4) {
    gated ? launch<4, 2, true, 1>(args, aligned, stream)
          : launch<4, 4, false, 1>(args, aligned, stream);
  } else {
    gated ? launch<16, 2, true, 2>(args, aligned, stream)
          : launch<16, 4, false, 2>(args, aligned, stream);
  }
  check_launch("grouped_gemm (stream)");
}

}  // namespace moe::cuda
