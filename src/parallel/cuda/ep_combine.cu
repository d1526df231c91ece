// Combine on the GPU: combine_send returns each received row's partial result into its source's
// buffer (peer to peer, through CUDA IPC) and publishes the count; combine_sum adds, for every
// token, the partial rows the ranks returned, in ascending rank order (deterministic), after
// waiting for their flags when they came peer to peer. See ep_kernels.h; the ordering argument
// of the publish (one system fence per block after its barrier) is the one in ep_dispatch.cu.
//
// Both kernels give each warp one segment of a row (32 lanes x their loads in flight of 16 bytes:
// 4 KiB to send, 2 KiB to add), so a long row (DeepSeek-V3's 14 KiB) spreads over several warps
// and a decode step's few rows still keep many warps busy; about kBlocksPerSm small blocks per SM.
#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/cuda/bf16_math.cuh"
#include "kernels/cuda/check.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ep_sync.cuh"

namespace moe::cuda::ep {
namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kBlocksPerSm = 4;
constexpr int kSendUnroll = 8;  // 16-byte loads in flight per lane: a segment of 2048 bf16
constexpr int kSumUnroll = 4;   // vectors per lane, times N loads each: a segment of 1024 bf16
constexpr int64_t kSendSegment = int64_t{kWarp} * kSendUnroll;  // 16-byte vectors per warp item
constexpr int64_t kSumSegment = int64_t{kWarp} * kSumUnroll;

__host__ __device__ int64_t segments_of(int64_t hidden_size, int64_t segment) {
  return (hidden_size / 8 + segment - 1) / segment;
}

__device__ void publish_counts(const CombineSendArgs& a) {
  __threadfence_system();
  const uint32_t step = *a.step;
  // An overflow seen here travels with every count, so every rank fails this step.
  const uint32_t overflow = (a.status->bits & kStatusOverflow) != 0 ? kOverflowSeenBit : 0;
  for (int s = 0; s < a.num_ranks; ++s) {
    const uint32_t count = static_cast<uint32_t>(a.received_counts[s]) | overflow;
    store_release_sys(a.dest_flags[s], make_flag(step, count));
  }
  *a.blocks_done = 0;
}

__global__ void __launch_bounds__(kThreads) combine_send_kernel(CombineSendArgs a) {
  const int64_t vectors = a.hidden_size / 8;
  const int64_t segments = segments_of(a.hidden_size, kSendSegment);
  const int64_t items = a.num_ranks * a.capacity * segments;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t w = blockIdx.x * int64_t{kWarps} + threadIdx.x / kWarp; w < items; w += warps) {
    const int64_t r = w / segments;
    const int s = static_cast<int>(r / a.capacity);
    const int64_t i = r % a.capacity;
    if (i >= a.received_counts[s]) continue;
    const auto* source = static_cast<const uint4*>(a.partial) + r * vectors;
    uint4* destination = static_cast<uint4*>(a.dest_rows[s]) + i * vectors;
    const int64_t base = w % segments * kSendSegment + lane;
    uint4 values[kSendUnroll];
#pragma unroll
    for (int u = 0; u < kSendUnroll; ++u) {
      const int64_t v = base + u * kWarp;
      if (v < vectors) values[u] = __ldg(source + v);
    }
#pragma unroll
    for (int u = 0; u < kSendUnroll; ++u) {
      const int64_t v = base + u * kWarp;
      if (v < vectors) destination[v] = values[u];
    }
  }
  // One system fence per block, after the barrier (the NOTE in ep_dispatch.cu).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (atomicAdd(a.blocks_done, 1u) == gridDim.x - 1) publish_counts(a);
  }
}

// Every block waits for every rank's flag itself (one thread per rank), so its own reads of the
// rows are ordered after an acquire (then __syncthreads).
__device__ void wait_for_combine(const CombineSumArgs& a) {
  if (threadIdx.x >= a.num_ranks) return;
  const int d = static_cast<int>(threadIdx.x);
  wait_for_combine_flag(&a.flags[d], d, *a.step, a.timeout_ns, a.status);
}

__global__ void __launch_bounds__(kThreads) combine_sum_kernel(CombineSumArgs a) {
  // After a dispatch wait timed out the step has failed (a peer is in an unknown step): waiting
  // for its combine flag too would only double the time to the error.
  if (a.flags != nullptr && (a.status->bits & kStatusDispatchTimeout) == 0) wait_for_combine(a);
  __syncthreads();
  const int N = a.num_ranks;
  const int64_t vectors = a.hidden_size / 8;
  const int64_t segments = segments_of(a.hidden_size, kSumSegment);
  const int64_t items = a.num_tokens * segments;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  auto* out = static_cast<uint4*>(a.out);
  for (int64_t w = blockIdx.x * int64_t{kWarps} + threadIdx.x / kWarp; w < items; w += warps) {
    const int64_t t = w / segments;
    const int64_t base = w % segments * kSumSegment + lane;
    float sum[kSumUnroll][8] = {};
    // Ranks in ascending order (the deterministic sum); each rank's kSumUnroll loads are in
    // flight together.
    for (int d = 0; d < N; ++d) {
      const int32_t slot = a.slot_of[t * N + d];
      if (slot < 0) continue;
      const auto* row = static_cast<const uint4*>(a.rows[d]) + int64_t{slot} * vectors;
      uint4 loaded[kSumUnroll];
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        const int64_t v = base + u * kWarp;
        if (v < vectors) loaded[u] = load_coherent(row + v);
      }
#pragma unroll
      for (int u = 0; u < kSumUnroll; ++u) {
        if (base + u * kWarp >= vectors) continue;
        float values[8];
        bf16x8_to_float(loaded[u], values);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[u][e] += values[e];
      }
    }
#pragma unroll
    for (int u = 0; u < kSumUnroll; ++u) {
      const int64_t v = base + u * kWarp;
      if (v >= vectors) continue;
      alignas(16) __nv_bfloat16 packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = __float2bfloat16(sum[u][e]);
      out[t * vectors + v] = *reinterpret_cast<const uint4*>(packed);
    }
  }
}

// Blocks of kWarps items each, about kBlocksPerSm per SM (blocks loop past that); at least one.
int64_t grid_for(int64_t items) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute (SMs)");
  const int64_t target = int64_t{kBlocksPerSm} * std::max(sms, 1);
  return std::clamp<int64_t>((items + kWarps - 1) / kWarps, 1, target);
}

__global__ void hold_kernel(uint64_t nanoseconds) {
  const uint64_t until = global_timer_ns() + nanoseconds;
  while (global_timer_ns() < until) {
  }
}

}  // namespace

void hold_stream(int64_t microseconds, cudaStream_t stream) {
  hold_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(microseconds) * 1000);
  check_launch("ep::hold_stream");
}

void combine_send(const CombineSendArgs& args, cudaStream_t stream) {
  const int64_t blocks =
      grid_for(args.num_ranks * args.capacity * segments_of(args.hidden_size, kSendSegment));
  combine_send_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  check_launch("ep::combine_send");
}

void combine_sum(const CombineSumArgs& args, cudaStream_t stream) {
  // With no tokens, one block still waits for the flags: buffers are reused next step only once
  // every peer has answered this one.
  const int64_t blocks = grid_for(args.num_tokens * segments_of(args.hidden_size, kSumSegment));
  combine_sum_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  check_launch("ep::combine_sum");
}

}  // namespace moe::cuda::ep
