// Router GEMM on the CPU: logits [M, E] = hidden [M, H] · weight [E, H]^T (+ bias), f32 math.
//
// Work is cut into fixed blocks of kBlockM tokens x kBlockE experts, one OpenMP task each, so
// the summation order never depends on the thread count. A block walks H in chunks of kBlockH
// columns: both operands of the chunk are converted to f32 once into stack buffers (zero-padded
// to whole register tiles and whole vectors) and then reused by every register tile of the block.
// Each (token, expert) pair keeps kLanes partial sums across chunks and adds them up at the end.
// Tested against the float64 reference in tests/routing/router_logits_test.cc.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/routing.h"
#include "kernels/cpu/threads.h"

namespace moe::cpu {
namespace {

// Partial sums per (token, expert): one AVX2 register. The vector extension lowers to any target,
// and the fixed lane count keeps the summation order the same on all of them.
constexpr int64_t kLanes = 8;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));

// Register tile: 1 token x 8 experts. Eight independent accumulators hide the FMA latency on two
// pipes; one token per tile means no padded tokens, which matters at decode batch sizes (M < 4).
constexpr int64_t kTileM = 1;
constexpr int64_t kTileE = 8;
constexpr int64_t kBlockM = 16;
constexpr int64_t kBlockE = 16;
constexpr int64_t kBlockH = 128;  // chunk width: both staged chunks (16 KiB) stay in L1

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Copies rows [row0, row0 + rows) x columns [h0, h0 + width) of `src` (rows of hidden_size
// elements of `dtype`) to f32 `dst` with row stride kBlockH. Columns up to padded_width and rows
// up to padded_rows are zero so the tiles below never need a remainder path; padded rows only
// feed accumulators that are never stored.
void stage(const void* src, DType dtype, int64_t hidden_size, int64_t row0, int64_t rows,
           int64_t padded_rows, int64_t h0, int64_t width, int64_t padded_width, float* dst) {
  const size_t element_size = dtype_size(dtype);
  for (int64_t r = 0; r < padded_rows; ++r) {
    float* row = dst + r * kBlockH;
    int64_t done = 0;
    if (r < rows) {
      const auto* first = static_cast<const char*>(src) +
                          static_cast<size_t>((row0 + r) * hidden_size + h0) * element_size;
      convert_to_f32(first, dtype, row, static_cast<size_t>(width));
      done = width;
    }
    std::fill(row + done, row + padded_width, 0.0f);
  }
}

// acc[i][j] += x row i · w row j over `width` columns (a multiple of kLanes), kept per lane.
inline void register_tile(const float* x, const float* w, int64_t width, Vec* acc,
                          int64_t acc_row_stride) {
  Vec a[kTileM][kTileE];
  for (int64_t i = 0; i < kTileM; ++i) {
    for (int64_t j = 0; j < kTileE; ++j) a[i][j] = acc[i * acc_row_stride + j];
  }
  for (int64_t h = 0; h < width; h += kLanes) {
    Vec wv[kTileE];
    for (int64_t j = 0; j < kTileE; ++j) wv[j] = load(w + j * kBlockH + h);
    for (int64_t i = 0; i < kTileM; ++i) {
      const Vec xv = load(x + i * kBlockH + h);
      for (int64_t j = 0; j < kTileE; ++j) a[i][j] += xv * wv[j];
    }
  }
  for (int64_t i = 0; i < kTileM; ++i) {
    for (int64_t j = 0; j < kTileE; ++j) acc[i * acc_row_stride + j] = a[i][j];
  }
}

float sum_lanes(Vec v) {
  float sum = 0;
  for (int64_t l = 0; l < kLanes; ++l) sum += v[l];
  return sum;
}

struct Problem {
  const void* hidden;
  DType hidden_dtype;
  const void* weight;
  DType weight_dtype;
  const float* router_bias;
  int64_t num_tokens;
  int64_t hidden_size;
  int64_t num_experts;
  float* logits;
};

void run_block(const Problem& p, int64_t m0, int64_t e0) {
  alignas(64) float x[kBlockM * kBlockH];  // [kBlockM, kBlockH] hidden chunk in f32
  alignas(64) float w[kBlockE * kBlockH];  // [kBlockE, kBlockH] weight chunk in f32
  Vec acc[kBlockM * kBlockE] = {};         // [kBlockM, kBlockE] per-lane partial sums

  const int64_t rows_m = std::min(kBlockM, p.num_tokens - m0);
  const int64_t rows_e = std::min(kBlockE, p.num_experts - e0);
  const int64_t padded_m = round_up(rows_m, kTileM);
  const int64_t padded_e = round_up(rows_e, kTileE);
  for (int64_t h0 = 0; h0 < p.hidden_size; h0 += kBlockH) {
    const int64_t width = std::min(kBlockH, p.hidden_size - h0);
    const int64_t padded_width = round_up(width, kLanes);
    stage(p.hidden, p.hidden_dtype, p.hidden_size, m0, rows_m, padded_m, h0, width, padded_width,
          x);
    stage(p.weight, p.weight_dtype, p.hidden_size, e0, rows_e, padded_e, h0, width, padded_width,
          w);
    for (int64_t i = 0; i < padded_m; i += kTileM) {
      for (int64_t j = 0; j < padded_e; j += kTileE) {
        register_tile(x + i * kBlockH, w + j * kBlockH, padded_width, acc + i * kBlockE + j,
                      kBlockE);
      }
    }
  }
  for (int64_t i = 0; i < rows_m; ++i) {
    for (int64_t j = 0; j < rows_e; ++j) {
      float logit = sum_lanes(acc[i * kBlockE + j]);
      if (p.router_bias) logit += p.router_bias[e0 + j];
      p.logits[(m0 + i) * p.num_experts + e0 + j] = logit;
    }
  }
}

}  // namespace

void router_logits(const void* hidden, DType hidden_dtype, const void* weight, DType weight_dtype,
                   const float* router_bias, int64_t num_tokens, int64_t hidden_size,
                   int64_t num_experts, float* logits, int num_threads) {
  const Problem problem{hidden,     hidden_dtype, weight,      weight_dtype, router_bias,
                        num_tokens, hidden_size,  num_experts, logits};
  const int64_t num_m_blocks = (num_tokens + kBlockM - 1) / kBlockM;
  const int64_t num_e_blocks = (num_experts + kBlockE - 1) / kBlockE;
  const int64_t num_blocks = num_m_blocks * num_e_blocks;
  if (num_blocks == 0) return;
  // Always the caller's team size, even for fewer blocks than threads: threads.h says why.
  const int threads = resolve_num_threads(num_threads);
  // Consecutive blocks share their tokens, so a thread's static chunk reuses its hidden rows.
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t b = 0; b < num_blocks; ++b) {
    run_block(problem, b / num_e_blocks * kBlockM, b % num_e_blocks * kBlockE);
  }
}

}  // namespace moe::cpu
