// The pull combine (CombineKind::kPull, peer to peer): the serving rank leaves its experts'
// partial rows where moe_sum wrote them, in its IPC-mapped buffer, and publishes one flag per
// source (combine_publish); each source waits for every rank's flag, then reads the partial rows
// of its tokens from each rank's buffer in place (over NVLink for peers) and adds them in
// ascending rank order (combine_pull). Against the push combine (ep_combine.cu), a partial row is
// read once from where it was written instead of being copied into the source's buffer first: one
// pass over the rows and one kernel boundary fewer. The sum is combine_sum's (same order, same f32
// accumulation and bf16 rounding), so both combines give the same bits. See ep_kernels.h.
//
// NOTE: memory ordering and buffer reuse (docs/parallel-cuda.md, "Pull combine").
//   Publish. combine_publish follows the experts in stream order, so moe_sum's stores of the
//   partial rows are complete when it starts; its one thread runs fence.sc.sys, then stores each
//   source's flag {step, count | overflow bit} with st.release.sys. In combine_pull, thread d of
//   every block reads rank d's flag with ld.acquire.sys until it carries this step, and the
//   block's loads of rank d's rows follow a __syncthreads (bar.sync orders them after the acquire
//   in causality order). The loads are coherent ld.global, not __ldg: the kernel starts before
//   the flags come, while the peer may still be writing the rows.
//   Reuse. A serving rank rewrites its partial rows (and anything else its experts touch) only in
//   its experts of step s + 1, which start after its dispatch_wait of s + 1 acquired every
//   source's dispatch flag of s + 1. A source releases that flag at the end of its dispatch_send
//   of s + 1, queued on its stream after its combine_pull of s: every load of step s had returned
//   its value before that kernel ended. So each read of step s happens before any write of step
//   s + 1 to those rows, for every pair of ranks, because every rank runs every stage every step:
//   a rank without tokens still publishes counts of 0 in dispatch_send, waits in dispatch_wait,
//   publishes its combine flags and launches one block of combine_pull that waits for every flag.
//   The source's own dispatch rows at the serving rank are reused as in the push combine: it
//   writes step s + 1 there only after its combine_pull of s saw the server's flag, published
//   after the server's experts of s (the last readers of those rows and ids).
//
// Work split: one warp per segment of a token's row (32 lanes x kUnroll 16-byte vectors: 2 KiB),
// kRanksInFlight ranks' loads issued before any is added, about kBlocksPerSm blocks per SM.
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

__global__ void combine_publish_kernel(CombinePublishArgs a) {
  // The experts' stores precede this kernel (stream order); the fence makes them visible at
  // system scope before any flag.
  __threadfence_system();
  const uint32_t step = *a.step;
  // An overflow seen here travels with every count, so every rank fails this step.
  const uint32_t overflow = (a.status->bits & kStatusOverflow) != 0 ? kOverflowSeenBit : 0;
  for (int s = 0; s < a.num_ranks; ++s) {
    const uint32_t count = static_cast<uint32_t>(a.received_counts[s]) | overflow;
    store_release_sys(a.dest_flags[s], make_flag(step, count));
  }
}

__global__ void __launch_bounds__(kThreads) combine_pull_kernel(CombinePullArgs a) {
  // Whether this block saw rank d's flag: a rank whose flag did not come is never read (it may
  // be dead, its buffer gone). After a dispatch wait timed out the step has failed (a peer is in
  // an unknown step): no rank is waited for or read.
  __shared__ bool arrived[kMaxRanks];
  const int N = a.num_ranks;
  if (threadIdx.x < N) {
    const int d = static_cast<int>(threadIdx.x);
    arrived[d] = (a.status->bits & kStatusDispatchTimeout) == 0 &&
                 wait_for_combine_flag(&a.flags[d], d, *a.step, a.timeout_ns, a.status);
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
    // Ranks in ascending order (the deterministic sum, as combine_sum's), kRanksInFlight at a
    // time: all their loads are issued before the first is added.
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

}  // namespace

void combine_publish(const CombinePublishArgs& args, cudaStream_t stream) {
  combine_publish_kernel<<<1, 1, 0, stream>>>(args);
  check_launch("ep::combine_publish");
}

void combine_pull(const CombinePullArgs& args, cudaStream_t stream) {
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
  combine_pull_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  check_launch("ep::combine_pull");
}

}  // namespace moe::cuda::ep
