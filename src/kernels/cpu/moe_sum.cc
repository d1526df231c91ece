#include "kernels/cpu/moe_sum.h"

#include <algorithm>
#include <cstring>

#include "moe/error.h"

namespace moe::cpu {

namespace {

// Columns summed at a time in a stack buffer (no allocation per call).
constexpr int64_t kColumnsPerChunk = 512;

// sum[h] += row[h] for `columns` values; plain loops the compiler vectorizes at the library's
// width. A bf16 value is the top half of its f32, so widening is a 16-bit shift.
void add_row(float* sum, const float* row, int64_t columns) {
  for (int64_t h = 0; h < columns; ++h) sum[h] += row[h];
}

void add_row(float* sum, const uint16_t* row, int64_t columns) {
  for (int64_t h = 0; h < columns; ++h) {
    const uint32_t bits = uint32_t{row[h]} << 16;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    sum[h] += value;
  }
}

void prefetch_to_l2(const void* begin, size_t bytes) {
  for (size_t offset = 0; offset < bytes; offset += 64) {
    __builtin_prefetch(static_cast<const char*>(begin) + offset, 0, 2);
  }
}

template <typename Row>
void sum_rows(const Row* pair_rows, const void* const* pair_row_ptrs, const float* shared,
              int64_t num_tokens, int64_t top_k, int64_t width, void* out, DType out_dtype,
              int num_threads) {
  const int64_t out_bytes = static_cast<int64_t>(dtype_size(out_dtype));
  const auto row_of = [&](int64_t p) {
    return pair_row_ptrs ? static_cast<const Row*>(pair_row_ptrs[p]) : pair_rows + p * width;
  };
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t t = 0; t < num_tokens; ++t) {
    float sum[kColumnsPerChunk];
    for (int64_t h0 = 0; h0 < width; h0 += kColumnsPerChunk) {
      const int64_t columns = std::min(kColumnsPerChunk, width - h0);
      std::fill(sum, sum + columns, 0.0f);
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t p = t * top_k + j;
        add_row(sum, row_of(p) + h0, columns);
        // The same columns of the next token's row, one token ahead: a chunk reads k rows a few
        // hundred bytes at a time, which the hardware prefetcher follows poorly. At 4096 tokens
        // of Qwen3-30B-A3B the sum took 7.3-9.7 instead of 10.6-12.1 ms on the AVX2 VM, and
        // 8.7-12.8 instead of 11.2-14.7 ms on the AMX host (docs/perf.md).
        if (t + 1 < num_tokens) prefetch_to_l2(row_of(p + top_k) + h0, columns * sizeof(Row));
      }
      if (shared) add_row(sum, shared + t * width + h0, columns);
      convert_from_f32(sum, out_dtype, static_cast<char*>(out) + (t * width + h0) * out_bytes,
                       static_cast<size_t>(columns));
    }
  }
}

}  // namespace

void moe_sum(const void* pair_rows, const void* const* pair_row_ptrs, DType rows_dtype,
             const float* shared, int64_t num_tokens, int64_t top_k, int64_t width, void* out,
             DType out_dtype, int num_threads) {
  switch (rows_dtype) {
    case DType::kF32:
      sum_rows(static_cast<const float*>(pair_rows), pair_row_ptrs, shared, num_tokens, top_k,
               width, out, out_dtype, num_threads);
      return;
    case DType::kBF16:
      sum_rows(static_cast<const uint16_t*>(pair_rows), pair_row_ptrs, shared, num_tokens, top_k,
               width, out, out_dtype, num_threads);
      return;
    default:
      break;
  }
  fail("moe_sum: unsupported pair row dtype: {} (expected f32 or bf16)", dtype_name(rows_dtype));
}

}  // namespace moe::cpu
