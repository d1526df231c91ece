// The router GEMM of a CPU layer (MoeLayer, EpMoeLayer), its weight packed once at construction:
// f32 panels for the f32 router kernels (routing.h), and on the amx path, for a bf16 router weight
// whose hidden size the tile kernel takes, the same weight in tile pairs too (router_tiles.h),
// which a bf16 hidden then multiplies. Each logit depends only on its token's row and the
// weights, whatever the batch and the threads: a layer and its expert-parallel form route alike.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/router_kernel.h"
#include "kernels/cpu/tile_kernel.h"
#include "moe/cpu_isa.h"
#include "moe/dtype.h"
#include "moe/tensor.h"

namespace moe::cpu {

class LayerRouter {
 public:
  LayerRouter() = default;
  // weight [num_experts, hidden_size] of weight_dtype; isa a resolved path (never kAuto).
  LayerRouter(CpuIsa isa, const void* weight, DType weight_dtype, int64_t num_experts,
              int64_t hidden_size, int num_threads);

  // Whether a hidden of this dtype goes through the tile kernel.
  bool takes_tiles(DType hidden_dtype) const;

  // logits [num_tokens, num_experts] f32 (+ router_bias [num_experts] f32, or null) from hidden
  // [num_tokens, hidden_size] of hidden_dtype; allocates nothing.
  void logits(const void* hidden, DType hidden_dtype, const float* router_bias, int64_t num_tokens,
              float* logits, int num_threads);

 private:
  int64_t num_experts_ = 0, hidden_size_ = 0;
  RouterKernel kernel_;
  Tensor panels_;  // f32 [num_panels, hidden_size, panel width]
  TileKernel tile_kernel_;
  Tensor tiles_;                // u8 panel pairs; undefined where the tile kernel is not used
  std::vector<uint16_t> tail_;  // router_tiles_tail_buffer
};

}  // namespace moe::cpu
