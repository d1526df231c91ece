// The sum stage on the CPU: out[t] = sum_j row(t * k + j) (j ascending) + shared[t], accumulated
// in f32 and rounded once to the output dtype, where row(p) is row p of pair_rows, or the row at
// pair_row_ptrs[p] when the rows lie elsewhere (expert parallelism's combine: results back from
// other ranks, and this rank's own). The rows are f32, or bf16 (cache3 of a bf16 layer,
// fused_experts.h), which widens to f32 exactly. The fixed order makes the result deterministic
// and the same wherever the rows are. Tested by tests/kernels/moe_sum_test.cc against a plain
// loop, by tests/experts against the reference backend and by tests/parallel.
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe::cpu {

// pair_rows [num_tokens * top_k, width] of rows_dtype (f32 or bf16), or pair_row_ptrs
// [num_tokens * top_k] (one of the two non-null), each pointing at `width` values of rows_dtype;
// shared [num_tokens, width] f32 or null; out [num_tokens, width] of out_dtype.
void moe_sum(const void* pair_rows, const void* const* pair_row_ptrs, DType rows_dtype,
             const float* shared, int64_t num_tokens, int64_t top_k, int64_t width, void* out,
             DType out_dtype, int num_threads);

}  // namespace moe::cpu
