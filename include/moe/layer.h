// MoeLayer: router + expert weights + experts kernel, with a workspace reused across calls,
// stage timers and per-expert counts recorded on every call.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moe/backend.h"
#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/experts.h"
#include "moe/tensor.h"

namespace moe {

// The weights of one MoE layer in the engine's layout. Optional tensors stay undefined when the
// config does not use them.
struct LayerWeights {
  Tensor router;           // [E, H]
  Tensor router_bias;      // [E] f32, when routing.has_router_bias
  Tensor correction_bias;  // [E] f32, when routing.has_correction_bias
  Tensor w13;              // [E, 2I, H]: gate rows, then up rows
  Tensor w2;               // [E, H, I]
  Tensor w13_bias;         // [E, 2I] f32, when experts.has_bias
  Tensor w2_bias;          // [E, H] f32, when experts.has_bias
  Tensor shared_w13;       // [2 Is, H], when experts.shared_intermediate_size > 0
  Tensor shared_w2;        // [H, Is]
  Tensor shared_gate;      // [1, H], when experts.shared_gate

  int64_t nbytes() const;  // bytes of all weights
};

// Deterministic synthetic weights for `config` in `dtype`, scaled like a trained model: each
// projection keeps activations of order one, router logits have unit spread. The same seed gives
// the same weights on every machine and thread count.
LayerWeights synthetic_layer_weights(const MoeConfig& config, DType dtype, uint64_t seed);
// The same weights with w13, w2 and their biases cut to `experts` (logical ids, in that order,
// repeats allowed): what one rank of an expert-parallel group holds, without building the rest.
// An empty list means every expert.
LayerWeights synthetic_layer_weights(const MoeConfig& config, DType dtype, uint64_t seed,
                                     std::span<const int32_t> experts);

struct LayerOptions {
  Backend backend = Backend::kAuto;
  int num_threads = 0;             // 0 = all hardware threads
  int64_t block_m = 0;             // 0 = the backend's choice
  CpuIsa cpu_isa = CpuIsa::kAuto;  // cpu backend: kAuto = MOE_CPU_ISA, or the fastest path
};

class MoeLayer {
 public:
  // Checks every weight against the config; throws moe::Error naming the first mismatch, or when
  // options.cpu_isa (or MOE_CPU_ISA) names a path this machine cannot run. On the cpu backend the
  // expert weights (w13, w2 and the shared experts') are packed once for the kernels and the layer
  // keeps only the packed copy: pass the weights by value (moved) to free the plain ones.
  MoeLayer(MoeConfig config, LayerWeights weights, LayerOptions options = {});
  // Decoder layer `layer` of the Hugging Face checkpoint in folder `dir`, its weights in `dtype`
  // (Checkpoint and load_moe_layer in moe/checkpoint.h say what is read and what is refused).
  static MoeLayer from_checkpoint(const std::string& dir, int64_t layer, DType dtype,
                                  LayerOptions options = {});
  ~MoeLayer();
  MoeLayer(MoeLayer&&) noexcept;
  MoeLayer& operator=(MoeLayer&&) noexcept;

  // hidden [M, H] f32/bf16/f16 -> out [M, H] of the same dtype. On the cuda backend, hidden and
  // out are both in host memory or both in the memory of the GPU the layer was built on (which
  // must be the current device), and must not overlap where the layer has shared experts (they
  // read hidden after the routed sum went to out); the work runs on `cuda_stream` (a
  // cudaStream_t; null is the legacy default stream), which is synchronized before the call
  // returns, since the routing and stage times are recorded on the host.
  void forward(const TensorView& hidden, const TensorView& out, void* cuda_stream = nullptr);
  // Host tensors only: the result is a host tensor.
  Tensor forward(const TensorView& hidden);
  // The experts half only, on a routing the caller chose: topk_ids [M, k] int32 in [0, E) and
  // topk_weights [M, k] f32 (benchmarks, or routing done elsewhere). Allocates nothing once warm.
  void forward_experts(const TensorView& hidden, const TensorView& topk_ids,
                       const TensorView& topk_weights, const TensorView& out);

  // Serves the experts from physical slots, some experts having several (EPLB's redundant
  // experts): slot_experts [num_slots] names the logical expert each slot holds, every expert at
  // least once. Each pair goes to one replica of its expert, spread evenly in pair order
  // (kernels/cpu/assign_replicas.h). Outputs do not change; per-slot loads do. Throws moe::Error
  // on an id out of range or an expert without a slot. An empty list returns to one slot per
  // expert.
  void set_replicas(const std::vector<int32_t>& slot_experts);
  int64_t num_slots() const;  // E without replicas

  const MoeConfig& config() const { return config_; }
  // The weights as given, except that on the cpu backend w13, w2, shared_w13 and shared_w2 are
  // undefined: they live only in packed form (unpacked_weights() rebuilds them).
  const LayerWeights& weights() const { return weights_; }
  LayerWeights unpacked_weights() const;  // every weight in the plain layout (copies)
  DType weight_dtype() const;             // of w13 and w2
  const LayerOptions& options() const { return options_; }
  // The instruction-set path of the cpu backend, fixed at construction; kAuto on the reference
  // backend.
  CpuIsa cpu_isa() const;

  // What the last forward did.
  const StageTimes& last_stage_times() const { return times_; }
  TensorView last_topk_ids() const;       // [M, k] int32
  TensorView last_topk_weights() const;   // [M, k] f32
  TensorView last_expert_counts() const;  // [E] int32: pairs per expert
  TensorView last_slot_counts() const;    // [num_slots] int32: pairs per physical slot

 private:
  struct State;
  void route_batch(const TensorView& hidden);          // fills topk ids, weights and counts
  void route_batch_checked(const TensorView& hidden);  // the same through the public route()
  void run_experts(const TensorView& hidden, const int32_t* topk_ids, const float* topk_weights,
                   const TensorView& out);

  MoeConfig config_;
  LayerWeights weights_;
  LayerOptions options_;
  StageTimes times_;
  std::unique_ptr<State> state_;
};

}  // namespace moe
