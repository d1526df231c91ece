// Work items are a block of up to TileKernel::max_rows tokens times a group of panel pairs: many
// tokens take every pair in one item (the router weight, 512 KiB for Qwen3-30B-A3B, stays in L2
// from one block to the next); few tokens split the pairs until every thread has items, so that
// in decode all threads stream the weight side by side. The kernel reads whole blocks of
// row_multiple rows, so the tokens past the last whole block come from a copy of that many rows.
#include "kernels/cpu/router_tiles.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/threads.h"
#include "moe/error.h"

namespace moe::cpu {
namespace {

constexpr int64_t kItemsPerThread = 2;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

PackedLayout router_layout(int64_t num_experts, int64_t hidden_size) {
  return plain_layout(DType::kBF16, num_experts, hidden_size);
}

}  // namespace

bool router_tiles_fit(int64_t hidden_size) {
  return hidden_size > 0 && hidden_size % kBf16KMultiple == 0;
}

Tensor pack_router_tiles(const void* weight, int64_t num_experts, int64_t hidden_size,
                         int num_threads) {
  const PackedLayout layout = router_layout(num_experts, hidden_size);
  Tensor packed(DType::kU8, {layout.bytes()});
  pack_matrices(layout, weight, 1, nullptr, packed.data<uint8_t>(), num_threads);
  return packed;
}

std::vector<uint16_t> router_tiles_tail_buffer(const TileKernel& kernel, int64_t hidden_size) {
  return std::vector<uint16_t>(static_cast<size_t>(kernel.row_multiple * hidden_size));
}

void router_logits_tiles(const TileKernel& kernel, const void* hidden, const void* packed,
                         const float* router_bias, int64_t num_tokens, int64_t hidden_size,
                         int64_t num_experts, std::vector<uint16_t>& tail, float* logits,
                         int num_threads) {
  if (num_tokens == 0) return;
  if (kernel.a_dtype != DType::kBF16 || kernel.max_rows > kPairWidth) {
    fail(
        "router_logits_tiles: kernel: expected a bf16 tile kernel of at most {} rows; got {} rows "
        "of {}",
        kPairWidth, kernel.max_rows, dtype_name(kernel.a_dtype));
  }
  if (!router_tiles_fit(hidden_size)) {
    fail("router_logits_tiles: hidden_size: expected a positive multiple of {}; got {}",
         kBf16KMultiple, hidden_size);
  }
  if (static_cast<int64_t>(tail.size()) < kernel.row_multiple * hidden_size) {
    fail(
        "router_logits_tiles: tail: expected at least {} elements ({} rows of hidden_size); got "
        "{}",
        kernel.row_multiple * hidden_size, kernel.row_multiple, tail.size());
  }
  const PackedLayout layout = router_layout(num_experts, hidden_size);
  const auto* rows = static_cast<const uint16_t*>(hidden);
  // Tokens [0, whole) in blocks of max_rows read from hidden; [whole, num_tokens) from `tail`.
  const int64_t whole = num_tokens / kernel.row_multiple * kernel.row_multiple;
  // The rows of `tail` past the tokens keep whatever an earlier call left there (zeros at first):
  // a tile row's sums depend on that row alone, and those rows' sums are not written out.
  if (whole < num_tokens) {
    std::memcpy(tail.data(), rows + whole * hidden_size,
                static_cast<size_t>((num_tokens - whole) * hidden_size) * sizeof(uint16_t));
  }
  const int64_t whole_blocks = ceil_div(whole, kernel.max_rows);
  const int64_t num_blocks = whole_blocks + (whole < num_tokens ? 1 : 0);
  // Always the caller's team size, even for fewer items than threads: threads.h says why.
  const int threads = resolve_num_threads(num_threads);
  const int64_t wanted_groups = ceil_div(threads * kItemsPerThread, num_blocks);
  const int64_t group_pairs =
      std::clamp<int64_t>(ceil_div(layout.num_pairs, wanted_groups), 1, layout.num_pairs);
  const int64_t num_groups = ceil_div(layout.num_pairs, group_pairs);
  const auto* weights = static_cast<const uint8_t*>(packed);
#pragma omp parallel num_threads(threads)
  {
    if (kernel.thread_begin) kernel.thread_begin();
    alignas(64) float acc[kPairWidth * kPairWidth];  // [max_rows <= 32, 32]
    // Consecutive items share their tokens, so a thread's static chunk reuses its hidden rows.
#pragma omp for schedule(static)
    for (int64_t item = 0; item < num_blocks * num_groups; ++item) {
      const bool from_tail = item / num_groups == whole_blocks;
      const int64_t row0 = from_tail ? whole : item / num_groups * kernel.max_rows;
      TileArgs t;
      t.a = from_tail ? tail.data() : rows + row0 * hidden_size;
      t.a_stride = hidden_size;
      t.rows = from_tail ? num_tokens - whole : std::min(kernel.max_rows, whole - row0);
      t.panel_bytes = layout.panel_bytes();
      t.k_begin = 0;
      t.k_end = layout.k_padded;
      t.acc = acc;
      const int64_t pair_end = std::min(layout.num_pairs, (item % num_groups + 1) * group_pairs);
      for (int64_t pair = item % num_groups * group_pairs; pair < pair_end; ++pair) {
        t.pair = weights + pair * layout.pair_bytes();
        kernel.run(t);
        const int64_t e0 = pair * kPairWidth;
        const int64_t experts = std::min(kPairWidth, num_experts - e0);
        for (int64_t r = 0; r < t.rows; ++r) {
          float* out = logits + (row0 + r) * num_experts + e0;
          for (int64_t c = 0; c < experts; ++c) {
            out[c] = router_bias ? acc[r * kPairWidth + c] + router_bias[e0 + c]
                                 : acc[r * kPairWidth + c];
          }
        }
      }
    }
    if (kernel.thread_end) kernel.thread_end();
  }
}

}  // namespace moe::cpu
