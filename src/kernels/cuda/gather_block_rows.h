// gemm1's input rows copied into block order before gemm1, so that its producer loads each
// stage's rows of a block as one TMA box (as gemm2 does from cache2 in block order) instead of
// gathering hidden[p / k] row by row with cp.async:
//
//   out[r] = hidden[sorted_pair_ids[r] / k]   for r < num_pairs_post_padded with a pair id < P
//                                             in a block of a local expert
//
// Padding rows and the rows of other ranks' experts are left as they are: gemm1 skips those
// blocks, and padding rows only reach padding rows of its product, which are never stored. The
// row count is read on the device, so the launch is sized from the bound.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

struct GatherBlockRowsArgs {
  const void* hidden = nullptr;  // bf16 [M, H], 16-byte aligned rows (H % 8 == 0)
  const int32_t* sorted_pair_ids = nullptr;
  const int32_t* expert_ids = nullptr;  // local id of each block, -1: another rank's expert
  const int32_t* num_pairs_post_padded = nullptr;  // device
  int64_t max_rows = 0;                            // its upper bound: the launch's rows
  int64_t num_pairs = 0;                           // P = M * k
  int64_t top_k = 0;
  int64_t block_m = 0;
  int64_t num_local_experts = 0;
  int64_t hidden_size = 0;  // H
  void* out = nullptr;      // bf16 [max_rows, H], 16-byte aligned
};

void gather_block_rows(const GatherBlockRowsArgs& args, cudaStream_t stream);

}  // namespace moe::cuda
