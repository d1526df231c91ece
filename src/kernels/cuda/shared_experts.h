// The shared experts on the GPU: the always-on MLP of DeepSeek-V3 and Qwen2-MoE over all M rows,
// added to the routed experts' output already in `out`.
//
//   gemm1  gate_up[t] = hidden[t] · w13^T                       [M, 2 Is] f32 (cuBLAS)
//   act    act[t] = silu(gate_up[t][:Is]) * gate_up[t][Is:]      [M, Is] bf16
//                   (* sigmoid(hidden[t] · gate) with a gate, Qwen2-MoE)
//   gemm2  out[t] = out[t] + act[t] · w2^T                       [M, H] bf16 (cuBLAS, beta = 1)
//
// bf16 operands, f32 accumulation; long batches run in chunks so the workspace stays bounded.
// Everything is queued on the caller's stream without host synchronization, so once a call of
// some M ran, calls of that M or less allocate nothing and can be captured in a CUDA graph.
// Tested by tests/cuda/shared_experts_test.cc against the reference backend.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/device_buffer.h"
#include "moe/tensor.h"

namespace moe::cuda {

// The act stage alone (the kernel; callers validate).
struct SharedActivationArgs {
  const float* gate_up = nullptr;  // [M, 2 Is]: gate columns, then up columns
  const void* hidden = nullptr;    // bf16 [M, H]; read only with a gate
  const void* gate = nullptr;      // bf16 [H], or null: no gate
  int64_t num_tokens = 0;          // M
  int64_t hidden_size = 0;         // H
  int64_t intermediate_size = 0;   // Is
  void* act = nullptr;             // bf16 [M, Is]
};

void shared_activation(const SharedActivationArgs& args, cudaStream_t stream);

// What one stream needs to run the shared experts: a cuBLAS handle of its own with a workspace
// of its own (one handle's workspace must not serve two streams that may run at once, and an
// explicit one keeps cuBLAS from allocating inside a graph capture), and the gate_up and act
// buffers, grown to the largest chunk and then reused. Built on the device current then.
class SharedExpertsWorkspace {
 public:
  SharedExpertsWorkspace();
  ~SharedExpertsWorkspace();
  SharedExpertsWorkspace(const SharedExpertsWorkspace&) = delete;
  SharedExpertsWorkspace& operator=(const SharedExpertsWorkspace&) = delete;

  size_t bytes() const;  // device memory held

 private:
  friend class SharedExperts;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer cublas_workspace_;
  DeviceBuffer gate_up_;  // [chunk, 2 Is] f32
  DeviceBuffer act_;      // [chunk, Is] bf16
};

// A layer's shared-expert weights in the memory of one GPU. Default-constructed: no shared
// experts (defined() is false).
class SharedExperts {
 public:
  SharedExperts() = default;
  // Copies bf16 host tensors to the current device: w13 [2 Is, H] (gate rows, then up rows),
  // w2 [H, Is], gate [1, H] or [H] (an empty view: no gate). Throws moe::Error naming the first
  // tensor of another device, dtype or shape, before anything is allocated.
  SharedExperts(const TensorView& w13, const TensorView& w2, const TensorView& gate);
  // Random bf16 weights drawn on the current device (benchmarks of large shapes): w13 and the
  // gate N(0, 1/H), w2 N(0, 1/Is), from `seed`.
  static SharedExperts random(int64_t hidden_size, int64_t intermediate_size, bool gated,
                              uint64_t seed);

  bool defined() const { return intermediate_size_ > 0; }
  int64_t hidden_size() const { return hidden_size_; }
  int64_t intermediate_size() const { return intermediate_size_; }
  bool gated() const { return gated_; }

  // out[t] += shared(hidden[t]) for t < num_tokens, hidden and out bf16 [num_tokens, H] on this
  // GPU, queued on `stream` with `workspace` (which no other stream may use until this work has
  // run). Throws moe::Error before queueing anything when check_args does; does nothing for
  // num_tokens = 0.
  void run(const void* hidden, int64_t num_tokens, void* out, SharedExpertsWorkspace& workspace,
           cudaStream_t stream) const;
  // Throws moe::Error unless run() can take these: shared experts defined, num_tokens >= 0, and
  // for num_tokens > 0 non-null hidden and out that do not overlap (a layer writes the routed sum
  // to out before the shared experts read hidden, so call this before the routed experts run).
  void check_args(const void* hidden, int64_t num_tokens, const void* out) const;

 private:
  int64_t hidden_size_ = 0;        // H
  int64_t intermediate_size_ = 0;  // Is
  bool gated_ = false;
  DeviceBuffer w13_, w2_, gate_;
};

}  // namespace moe::cuda
