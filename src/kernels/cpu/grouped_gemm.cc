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

// Panel rows per micro-kernel step: with kWeightRowsPerTile weight rows that makes 12 vector
// accumulators, which fit the 16 vector registers of AVX2 beside the operands.
constexpr int kRowsPerStep = 3;
// Partial sums per dot product: one 8-lane vector. The summation order (8 strided partial sums,
// folded left to right, then the tail) is fixed by this code alone, and every output element is
// computed the same way whichever micro-kernel variant or thread computes it: results are
// bitwise independent of blocking and of the thread count.
constexpr int64_t kLanes = 8;
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));

Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);  // unaligned load
  return v;
}

// out[r][t] = a_rows[r] . w_rows[t] over k_dim, for kRows panel rows and kWeightRowsPerTile
// weight rows: each loaded weight vector feeds kRows FMAs, each panel vector feeds four.
// (The library is built with -ffp-contract=fast, so `acc + a * w` is one fused multiply-add.)
template <int kRows>
void dot_tile(const float* const* a_rows, const float* const* w_rows, int64_t k_dim,
              float out[][kWeightRowsPerTile]) {
  Lanes acc[kRows][kWeightRowsPerTile] = {};
  int64_t i = 0;
  for (; i + kLanes <= k_dim; i += kLanes) {
    Lanes w[kWeightRowsPerTile];
    for (int t = 0; t < kWeightRowsPerTile; ++t) w[t] = load_lanes(w_rows[t] + i);
    for (int r = 0; r < kRows; ++r) {
      const Lanes a = load_lanes(a_rows[r] + i);
      for (int t = 0; t < kWeightRowsPerTile; ++t) acc[r][t] += a * w[t];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int t = 0; t < kWeightRowsPerTile; ++t) {
      float sum = 0.0f;
      for (int64_t l = 0; l < kLanes; ++l) sum += acc[r][t][l];
      for (int64_t j = i; j < k_dim; ++j) sum += a_rows[r][j] * w_rows[t][j];
      out[r][t] = sum;
    }
  }
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
    const void* row = args.a_row_ptrs
                          ? args.a_row_ptrs[p]
                          : row_address(args.a, args.a_dtype, p / args.a_row_divisor, args.k_dim);
    convert_to_f32(row, args.a_dtype, dst, static_cast<size_t>(args.k_dim));
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
    // A short last tile repeats its first row; the extra results are not stored.
    for (int64_t t = tile; t < kWeightRowsPerTile; ++t) w_rows[t] = w_rows[0];
    for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerStep) {
      const int64_t step = std::min<int64_t>(kRowsPerStep, rows - r0);
      float results[kRowsPerStep][kWeightRowsPerTile];
      const float* a_rows[kRowsPerStep];
      for (int64_t r = 0; r < step; ++r) a_rows[r] = panel + (r0 + r) * args.k_dim;
      if (step == kRowsPerStep) {
        dot_tile<kRowsPerStep>(a_rows, w_rows, args.k_dim, results);
      } else {
        for (int64_t r = 0; r < step; ++r) dot_tile<1>(&a_rows[r], w_rows, args.k_dim, &results[r]);
      }
      for (int64_t r = 0; r < step; ++r) {
        const int32_t p = pairs[r0 + r];
        float* c_row = args.c + p * args.n;
        const float scale = args.out_scale ? args.out_scale[p] : 1.0f;
        for (int64_t t = 0; t < tile; ++t) {
          const float value = results[r][t] + (bias ? bias[n0 + t] : 0.0f);
          c_row[n0 + t] = value * scale;
        }
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
