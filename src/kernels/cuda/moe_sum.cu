// One thread per 8 output elements of a token. Each pair's row is only read when its expert was
// computed here, so rows of skipped pairs (ids out of range, experts of other ranks) need no
// zeroing and one bad id never touches another token.
#include <cuda_bf16.h>

#include "kernels/cuda/alignment.h"
#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/moe_sum.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 128;

__device__ bool pair_computed(const SumArgs& a, int32_t id) {
  if (id < 0 || id >= a.num_experts) return false;
  if (a.expert_map == nullptr) return true;
  const int32_t local = a.expert_map[id];
  return local >= 0 && local < a.num_local_experts;
}

// Pairs whose loads are issued together: the ids of a group first, then their rows, so that a
// token's k rows cost two round trips to L2 per group instead of two per pair.
constexpr int kGroup = 8;

template <bool kAligned>
__global__ void __launch_bounds__(kThreads) sum_kernel(SumArgs a) {
  const int64_t token = blockIdx.y;
  const int64_t h = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 8;
  const int64_t H = a.hidden_size;
  if (h >= H) return;
  const auto* cache3 = static_cast<const __nv_bfloat16*>(a.cache3);
  float sum[8] = {};
  for (int64_t j0 = 0; j0 < a.top_k; j0 += kGroup) {
    bool computed[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int64_t pair = token * a.top_k + j0 + j;
      computed[j] = j0 + j < a.top_k && pair_computed(a, a.topk_ids[pair]);
    }
    uint4 rows[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int64_t pair = token * a.top_k + j0 + j;
      // A skipped pair's row is never read: its size reads as 0, so the load yields zeros.
      rows[j] = load_bf16x8<kAligned, true>(cache3 + pair * H, h, computed[j] ? H : 0);
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (!computed[j]) continue;
      float row[8];
      bf16x8_to_float(rows[j], row);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += row[e];
    }
  }
  auto* out = static_cast<__nv_bfloat16*>(a.out) + token * H;
  if constexpr (kAligned) {
    // One 16-byte store, where eight 2-byte stores would each span the warp's whole 512 bytes.
    uint4 packed;
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(sum[2 * i], sum[2 * i + 1]);
    *reinterpret_cast<uint4*>(out + h) = packed;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (h + e < H) out[h + e] = __float2bfloat16(sum[e]);
    }
  }
}

}  // namespace

void moe_sum(const SumArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return;
  const int64_t per_block = kThreads * 8;
  const dim3 grid(static_cast<unsigned>((args.hidden_size + per_block - 1) / per_block),
                  static_cast<unsigned>(args.num_tokens));
  const bool aligned = args.hidden_size % 8 == 0 && aligned16(args.cache3) && aligned16(args.out);
  if (aligned) {
    sum_kernel<true><<<grid, kThreads, 0, stream>>>(args);
  } else {
    sum_kernel<false><<<grid, kThreads, 0, stream>>>(args);
  }
  check_launch("moe_sum");
}

}  // namespace moe::cuda
