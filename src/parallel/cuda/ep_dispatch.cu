// Dispatch on the GPU: dispatch_send writes each token row once per serving rank straight into
// that rank's region (a peer's IPC-mapped buffer, or a local staging buffer for NCCL); on the
// peer-to-peer paths its last block then receives (waits for every source's count). See
// ep_kernels.h.
//
// Work split: a block takes a chunk of consecutive tokens (one token per block at decode sizes,
// up to kMaxChunk at prefill sizes, so about two blocks per SM run), counts the chunk's rows per
// destination with shared-memory atomics, then takes the chunk's slots at each destination with
// one global atomicAdd per destination (not one per token: that counter is the only contended
// word). Rows move as 16-byte vectors, kUnroll loads in flight per thread before the stores.
//
// NOTE: memory ordering of the publish (docs/parallel-cuda.md). Each block's threads store rows,
// ids and weights weakly, then __syncthreads (bar.sync, which synchronizes the block's threads in
// the PTX memory model), then thread 0 alone runs fence.sc.sys and counts the block done with a
// relaxed atomicAdd at GPU scope: a release pattern that covers every store of its block by
// cumulativity (the pattern of cooperative groups' grid sync, at system scope). The block that
// counts last has observed every earlier increment (one RMW chain), fences again and publishes
// each count with a relaxed system-scope store: that fence and a strong store after it are a
// release pattern, cumulative too, so a peer whose ld.acquire.sys reads the new step reads every
// row, id and weight of it (one fence for all the flags: st.release.sys would fence again before
// each). The same block then receives: its threads s < N acquire source s's flag, and after a
// __syncthreads its writes (the masked ids) and every later kernel's reads of the received rows
// follow those acquires.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ep_sync.cuh"

namespace moe::cuda::ep {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxChunk = 64;    // tokens one block slots at once (shared memory); <= kThreads
constexpr int kBlocksPerSm = 2;  // target grid: enough bytes in flight to fill NVLink
constexpr int kUnroll = 8;       // 16-byte loads in flight per thread before the stores
static_assert(kMaxChunk <= kThreads, "one thread per token of a chunk finds its destinations");

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
      store_relaxed_sys(a.dest_flags[d], make_flag(step, static_cast<uint32_t>(needed)));
    }
  }
  if (overflow) note_error(a.status, kStatusOverflow, step);
  *a.blocks_done = 0;
  *a.step = step;
}

// Tokens [t0, t0 + n) of one block (n <= kMaxChunk): slots, ids and weights, then the rows.
__device__ void send_chunk(const DispatchSendArgs& a, int64_t t0, int n,
                           int32_t (&slots)[kMaxChunk][kMaxRanks], int32_t* counted,
                           int32_t* first) {
  const int64_t k = a.top_k;
  const int N = a.num_ranks;
  if (threadIdx.x < N) counted[threadIdx.x] = 0;
  __syncthreads();
  // The token's place among this chunk's rows for each destination that serves it.
  if (threadIdx.x < n) {
    const int64_t t = t0 + threadIdx.x;
    uint32_t serving = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t expert = a.topk_ids[t * k + j];
      if (expert < 0 || expert >= a.num_experts) continue;
      const int32_t rank = a.rank_of_expert[expert];
      if (rank >= 0 && rank < N) serving |= 1u << rank;
    }
    for (int d = 0; d < N; ++d) {
      slots[threadIdx.x][d] = (serving >> d & 1u) != 0 ? atomicAdd(&counted[d], 1) : -1;
    }
  }
  __syncthreads();
  if (threadIdx.x < N) {
    const int d = static_cast<int>(threadIdx.x);
    first[d] = counted[d] > 0 ? atomicAdd(&a.send_counters[d], counted[d]) : 0;
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < n * N; i += blockDim.x) {
    const int t = i / N, d = i % N;
    int32_t slot = slots[t][d];
    if (slot >= 0) {
      slot += first[d];
      if (slot >= a.capacity) slot = -1;  // past it: counted (reported), never written
    }
    slots[t][d] = slot;
    a.slot_of[(t0 + t) * N + d] = slot;
  }
  __syncthreads();

  const int per_token = N * static_cast<int>(k);
  for (int i = static_cast<int>(threadIdx.x); i < n * per_token; i += blockDim.x) {
    const int t = i / per_token, d = (i % per_token) / static_cast<int>(k);
    const int64_t j = i % k;
    const int32_t slot = slots[t][d];
    if (slot < 0) continue;
    const int32_t expert = a.topk_ids[(t0 + t) * k + j];
    a.dest_ids[d][slot * k + j] = served_by(a, expert, d) ? expert : -1;
    a.dest_weights[d][slot * k + j] = a.topk_weights[(t0 + t) * k + j];
  }

  // The chunk's rows are contiguous in `hidden`: one flat range of 16-byte vectors.
  const int vectors = static_cast<int>(a.hidden_size / 8);
  const int total = n * vectors;
  const auto* source = static_cast<const uint4*>(a.hidden) + t0 * vectors;
  for (int base = static_cast<int>(threadIdx.x); base < total; base += kThreads * kUnroll) {
    uint4 values[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int w = base + u * kThreads;
      if (w < total) values[u] = __ldg(source + w);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int w = base + u * kThreads;
      if (w >= total) continue;
      const int t = w / vectors, v = w % vectors;
      for (int d = 0; d < N; ++d) {
        const int32_t slot = slots[t][d];
        if (slot >= 0) {
          static_cast<uint4*>(a.dest_rows[d])[int64_t{slot} * vectors + v] = values[u];
        }
      }
    }
  }
  __syncthreads();  // slots[] and counted[] are rewritten for the next chunk
}

// The last block, after publishing (peer to peer): waits for every source's flag of this step
// (its threads s < N), records the counts, and masks the ids of the slots past each count: they
// hold an older step's ids, which the experts must skip.
__device__ void receive(const DispatchSendArgs& a) {
  __shared__ int32_t counts[kMaxRanks];
  const DispatchWaitArgs& w = a.wait;
  const uint32_t step = *a.step;  // advanced by publish_counts, before the block's barrier
  if (threadIdx.x < a.num_ranks) {
    const int s = static_cast<int>(threadIdx.x);
    bool timed_out = false;
    uint64_t seen = 0;
    const uint64_t flag =
        wait_for_step(&w.flags[s], step, global_timer_ns() + w.timeout_ns, &timed_out, &seen);
    int64_t needed = 0;
    if (timed_out) {
      note_timeout(a.status, s, step, seen, kStatusDispatchTimeout);
    } else {
      needed = flag_value(flag);
      if (needed > a.capacity) {
        a.status->needed_from[s] = static_cast<int32_t>(needed);
        note_error(a.status, kStatusOverflow, step);
      }
    }
    counts[s] = static_cast<int32_t>(needed < a.capacity ? needed : a.capacity);
    w.received_counts[s] = counts[s];
  }
  __syncthreads();
  const int64_t k = a.top_k;
  const int64_t per_source = a.capacity * k;
  for (int s = 0; s < a.num_ranks; ++s) {
    int32_t* ids = w.ids + s * per_source;
    for (int64_t i = counts[s] * k + threadIdx.x; i < per_source; i += blockDim.x) ids[i] = -1;
  }
}

__global__ void __launch_bounds__(kThreads) dispatch_send_kernel(DispatchSendArgs a, int chunk) {
  __shared__ int32_t slots[kMaxChunk][kMaxRanks];
  __shared__ int32_t counted[kMaxRanks], first[kMaxRanks];
  const int64_t chunks = (a.num_tokens + chunk - 1) / chunk;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t t0 = c * chunk;
    send_chunk(a, t0, static_cast<int>(std::min<int64_t>(chunk, a.num_tokens - t0)), slots, counted,
               first);
  }
  // One system fence per block, after the barrier (see the NOTE above).
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    last = atomicAdd(a.blocks_done, 1u) == gridDim.x - 1;
    if (last) publish_counts(a);
  }
  __syncthreads();
  if (last && a.wait.flags != nullptr) receive(a);
}

int sm_count() {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute (SMs)");
  return std::max(sms, 1);
}

}  // namespace

void dispatch_send(const DispatchSendArgs& args, cudaStream_t stream) {
  // About kBlocksPerSm blocks per SM: chunks of one token at decode sizes, larger chunks (up to
  // kMaxChunk, then blocks loop) at prefill sizes. At least one block: with no tokens the counts
  // (zeros) must still be published.
  const int64_t target = int64_t{kBlocksPerSm} * sm_count();
  const int64_t chunk =
      std::clamp<int64_t>((args.num_tokens + target - 1) / target, 1, int64_t{kMaxChunk});
  const int64_t chunks = (args.num_tokens + chunk - 1) / chunk;
  const int64_t blocks = std::clamp<int64_t>(chunks, 1, target);
  dispatch_send_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      args, static_cast<int>(chunk));
  check_launch("ep::dispatch_send");
}

}  // namespace moe::cuda::ep
