// Pieces shared by the tensor-core grouped GEMMs (mma.sync and wgmma): 16-byte async copies into
// shared memory, the table of pair ids and input rows of one aligned block, the bf16 store of two
// neighbouring output elements, and the launch of a grid of (aligned block, column tile) blocks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/shared_memory_limit.cuh"

namespace moe::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared (a shared-window address), zero-filled when !valid: nothing is read
// then, so `global` may be any mapped address.
__device__ __forceinline__ void copy16_async(uint32_t shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Fills pair_of_row / input_row [kRows] for aligned block `block` (-1 for padding) and
// synchronizes the thread block. Input row of pair p: p / row_divisor.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_block_rows(const GroupedGemmArgs& a, int64_t block,
                                                int32_t* pair_of_row, int32_t* input_row) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int64_t pair = a.sorted_pair_ids[block * kRows + r];
    const bool valid = pair >= 0 && pair < a.num_pairs;
    pair_of_row[r] = valid ? static_cast<int32_t>(pair) : -1;
    input_row[r] = valid ? static_cast<int32_t>(pair / a.row_divisor) : -1;
  }
  __syncthreads();
}

// out[column] and out[column + 1] of one row, as far as they exist; one 4-byte store when the
// row pitch keeps it aligned (paired).
__device__ __forceinline__ void store_bf16_pair(__nv_bfloat16* row, int64_t column, int64_t columns,
                                                bool paired, float v0, float v1) {
  __nv_bfloat16* destination = row + column;
  if (paired && column + 1 < columns) {
    *reinterpret_cast<__nv_bfloat162*>(destination) = __floats2bfloat162_rn(v0, v1);
  } else {
    if (column < columns) destination[0] = __float2bfloat16(v0);
    if (column + 1 < columns) destination[1] = __float2bfloat16(v1);
  }
}

// One thread block per (aligned block, column tile): x walks the max_blocks aligned blocks (those
// past num_pairs_post_padded exit at once), y the tiles of columns_per_block output columns.
template <auto kKernel>
void launch_block_grid(int threads, size_t shared_bytes, int64_t columns_per_block,
                       const GroupedGemmArgs& args, cudaStream_t stream, const char* kernel_name) {
  allow_shared_bytes<kKernel>(shared_bytes, kernel_name);
  const dim3 grid(
      static_cast<unsigned>(args.max_blocks),
      static_cast<unsigned>((args.out_columns + columns_per_block - 1) / columns_per_block));
  kKernel<<<grid, threads, shared_bytes, stream>>>(args);
}

}  // namespace moe::cuda
