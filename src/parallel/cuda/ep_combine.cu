// Combine on the GPU: each rank's experts leave their partial rows (one per token and serving
// rank) where moe_sum wrote them, and the token's source adds them in ascending rank order
// (deterministic). Peer to peer the partial rows stay in the serving rank's IPC-mapped buffer:
// the first block of combine_sum to run raises one flag per source, and every block waits for
// every rank's flag, then reads the rows in place (over NVLink for peers). Over NCCL the peers'
// rows came back by an all-to-all the host waited for: combine_sum adds them without flags. See
// ep_kernels.h.
//
// NOTE: memory ordering and buffer reuse, peer to peer (docs/parallel-cuda.md, "Combine: ordering
// and reuse without resets").
//   Publish. combine_sum follows the experts in stream order, so moe_sum's stores of the partial
//   rows are complete when it starts; thread 0 of its first block to run runs fence.sc.sys, then
//   stores each source's flag {step, count | overflow bit} with st.relaxed.sys (the fence and the
//   strong store are a release pattern). In combine_sum, thread d of every block reads rank d's
//   flag with ld.acquire.sys until it carries this step, and the block's loads of rank d's rows
//   follow a __syncthreads (bar.sync orders them after the acquire in causality order). The
//   loads are coherent ld.global, not __ldg: the kernel starts before the flags come, while the
//   peer may still be writing the rows.
//   Reuse of the partial rows. A serving rank rewrites them (and anything else its experts touch)
//   only in its experts of step s + 1, which start after the last block of its dispatch_send of
//   s + 1 acquired every source's dispatch flag of s + 1. A source releases that flag at the end
//   of its dispatch_send of s + 1, queued on its stream after its combine_sum of s: every load of
//   step s had returned its value before that kernel ended. So each read of step s happens before
//   any write of step s + 1 to those rows, for every pair of ranks, because every rank runs every
//   stage every step: a rank without tokens still publishes counts of 0 and waits in
//   dispatch_send (its one block), and launches one block of combine_sum that publishes its
//   combine flags and waits for every flag.
//   Reuse of the dispatch rows. A source writes step s + 1 into a serving rank's dispatch region
//   only after its combine_sum of s saw that rank's combine flag, published after its experts of
//   s (the last readers of those rows and ids).
//
// Work split: one warp per segment of a token's row (32 lanes x kUnroll 16-byte vectors: 2 KiB),
// so a long row (DeepSeek-V3's 14 KiB) spreads over several warps and a decode step's few rows
// still keep many warps busy; kRanksInFlight ranks' loads issued before any is added (what keeps
// enough remote loads in flight over NVLink); about kBlocksPerSm small blocks per SM.
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
constexpr int kUnroll = 4;         // 16-byte vectors per lane and rank: a segment of 1024 bf16
constexpr int kRanksInFlight = 2;  // ranks whose loads are in flight together (8 per lane)
constexpr int64_t kSegment = int64_t{kWarp} * kUnroll;  // 16-byte vectors per warp item
static_assert(kMaxRanks <= kThreads, "thread d of each block waits for rank d's flag");

__host__ __device__ int64_t segments_of(int64_t hidden_size) {
  return (hidden_size / 8 + kSegment - 1) / kSegment;
}

// This rank's flags of this step, once: by the first block of combine_sum to run (a kernel of its
// own would put one more launch on every step's critical path; the first block to run, rather
// than block 0, so that no waiting block depends on a block not yet scheduled). The experts'
// stores precede the kernel in stream order; the fence and the strong stores of the flags after
// it are a release pattern (one fence for every flag).
__device__ void publish_once(const CombineSumArgs& a) {
  const CombinePublishArgs& p = a.publish;
  const uint32_t step = *a.step;
  if (atomicExch(p.published_step, step) == step) return;
  __threadfence_system();
  // An overflow seen here travels with every count, so every rank fails this step.
  const uint32_t overflow = (a.status->bits & kStatusOverflow) != 0 ? kOverflowSeenBit : 0;
  for (int s = 0; s < a.num_ranks; ++s) {
    const uint32_t count = static_cast<uint32_t>(p.received_counts[s]) | overflow;
    store_relaxed_sys(p.dest_flags[s], make_flag(step, count));
  }
}

// Whether this block may read rank d's rows: without flags always; with flags once it saw d's
// flag of this step. A rank whose flag did not come is never read (it may be dead, its buffer
// gone); after a dispatch wait timed out the step has failed (a peer is in an unknown step): no
// rank is waited for or read.
__device__ bool rank_arrived(const CombineSumArgs& a, int d) {
  if (a.flags == nullptr) return true;
  return (a.status->bits & kStatusDispatchTimeout) == 0 &&
         wait_for_combine_flag(&a.flags[d], d, *a.step, a.timeout_ns, a.status);
}

__global__ void __launch_bounds__(kThreads) combine_sum_kernel(CombineSumArgs a) {
  __shared__ bool arrived[kMaxRanks];
  const int N = a.num_ranks;
  if (threadIdx.x == 0 && a.publish.published_step != nullptr) publish_once(a);
  if (threadIdx.x < N) {
    const int d = static_cast<int>(threadIdx.x);
    arrived[d] = rank_arrived(a, d);
  }
  __syncthreads();
  const int64_t vectors = a.hidden_size / 8;
  const int64_t segments = segments_of(a.hidden_size);
  const int64_t items = a.num_tokens * segments;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  auto* out = static_cast<uint4*>(a.out);
  for (int64_t w = blockIdx.x * int64_t{kWarps} + threadIdx.x / kWarp; w < items; w += warps) {
    const int64_t t = w / segments;
    const int64_t base = w % segments * kSegment + lane;
    float sum[kUnroll][8] = {};
    // Ranks in ascending order (the deterministic sum), kRanksInFlight at a time: all their
    // loads are issued before the first is added.
    for (int d0 = 0; d0 < N; d0 += kRanksInFlight) {
      const uint4* rows[kRanksInFlight];
#pragma unroll
      for (int r = 0; r < kRanksInFlight; ++r) {
        const int d = d0 + r;
        const int32_t slot = d < N && arrived[d] ? a.slot_of[t * N + d] : -1;
        rows[r] =
            slot >= 0 ? static_cast<const uint4*>(a.rows[d]) + int64_t{slot} * vectors : nullptr;
      }
      uint4 loaded[kRanksInFlight][kUnroll];
#pragma unroll
      for (int r = 0; r < kRanksInFlight; ++r) {
        if (rows[r] == nullptr) continue;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t v = base + u * kWarp;
          if (v < vectors) loaded[r][u] = load_coherent(rows[r] + v);
        }
      }
#pragma unroll
      for (int r = 0; r < kRanksInFlight; ++r) {
        if (rows[r] == nullptr) continue;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (base + u * kWarp >= vectors) continue;
          float values[8];
          bf16x8_to_float(loaded[r][u], values);
#pragma unroll
          for (int e = 0; e < 8; ++e) sum[u][e] += values[e];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + u * kWarp;
      if (v >= vectors) continue;
      alignas(16) __nv_bfloat16 packed[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) packed[e] = __float2bfloat16(sum[u][e]);
      out[t * vectors + v] = *reinterpret_cast<const uint4*>(packed);
    }
  }
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

void combine_sum(const CombineSumArgs& args, cudaStream_t stream) {
  // Blocks of kWarps items, about kBlocksPerSm per SM (blocks loop past that). With no tokens,
  // one block still waits for every flag: peers reuse their buffers next step only once every
  // rank has answered this one (the NOTE above).
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute (SMs)");
  const int64_t items = args.num_tokens * segments_of(args.hidden_size);
  const int64_t blocks = std::clamp<int64_t>((items + kWarps - 1) / kWarps, 1,
                                             int64_t{kBlocksPerSm} * std::max(sms, 1));
  combine_sum_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  check_launch("ep::combine_sum");
}

}  // namespace moe::cuda::ep
