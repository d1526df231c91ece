#include "kernels/cpu/moe_sum.h"

#include <algorithm>

namespace moe::cpu {

namespace {

// Columns summed at a time in a stack buffer (no allocation per call).
constexpr int64_t kColumnsPerChunk = 512;

}  // namespace

void moe_sum(const float* pair_rows, const float* const* pair_row_ptrs, const float* shared,
             int64_t num_tokens, int64_t top_k, int64_t width, void* out, DType out_dtype,
             int num_threads) {
  const int64_t out_bytes = static_cast<int64_t>(dtype_size(out_dtype));
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t t = 0; t < num_tokens; ++t) {
    float sum[kColumnsPerChunk];
    for (int64_t h0 = 0; h0 < width; h0 += kColumnsPerChunk) {
      const int64_t columns = std::min(kColumnsPerChunk, width - h0);
      std::fill(sum, sum + columns, 0.0f);
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t p = t * top_k + j;
        const float* row = (pair_row_ptrs ? pair_row_ptrs[p] : pair_rows + p * width) + h0;
        for (int64_t h = 0; h < columns; ++h) sum[h] += row[h];
      }
      if (shared) {
        const float* row = shared + t * width + h0;
        for (int64_t h = 0; h < columns; ++h) sum[h] += row[h];
      }
      convert_from_f32(sum, out_dtype, static_cast<char*>(out) + (t * width + h0) * out_bytes,
                       static_cast<size_t>(columns));
    }
  }
}

}  // namespace moe::cpu
