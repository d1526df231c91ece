// One random fused-experts problem, its inputs and how to run it on any backend: the harness
// every experts backend is tested with against the reference backend.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/cpu/tile_kernel.h"
#include "moe/experts.h"
#include "moe/tensor.h"

namespace moe::testing {

enum class Routing { kUniform, kAllToOneExpert, kSkewed };

struct ExpertsCase {
  int64_t num_tokens = 4;
  int64_t hidden_size = 32;
  int64_t intermediate_size = 16;
  int64_t num_experts = 8;
  int64_t top_k = 2;
  DType dtype = DType::kF32;         // hidden and out
  DType weight_dtype = DType::kF32;  // w13, w2 and the shared weights
  Activation activation = Activation::kSilu;
  Routing routing = Routing::kUniform;
  bool weight_on_input = false;
  bool biases = false;
  bool expert_map = false;  // every third expert is not local
  int64_t shared_intermediate_size = 0;
  bool shared_gate = false;
  int64_t block_m = 0;
  uint64_t seed = 1;

  std::string describe() const;
};

// Inputs of a case; options point into the owned tensors.
struct ExpertsInputs {
  Tensor hidden, w13, w2, topk_weights, topk_ids;
  Tensor w13_bias, w2_bias, expert_map, shared_w13, shared_w2, shared_gate;
  ExpertsOptions options;
};

ExpertsInputs make_inputs(const ExpertsCase& c);

// Runs `backend` into a NaN-poisoned output followed by a guard row; fails the current test
// if the guard row changed.
Tensor run_backend(const ExpertsInputs& inputs, Backend backend, int num_threads = 0);

// The same through the cpu pipeline with the given tile kernels (any path, or an emulated one),
// packing the touched experts as the public call does.
Tensor run_cpu_kernels(const ExpertsInputs& inputs, const cpu::ExpertKernels& kernels,
                       int num_threads = 0);

// The reference result in f32 (inputs converted exactly to f32 when they are bf16/f16), so a
// low-precision backend is compared with the unrounded answer.
Tensor run_reference_f32(const ExpertsInputs& inputs);

}  // namespace moe::testing
