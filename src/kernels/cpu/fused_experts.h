// The CPU experts pipeline: align, gemm1, act, gemm2, sum, and the shared experts, over a
// workspace that is sized once and reused (no allocation per call after warm-up).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/experts_problem.h"
#include "moe/experts.h"

namespace moe::cpu {

// Rows per block when the caller does not choose: large enough that a weight tile is reused
// across many rows in prefill, small enough that the A panel stays in L2.
inline constexpr int64_t kDefaultBlockM = 32;

// Buffers of one layer's calls. They only grow, so a steady stream of batches no larger than the
// largest seen so far allocates nothing.
struct ExpertsWorkspace {
  std::vector<int32_t> sorted_pair_ids;    // [max_num_pairs_post_padded]
  std::vector<int32_t> expert_ids;         // [max blocks]
  std::vector<int32_t> expert_offsets;     // [E + 1], align scratch
  std::vector<float> cache13;              // [M*k, max(2I, H)]: cache1, then reused as cache3
  std::vector<float> cache2;               // [M*k, I]
  std::vector<int32_t> shared_pair_ids;    // [blocks * block_m]: tokens 0..M-1, then padding
  std::vector<int32_t> shared_expert_ids;  // [blocks], all 0
  std::vector<float> shared_gate;          // [M]: sigmoid(hidden · gate)
  std::vector<float> shared_cache1;        // [M, 2 Is]
  std::vector<float> shared_cache2;        // [M, Is]
  std::vector<float> shared_out;           // [M, H]
  std::vector<float> gemm_scratch;         // per-thread panels of the grouped GEMM
};

// Runs the whole experts half of the layer for a validated problem. block_m in [1, kMaxBlockM].
// The same as routed_pair_outputs, then shared_expert_outputs, then moe_sum.
void fused_experts(const ExpertsProblem& problem, int64_t block_m, ExpertsWorkspace& workspace,
                   int num_threads, StageTimes* times);

// Align, gemm1, act and gemm2 of every pair: returns cache3 [M*k, H] f32 in pair order (the router
// weight applied as the problem says), held by the workspace until its next use. Expert
// parallelism runs this on the pairs a rank received and sends the rows back.
const float* routed_pair_outputs(const ExpertsProblem& problem, int64_t block_m,
                                 ExpertsWorkspace& workspace, int num_threads, StageTimes* times);

// The shared MLP over all M tokens: returns [M, H] f32 held by the workspace, or null when the
// problem has no shared experts. Does not touch the buffers routed_pair_outputs returns.
const float* shared_expert_outputs(const ExpertsProblem& problem, int64_t block_m,
                                   ExpertsWorkspace& workspace, int num_threads, StageTimes* times);

}  // namespace moe::cpu
