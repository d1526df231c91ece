#include "kernels/cpu/layer_router.h"

#include "kernels/cpu/router_tiles.h"
#include "kernels/cpu/routing.h"

namespace moe::cpu {

LayerRouter::LayerRouter(CpuIsa isa, const void* weight, DType weight_dtype, int64_t num_experts,
                         int64_t hidden_size, int num_threads)
    : num_experts_(num_experts),
      hidden_size_(hidden_size),
      kernel_(router_kernel(isa)),
      panels_(pack_router_weight(weight, weight_dtype, num_experts, hidden_size, num_threads)) {
  // The f32 panels stay for a hidden of another dtype, which the bf16 tiles would round. Asking
  // whether amx is supported also has Linux grant this process the tile state, once.
  if (isa == CpuIsa::kAmx && weight_dtype == DType::kBF16 && router_tiles_fit(hidden_size) &&
      cpu_isa_supported(CpuIsa::kAmx)) {
    tile_kernel_ = amx_expert_kernels().tile;
    tiles_ = pack_router_tiles(weight, num_experts, hidden_size, num_threads);
    tail_ = router_tiles_tail_buffer(tile_kernel_, hidden_size);
  }
}

bool LayerRouter::takes_tiles(DType hidden_dtype) const {
  return tiles_.defined() && hidden_dtype == DType::kBF16;
}

void LayerRouter::logits(const void* hidden, DType hidden_dtype, const float* router_bias,
                         int64_t num_tokens, float* logits, int num_threads) {
  if (takes_tiles(hidden_dtype)) {
    router_logits_tiles(tile_kernel_, hidden, tiles_.data<uint8_t>(), router_bias, num_tokens,
                        hidden_size_, num_experts_, tail_, logits, num_threads);
    return;
  }
  router_logits(kernel_, hidden, hidden_dtype, panels_.data<float>(), router_bias, num_tokens,
                hidden_size_, num_experts_, logits, num_threads);
}

}  // namespace moe::cpu
