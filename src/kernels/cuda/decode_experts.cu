// The experts of a decode-size batch in one launch. At a few tokens the layer is its weights read
// from HBM; as three launches (gemm1, gemm2, sum) each pays a ramp-up and a drain, and the
// tiny-batch path reads an expert's weights once for every pair that chose it.
//
// - Slots. Each thread block numbers the batch's distinct (expert, repeat) keys in order of first
//   appearance, a thread per pair: a slot is one expert and the tokens that chose it (a token that
//   names an expert twice gets a second slot, so a slot has at most one row per token).
// - Items, taken in order from a counter as thread blocks finish their last: first, for each
//   slot, its gemm1 items (16 columns of I over the slot's rows, act written in pair order); then
//   the gemm2 items (8 columns of H, all slots: each warp takes every fourth slot and leaves
//   weight * (act . w2) of each pair in shared memory; a token's pairs are then added in its own
//   order). An output element is so the same sum in the same order on every run, whatever the
//   other tokens chose, and no cache3 or sum launch is needed.
// - A gemm2 warp waits for the gemm1 items of each slot it reads: a counter per slot, raised
//   after the item's act rows are fenced. Items are taken in order, so every gemm1 item is held
//   by a running thread block before any gemm2 item is handed out, and a thread block that holds
//   a gemm1 item never waits: the waits end whatever the grid's residency.
// - The last thread block to finish sets the counters back to zero for the next launch, so a
//   CUDA graph replays the launch alone.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/decode_experts.h"
#include "moe/error.h"

namespace moe::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
static_assert(kThreads >= kDecodeMaxPairs, "a thread per pair numbers the slots");
constexpr int kGemm1Columns = 4;  // per warp; 8 weight rows (gate and up)
constexpr int kGemm1ItemColumns = kWarps * kGemm1Columns;
constexpr int kGemm2ItemColumns = 8;  // every warp, its share of the slots
constexpr int kBlocksPerMultiprocessor = 4;
constexpr int kNextItem = 0, kBlocksDone = 1, kSlotDone = 2;

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// Act rows are written during the launch by other thread blocks: read them through L2.
__device__ __forceinline__ uint4 load_act(const __nv_bfloat16* row, int64_t k) {
  return __ldcg(reinterpret_cast<const uint4*>(row + k));
}

struct Slots {
  int32_t expert[kDecodeMaxPairs];
  int32_t rows[kDecodeMaxPairs];                   // pairs of the slot
  int32_t row[kDecodeMaxPairs][kDecodeMaxTokens];  // their ids, in token order
  int32_t slot_of_pair[kDecodeMaxPairs];           // -1: an id outside [0, E)
  int32_t count;
};

// Fills `slots` from the ids (every thread of the block takes part).
__device__ void number_slots(const DecodeArgs& a, Slots& slots) {
  __shared__ int32_t ids[kThreads], repeat[kThreads], slot_of_leader[kThreads];
  __shared__ int32_t leaders_of_warp[kWarps];
  const int i = threadIdx.x, lane = i % 32, warp = i / 32;
  const int num_pairs = static_cast<int>(a.num_tokens * a.top_k), k = static_cast<int>(a.top_k);
  int32_t id = -1;
  if (i < num_pairs) {
    id = a.topk_ids[i];
    if (id < 0 || id >= a.num_experts) id = -1;
  }
  ids[i] = id;
  slots.rows[i] = 0;
  __syncthreads();
  int r = 0;
  if (id >= 0) {
    for (int j = i / k * k; j < i; ++j) r += ids[j] == id;
  }
  repeat[i] = r;
  __syncthreads();
  int leader = i;
  if (id >= 0) {
    for (int j = 0; j < i; ++j) {
      if (ids[j] == id && repeat[j] == r) {
        leader = j;
        break;
      }
    }
  }
  const bool leads = id >= 0 && leader == i;
  const unsigned ballot = __ballot_sync(0xffffffffu, leads);
  if (lane == 0) leaders_of_warp[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? leaders_of_warp[w] : 0;
    total += leaders_of_warp[w];
  }
  slot_of_leader[i] = leads ? before + __popc(ballot & ((1u << lane) - 1)) : -1;
  if (i == 0) slots.count = total;
  __syncthreads();
  const int slot = id >= 0 ? slot_of_leader[leader] : -1;
  slots.slot_of_pair[i] = slot;
  if (leads) slots.expert[slot] = id;
  __syncthreads();
  if (slot >= 0) {
    int row = 0;  // pairs come in token order, so rows do too
    for (int j = 0; j < i; ++j) row += slots.slot_of_pair[j] == slot;
    slots.row[slot][row] = i;
    atomicAdd(&slots.rows[slot], 1);
  }
  __syncthreads();
}

// act[p][c] = silu(x . gate_c) * (x . up_c) for the slot's pairs p (x = hidden[p / k]) and this
// warp's kGemm1Columns columns c of the item's column block. One row at a time: few registers,
// so more warps in flight; decode batches rarely give an expert a second row, whose pass then
// finds the weights in L2.
__device__ void gemm1_item(const DecodeArgs& a, const Slots& slots, int slot, int64_t block) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t H = a.hidden_size, I = a.intermediate_size;
  const int64_t first = block * kGemm1ItemColumns + warp * kGemm1Columns;
  if (first >= I) return;
  const auto* weights = static_cast<const __nv_bfloat16*>(a.w13) + slots.expert[slot] * 2 * I * H;
  const __nv_bfloat16* row[2 * kGemm1Columns];
#pragma unroll
  for (int i = 0; i < 2 * kGemm1Columns; ++i) {
    const int64_t column = first + i % kGemm1Columns;
    // Columns past I re-read the first row; their sums are never stored.
    const int64_t r = column < I ? (i < kGemm1Columns ? column : I + column) : 0;
    row[i] = weights + r * H;
  }
  const auto* hidden = static_cast<const __nv_bfloat16*>(a.hidden);
  auto* act = static_cast<__nv_bfloat16*>(a.act);

  for (int r = 0; r < slots.rows[slot]; ++r) {
    const int32_t pair = slots.row[slot][r];
    const __nv_bfloat16* x_row = hidden + pair / a.top_k * H;
    float acc[2 * kGemm1Columns] = {};
#pragma unroll 2
    for (int64_t k = lane * 8; k < H; k += 32 * 8) {
      uint4 packed[2 * kGemm1Columns];
#pragma unroll
      for (int i = 0; i < 2 * kGemm1Columns; ++i) {
        packed[i] = load_bf16x8<true, true>(row[i], k, H);
      }
      float x[8];
      bf16x8_to_float(load_bf16x8<true, false>(x_row, k, H), x);
      add_bf16x8_products(packed, x, acc);
    }
#pragma unroll
    for (int i = 0; i < 2 * kGemm1Columns; ++i) acc[i] = warp_sum(acc[i]);
#pragma unroll
    for (int c = 0; c < kGemm1Columns; ++c) {
      if (lane == c && first + c < I) {
        act[pair * I + first + c] = __float2bfloat16(silu(acc[c]) * acc[kGemm1Columns + c]);
      }
    }
  }
}

// out[t][c] = sum over j of weight(t, j) * (act[t k + j] . w2[expert][c]) for the item's
// kGemm2ItemColumns columns c. Each warp takes slots warp, warp + kWarps, ... and puts each of
// their pairs' products in `products`; the sum then adds a token's pairs in the order j, as the
// sum kernel does, so a token's output depends on its own pairs only.
__device__ void gemm2_item(const DecodeArgs& a, const Slots& slots, uint32_t gemm1_blocks,
                           int64_t block, float (&products)[kDecodeMaxPairs][kGemm2ItemColumns]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t H = a.hidden_size, I = a.intermediate_size;
  const int64_t first = block * kGemm2ItemColumns;
  const auto* act = static_cast<const __nv_bfloat16*>(a.act);

  for (int slot = warp; slot < slots.count; slot += kWarps) {
    const auto* weights = static_cast<const __nv_bfloat16*>(a.w2) + slots.expert[slot] * H * I;
    while (load_acquire(a.sync + kSlotDone + slot) < gemm1_blocks) __nanosleep(64);
    const __nv_bfloat16* row[kGemm2ItemColumns];
#pragma unroll
    for (int c = 0; c < kGemm2ItemColumns; ++c) {
      row[c] = weights + (first + c < H ? first + c : 0) * I;  // past H: never stored
    }
    for (int r = 0; r < slots.rows[slot]; ++r) {
      const int32_t pair = slots.row[slot][r];
      const __nv_bfloat16* x_row = act + pair * I;
      float acc[kGemm2ItemColumns] = {};
#pragma unroll 2
      for (int64_t k = lane * 8; k < I; k += 32 * 8) {
        uint4 packed[kGemm2ItemColumns];
#pragma unroll
        for (int c = 0; c < kGemm2ItemColumns; ++c) {
          packed[c] = load_bf16x8<true, true>(row[c], k, I);
        }
        float x[8];
        bf16x8_to_float(load_act(x_row, k), x);
        add_bf16x8_products(packed, x, acc);
      }
      const float weight = a.topk_weights[pair];
#pragma unroll
      for (int c = 0; c < kGemm2ItemColumns; ++c) {
        acc[c] = warp_sum(acc[c]);
        if (lane == c) products[pair][c] = weight * acc[c];
      }
    }
  }
  __syncthreads();
  const int c = threadIdx.x % kGemm2ItemColumns, t = threadIdx.x / kGemm2ItemColumns;
  if (t < a.num_tokens && first + c < H) {
    float sum = 0.0f;
    for (int64_t j = 0; j < a.top_k; ++j) {
      const int64_t pair = t * a.top_k + j;
      if (slots.slot_of_pair[pair] >= 0) sum += products[pair][c];
    }
    static_cast<__nv_bfloat16*>(a.out)[t * H + first + c] = __float2bfloat16(sum);
  }
}

__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeArgs a) {
  static_assert(kDecodeMaxTokens * kGemm2ItemColumns <= kThreads,
                "a thread per output of a gemm2 item");
  __shared__ Slots slots;
  __shared__ float products[kDecodeMaxPairs][kGemm2ItemColumns];
  __shared__ uint32_t next_item;
  number_slots(a, slots);

  const auto gemm1_blocks =
      static_cast<uint32_t>((a.intermediate_size + kGemm1ItemColumns - 1) / kGemm1ItemColumns);
  const uint32_t gemm1_items = static_cast<uint32_t>(slots.count) * gemm1_blocks;
  const auto items = gemm1_items + static_cast<uint32_t>((a.hidden_size + kGemm2ItemColumns - 1) /
                                                         kGemm2ItemColumns);
  if (threadIdx.x == 0) next_item = atomicAdd(a.sync + kNextItem, 1u);
  __syncthreads();
  uint32_t item = next_item;
  while (item < items) {
    __syncthreads();  // every thread has read next_item
    // Ask for the next item now: the atomic's round trip overlaps this item's loads.
    if (threadIdx.x == 0) next_item = atomicAdd(a.sync + kNextItem, 1u);
    if (item < gemm1_items) {
      const int slot = static_cast<int>(item / gemm1_blocks);
      gemm1_item(a, slots, slot, item % gemm1_blocks);
      __threadfence();  // the act rows, visible before the slot's counter rises
      __syncthreads();
      if (threadIdx.x == 0) atomicAdd(a.sync + kSlotDone + slot, 1u);
    } else {
      gemm2_item(a, slots, gemm1_blocks, item - gemm1_items, products);
    }
    __syncthreads();
    item = next_item;
  }

  if (threadIdx.x == 0 && atomicAdd(a.sync + kBlocksDone, 1u) == gridDim.x - 1) {
    // Every other block has taken its last item and read its last counter.
    a.sync[kNextItem] = 0;
    a.sync[kBlocksDone] = 0;
    for (int slot = 0; slot < slots.count; ++slot) a.sync[kSlotDone + slot] = 0;
  }
}

void launch(const DecodeArgs& args, cudaStream_t stream) {
  constexpr auto kernel = decode_kernel;
  int device = 0, multiprocessors = 0, per_multiprocessor = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute(multiprocessors)");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, kThreads, 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor(decode_kernel)");
  if (args.max_multiprocessors > 0) {
    multiprocessors = std::min(multiprocessors, args.max_multiprocessors);
  }
  const int blocks =
      std::max(1, multiprocessors * std::min(per_multiprocessor, kBlocksPerMultiprocessor));
  kernel<<<blocks, kThreads, 0, stream>>>(args);
}

}  // namespace

void decode_experts(const DecodeArgs& args, cudaStream_t stream) {
  if (args.num_tokens < 0 || args.num_tokens > kDecodeMaxTokens ||
      args.num_tokens * args.top_k > kDecodeMaxPairs) {
    fail("decode_experts: expected at most {} tokens and {} pairs; got {} tokens, {} pairs",
         kDecodeMaxTokens, kDecodeMaxPairs, args.num_tokens, args.num_tokens * args.top_k);
  }
  if (args.hidden_size % 8 != 0 || args.intermediate_size % 8 != 0) {
    fail("decode_experts: expected H and I multiples of 8; got H {}, I {}", args.hidden_size,
         args.intermediate_size);
  }
  if (args.num_tokens == 0) return;
  launch(args, stream);
  check_launch("decode_experts");
}

}  // namespace moe::cuda
