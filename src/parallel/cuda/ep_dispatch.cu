// Dispatch on the GPU: dispatch_send writes each token row once per serving rank straight into
// that rank's region (a peer's IPC-mapped buffer, or a local staging buffer for NCCL), and
// dispatch_wait is the receiving side of the low-latency path. See ep_kernels.h.
//
// NOTE: memory ordering of the publish. Every thread of every block makes its row stores visible
// system-wide (__threadfence_system) before its block counts itself done (atomicAdd at GPU
// scope, after __syncthreads). The block that counts last fences again, so it has observed every
// other block's stores, and publishes each count with st.release.sys: a peer whose
// ld.acquire.sys reads the new step therefore reads every row, id and weight of it.
#include "kernels/cuda/check.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ep_sync.cuh"

namespace moe::cuda::ep {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // larger batches loop over tokens
constexpr int kUnroll = 4;        // 16-byte loads in flight per thread before the stores
constexpr int kWaitThreads = 512;

__device__ void note_error(Status* status, uint32_t bit, uint32_t step) {
  atomicOr(&status->bits, bit);
  atomicCAS(&status->step, 0u, step);
}

__device__ bool served_by(const DispatchSendArgs& a, int32_t expert, int rank) {
  return expert >= 0 && expert < a.num_experts && a.rank_of_expert[expert] == rank;
}

// The block that finished last: every row is out, so the counts are final.
__device__ void publish_counts(const DispatchSendArgs& a) {
  __threadfence_system();
  const uint32_t step = *a.step + 1;
  bool overflow = false;
  for (int d = 0; d < a.num_ranks; ++d) {
    const int32_t needed = atomicExch(&a.send_counters[d], 0);
    a.sent_counts[d] = needed;
    if (needed > a.capacity) {
      a.status->needed_to[d] = needed;
      overflow = true;
    }
    if (a.dest_flags[d] != nullptr) {
      store_release_sys(a.dest_flags[d], make_flag(step, static_cast<uint32_t>(needed)));
    }
  }
  if (overflow) note_error(a.status, kStatusOverflow, step);
  *a.blocks_done = 0;
  *a.step = step;
}

__global__ void __launch_bounds__(kThreads) dispatch_send_kernel(DispatchSendArgs a) {
  __shared__ int32_t slots[kMaxRanks];
  const int64_t k = a.top_k;
  const int N = a.num_ranks;
  const int64_t vectors = a.hidden_size / 8;
  for (int64_t t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
    if (threadIdx.x < N) {
      const int d = static_cast<int>(threadIdx.x);
      bool serves = false;
      for (int64_t j = 0; j < k; ++j) serves |= served_by(a, a.topk_ids[t * k + j], d);
      int32_t slot = -1;
      if (serves) {
        const int32_t index = atomicAdd(&a.send_counters[d], 1);
        if (index < a.capacity) slot = index;  // past it: counted (reported), never written
      }
      slots[d] = slot;
      a.slot_of[t * N + d] = slot;
    }
    __syncthreads();

    for (int64_t i = threadIdx.x; i < N * k; i += blockDim.x) {
      const int d = static_cast<int>(i / k);
      const int64_t j = i % k;
      const int32_t slot = slots[d];
      if (slot < 0) continue;
      const int32_t expert = a.topk_ids[t * k + j];
      a.dest_ids[d][slot * k + j] = served_by(a, expert, d) ? expert : -1;
      a.dest_weights[d][slot * k + j] = a.topk_weights[t * k + j];
    }

    const auto* source = static_cast<const uint4*>(a.hidden) + t * vectors;
    for (int64_t v = threadIdx.x; v < vectors; v += static_cast<int64_t>(blockDim.x) * kUnroll) {
      uint4 values[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t w = v + u * static_cast<int64_t>(blockDim.x);
        if (w < vectors) values[u] = __ldg(source + w);
      }
      for (int d = 0; d < N; ++d) {
        const int32_t slot = slots[d];
        if (slot < 0) continue;
        uint4* row = static_cast<uint4*>(a.dest_rows[d]) + slot * vectors;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t w = v + u * static_cast<int64_t>(blockDim.x);
          if (w < vectors) row[w] = values[u];
        }
      }
    }
    __syncthreads();  // slots[] is rewritten for the next token
  }

  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(a.blocks_done, 1u) == gridDim.x - 1) publish_counts(a);
}

__global__ void __launch_bounds__(kWaitThreads) dispatch_wait_kernel(DispatchWaitArgs a) {
  __shared__ int32_t counts[kMaxRanks];
  const uint32_t step = *a.step;
  if (threadIdx.x < a.num_ranks) {
    const int s = static_cast<int>(threadIdx.x);
    bool timed_out = false;
    uint64_t seen = 0;
    const uint64_t flag =
        wait_for_step(&a.flags[s], step, global_timer_ns() + a.timeout_ns, &timed_out, &seen);
    int64_t needed = 0;
    if (timed_out) {
      if (atomicCAS(&a.status->timeout_peer, -1, s) == -1) {
        a.status->timeout_expected_step = step;
        a.status->timeout_last_flag = seen;
      }
      note_error(a.status, kStatusDispatchTimeout, step);
    } else {
      needed = flag_value(flag);
      if (needed > a.capacity) {
        a.status->needed_from[s] = static_cast<int32_t>(needed);
        note_error(a.status, kStatusOverflow, step);
      }
    }
    counts[s] = static_cast<int32_t>(needed < a.capacity ? needed : a.capacity);
    a.received_counts[s] = counts[s];
  }
  __syncthreads();
  // Slots past a source's count hold an older step's ids: mask them so the experts skip them.
  const int64_t k = a.top_k;
  const int64_t per_source = a.capacity * k;
  for (int64_t i = threadIdx.x; i < a.num_ranks * per_source; i += blockDim.x) {
    const int64_t s = i / per_source;
    if ((i % per_source) / k >= counts[s]) a.ids[i] = -1;
  }
}

}  // namespace

void dispatch_send(const DispatchSendArgs& args, cudaStream_t stream) {
  // At least one block: with no tokens the counts (zeros) must still be published.
  const int64_t blocks = args.num_tokens < 1            ? 1
                         : args.num_tokens < kMaxBlocks ? args.num_tokens
                                                        : kMaxBlocks;
  dispatch_send_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  check_launch("ep::dispatch_send");
}

void dispatch_wait(const DispatchWaitArgs& args, cudaStream_t stream) {
  dispatch_wait_kernel<<<1, kWaitThreads, 0, stream>>>(args);
  check_launch("ep::dispatch_wait");
}

}  // namespace moe::cuda::ep
