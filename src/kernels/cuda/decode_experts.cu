// The experts of a decode-size batch in one launch: the tiny batch's gemm1 and its gemm2 with the
// sum (tiny_gemm2_sum.cuh) as items of one grid. As two launches, a token's gemm2 waits for every
// token's gemm1; here it starts as soon as its own token's gemm1 is done, while the next token's
// still streams.
//
// - Items, in the order thread blocks take them from a counter (a block takes one): first the
//   gemm1 items, token by token (kGemm1ItemColumns columns of I for one pair, act written in pair
//   order, as the stream kernel's tiny batch does); then the gemm2 items, token by token
//   (kGemm2Columns columns of H for one token, as tiny_gemm2_sum's blocks). Every output is so the
//   same sum in the same order as the tiny batch's up to kTinySumMaxTokens, bit for bit.
// - A gemm2 item waits for its token's gemm1 items: a counter per token, raised after an item's
//   act values are fenced. Every gemm1 item is held by a running thread block before any gemm2
//   item is handed out, and a block with a gemm1 item never waits: the waits end whatever the
//   grid's residency.
// - The last thread block to finish sets the counters back to zero for the next launch, so a
//   CUDA graph replays the launch alone.
//
// On the H200 (docs/perf.md) it loses to the tiny batch's two launches: in one run Qwen3-30B-A3B
// at 1, 2 and 4 tokens 28.2-28.3, 46.0-46.1 and 83.9-84.0 us against 25.1-25.3, 43.6-43.8 and
// 74.0, DeepSeek-V3 180.8-181.6, 324.2-324.9 and 639.7-640.8 against 167.8-168.1,
// 320.0-320.2 and 587.7-588.2. (An earlier build won at 2 tokens on another machine, DeepSeek-V3
// 317-320 against 329-335, and lost there at 1 and 4.) Not for want of resident blocks: at 74
// registers 3 blocks of 8 warps fit a multiprocessor, and capped at 64 or 48 registers (4 or 5
// blocks) it was slower still at every size, Qwen3-30B-A3B's 1 token 30.0-30.3 and 35.3-35.5 us
// against 28.9. Loading a gemm2 item's first weights before its wait, into registers or into L2,
// was slower too.
#include <cuda_bf16.h>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/decode_experts.h"
#include "kernels/cuda/tiny_gemm2_sum.cuh"
#include "moe/error.h"

namespace moe::cuda {
namespace {

constexpr int kWarps = kTinySumMaxWarps;
constexpr int kThreads = kWarps * 32;
constexpr int kGemm1Columns = 2;  // per warp; 4 weight rows (gate and up), as the stream kernel
constexpr int kGemm1ItemColumns = kWarps * kGemm1Columns;
constexpr int kGemm2Columns = 4;  // per item, as tiny_gemm2_sum's blocks
constexpr int kNextItem = 0, kBlocksDone = 1, kTokenDone = 2;

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// act[pair][c] = silu(x . gate_c) * (x . up_c), x = hidden[pair / k], for this warp's
// kGemm1Columns columns of the item's column block; nothing for an id outside [0, E).
__device__ void gemm1_item(const DecodeArgs& a, int64_t pair, int64_t column_block) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t H = a.hidden_size, I = a.intermediate_size;
  const int32_t expert = a.topk_ids[pair];
  const int64_t first = column_block * kGemm1ItemColumns + warp * kGemm1Columns;
  if (expert < 0 || expert >= a.num_experts || first >= I) return;
  const auto* weights = static_cast<const __nv_bfloat16*>(a.w13) + expert * 2 * I * H;
  constexpr int kRows = 2 * kGemm1Columns;
  const __nv_bfloat16* row[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t column = first + i % kGemm1Columns;
    // Columns past I re-read the first row; their sums are never stored.
    const int64_t r = column < I ? (i < kGemm1Columns ? column : I + column) : 0;
    row[i] = weights + r * H;
  }
  const auto* x_row = static_cast<const __nv_bfloat16*>(a.hidden) + pair / a.top_k * H;

  float acc[kRows] = {};
#pragma unroll 2
  for (int64_t k = lane * 8; k < H; k += 32 * 8) {
    uint4 packed[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) packed[i] = load_bf16x8<true, true>(row[i], k, H);
    float x[8];
    bf16x8_to_float(load_bf16x8<true, false>(x_row, k, H), x);
    add_bf16x8_products(packed, x, acc);
  }
  auto* act = static_cast<__nv_bfloat16*>(a.act);
#pragma unroll
  for (int c = 0; c < kGemm1Columns; ++c) {
    const float gate = warp_sum(acc[c]), up = warp_sum(acc[kGemm1Columns + c]);
    if (lane == c && first + c < I) act[pair * I + first + c] = __float2bfloat16(silu(gate) * up);
  }
}

__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeArgs a) {
  __shared__ uint32_t item;
  if (threadIdx.x == 0) item = atomicAdd(a.sync + kNextItem, 1u);
  __syncthreads();

  const int64_t k = a.top_k;
  const int64_t gemm1_blocks = (a.intermediate_size + kGemm1ItemColumns - 1) / kGemm1ItemColumns;
  const int64_t token_items = k * gemm1_blocks;  // gemm1 items of one token
  const int64_t gemm1_items = a.num_tokens * token_items;
  if (item < gemm1_items) {
    // Token by token; within a token the pairs vary fastest, as the stream kernel's blocks do.
    const int64_t token = item / token_items, rest = item % token_items;
    gemm1_item(a, token * k + rest % k, rest / k);
    __threadfence();  // the act values, visible before the token's counter rises
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(a.sync + kTokenDone + token, 1u);
  } else {
    const int64_t gemm2_blocks = (a.hidden_size + kGemm2Columns - 1) / kGemm2Columns;
    const int64_t token = (item - gemm1_items) / gemm2_blocks;
    const int64_t column_block = (item - gemm1_items) % gemm2_blocks;
    while (load_acquire(a.sync + kTokenDone + token) < token_items) __nanosleep(32);
    const TinyGemm2SumArgs sum{
        a.act,        a.w2,    a.topk_weights, a.topk_ids,          a.num_experts,
        a.num_tokens, a.top_k, a.hidden_size,  a.intermediate_size, a.out};
    tiny_gemm2_sum_columns<kGemm2Columns, true, true>(sum, token, column_block * kGemm2Columns);
  }

  if (threadIdx.x == 0 && atomicAdd(a.sync + kBlocksDone, 1u) == gridDim.x - 1) {
    // Every other block has taken its item and read its last counter.
    a.sync[kNextItem] = 0;
    a.sync[kBlocksDone] = 0;
    for (int64_t t = 0; t < a.num_tokens; ++t) a.sync[kTokenDone + t] = 0;
  }
}

}  // namespace

void decode_experts(const DecodeArgs& args, cudaStream_t stream) {
  if (args.num_tokens < 0 || args.num_tokens > kDecodeMaxTokens) {
    fail("decode_experts: expected at most {} tokens; got {}", kDecodeMaxTokens, args.num_tokens);
  }
  if (args.hidden_size % 8 != 0 || args.intermediate_size % 8 != 0) {
    fail("decode_experts: expected H and I multiples of 8; got H {}, I {}", args.hidden_size,
         args.intermediate_size);
  }
  if (args.num_tokens == 0 || args.hidden_size == 0 || args.top_k == 0) return;
  const int64_t gemm1_blocks = (args.intermediate_size + kGemm1ItemColumns - 1) / kGemm1ItemColumns;
  const int64_t gemm2_blocks = (args.hidden_size + kGemm2Columns - 1) / kGemm2Columns;
  const int64_t items = args.num_tokens * (args.top_k * gemm1_blocks + gemm2_blocks);
  if (items >= int64_t{1} << 31) {
    fail("decode_experts: expected fewer than 2^31 items; got {} (H {}, I {}, k {})", items,
         args.hidden_size, args.intermediate_size, args.top_k);
  }
  decode_kernel<<<static_cast<unsigned>(items), kThreads, 0, stream>>>(args);
  check_launch("decode_experts");
}

}  // namespace moe::cuda
