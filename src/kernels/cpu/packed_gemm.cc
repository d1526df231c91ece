#include "kernels/cpu/packed_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/cpu/cpu_tuning.h"
#include "kernels/cpu/epilogue_rows.h"

namespace moe::cpu {

namespace {

constexpr int64_t kCacheLine = 64;
constexpr int64_t kFloatsPerCacheLine = kCacheLine / sizeof(float);
int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// One thread's slice of PackedGemmWorkspace::thread_buffers.
struct ThreadBuffers {
  char* rows = nullptr;  // [row_capacity, a_stride] of the kernel's input dtype
  // [acc_pairs, row_capacity, 32]: the sums of one pair for every row, or of every pair of an
  // item while its k panels take turns (k_panel)
  float* acc = nullptr;
  float* convert = nullptr;  // [k]: one input row in f32 on its way to bf16
};

struct BufferShape {
  int64_t row_capacity = 0;
  int64_t a_stride = 0;
  int64_t row_bytes = 0;
  int64_t acc_pairs = 1;
  int64_t floats = 0;  // per thread, a multiple of a cache line
};

// The most bytes of a chunk's input rows the driver counts on L2 to keep while they meet every
// pair of an item: three quarters of a 2 MiB L2 (Sapphire Rapids' per core), the rest left to the
// weights. On the 2-core AMX VM (docs/perf.md, forty-second session) 1 MiB cost Qwen3-30B-A3B's
// 4096 tokens 2-9% (chunks of 257-320 rows of 4 KiB went through k in two panels), 2 MiB left
// Mixtral-8x7B's gemm1 rows (256 of 8 KiB) in one panel and its 1024 tokens about a third slower.
constexpr int64_t kRowsInL2Bytes = 3 << 19;

// Rows are padded to this: the largest row multiple of any kernel (two AMX tiles).
constexpr int64_t kRowPadding = 32;

BufferShape buffer_shape(int64_t max_chunk_rows, const PackedLayout& layout, DType a_dtype) {
  BufferShape s;
  s.row_capacity = round_up(max_chunk_rows, kRowPadding);
  // One spare cache line per row: rows a power of two apart would share L1 sets.
  const int64_t elem = static_cast<int64_t>(dtype_size(a_dtype));
  s.a_stride = layout.k_padded + kCacheLine / elem;
  s.row_bytes = s.a_stride * elem;
  // A chunk whose rows outgrow kRowsInL2Bytes keeps the sums of all its pairs (k_panel).
  if (s.row_capacity * s.row_bytes > kRowsInL2Bytes) s.acc_pairs = layout.num_pairs;
  const int64_t row_floats = round_up(s.row_capacity * s.row_bytes / 4, kFloatsPerCacheLine);
  s.floats = row_floats + s.acc_pairs * s.row_capacity * kPairWidth +
             round_up(layout.k, kFloatsPerCacheLine);
  return s;
}

ThreadBuffers carve(float* base, const BufferShape& s) {
  ThreadBuffers b;
  b.rows = reinterpret_cast<char*>(base);
  b.acc = base + round_up(s.row_capacity * s.row_bytes / 4, kFloatsPerCacheLine);
  b.convert = b.acc + s.acc_pairs * s.row_capacity * kPairWidth;
  return b;
}

// kPairBlockBytes of a pair, a multiple of bf16's k multiple (AMX tile depth).
int64_t default_k_block(const PackedLayout& layout) {
  const int64_t bytes_per_k = kPairWidth * static_cast<int64_t>(dtype_size(layout.dtype));
  return std::max<int64_t>(kPairBlockBytes / bytes_per_k / kBf16KMultiple, 1) * kBf16KMultiple;
}

// The k block of a chunk of `row_blocks` row blocks: default_k_block; the whole of k for a chunk
// short enough for the kernel's whole_k_row_blocks or long enough for its whole_k_from_row_blocks
// (TileKernel says when each pays); or MOE_CPU_KBLOCK (cpu_tuning.h).
int64_t k_block(const PackedLayout& layout, const TileKernel& kernel, int64_t row_blocks) {
  if (cpu_tuning().k_block > 0) return cpu_tuning().k_block;
  if (row_blocks <= kernel.whole_k_row_blocks) return layout.k_padded;
  if (kernel.whole_k_from_row_blocks > 0 && row_blocks >= kernel.whole_k_from_row_blocks) {
    return layout.k_padded;
  }
  return default_k_block(layout);
}

const char* input_row(const PackedGemmArgs& args, int32_t id) {
  if (args.a_row_ptrs) return static_cast<const char*>(args.a_row_ptrs[id]);
  const int64_t row = id / args.a_row_divisor;
  return static_cast<const char*>(args.a) +
         row * args.layout.k * static_cast<int64_t>(dtype_size(args.a_dtype));
}

// What the kernels read of the row buffer beyond the data: zero past each row's `used` bytes, and
// whole rows of zeros past the last up to the kernel's row multiple.
void zero_row_tails(int64_t num_rows, int64_t used, int64_t row_multiple, const BufferShape& s,
                    const ThreadBuffers& b) {
  for (int64_t r = 0; r < num_rows; ++r) {
    std::memset(b.rows + r * s.row_bytes + used, 0, static_cast<size_t>(s.row_bytes - used));
  }
  const int64_t padded = round_up(num_rows, row_multiple);
  std::memset(b.rows + num_rows * s.row_bytes, 0,
              static_cast<size_t>((padded - num_rows) * s.row_bytes));
}

// The chunk's rows, converted to the kernel's input dtype, zero past k and past the last row up
// to the kernel's row multiple.
void gather_rows(const PackedGemmArgs& args, const ExpertRows& chunk, DType kernel_dtype,
                 int64_t row_multiple, const BufferShape& s, const ThreadBuffers& b) {
  const int64_t k = args.layout.k;
  for (int64_t r = 0; r < chunk.num_rows; ++r) {
    const int32_t id = chunk.ids[r];
    const char* src = input_row(args, id);
    char* dst = b.rows + r * s.row_bytes;
    const float scale = args.a_scale ? args.a_scale[id] : 1.0f;
    if (kernel_dtype == args.a_dtype && !args.a_scale) {
      std::memcpy(dst, src, static_cast<size_t>(k) * dtype_size(kernel_dtype));
    } else if (kernel_dtype == DType::kF32) {
      float* row = reinterpret_cast<float*>(dst);
      convert_to_f32(src, args.a_dtype, row, static_cast<size_t>(k));
      if (args.a_scale) {
        for (int64_t i = 0; i < k; ++i) row[i] *= scale;
      }
    } else {
      convert_to_f32(src, args.a_dtype, b.convert, static_cast<size_t>(k));
      if (args.a_scale) {
        for (int64_t i = 0; i < k; ++i) b.convert[i] *= scale;
      }
      convert_from_f32(b.convert, kernel_dtype, dst, static_cast<size_t>(k));
    }
  }
  zero_row_tails(chunk.num_rows, k * static_cast<int64_t>(dtype_size(kernel_dtype)), row_multiple,
                 s, b);
}

// Where a gated epilogue stores row r of a chunk: out + ids[r] * stride elements of dtype. By
// default args.out at the chunk's own row ids; packed_mlp_prefill's rows go to a buffer of the
// chunk's rows in order instead (ids 0, 1, ...).
struct GatedOut {
  void* out = nullptr;
  int64_t stride = 0;
  DType dtype = DType::kF32;
  const int32_t* ids = nullptr;
};

// acc [chunk rows, 32] -> the outputs of the chunk's rows for pair `pair`. SiLU runs on the path's
// own build of epilogue_rows.h; the other activations row by row through gated_activation().
void gated_epilogue(const PackedGemmArgs& args, const ExpertKernels& kernels,
                    const ExpertRows& chunk, int64_t pair, const float* acc, const GatedOut* to) {
  const int64_t n = args.layout.n, intermediate = n / 2;
  const GatedOut dst = to ? *to : GatedOut{args.out, intermediate, args.out_dtype, chunk.ids};
  const int64_t i0 = pair * kPanelWidth;
  const int64_t width = std::min(kPanelWidth, intermediate - i0);
  float bias[kPairWidth] = {};  // gate, then up
  if (args.bias) {
    const float* expert_bias = args.bias + chunk.expert * n;
    std::copy(expert_bias + i0, expert_bias + i0 + width, bias);
    std::copy(expert_bias + intermediate + i0, expert_bias + intermediate + i0 + width,
              bias + kPanelWidth);
  }
  if (args.activation.activation == Activation::kSilu) {
    EpilogueArgs e;
    e.acc = acc;
    e.rows = chunk.num_rows;
    e.ids = dst.ids;
    e.bias = args.bias ? bias : nullptr;
    e.width = width;
    e.out = static_cast<char*>(dst.out) + i0 * static_cast<int64_t>(dtype_size(dst.dtype));
    e.out_stride = dst.stride;
    e.out_dtype = dst.dtype;
    (kernels.silu_rows ? kernels.silu_rows : &silu_rows<kBaselineLanes>)(e);
    return;
  }
  float gate[kPanelWidth], up[kPanelWidth], activated[kPanelWidth];
  const int64_t out_bytes = static_cast<int64_t>(dtype_size(dst.dtype));
  for (int64_t r = 0; r < chunk.num_rows; ++r) {
    const float* values = acc + r * kPairWidth;
    for (int64_t c = 0; c < width; ++c) {
      gate[c] = values[c] + bias[c];
      up[c] = values[kPanelWidth + c] + bias[kPanelWidth + c];
    }
    const int32_t id = dst.ids[r];
    gated_activation(args.activation, gate, up, width, activated);
    convert_from_f32(activated, dst.dtype,
                     static_cast<char*>(dst.out) + (id * dst.stride + i0) * out_bytes,
                     static_cast<size_t>(width));
  }
}

void plain_epilogue(const PackedGemmArgs& args, const ExpertKernels& kernels,
                    const ExpertRows& chunk, int64_t pair, const float* acc) {
  const int64_t n = args.layout.n;
  const int64_t n0 = pair * kPairWidth;
  const int64_t width = std::min(kPairWidth, n - n0);
  float bias[kPairWidth] = {};
  if (args.bias) {
    const float* expert_bias = args.bias + chunk.expert * n + n0;
    std::copy(expert_bias, expert_bias + width, bias);
  }
  EpilogueArgs e;
  e.acc = acc;
  e.rows = chunk.num_rows;
  e.ids = chunk.ids;
  e.bias = args.bias ? bias : nullptr;
  e.scale = args.out_scale;
  e.width = width;
  e.out = static_cast<char*>(args.out) + n0 * static_cast<int64_t>(dtype_size(args.out_dtype));
  e.out_stride = n;
  e.out_dtype = args.out_dtype;
  e.stream = args.stream_out;
  (kernels.scale_rows ? kernels.scale_rows : &scale_rows<kBaselineLanes>)(e);
}

// The epilogue of rows [r0, r0 + rows) of the chunk for pair `pair`, from their sums at acc.
void row_block_epilogue(const PackedGemmArgs& args, const ExpertKernels& kernels,
                        const ExpertRows& chunk, int64_t r0, int64_t rows, int64_t pair,
                        const float* acc, const GatedOut* gated_out) {
  const ExpertRows block{chunk.expert, static_cast<int32_t>(rows), chunk.ids + r0};
  if (!args.layout.gated) {
    plain_epilogue(args, kernels, block, pair, acc);
  } else if (gated_out == nullptr) {
    gated_epilogue(args, kernels, block, pair, acc, nullptr);
  } else {
    GatedOut to = *gated_out;
    to.ids += r0;
    gated_epilogue(args, kernels, block, pair, acc, &to);
  }
}

// The weights of one k block: the same slice of both panels of a pair.
struct BlockSpan {
  const uint8_t* panel0 = nullptr;
  const uint8_t* panel1 = nullptr;
  int64_t bytes = 0;  // of each panel; 0 = nothing
};

// Part `part` of `parts` of the span's cache lines. The driver spreads the next block's lines over
// the current block's row blocks, so the requests trickle out beside the arithmetic instead of
// stalling it in one burst.
BlockSpan span_part(const BlockSpan& span, int64_t part, int64_t parts) {
  const int64_t lines = span.bytes / kCacheLine;
  const int64_t first = lines * part / parts, end = lines * (part + 1) / parts;
  return {span.panel0 + first * kCacheLine, span.panel1 + first * kCacheLine,
          (end - first) * kCacheLine};
}

void prefetch_to_l2(const BlockSpan& span) {
  for (int64_t offset = 0; offset < span.bytes; offset += kCacheLine) {
    __builtin_prefetch(span.panel0 + offset, 0, 2);
    __builtin_prefetch(span.panel1 + offset, 0, 2);
  }
}

// A k range [begin, end) of every pair of an item, walked pair by pair (k_panel).
struct KRange {
  int64_t begin = 0, end = 0;
};

// The weights of the k block `ahead` blocks after block `block` (of the range's blocks) of pair
// `pair`, counting on through the item's later pairs in the same k range; empty past the item's
// end or when `ahead` is 0.
BlockSpan block_ahead(const PackedLayout& layout, const uint8_t* expert, const WorkItem& item,
                      const KRange& range, int64_t pair, int64_t block, int64_t k_step,
                      int64_t ahead) {
  BlockSpan span;
  const int64_t blocks_per_pair = (range.end - range.begin + k_step - 1) / k_step;
  const int64_t target = (pair - item.pair_begin) * blocks_per_pair + block + ahead;
  const int64_t target_pair = item.pair_begin + target / blocks_per_pair;
  if (ahead == 0 || target_pair >= item.pair_end) return span;
  const int64_t k0 = range.begin + target % blocks_per_pair * k_step;
  const int64_t bytes_per_k = kPanelWidth * static_cast<int64_t>(dtype_size(layout.dtype));
  span.panel0 = expert + target_pair * layout.pair_bytes() + k0 * bytes_per_k;
  span.panel1 = span.panel0 + layout.panel_bytes();
  span.bytes = (std::min(k0 + k_step, range.end) - k0) * bytes_per_k;
  return span;
}

// The k values of a panel: as many whole k blocks as keep the chunk's rows of that range within
// kRowsInL2Bytes, or the whole of k. Past it, the rows a chunk meets each pair with would leave L2
// before the next pair reads them (Mixtral-8x7B's gemm2 reads 28 KiB of k per row: 256 rows of it
// are 7 MiB), so each panel instead meets every pair of the item while its rows stay, and the
// pairs' sums wait in acc between panels. The k blocks and their order are the same either way,
// and so are the sums' bits.
int64_t k_panel(const PackedLayout& layout, const BufferShape& s, int64_t rows, int64_t k_step) {
  const int64_t row_bytes_per_k = s.row_bytes / s.a_stride;
  const int64_t padded_rows = round_up(rows, kRowPadding);
  if (padded_rows * layout.k_padded * row_bytes_per_k <= kRowsInL2Bytes) return layout.k_padded;
  const int64_t blocks = kRowsInL2Bytes / (padded_rows * row_bytes_per_k * k_step);
  return std::min(layout.k_padded, std::max<int64_t>(blocks, 1) * k_step);
}

// Sums of one pair for a whole chunk beyond which each row block's epilogue follows its last call
// (192 rows): half of a 48 KiB L1, which also holds the weight block and the rows. On the AMX host
// that took 5% less time at 4096 tokens and 3% at 16384 (chunks of 220-320 rows); done in every
// chunk it also took 1-2% more at 2048 (100-160 rows), where the sums stay in L1 anyway
// (docs/perf.md).
constexpr int64_t kChunkSumsInL1 = 24 * 1024;

// Streams the item's pairs from memory once: each k block of a pair is multiplied with every row
// block of the chunk while it sits in L1 (or in L2, when the block is the whole of k), the sums
// wait in acc, and the epilogue runs once the pair's last k block is done: over the whole chunk,
// or, when the chunk's sums outgrow kChunkSumsInL1, over each row block right after its last
// call, while the sums that call stored are still in L1. Meanwhile a later k block (block_ahead;
// the next pair, when blocks are the whole of k) is prefetched to L2: the chunk's row blocks give
// memory the time to deliver it. A chunk whose rows outgrow L2 goes through k in panels
// (k_panel), each over every pair of the item, with a pair's sums in its own slice of acc.
void run_item(const PackedGemmArgs& args, const ExpertKernels& kernels, const ExpertRows& chunk,
              const WorkItem& item, const BufferShape& s, const ThreadBuffers& b,
              const GatedOut* gated_out = nullptr) {
  const PackedLayout& layout = args.layout;
  const TileKernel& kernel = kernels.tile;
  const uint8_t* expert = args.experts[chunk.expert];
  const int64_t row_blocks = (chunk.num_rows + kernel.max_rows - 1) / kernel.max_rows;
  const int64_t chunk_k_block = k_block(layout, kernel, row_blocks);
  // Panels are whole blocks; a chunk that takes the whole of k in one block is cut in default ones.
  const int64_t panel =
      k_panel(layout, s, chunk.num_rows,
              chunk_k_block < layout.k_padded ? chunk_k_block : default_k_block(layout));
  const int64_t k_step = std::min(chunk_k_block, panel);
  const bool panels = panel < layout.k_padded;
  // The first row block over a k block reads the weights from memory or L2 and prefetches ahead
  // of its steps. A k block larger than the default (MOE_CPU_KBLOCK) leaves L1 between row blocks,
  // so every row block prefetches; the whole of k (TileKernel::whole_k_row_blocks and
  // whole_k_from_row_blocks) is in L2 for the later row blocks, whose hardware prefetcher follows
  // each panel's sequential loads.
  const bool whole_k = k_step >= layout.k_padded && cpu_tuning().k_block == 0;
  const bool block_fits_l1 =
      k_step * kPairWidth * static_cast<int64_t>(dtype_size(layout.dtype)) <= kPairBlockBytes;
  const bool short_chunk = row_blocks <= std::max<int64_t>(1, kernel.whole_k_row_blocks);
  const int64_t ahead_blocks = cpu_tuning().prefetch_blocks.value_or(
      short_chunk ? kernel.prefetch_blocks : kernel.prefill_prefetch_blocks);
  const bool epilogue_per_row_block =
      row_blocks * kernel.max_rows * kPairWidth * static_cast<int64_t>(sizeof(float)) >
      kChunkSumsInL1;
  for (KRange range{0, panel}; range.begin < layout.k_padded;
       range = {range.end, std::min(range.end + panel, layout.k_padded)}) {
    for (int64_t pair = item.pair_begin; pair < item.pair_end; ++pair) {
      float* const acc =
          b.acc + (panels ? (pair - item.pair_begin) * s.row_capacity * kPairWidth : 0);
      TileArgs t;
      t.a_stride = s.a_stride;
      t.pair = expert + pair * layout.pair_bytes();
      t.panel_bytes = layout.panel_bytes();
      for (int64_t k0 = range.begin; k0 < range.end; k0 += k_step) {
        t.k_begin = k0;
        t.k_end = std::min(k0 + k_step, range.end);
        t.accumulate = k0 > 0;
        const BlockSpan next = block_ahead(layout, expert, item, range, pair,
                                           (k0 - range.begin) / k_step, k_step, ahead_blocks);
        for (int64_t block = 0; block < row_blocks; ++block) {
          const int64_t r0 = block * kernel.max_rows;
          const BlockSpan ahead = span_part(next, block, row_blocks);
          if (kernel.spreads_prefetch) {
            t.ahead0 = ahead.panel0;
            t.ahead1 = ahead.panel1;
            t.ahead_bytes = ahead.bytes;
          } else {
            prefetch_to_l2(ahead);
          }
          t.rows = std::min(kernel.max_rows, chunk.num_rows - r0);
          t.a = b.rows + r0 * s.row_bytes;
          t.acc = acc + r0 * kPairWidth;
          t.prefetch = block == 0 || (!block_fits_l1 && !whole_k);
          kernel.run(t);
          if (epilogue_per_row_block && t.k_end == layout.k_padded) {
            row_block_epilogue(args, kernels, chunk, r0, t.rows, pair, t.acc, gated_out);
          }
        }
      }
      if (!epilogue_per_row_block && range.end == layout.k_padded) {
        row_block_epilogue(args, kernels, chunk, 0, chunk.num_rows, pair, acc, gated_out);
      }
    }
  }
}

WorkCosts work_costs(const PackedGemmArgs& args, const ExpertKernels& kernels,
                     int64_t rows_per_pass) {
  WorkCosts costs;
  costs.num_pairs = args.layout.num_pairs;
  costs.pair_bytes = static_cast<double>(args.layout.pair_bytes());
  costs.pair_flops_per_row = 2.0 * kPairWidth * static_cast<double>(args.layout.k);
  costs.flops_per_byte = kernels.flops_per_byte;
  costs.rows_per_pass = rows_per_pass;
  costs.row_multiple = kernels.tile.max_rows;
  return costs;
}

int64_t total_rows(const ExpertRows* groups, int64_t num_groups) {
  int64_t rows = 0;
  for (int64_t g = 0; g < num_groups; ++g) rows += groups[g].num_rows;
  return rows;
}

// The most rows a chunk of these groups can hold, however they are routed: buffers sized for it
// make batches no larger than one seen before allocate nothing.
int64_t max_chunk_rows(const ExpertRows* groups, int64_t num_groups, const WorkCosts& costs) {
  return std::min(total_rows(groups, num_groups),
                  round_up(costs.rows_per_pass, costs.row_multiple));
}

// Clears the flag of every chunk that `items` (listed chunk by chunk) cut into several items.
void clear_chunks_of_several_items(const std::vector<WorkItem>& items,
                                   std::vector<uint8_t>& flags) {
  for (size_t i = 0; i < items.size(); ++i) {
    const bool alone = (i == 0 || items[i - 1].chunk != items[i].chunk) &&
                       (i + 1 == items.size() || items[i + 1].chunk != items[i].chunk);
    if (!alone) flags[static_cast<size_t>(items[i].chunk)] = 0;
  }
}

// The workspace's per-thread buffers, `floats` for each thread; returns the first thread's slice.
// Each slice starts on a cache line (floats is a multiple of one).
float* thread_slices(PackedGemmWorkspace& ws, int num_threads, int64_t floats) {
  const int64_t needed = num_threads * floats + kFloatsPerCacheLine;
  if (static_cast<int64_t>(ws.thread_buffers.size()) < needed) {
    ws.thread_buffers.resize(static_cast<size_t>(needed));
  }
  const auto address = reinterpret_cast<uintptr_t>(ws.thread_buffers.data());
  return ws.thread_buffers.data() +
         (round_up(static_cast<int64_t>(address), 64) - static_cast<int64_t>(address)) / 4;
}

// Whether packed_mlp_prefill may keep gemm2's rows to itself: gemm2 reads gemm1's outputs by row
// id, unscaled, and gemm1 stores them in the kernels' input dtype, so the rows gemm2 would gather
// are bit for bit the ones gemm1 computed.
bool down_reads_up_rows(const PackedGemmArgs& up, const PackedGemmArgs& down,
                        const ExpertKernels& kernels) {
  return up.layout.gated && up.out_dtype == kernels.tile.a_dtype && down.a == up.out &&
         down.a_dtype == up.out_dtype && down.a_row_divisor == 1 && down.a_row_ptrs == nullptr &&
         down.a_scale == nullptr && down.layout.k == up.layout.n / 2;
}

// Runs ws.items (of the chunks ws.chunks) of `up` on num_threads threads, each thread gathering a
// chunk's rows once per run of that chunk's items. With `down`, a chunk flagged in ws.whole then
// runs every pair of `down` on the same thread, from the rows up's epilogue wrote into the
// thread's second buffer (packed_mlp_prefill).
void run_items(const PackedGemmArgs& up, const PackedGemmArgs* down, const ExpertKernels& kernels,
               int64_t max_rows, PackedGemmWorkspace& ws, int num_threads) {
  const DType kernel_dtype = kernels.tile.a_dtype;
  const int64_t row_multiple = kernels.tile.row_multiple;
  const BufferShape up_shape = buffer_shape(max_rows, up.layout, kernel_dtype);
  const BufferShape down_shape =
      down ? buffer_shape(max_rows, down->layout, kernel_dtype) : BufferShape{};
  const int64_t floats = up_shape.floats + down_shape.floats;
  float* base = thread_slices(ws, num_threads, floats);
  if (down && static_cast<int64_t>(ws.row_order.size()) < max_rows) {
    ws.row_order.resize(static_cast<size_t>(max_rows));
    std::iota(ws.row_order.begin(), ws.row_order.end(), 0);
  }
  const int64_t down_used = up.layout.n / 2 * static_cast<int64_t>(dtype_size(kernel_dtype));

  const int64_t num_items = static_cast<int64_t>(ws.items.size());
#pragma omp parallel num_threads(num_threads)
  {
    float* slice = base + omp_get_thread_num() * floats;
    const ThreadBuffers up_rows = carve(slice, up_shape);
    const ThreadBuffers down_rows = carve(slice + up_shape.floats, down_shape);
    const GatedOut to_down_rows{down_rows.rows, down_shape.a_stride, kernel_dtype,
                                ws.row_order.data()};
    if (kernels.tile.thread_begin) kernels.tile.thread_begin();
    int32_t gathered_chunk = -1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_items; ++i) {
      const WorkItem& item = ws.items[i];
      const ExpertRows& chunk = ws.chunks[item.chunk];
      if (item.chunk != gathered_chunk) {
        gather_rows(up, chunk, kernel_dtype, row_multiple, up_shape, up_rows);
        gathered_chunk = item.chunk;
      }
      if (!down || !ws.whole[static_cast<size_t>(item.chunk)]) {
        run_item(up, kernels, chunk, item, up_shape, up_rows);
        continue;
      }
      // gemm1's outputs become gemm2's rows here, in chunk order, and stay in this core's
      // caches: cache2 is neither written nor gathered for this chunk.
      zero_row_tails(chunk.num_rows, down_used, row_multiple, down_shape, down_rows);
      run_item(up, kernels, chunk, item, up_shape, up_rows, &to_down_rows);
      const WorkItem all_pairs{item.chunk, 0, static_cast<int32_t>(down->layout.num_pairs)};
      run_item(*down, kernels, chunk, all_pairs, down_shape, down_rows);
    }
    if (kernels.tile.thread_end) kernels.tile.thread_end();
  }
}

}  // namespace

void packed_gemm(const PackedGemmArgs& args, const ExpertRows* groups, int64_t num_groups,
                 const ExpertKernels& kernels, int64_t rows_per_pass, PackedGemmWorkspace& ws,
                 int num_threads) {
  const WorkCosts costs = work_costs(args, kernels, rows_per_pass);
  split_work(groups, num_groups, costs, num_threads, ws.chunks, ws.items);
  if (ws.items.empty()) return;
  run_items(args, nullptr, kernels, max_chunk_rows(groups, num_groups, costs), ws, num_threads);
}

void packed_mlp_prefill(const PackedGemmArgs& up, const PackedGemmArgs& down,
                        const ExpertRows* groups, int64_t num_groups, const ExpertKernels& kernels,
                        int64_t rows_per_pass, PackedGemmWorkspace& ws, int num_threads,
                        std::vector<ExpertRows>& rest) {
  const WorkCosts up_costs = work_costs(up, kernels, rows_per_pass);
  const WorkCosts down_costs = work_costs(down, kernels, rows_per_pass);
  split_work(groups, num_groups, up_costs, num_threads, ws.chunks, ws.items);
  split_work(groups, num_groups, down_costs, num_threads, ws.down_chunks, ws.down_items);
  // The same rows per pass and row multiple make the same chunks for both. A chunk is run whole
  // (both GEMMs on one thread) when each split made it a single item.
  const size_t num_chunks = ws.chunks.size();
  const size_t chunk_bound = static_cast<size_t>(
      num_groups + total_rows(groups, num_groups) / std::max<int64_t>(rows_per_pass, 1));
  ws.whole.reserve(chunk_bound);
  rest.reserve(chunk_bound);
  ws.whole.assign(num_chunks, down_reads_up_rows(up, down, kernels) ? 1 : 0);
  clear_chunks_of_several_items(ws.items, ws.whole);
  clear_chunks_of_several_items(ws.down_items, ws.whole);
  rest.clear();
  for (size_t c = 0; c < num_chunks; ++c) {
    if (!ws.whole[c]) rest.push_back(ws.chunks[c]);
  }
  if (ws.items.empty()) return;
  run_items(up, &down, kernels, max_chunk_rows(groups, num_groups, up_costs), ws, num_threads);
}

}  // namespace moe::cpu
