#include "kernels/cpu/grouped_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace moe::cpu {

namespace {

// Weight rows converted to f32 at a time; each is then dotted with every row of the A panel
// while it sits in L1.
constexpr int64_t kWeightRowsPerTile = 4;
// Output columns per work item: enough items that both cores share every expert even when a
// decode batch has a single block per expert.
constexpr int64_t kColumnsPerItem = 64;

// A dot product whose summation order is fixed by the code alone (kLanes partial sums, then
// the tail), not by the compiler's choice of vector width or alignment peeling: the same
// inputs give the same bits on every thread.
float dot(const float* a, const float* b, int64_t length) {
  constexpr int64_t kLanes = 16;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= length; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += a[i + l] * b[i + l];
  }
  float sum = 0.0f;
  for (int64_t l = 0; l < kLanes; ++l) sum += lanes[l];
  for (; i < length; ++i) sum += a[i] * b[i];
  return sum;
}

const char* row_address(const void* base, DType dtype, int64_t row, int64_t width) {
  return static_cast<const char*>(base) + row * width * static_cast<int64_t>(dtype_size(dtype));
}

// Converts the real rows of a block into an f32 panel [rows, k_dim]; returns the pair ids.
int64_t pack_a_panel(const GroupedGemmArgs& args, const int32_t* block_ids, float* panel,
                     int32_t* pairs) {
  int64_t rows = 0;
  for (int64_t i = 0; i < args.block_m; ++i) {
    const int32_t p = block_ids[i];
    if (p >= args.num_pairs) continue;
    float* dst = panel + rows * args.k_dim;
    convert_to_f32(row_address(args.a, args.a_dtype, p / args.a_row_divisor, args.k_dim),
                   args.a_dtype, dst, static_cast<size_t>(args.k_dim));
    if (args.a_scale) {
      const float scale = args.a_scale[p];
      for (int64_t k = 0; k < args.k_dim; ++k) dst[k] *= scale;
    }
    pairs[rows++] = p;
  }
  return rows;
}

void zero_block_columns(const GroupedGemmArgs& args, const int32_t* block_ids, int64_t n_begin,
                        int64_t n_end) {
  for (int64_t i = 0; i < args.block_m; ++i) {
    const int32_t p = block_ids[i];
    if (p >= args.num_pairs) continue;
    std::fill(args.c + p * args.n + n_begin, args.c + p * args.n + n_end, 0.0f);
  }
}

void run_item(const GroupedGemmArgs& args, int64_t block, int64_t n_begin, int64_t n_end,
              float* scratch) {
  const int32_t* block_ids = args.sorted_pair_ids + block * args.block_m;
  const int32_t expert = args.expert_ids[block];
  if (expert < 0) {
    zero_block_columns(args, block_ids, n_begin, n_end);
    return;
  }
  float* panel = scratch;                                  // [block_m, k_dim]
  float* weight_tile = panel + args.block_m * args.k_dim;  // [kWeightRowsPerTile, k_dim]
  int32_t pairs[kMaxBlockM];
  const int64_t rows = pack_a_panel(args, block_ids, panel, pairs);
  if (rows == 0) return;

  const int64_t expert_row0 = expert * args.n;
  const float* bias = args.bias ? args.bias + expert_row0 : nullptr;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += kWeightRowsPerTile) {
    const int64_t tile = std::min(kWeightRowsPerTile, n_end - n0);
    const float* w_rows[kWeightRowsPerTile];
    for (int64_t t = 0; t < tile; ++t) {
      const char* src = row_address(args.w, args.w_dtype, expert_row0 + n0 + t, args.k_dim);
      if (args.w_dtype == DType::kF32) {
        w_rows[t] = reinterpret_cast<const float*>(src);
      } else {
        convert_to_f32(src, args.w_dtype, weight_tile + t * args.k_dim,
                       static_cast<size_t>(args.k_dim));
        w_rows[t] = weight_tile + t * args.k_dim;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* a_row = panel + r * args.k_dim;
      const int32_t p = pairs[r];
      float* c_row = args.c + p * args.n;
      const float scale = args.out_scale ? args.out_scale[p] : 1.0f;
      for (int64_t t = 0; t < tile; ++t) {
        float value = dot(a_row, w_rows[t], args.k_dim);
        if (bias) value += bias[n0 + t];
        c_row[n0 + t] = value * scale;
      }
    }
  }
}

}  // namespace

int64_t grouped_gemm_scratch_floats(int64_t block_m, int64_t k_dim) {
  return (block_m + kWeightRowsPerTile) * k_dim;
}

void grouped_gemm(const GroupedGemmArgs& args, float* scratch, int num_threads) {
  const int64_t column_items = (args.n + kColumnsPerItem - 1) / kColumnsPerItem;
  const int64_t num_items = args.num_blocks * column_items;
  const int64_t scratch_per_thread = grouped_gemm_scratch_floats(args.block_m, args.k_dim);
#pragma omp parallel num_threads(num_threads)
  {
    float* mine = scratch + omp_get_thread_num() * scratch_per_thread;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const int64_t block = item / column_items;
      const int64_t n_begin = (item % column_items) * kColumnsPerItem;
      run_item(args, block, n_begin, std::min(n_begin + kColumnsPerItem, args.n), mine);
    }
  }
}

}  // namespace moe::cpu
