// The experts on the GPU: align, gemm1 (+ SiLU-and-multiply), gemm2 (+ router weight), sum.
// bf16 hidden and weights; validated at the API edge (src/ops). Long batches run in chunks of
// kChunkTokens so the workspace stays bounded.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/experts_problem.h"
#include "moe/experts.h"

namespace moe::cuda {

inline constexpr int64_t kChunkTokens = 16384;
// The tiny batch runs gemm2 and the sum as one launch up to this many tokens (tiny_gemm2_sum.h).
inline constexpr int64_t kTinySumMaxTokens = 2;

// How one call runs: which grouped-GEMM kernel, rows per aligned block, and whether align takes
// the tiny-batch path (one pair per block, no sort). kDecode with the tiny batch runs the whole
// call in one launch instead (decode_experts.h).
struct ExpertsPlan {
  GemmKernel kernel = GemmKernel::kStream;
  int64_t block_m = 16;
  bool tiny_batch = false;
  // Multiprocessors the persistent GEMM grids may take (GroupedGemmArgs); 0 = all.
  int max_multiprocessors = 0;
};

// The built-in choice when no tuned entry exists: the stream kernel while experts see few rows
// (weights dominate), tensor cores once rows per expert make the GEMMs compute-bound.
ExpertsPlan default_plan(const ExpertsProblem& problem);

// Why `plan` cannot run `problem` (block_m the kernel does not take, rows the tensor-core kernel
// cannot load, tiny batch with block_m != 1 or an expert map); empty when it can.
std::string why_plan_cannot_run(const ExpertsPlan& plan, const ExpertsProblem& problem);

// Throws moe::Error with that reason when `plan` cannot run `problem`.
void check_plan(const ExpertsPlan& plan, const ExpertsProblem& problem);

// Owns the device workspace. After the first call of a given shape, later calls of that shape
// or smaller allocate nothing and never synchronize, so they can be captured in a CUDA graph.
class ExpertsRunner {
 public:
  // `times`, if given, gets per-stage GPU times (events; this synchronizes the stream).
  void run(const ExpertsProblem& problem, const ExpertsPlan& plan, cudaStream_t stream,
           StageTimes* times = nullptr);
  // Sizes the workspace for `problem` and `plan` without running anything.
  void reserve(const ExpertsProblem& problem, const ExpertsPlan& plan);
  size_t workspace_bytes() const;

  // For measurements: from the next call on, the tma plans' GEMMs record when each of their
  // thread blocks starts and ends (GroupedGemmArgs::timeline), and every plan but decode/1 puts
  // marks between its stages (time_mark.h); read_timeline gives those of the last call with
  // tokens (its last chunk's), synchronizing the stream. Times are from the first start of
  // gemm1's thread blocks, or from the call's start mark where no thread block recorded one.
  void record_timeline(bool on) { record_timeline_ = on; }
  struct ThreadBlockSpan {
    int gemm = 0;  // 1 or 2
    int block = 0;
    double start_us = 0, end_us = 0;
    int multiprocessor = 0;
  };
  // When the stream reached each point; NaN where the call has no such stage (gathered: only
  // plans that copy gemm1's rows into block order; all of them for decode/1).
  struct StageMarks {
    double start_us, aligned_us, gathered_us, gemm2_done_us, done_us;
  };
  struct Timeline {
    std::vector<ThreadBlockSpan> spans;  // tma plans only
    StageMarks marks;
  };
  Timeline read_timeline(cudaStream_t stream) const;

 private:
  // The decode plan: one launch (decode_experts.h), act in cache2_, its counters in decode_sync_.
  void run_decode(const ExpertsProblem& problem, cudaStream_t stream, StageTimes* times);

  DeviceBuffer sorted_pair_ids_, expert_ids_, num_pairs_post_padded_, align_scratch_, cache2_,
      cache3_, tile_counter_, decode_sync_, block_done_, timeline_;
  bool decode_sync_zeroed_ = false, tile_counter_zeroed_ = false, block_done_zeroed_ = false;
  bool record_timeline_ = false;
};

}  // namespace moe::cuda
