// align_block_size on the GPU as a counting sort over segments of the pairs:
//   count    one warp per segment of consecutive pairs counts its pairs per expert into a row of
//            counts [num_segments, E] (a warp-private row in shared memory).
//   scan     one thread block sums the rows per expert, pads each expert to block_m, scans the
//            experts into offsets, rewrites every count as the position where that segment's
//            pairs of that expert start, and writes expert_ids, the padding and the total.
//   scatter  the count warps again, each walking its segment in pair order: lanes of one 32-pair
//            step that share an expert (found by ballots) take consecutive slots after the
//            segment's position for that expert, lower lanes first.
// The layout is therefore stable (pairs of an expert in ascending pair order) and identical to
// the CPU kernel's. Small batches run the three phases in one thread block and one launch, a
// segment per warp: the rows stay in shared memory and each lane keeps the ids it read in
// registers for the scatter, so only the ids and the outputs cross global memory. Past 2048 pairs
// on Hopper (up to 256 experts) a cluster of up to 8 such blocks does the same in one launch, each
// block reading the others' counts from their shared memory. Otherwise large batches run three
// launches with the rows in the global scratch, the scan on one thread block over at most
// kMaxCounts counts.
//
// Tested by tests/cuda/align_block_size_test.cc against the CPU kernel, entry for entry.
#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <utility>

#include "kernels/cuda/align_block_size.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/shared_memory_limit.cuh"

namespace moe::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kScanThreads = 1024;
constexpr int64_t kMinSegmentPairs = 256;  // a warp's shortest walk: 8 steps of 32 pairs
constexpr int64_t kMaxSegments = 256;
constexpr int64_t kMaxCounts = int64_t{1} << 17;  // segments x experts the scan reads twice
constexpr int kRowInts = 8192;                    // shared ints of count/scatter rows per block
constexpr int kStepsInFlight = 8;                 // id loads a lane issues before using them
constexpr int kSingleBlockSteps = 4;              // steps a warp of the single block walks
// One launch does it all while the pairs fit a few steps per warp and every warp gets a row.
constexpr int64_t kSingleBlockPairs = 8192;
constexpr int64_t kSingleBlockExperts = kRowInts / (kScanThreads / kWarp);
// The cluster path: up to 8 blocks (the largest cluster every Hopper GPU runs) of kScanThreads,
// one per kClusterBlockPairs pairs, i.e. 2 steps a warp (1 step measured the same on the H200).
constexpr int kMaxClusterBlocks = 8;
constexpr int64_t kClusterBlockPairs = 2 * kScanThreads;

// Pairs [begin, end) of segment s: equal runs, a multiple of 32 pairs, so the walk of the count
// and the scatter phases see the same segments.
struct Segments {
  int64_t pairs_per_segment;
  int64_t count;
};

Segments segments_of(int64_t num_pairs, int64_t num_experts) {
  const int64_t most = std::clamp<int64_t>(kMaxCounts / num_experts, 1, kMaxSegments);
  int64_t length = std::max(kMinSegmentPairs, (num_pairs + most - 1) / most);
  length = (length + kWarp - 1) / kWarp * kWarp;
  return {length, std::max<int64_t>(1, (num_pairs + length - 1) / length)};
}

// The single block: one warp per segment of kSingleBlockSteps 32-pair steps (up to kStepsInFlight
// once it has kScanThreads), and at least a thread per expert for the scan. Every instruction of
// the block runs on each of its warps, so warps without pairs to walk only cost issue slots.
struct SingleBlock {
  int threads;
  Segments seg;
};

static_assert(kSingleBlockPairs <= int64_t{kScanThreads} * kStepsInFlight);
static_assert(kSingleBlockSteps <= kStepsInFlight);
SingleBlock single_block_for(int64_t num_pairs, int64_t num_experts) {
  constexpr int64_t kMaxWarps = kScanThreads / kWarp;
  const int64_t for_pairs =
      (num_pairs + kWarp * kSingleBlockSteps - 1) / (kWarp * kSingleBlockSteps);
  const int64_t for_experts = (num_experts + kWarp - 1) / kWarp;
  const int64_t warps = std::clamp<int64_t>(std::max(for_pairs, for_experts), 1, kMaxWarps);
  int64_t length = (num_pairs + warps - 1) / warps;
  length = std::max<int64_t>(kWarp, (length + kWarp - 1) / kWarp * kWarp);
  return {static_cast<int>(warps * kWarp),
          {length, std::max<int64_t>(1, (num_pairs + length - 1) / length)}};
}

__device__ int32_t local_expert(const AlignArgs& a, int32_t expert) {
  if (a.expert_map == nullptr) return expert;
  const int32_t local = a.expert_map[expert];
  return (local >= 0 && local < a.num_local_experts) ? local : -1;
}

// The expert of pair p, or -1 past the end and for ids outside [0, E) (no slot).
__device__ __forceinline__ int32_t expert_of(const AlignArgs& a, int64_t p, int64_t end) {
  if (p >= end) return -1;
  const int32_t id = a.topk_ids[p];
  return id >= 0 && id < a.num_experts ? id : -1;
}

// The experts of kStepsInFlight 32-pair steps from pair `first` on (lane i of step j holds pair
// first + 32 j + i), all loads issued before any is used.
__device__ __forceinline__ void load_steps(const AlignArgs& a, int64_t first, int64_t end,
                                           int32_t (&experts)[kStepsInFlight]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int i = 0; i < kStepsInFlight; ++i) experts[i] = expert_of(a, first + i * kWarp + lane, end);
}

// Calls step(expert, first_pair) for segment s in order, a 32-pair step at a time.
template <typename Step>
__device__ __forceinline__ void walk_segment(const AlignArgs& a, Segments seg, int64_t s,
                                             Step&& step) {
  const int64_t begin = s * seg.pairs_per_segment;
  const int64_t end = std::min(a.num_pairs, begin + seg.pairs_per_segment);
  for (int64_t first = begin; first < end; first += kWarp * kStepsInFlight) {
    int32_t experts[kStepsInFlight];
    load_steps(a, first, end, experts);
#pragma unroll
    for (int i = 0; i < kStepsInFlight; ++i) {
      if (first + i * kWarp < end) step(experts[i], first + i * kWarp);  // warp-uniform
    }
  }
}

__device__ __forceinline__ void zero_row(int32_t* row, int64_t num_experts) {
  for (int64_t e = threadIdx.x % kWarp; e < num_experts; e += kWarp) row[e] = 0;
  __syncwarp();
}

__device__ __forceinline__ void count_step(int32_t* row, int32_t expert) {
  if (expert >= 0) atomicAdd(&row[expert], 1);
}

// The lanes whose expert equals this lane's (meaningless for -1, which takes no slot): a ballot
// per bit of the id. __match_any_sync does it in one instruction, which the H200 runs slower:
// clock stamps in the single block at 8192 pairs over 128 experts put a 32-pair step of all 32
// warps at about 1900 cycles with it, 1200 with the ballots.
__device__ __forceinline__ uint32_t peers_of(int32_t expert, int64_t num_experts) {
  const int id_bits = 32 - __clz(static_cast<int>(num_experts) - 1);
  uint32_t peers = __ballot_sync(0xffffffff, expert >= 0);
  for (int b = 0; b < id_bits; ++b) {
    const bool set = (expert >> b) & 1;
    const uint32_t lanes_set = __ballot_sync(0xffffffff, set);
    peers &= set ? lanes_set : ~lanes_set;
  }
  return peers;
}

// The step's pairs to their experts' next slots of this segment (row[e]: the next slot of e).
// Every lane of the warp calls it (pairs without a slot as -1): the ballots take the full mask.
__device__ __forceinline__ void scatter_step(const AlignArgs& a, int32_t* row, int32_t expert,
                                             int64_t first_pair) {
  const int lane = threadIdx.x % kWarp;
  const uint32_t lanes_below = (1u << lane) - 1;
  const uint32_t peers = peers_of(expert, a.num_experts);
  if (expert >= 0) {
    a.sorted_pair_ids[row[expert] + __popc(peers & lanes_below)] =
        static_cast<int32_t>(first_pair + lane);
  }
  __syncwarp();  // every peer has read row[expert] before the lowest one moves it on
  if (expert >= 0 && (peers & lanes_below) == 0) row[expert] += __popc(peers);
  __syncwarp();
}

// ---- count (three-launch path): row s of the scratch = pairs of segment s per expert ----
__device__ void count_segment(const AlignArgs& a, Segments seg, int64_t s, int32_t* row) {
  zero_row(row, a.num_experts);
  walk_segment(a, seg, s, [&](int32_t expert, int64_t) { count_step(row, expert); });
  __syncwarp();
  int32_t* counts = a.scratch + s * a.num_experts;
  for (int64_t e = threadIdx.x % kWarp; e < a.num_experts; e += kWarp) counts[e] = row[e];
}

// ---- scatter (three-launch path): segment s from the start positions the scan left ----
__device__ void scatter_segment(const AlignArgs& a, Segments seg, int64_t s, int32_t* row) {
  const int32_t* starts = a.scratch + s * a.num_experts;
  for (int64_t e = threadIdx.x % kWarp; e < a.num_experts; e += kWarp) row[e] = starts[e];
  __syncwarp();
  walk_segment(a, seg, s, [&](int32_t expert, int64_t first_pair) {
    scatter_step(a, row, expert, first_pair);
  });
}

// ---- pieces of the scan that the single block, the scan launch and the cluster share ----

// offsets[e] = the padded counts of the experts below e (each rounded up to block_m), offsets[E]
// = their sum. Each thread adds a run of experts, then the runs are scanned. Every thread of the
// block calls it; it ends with a barrier.
__device__ void padded_offsets(const int32_t* counts, int E, int block_m, int32_t* offsets) {
  __shared__ int32_t warp_sums[kScanThreads / kWarp];
  const int threads = blockDim.x, t = threadIdx.x;
  const auto padded = [&](int e) { return (counts[e] + block_m - 1) / block_m * block_m; };
  const int run = (E + threads - 1) / threads;
  const int run_begin = min(E, t * run), run_end = min(E, run_begin + run);
  int32_t run_sum = 0;
  for (int e = run_begin; e < run_end; ++e) run_sum += padded(e);
  const int lane = t % kWarp, warp = t / kWarp;
  int32_t inclusive = run_sum;
  for (int offset = 1; offset < kWarp; offset *= 2) {
    const int32_t below = __shfl_up_sync(0xffffffff, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  if (lane == kWarp - 1) warp_sums[warp] = inclusive;
  __syncthreads();
  // The runs of the warps below: lane w holds warp w's sum, a shuffle reduction adds them.
  int32_t below = lane < warp ? warp_sums[lane] : 0;
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    below += __shfl_xor_sync(0xffffffff, below, offset);
  }
  int32_t before = below + inclusive - run_sum;
  for (int e = run_begin; e < run_end; ++e) {
    offsets[e] = before;
    before += padded(e);
  }
  if (t == threads - 1) offsets[E] = before;
  __syncthreads();
}

// expert_ids of blocks first, first + stride, ...: block b belongs to the last expert whose
// offset is at most b * block_m.
__device__ void write_expert_ids(const AlignArgs& a, const int32_t* offsets, int first,
                                 int stride) {
  const int E = static_cast<int>(a.num_experts), block_m = static_cast<int>(a.block_m);
  const int num_blocks = offsets[E] / block_m;
  for (int b = first; b < num_blocks; b += stride) {
    int low = 0, high = E;  // offsets[low] <= b * block_m < offsets[high]
    while (high - low > 1) {
      const int middle = (low + high) / 2;
      (offsets[middle] <= b * block_m ? low : high) = middle;
    }
    a.expert_ids[b] = local_expert(a, low);
  }
}

// ---- scan: offsets per expert, start positions per (segment, expert), expert_ids, padding ----
// `table` [segments, E]: the counts on entry, the start positions on return (global scratch or
// shared memory). `shared`: offsets [E + 1], counts [E], slice sums [groups, E] (groups =
// max(1, threads / E)). 32-bit arithmetic throughout (E <= 8192, positions fit the int32 output):
// every instruction here runs on each warp of the block, and 64-bit division is a long routine.
__device__ void scan_counts(const AlignArgs& a, Segments seg, int32_t* table, int32_t* shared) {
  const int E = static_cast<int>(a.num_experts), block_m = static_cast<int>(a.block_m);
  const int segments = static_cast<int>(seg.count);
  const int threads = blockDim.x, t = threadIdx.x;
  int32_t* offsets = shared;          // [E + 1]
  int32_t* counts = offsets + E + 1;  // [E]
  int32_t* slice_sums = counts + E;   // [groups, E]
  // Thread (group g, expert e) owns the segments of slice g; experts past the threads loop.
  const int groups = max(1, threads / E);
  const int per_slice = (segments + groups - 1) / groups;
  for (int i = t; i < groups * E; i += threads) {
    const int g = i / E, e = i - g * E;
    const int end = min(segments, (g + 1) * per_slice);
    int32_t sum = 0;
#pragma unroll 8
    for (int s = g * per_slice; s < end; ++s) sum += table[s * E + e];
    slice_sums[i] = sum;
  }
  __syncthreads();
  for (int e = t; e < E; e += threads) {
    int32_t sum = 0;
    for (int g = 0; g < groups; ++g) sum += slice_sums[g * E + e];
    counts[e] = sum;
  }
  __syncthreads();

  padded_offsets(counts, E, block_m, offsets);
  if (t == 0) *a.num_pairs_post_padded = offsets[E];

  // Counts become start positions: expert offset + pairs of that expert in earlier segments.
  for (int i = t; i < groups * E; i += threads) {
    const int g = i / E, e = i - g * E;
    int32_t position = offsets[e];
    for (int h = 0; h < g; ++h) position += slice_sums[h * E + e];
    const int end = min(segments, (g + 1) * per_slice);
#pragma unroll 8
    for (int s = g * per_slice; s < end; ++s) {
      const int32_t count = table[s * E + e];
      table[s * E + e] = position;
      position += count;
    }
  }

  write_expert_ids(a, offsets, t, threads);
  // The padding, pair id num_pairs: every slot gets it here and the scatter, after a barrier or
  // in the next launch, overwrites the slots of pairs. All threads store consecutive slots, four at
  // a time where the output is 16-byte aligned. A warp per expert, storing only its padding, left
  // each warp a serial walk over its experts; on the H200 the single block at DeepSeek-V3's 64
  // tokens (512 pairs, 256 experts) took 12.1 us that way and 8.1 us this way (docs/perf.md).
  const int32_t sentinel = static_cast<int32_t>(a.num_pairs);
  const int total = offsets[E];
  int scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(a.sorted_pair_ids) % 16 == 0) {
    auto* quads = reinterpret_cast<int4*>(a.sorted_pair_ids);
    for (int i = t; i < total / 4; i += threads) {
      quads[i] = make_int4(sentinel, sentinel, sentinel, sentinel);
    }
    scalar_from = total / 4 * 4;
  }
  for (int i = scalar_from + t; i < total; i += threads) a.sorted_pair_ids[i] = sentinel;
}

size_t scan_shared_bytes(int64_t num_experts, int threads) {
  const int64_t groups = std::max<int64_t>(1, threads / num_experts);
  return static_cast<size_t>(2 * num_experts + 1 + groups * num_experts) * sizeof(int32_t);
}

// Warps of a count or scatter block: each needs a row of E ints in shared memory.
int rows_per_block(int64_t num_experts) {
  return static_cast<int>(std::clamp<int64_t>(kRowInts / num_experts, 1, 8));
}

__global__ void count_kernel(AlignArgs a, Segments seg) {
  extern __shared__ int32_t rows[];  // [warps, E]
  const int warp = threadIdx.x / kWarp;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (s < seg.count) count_segment(a, seg, s, rows + warp * a.num_experts);
}

__global__ void __launch_bounds__(kScanThreads) scan_kernel(AlignArgs a, Segments seg) {
  extern __shared__ int32_t shared[];
  scan_counts(a, seg, a.scratch, shared);
}

__global__ void scatter_kernel(AlignArgs a, Segments seg) {
  extern __shared__ int32_t rows[];  // [warps, E]
  const int warp = threadIdx.x / kWarp;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (s < seg.count) scatter_segment(a, seg, s, rows + warp * a.num_experts);
}

// All three phases in one thread block, segment w on warp w: its counts and then start positions
// in row w of shared memory, each lane's ids in registers from the count to the scatter.
__global__ void __launch_bounds__(kScanThreads) single_block_kernel(AlignArgs a, Segments seg) {
  extern __shared__ int32_t shared[];
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int64_t E = a.num_experts;
  int32_t* rows = shared;  // [warps, E], then the scan's arrays
  int32_t* row = rows + warp * E;
  const int64_t first = warp * seg.pairs_per_segment;
  const int64_t end = std::min(a.num_pairs, first + seg.pairs_per_segment);
  const int64_t steps = std::max<int64_t>(0, (end - first + kWarp - 1) / kWarp);  // warp-uniform
  int32_t experts[kStepsInFlight];
  load_steps(a, first, end, experts);
  zero_row(row, E);
#pragma unroll
  for (int i = 0; i < kStepsInFlight; ++i) count_step(row, experts[i]);
  __syncthreads();
  scan_counts(a, seg, rows, rows + warps * E);
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kStepsInFlight; ++i) {
    if (i < steps) scatter_step(a, row, experts[i], first + i * kWarp);
  }
}

// The cluster path (Hopper): the single block's phases spread over a cluster of thread blocks,
// a segment per warp of the cluster, so that each warp walks a few steps. Each block sums its
// warps' counts per expert; after a cluster barrier each block reads the other blocks' sums from
// their shared memory and scans the experts itself. Each block then scatters its own pairs and
// writes a share of the padding and of expert_ids. Only padding slots get the sentinel here, so no
// two threads of the cluster write one slot.
__global__ void __launch_bounds__(kScanThreads) cluster_kernel(AlignArgs a, Segments seg) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int blocks = static_cast<int>(cluster.num_blocks());
  const int t = threadIdx.x, lane = t % kWarp, warp = t / kWarp;
  const int threads = blockDim.x, warps = threads / kWarp;
  const int E = static_cast<int>(a.num_experts);
  extern __shared__ int32_t shared[];
  int32_t* rows = shared;                    // [warps, E]: counts, then each warp's next slots
  int32_t* block_counts = rows + warps * E;  // [E]: this block's pairs per expert
  int32_t* counts = block_counts + E;        // [E]: the batch's pairs per expert
  int32_t* lower = counts + E;               // [E]: pairs of lower-ranked blocks per expert
  int32_t* offsets = lower + E;              // [E + 1]
  int32_t* row = rows + warp * E;
  const int64_t s = static_cast<int64_t>(rank) * warps + warp;
  const int64_t first = s * seg.pairs_per_segment;
  const int64_t end = std::min(a.num_pairs, first + seg.pairs_per_segment);
  const int64_t steps = std::max<int64_t>(0, (end - first + kWarp - 1) / kWarp);  // warp-uniform
  // Segments of up to kStepsInFlight steps keep their ids in registers until the scatter; longer
  // ones read them again there (from L2).
  const bool in_registers = seg.pairs_per_segment <= kWarp * kStepsInFlight;
  int32_t experts[kStepsInFlight];
  if (in_registers) load_steps(a, first, end, experts);
  zero_row(row, E);
  if (in_registers) {
#pragma unroll
    for (int i = 0; i < kStepsInFlight; ++i) count_step(row, experts[i]);
  } else {
    walk_segment(a, seg, s, [&](int32_t expert, int64_t) { count_step(row, expert); });
  }
  __syncthreads();
  // Each warp's row becomes the pairs of the block's lower warps per expert.
  for (int e = t; e < E; e += threads) {
    int32_t sum = 0;
    for (int w = 0; w < warps; ++w) {
      const int32_t count = rows[w * E + e];
      rows[w * E + e] = sum;
      sum += count;
    }
    block_counts[e] = sum;
  }
  cluster.sync();
  for (int e = t; e < E; e += threads) {
    int32_t sum = 0, below = 0;
    for (int b = 0; b < blocks; ++b) {
      if (b == rank) below = sum;
      sum += cluster.map_shared_rank(block_counts, b)[e];
    }
    counts[e] = sum;
    lower[e] = below;
  }
  auto reads_done = cluster.barrier_arrive();
  __syncthreads();
  padded_offsets(counts, E, static_cast<int>(a.block_m), offsets);
  if (rank == 0 && t == 0) *a.num_pairs_post_padded = offsets[E];
  for (int e = lane; e < E; e += kWarp) row[e] += offsets[e] + lower[e];
  __syncwarp();
  if (in_registers) {
#pragma unroll
    for (int i = 0; i < kStepsInFlight; ++i) {
      if (i < steps) scatter_step(a, row, experts[i], first + i * kWarp);
    }
  } else {
    walk_segment(a, seg, s, [&](int32_t expert, int64_t first_pair) {
      scatter_step(a, row, expert, first_pair);
    });
  }
  // The padding of expert e, by warp e of the cluster (then e + all its warps...).
  const int32_t sentinel = static_cast<int32_t>(a.num_pairs);
  for (int e = rank * warps + warp; e < E; e += blocks * warps) {
    for (int i = offsets[e] + counts[e] + lane; i < offsets[e + 1]; i += kWarp) {
      a.sorted_pair_ids[i] = sentinel;
    }
  }
  write_expert_ids(a, offsets, rank * threads + t, blocks * threads);
  cluster.barrier_wait(std::move(reads_done));  // no block leaves while others read its counts
#endif
}

__global__ void tiny_kernel(AlignArgs a) {
  const int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p == 0) *a.num_pairs_post_padded = static_cast<int32_t>(a.num_pairs);
  if (p >= a.num_pairs) return;
  const int32_t id = a.topk_ids[p];
  a.sorted_pair_ids[p] = static_cast<int32_t>(p);
  a.expert_ids[p] = (id >= 0 && id < a.num_experts) ? local_expert(a, id) : -1;
}

// Whether the pairs are sorted by single_block_kernel, which needs no scratch.
bool fits_one_block(int64_t num_pairs, int64_t num_experts) {
  return num_pairs <= kSingleBlockPairs && num_experts <= kSingleBlockExperts;
}

// The launch of the cluster path for this many blocks and experts (`config.attrs` points into
// the struct, so it is not copied).
struct ClusterLaunch {
  cudaLaunchAttribute attribute = {};
  cudaLaunchConfig_t config = {};
  ClusterLaunch(int blocks, int64_t num_experts, cudaStream_t stream) {
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(blocks);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(static_cast<unsigned>(blocks));
    config.blockDim = dim3(kScanThreads);
    config.dynamicSmemBytes =
        static_cast<size_t>((kScanThreads / kWarp + 4) * num_experts + 1) * sizeof(int32_t);
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether the current GPU runs the largest cluster: Hopper or later, and enough multiprocessors
// in one cluster's reach (a MIG slice may have fewer). Asked once per device.
bool clusters_run() {
  static std::array<std::atomic<int>, kDevicesRemembered> known{};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const bool remembered = device >= 0 && device < kDevicesRemembered;
  if (remembered && known[device].load(std::memory_order_acquire) != 0) {
    return known[device].load(std::memory_order_relaxed) == 2;
  }
  int major = 0, active = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
        "cudaDeviceGetAttribute(compute capability)");
  if (major >= 9) {
    ClusterLaunch largest(kMaxClusterBlocks, kSingleBlockExperts, nullptr);
    check(cudaOccupancyMaxActiveClusters(&active, cluster_kernel, &largest.config),
          "cudaOccupancyMaxActiveClusters(align cluster_kernel)");
  }
  if (remembered) known[device].store(active > 0 ? 2 : 1, std::memory_order_release);
  return active > 0;
}

// Blocks of the cluster path for this batch: 0 where the single block does (small batches), or
// where the GPU has no clusters or the rows of E counts per warp do not fit.
int cluster_blocks_for(int64_t num_pairs, int64_t num_experts) {
  if (num_experts > kSingleBlockExperts) return 0;
  const int64_t blocks = std::min<int64_t>(
      kMaxClusterBlocks, (num_pairs + kClusterBlockPairs - 1) / kClusterBlockPairs);
  return blocks >= 2 && clusters_run() ? static_cast<int>(blocks) : 0;
}

void launch_cluster(const AlignArgs& args, int blocks, cudaStream_t stream) {
  const int64_t warps = blocks * (kScanThreads / kWarp);
  int64_t length = (args.num_pairs + warps - 1) / warps;
  length = std::max<int64_t>(kWarp, (length + kWarp - 1) / kWarp * kWarp);
  ClusterLaunch launch(blocks, args.num_experts, stream);
  check(cudaLaunchKernelEx(&launch.config, cluster_kernel, args, Segments{length, warps}),
        "cudaLaunchKernelEx(align cluster_kernel)");
}

}  // namespace

// An upper bound of the segments of any batch up to num_pairs (the count itself is not monotonic
// in num_pairs), so a workspace reserved for a long batch also serves a shorter last chunk.
size_t align_scratch_bytes(int64_t num_pairs, int64_t num_experts) {
  if (num_experts <= 0 || fits_one_block(num_pairs, num_experts)) return 0;
  const int64_t most = std::clamp<int64_t>(kMaxCounts / num_experts, 1, kMaxSegments);
  const int64_t segments =
      std::clamp<int64_t>((num_pairs + kMinSegmentPairs - 1) / kMinSegmentPairs, 1, most);
  return static_cast<size_t>(segments * num_experts) * sizeof(int32_t);
}

void align_block_size(const AlignArgs& args, cudaStream_t stream) {
  const int64_t E = args.num_experts;
  if (const int blocks = cluster_blocks_for(args.num_pairs, E); blocks > 0) {
    launch_cluster(args, blocks, stream);
    return;
  }
  if (fits_one_block(args.num_pairs, E)) {
    const SingleBlock block = single_block_for(args.num_pairs, E);
    const size_t bytes = static_cast<size_t>(block.threads / kWarp * E) * sizeof(int32_t) +
                         scan_shared_bytes(E, block.threads);
    allow_shared_bytes<single_block_kernel>(
        static_cast<size_t>(kRowInts) * sizeof(int32_t) +
            scan_shared_bytes(kSingleBlockExperts, kScanThreads),
        "cudaFuncSetAttribute(align single_block_kernel)");
    single_block_kernel<<<1, block.threads, bytes, stream>>>(args, block.seg);
    check_launch("align_block_size");
    return;
  }
  const Segments seg = segments_of(args.num_pairs, E);
  const int rows = rows_per_block(E);
  const auto blocks = static_cast<unsigned>((seg.count + rows - 1) / rows);
  const size_t row_bytes = static_cast<size_t>(rows * E) * sizeof(int32_t);
  count_kernel<<<blocks, rows * kWarp, row_bytes, stream>>>(args, seg);
  check_launch("align_block_size (count)");
  const size_t scan_bytes = scan_shared_bytes(E, kScanThreads);
  allow_shared_bytes<scan_kernel>(scan_shared_bytes(kMaxAlignExperts, kScanThreads),
                                  "cudaFuncSetAttribute(align scan_kernel)");
  scan_kernel<<<1, kScanThreads, scan_bytes, stream>>>(args, seg);
  check_launch("align_block_size (scan)");
  scatter_kernel<<<blocks, rows * kWarp, row_bytes, stream>>>(args, seg);
  check_launch("align_block_size (scatter)");
}

void align_tiny_batch(const AlignArgs& args, cudaStream_t stream) {
  const int64_t blocks = std::max<int64_t>(1, (args.num_pairs + 255) / 256);
  tiny_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(args);
  check_launch("align_tiny_batch");
}

}  // namespace moe::cuda
