// The shared experts' act stage: act[t][i] = silu(gate_up[t][i]) * gate_up[t][Is + i], times
// sigmoid(hidden[t] · gate) where the layer has a shared-expert gate, rounded once to bf16. The
// gate scales act rather than gemm2's output: the same product, since gemm2 is linear, and the
// rounding to bf16 comes after it either way.
//
// One thread block per (token, kColumnsPerBlock columns). With a gate every block of a token first
// reduces the token's dot product over H in f32: H * 4 bytes read again per block, from L2, which
// costs less than a launch of its own. Tested through tests/cuda/shared_experts_test.cc.
#include <cuda_bf16.h>

#include "kernels/cuda/alignment.h"
#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/shared_experts.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColumnsPerThread = 4;
constexpr int64_t kColumnsPerBlock = kThreads * kColumnsPerThread;

// sigmoid(row · gate) over H elements, for every thread of the block (all must call it).
// kAligned: row and gate 16-byte aligned and H % 8 == 0.
template <bool kAligned>
__device__ float gate_value(const __nv_bfloat16* row, const __nv_bfloat16* gate, int64_t H) {
  __shared__ float warp_sums[kThreads / 32];
  float sum = 0.0f;
  for (int64_t h = static_cast<int64_t>(threadIdx.x) * 8; h < H; h += kThreads * 8) {
    float x[8], g[8];
    bf16x8_to_float(load_bf16x8<kAligned, false>(row, h, H), x);
    bf16x8_to_float(load_bf16x8<kAligned, false>(gate, h, H), g);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += x[e] * g[e];
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  float logit = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) logit += warp_sums[w];
  return 1.0f / (1.0f + expf(-logit));
}

template <bool kAligned>
__global__ void __launch_bounds__(kThreads) shared_activation_kernel(SharedActivationArgs a) {
  const int64_t token = blockIdx.y, H = a.hidden_size, Is = a.intermediate_size;
  float scale = 1.0f;
  if (a.gate != nullptr) {  // the same for the whole grid: every thread of the block calls it
    scale = gate_value<kAligned>(static_cast<const __nv_bfloat16*>(a.hidden) + token * H,
                                 static_cast<const __nv_bfloat16*>(a.gate), H);
  }
  const float* gate_up = a.gate_up + token * 2 * Is;            // [2 Is]
  auto* act = static_cast<__nv_bfloat16*>(a.act) + token * Is;  // [Is]
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
#pragma unroll
  for (int c = 0; c < kColumnsPerThread; ++c) {
    const int64_t i = first + c * kThreads;
    if (i < Is) act[i] = __float2bfloat16(silu(gate_up[i]) * gate_up[Is + i] * scale);
  }
}

}  // namespace

void shared_activation(const SharedActivationArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return;
  // One row of blocks per token: callers pass at most kChunkTokens rows, within grid.y's 65535.
  const dim3 grid(
      static_cast<unsigned>((args.intermediate_size + kColumnsPerBlock - 1) / kColumnsPerBlock),
      static_cast<unsigned>(args.num_tokens));
  const bool aligned = args.hidden_size % 8 == 0 && aligned16(args.hidden) && aligned16(args.gate);
  if (aligned) {
    shared_activation_kernel<true><<<grid, kThreads, 0, stream>>>(args);
  } else {
    shared_activation_kernel<false><<<grid, kThreads, 0, stream>>>(args);
  }
  check_launch("shared_activation");
}

}  // namespace moe::cuda
