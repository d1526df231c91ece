// Block-sparse grouped GEMM on the CPU: the gemm1 and gemm2 of the experts.
//
// For every block b of block_m entries of sorted_pair_ids whose expert_ids[b] = e >= 0, and every
// real pair p in it (p < num_pairs; the sentinel pads are skipped):
//   c[p, :] = out_scale[p] * ((a_scale[p] * row(p)) · w[e]^T + bias[e, :])
// Rows of blocks with expert -1 (not local) are written with zeros. Input rows row(p) are read in
// place at a_row_ptrs[p] when given, else at row p / a_row_divisor of a (gemm1 reads hidden[p / k],
// or, under expert parallelism, a received row or one of the rank's own rows; gemm2 reads
// cache2[p]).
//
// Each output element is one dot product computed by one thread in a fixed order, so results
// do not depend on the thread count. Tested by tests/experts (against the reference backend).
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe::cpu {

// The largest block the kernel accepts (its per-block pair list lives on the stack).
inline constexpr int64_t kMaxBlockM = 1024;

struct GroupedGemmArgs {
  const void* a = nullptr;  // [*, k_dim] rows of a_dtype
  DType a_dtype = DType::kF32;
  int64_t a_row_divisor = 1;                // row of pair p is p / a_row_divisor ...
  const void* const* a_row_ptrs = nullptr;  // ... or the row at a_row_ptrs[p]: [num_pairs]
  const float* a_scale = nullptr;           // [num_pairs] or null
  const void* w = nullptr;                  // [num_local_experts, n, k_dim] of w_dtype
  DType w_dtype = DType::kF32;
  const float* bias = nullptr;       // [num_local_experts, n] or null
  const float* out_scale = nullptr;  // [num_pairs] or null
  int64_t n = 0;
  int64_t k_dim = 0;
  const int32_t* sorted_pair_ids = nullptr;  // [num_blocks * block_m]
  const int32_t* expert_ids = nullptr;       // [num_blocks]
  int64_t num_blocks = 0;
  int64_t block_m = 0;
  int64_t num_pairs = 0;  // ids >= num_pairs are padding
  float* c = nullptr;     // [num_pairs, n]
};

// Scratch, in floats, one thread needs: an A panel of block_m rows and a tile of weight rows.
int64_t grouped_gemm_scratch_floats(int64_t block_m, int64_t k_dim);

// `scratch` holds num_threads * grouped_gemm_scratch_floats(...) floats.
void grouped_gemm(const GroupedGemmArgs& args, float* scratch, int num_threads);

}  // namespace moe::cpu
