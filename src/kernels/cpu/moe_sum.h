// The sum stage on the CPU: out[t] = sum_j pair_rows[t * k + j] (j ascending) + shared[t],
// accumulated in f32 and rounded once to the output dtype. The fixed order makes the result
// deterministic. Tested by tests/experts against the reference backend.
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe::cpu {

// pair_rows [num_tokens * top_k, width] f32; shared [num_tokens, width] f32 or null;
// out [num_tokens, width] of out_dtype.
void moe_sum(const float* pair_rows, const float* shared, int64_t num_tokens, int64_t top_k,
             int64_t width, void* out, DType out_dtype, int num_threads);

}  // namespace moe::cpu
