// The experts GEMMs on packed weights: gemm1 with the activation in its epilogue (cache1 is never
// written), gemm2 with the bias and the router weight in its epilogue.
//
// For every group of rows (one expert's pair or token ids) and every panel pair of that expert's
// packed matrix (packed_weights.h):
//   acc[r, :] = row(ids[r]) * a_scale[ids[r]] · pair^T                          (tile_kernel.h)
//   gated:  out[ids[r], 16j + c] = act(acc[r, c] + bias_gate, acc[r, 16 + c] + bias_up)
//   plain:  out[ids[r], 32j + c] = (acc[r, c] + bias) * out_scale[ids[r]]
// (computed in f32 and stored in out_dtype: rounded once where that is bf16), where row(i) is
// row i / a_row_divisor of A, or the row at a_row_ptrs[i] when the rows lie elsewhere (expert
// parallelism: rows received from other ranks, and the rank's own). The input
// rows are gathered and converted (f32, or bf16 for the bf16 kernels) into a per-thread buffer
// once per chunk of rows, straight from where they live (hidden[p / k], cache2[p]). Each
// work item (work_split.h) streams its weight pairs from memory once for all rows of its chunk:
// each 16 KiB k block of a pair stays in L1 while the kernel walks the chunk's row blocks (in the
// amx kernel's chunks of one or two row blocks, whose sums stay in tiles, the whole of k stays in
// L2 instead: TileKernel::whole_k_row_blocks), and the next block is prefetched meanwhile. Each
// output element is computed in a fixed order, so results do not depend on the thread count.
// Tested by tests/experts (every path against the reference backend; packed_mlp_prefill against
// two passes of packed_gemm, bit for bit).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/gated_activation.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/tile_kernel.h"
#include "kernels/cpu/work_split.h"

namespace moe::cpu {

// Bytes of one k block of a panel pair: small enough that the block and the matching slice of a
// block of input rows stay in a 32 KiB L1 while every row block of the chunk passes over it.
inline constexpr int64_t kPairBlockBytes = 16 * 1024;

struct PackedGemmArgs {
  const void* a = nullptr;  // [*, layout.k] of a_dtype
  DType a_dtype = DType::kF32;
  int64_t a_row_divisor = 1;                // row id i reads row i / a_row_divisor ...
  const void* const* a_row_ptrs = nullptr;  // ... or the row at a_row_ptrs[i]: [ids]
  const float* a_scale = nullptr;           // [ids] or null
  PackedLayout layout;
  const uint8_t* const* experts = nullptr;  // [num experts]: each expert's packed matrix
  const float* bias = nullptr;              // [num experts, layout.n] or null
  ActivationParams activation;              // gated layouts
  const float* out_scale = nullptr;         // plain layouts: [ids] or null
  // [ids, layout.n / 2 (gated) or layout.n] of out_dtype, f32 or bf16. Gated outputs are the next
  // GEMM's inputs and may be stored in that GEMM's input dtype (bf16 for the bf16 kernels):
  // rounded once, here, rather than by every thread that gathers them. Plain outputs are cache3
  // (bf16 for a bf16 layer, fused_experts.h) or the shared experts' f32 rows.
  void* out = nullptr;
  DType out_dtype = DType::kF32;
  // Plain layouts: whole output rows go past the caches (EpilogueArgs::stream), for an out far
  // larger than the caches that a later stage reads once.
  bool stream_out = false;
};

// Buffers that only grow: a steady stream of batches allocates nothing.
struct PackedGemmWorkspace {
  std::vector<ExpertRows> chunks;
  std::vector<WorkItem> items;
  std::vector<float> thread_buffers;  // per thread: input rows, accumulators, a row of f32
  // packed_mlp_prefill: gemm2's split, which chunks run whole, and the ids 0, 1, ... of a
  // chunk's rows in order.
  std::vector<ExpertRows> down_chunks;
  std::vector<WorkItem> down_items;
  std::vector<uint8_t> whole;
  std::vector<int32_t> row_order;
};

// rows_per_pass: most rows of one expert per pass over its weights (the block_m option).
void packed_gemm(const PackedGemmArgs& args, const ExpertRows* groups, int64_t num_groups,
                 const ExpertKernels& kernels, int64_t rows_per_pass,
                 PackedGemmWorkspace& workspace, int num_threads);

// gemm1 (`up`, gated) of every group, and gemm2 (`down`, which reads up's outputs by row id:
// down.a == up.out) of the chunks that both work splits leave to one thread whole (prefill,
// work_split.h). The thread keeps such a chunk's gemm1 outputs as gemm2's input rows in its own
// buffer, in its caches: up.out is not written for them, nor read back. `rest` receives the
// chunks whose gemm2 is still to run, for packed_gemm(down, rest, ...). The results are bit for
// bit those of packed_gemm(up) then packed_gemm(down); when down does not read up's rows as they
// are (scaled, another dtype), every chunk is left to `rest`.
void packed_mlp_prefill(const PackedGemmArgs& up, const PackedGemmArgs& down,
                        const ExpertRows* groups, int64_t num_groups, const ExpertKernels& kernels,
                        int64_t rows_per_pass, PackedGemmWorkspace& workspace, int num_threads,
                        std::vector<ExpertRows>& rest);

}  // namespace moe::cpu
