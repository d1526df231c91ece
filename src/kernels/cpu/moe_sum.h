// The sum stage on the CPU: out[t] = sum_j pair_rows[row(t * k + j)] (j ascending) + shared[t],
// accumulated in f32 and rounded once to the output dtype, where row(p) = p, or pair_row_ids[p]
// when the rows came back from other ranks in another order (expert parallelism's combine). The
// fixed order makes the result deterministic and the same with or without the index. Tested by
// tests/experts against the reference backend and by tests/parallel.
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe::cpu {

// pair_rows [*, width] f32 (num_tokens * top_k rows when pair_row_ids is null); pair_row_ids
// [num_tokens * top_k] or null; shared [num_tokens, width] f32 or null; out [num_tokens, width] of
// out_dtype.
void moe_sum(const float* pair_rows, const int32_t* pair_row_ids, const float* shared,
             int64_t num_tokens, int64_t top_k, int64_t width, void* out, DType out_dtype,
             int num_threads);

}  // namespace moe::cpu
