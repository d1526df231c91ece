// The CPU experts pipeline: align, gemm1 with act fused, gemm2 with the router weight fused, the
// shared experts and the sum, on packed weights (packed_experts.h) through the tile kernels of one
// instruction set (tile_kernel.h), over a workspace that is sized once and reused.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/packed_experts.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/tile_kernel.h"
#include "kernels/experts_problem.h"
#include "moe/experts.h"

namespace moe::cpu {

// block_m is the most rows of one expert multiplied in one pass over its weights. The default
// covers an expert's share of a 4096-token batch of a 128-expert top-8 model, 256 rows on average
// and up to about 1.2 times that under random routing, so prefill streams each expert's weights
// once, while the rows (bf16: 1.3 MiB at H = 2048) stay in L2. At 256 the experts past it were cut
// into two chunks of about 150 rows, and the amx path took 5% more time at 4096 tokens on a 2-core
// AMX Xeon; 384 was 1-2% slower than 320 at 6144 and 16384 tokens; avx512bf16 was level, avx2
// level in one process and 4% slower at 4096 tokens in another (docs/perf.md).
inline constexpr int64_t kDefaultBlockM = 320;
// The largest block_m accepted: each thread holds block_m input rows.
inline constexpr int64_t kMaxBlockM = 1024;

// Buffers of one layer's calls. They only grow, so a steady stream of batches no larger than the
// largest seen so far allocates nothing.
struct ExpertsWorkspace {
  std::vector<int32_t> sorted_pair_ids;  // [M*k]: pair ids grouped by expert
  std::vector<int32_t> block_experts;    // [M*k], align output (one pair per block)
  std::vector<int32_t> expert_offsets;   // [E + 1]
  std::vector<ExpertRows> groups;        // [touched experts]
  std::vector<float> cache2;             // [M*k, I] of the kernels' input dtype
  std::vector<ExpertRows> gemm2_rest;    // chunks whose gemm2 reads cache2 (packed_mlp_prefill)
  std::vector<float> cache3;             // [M*k, H] of cache3_dtype, from a cache line on
  std::vector<int32_t> token_ids;        // [M]: 0..M-1, the shared experts' rows
  std::vector<float> shared_gate;        // [M]: sigmoid(hidden · gate)
  std::vector<float> gate_row;           // [2H]: a hidden row and the gate in f32
  std::vector<float> shared_cache2;      // [M, Is] of the kernels' input dtype
  std::vector<float> shared_out;         // [M, H]
  PackedGemmWorkspace gemm;
  // Experts packed by the call itself when the caller has no packed weights.
  std::vector<int32_t> local_slot;        // [E_local]: where a touched expert was packed, or -1
  std::vector<int32_t> touched;           // [touched experts]: local ids
  std::vector<const uint8_t*> w13_table;  // [E_local]
  std::vector<const uint8_t*> w2_table;   // [E_local]
  Tensor packed_w13, packed_w2;           // [touched, layout bytes]
  PackedExperts packed_shared;
};

// Runs the whole experts half of the layer for a validated problem with block_m in
// [1, kMaxBlockM]. `packed` holds the problem's weights prepacked, or is null: then the call packs
// the experts this batch touches into the workspace first (the vLLM-shaped call on plain weights).
// The same as routed_pair_outputs, then shared_expert_outputs, then moe_sum.
void fused_experts(const ExpertsProblem& problem, const PackedExpertsView* packed,
                   const ExpertKernels& kernels, int64_t block_m, ExpertsWorkspace& workspace,
                   int num_threads, StageTimes* times);

// The dtype gemm2 stores cache3 in, for a layer whose output (ExpertsProblem::out, of
// hidden_dtype) is out_dtype: bf16 for bf16, else f32. Each value is the f32
// (acc + bias) * topk_weight rounded once to bf16; the sum widens it back and adds in f32. That
// halves the bytes gemm2 writes and the sum reads (256 MiB -> 128 MiB at 4096 tokens of
// Qwen3-30B-A3B), as the CUDA backend and vLLM keep cache3, for one extra bf16 rounding per pair
// row. f32 and f16 layers keep f32: f16 carries 3 more significant bits than bf16.
DType cache3_dtype(DType out_dtype);

// Align, gemm1, act and gemm2 of every pair: returns cache3 [M*k, H] of cache3_dtype(hidden_dtype)
// in pair order (the router weight applied as the problem says), held by the workspace until its
// next use. Expert parallelism runs this on the pairs a rank received and sends the rows back.
const void* routed_pair_outputs(const ExpertsProblem& problem, const PackedExpertsView* packed,
                                const ExpertKernels& kernels, int64_t block_m,
                                ExpertsWorkspace& workspace, int num_threads, StageTimes* times);

// The shared MLP over all M tokens: returns [M, H] f32 held by the workspace, or null when the
// problem has no shared experts or no tokens. Does not touch the buffers routed_pair_outputs
// returns.
const float* shared_expert_outputs(const ExpertsProblem& problem, const PackedExpertsView* packed,
                                   const ExpertKernels& kernels, int64_t block_m,
                                   ExpertsWorkspace& workspace, int num_threads, StageTimes* times);

}  // namespace moe::cpu
