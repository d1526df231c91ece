// The experts half of a MoE layer: align, gemm1, act, gemm2, sum (and shared experts), with
// vLLM's fused_experts argument order and meaning.
//
//   gemm1  cache1[p] = hidden[p / k] · w13[e]^T (+ b13[e])            [M*k, 2I]
//   act    cache2[p] = act(cache1[p][:I], cache1[p][I:])               [M*k, I]
//   gemm2  cache3[p] = topk_weights[p] * (cache2[p] · w2[e]^T (+ b2[e])) [M*k, H]
//   sum    out[t] = sum_j cache3[t*k + j], j ascending (+ shared(hidden[t]))
//
// With apply_router_weight_on_input, gemm1 reads topk_weights[p] * hidden[p / k] and gemm2 does
// not scale (Llama-4, top-1 only in practice). Pairs whose expert is not local contribute zero.
#pragma once

#include <cstdint>

#include "moe/backend.h"
#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/tensor.h"

namespace moe {

// Wall time of each stage of one call, in microseconds.
struct StageTimes {
  double route_us = 0;
  double align_us = 0;
  // CPU prefill runs gemm2 of a chunk that one thread takes whole right after its gemm1; that
  // gemm2 time counts in gemm1_us. The CUDA decode plan runs gemm1, gemm2 and the sum in one
  // launch, all counted in gemm1_us.
  double gemm1_us = 0;
  double act_us = 0;
  double gemm2_us = 0;
  double sum_us = 0;
  double shared_us = 0;  // shared experts (gemm1, act, gemm2 of the always-on MLP)
  double total_us() const {
    return route_us + align_us + gemm1_us + act_us + gemm2_us + sum_us + shared_us;
  }
};

// The always-on MLP of models with shared experts (several shared experts are one MLP with the
// sum of their intermediate sizes).
struct SharedExpertWeights {
  TensorView w13;   // [2 * Is, H]
  TensorView w2;    // [H, Is]
  TensorView gate;  // [1, H] or [H]: output scaled by sigmoid(hidden · gate); empty = no gate
  bool defined() const { return !w13.empty(); }
};

struct ExpertsOptions {
  Activation activation = Activation::kSilu;
  float swiglu_alpha = 1.702f;  // kClampedSwiglu
  float swiglu_limit = 7.0f;    // kClampedSwiglu
  bool apply_router_weight_on_input = false;
  TensorView w13_bias;    // [E_local, 2I], optional
  TensorView w2_bias;     // [E_local, H], optional
  TensorView expert_map;  // [E_global] int32: local expert id or -1; empty = all experts local
  SharedExpertWeights shared;
  // cpu backend: the most rows of one expert multiplied in one pass over its weights;
  // 0 = the backend's choice.
  int64_t block_m = 0;
  Backend backend = Backend::kAuto;
  CpuIsa cpu_isa = CpuIsa::kAuto;  // cpu backend: kAuto = MOE_CPU_ISA, or the fastest path
  int num_threads = 0;             // 0 = all hardware threads
  // CUDA backend: the cudaStream_t to run on (null = the legacy default stream). Work is only
  // queued; the call returns without synchronizing unless stage times are asked for.
  void* cuda_stream = nullptr;
};

// hidden [M, H] f32/bf16/f16; w13 [E_local, 2I, H] and w2 [E_local, H, I] of one float dtype;
// topk_weights [M, k] f32; topk_ids [M, k] int32 (global ids); out [M, H] of hidden's dtype.
// Validates everything, then runs the chosen backend. `times`, if given, receives stage times.
void fused_experts(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                   const TensorView& topk_weights, const TensorView& topk_ids,
                   const TensorView& out, const ExpertsOptions& options = {},
                   StageTimes* times = nullptr);

Tensor fused_experts(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                     const TensorView& topk_weights, const TensorView& topk_ids,
                     const ExpertsOptions& options = {}, StageTimes* times = nullptr);

}  // namespace moe
