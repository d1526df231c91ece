// The GPU half of MoeLayer (backend kCuda): the layer's weights copied once to the memory of the
// device current at construction, then route (cuBLAS router GEMM + fused select), the routed
// experts (the tuned plan for this GPU and shape, ops/cuda_plan_choice.h) and the shared experts
// (added to the routed sum) on the caller's stream, over buffers that grow to the largest batch and
// are then reused.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fused_experts.h"
#include "kernels/cuda/shared_experts.h"
#include "moe/config.h"
#include "moe/experts.h"
#include "moe/layer.h"

namespace moe {

class CudaLayer {
 public:
  // Throws moe::Error naming what the CUDA backend does not run yet for this config.
  CudaLayer(const MoeConfig& config, const LayerWeights& weights);
  ~CudaLayer();
  CudaLayer(const CudaLayer&) = delete;
  CudaLayer& operator=(const CudaLayer&) = delete;

  // hidden and out bf16 [M, H], both on the CPU or both on the GPU (the layer's, which must be
  // current). Runs on `stream` and synchronizes it before returning: the batch's routing is left
  // in topk_ids / topk_weights / expert_counts (host, resized to fit), so the buffers are free
  // for the next call whatever stream it uses.
  void forward(const TensorView& hidden, const TensorView& out, std::vector<int32_t>& topk_ids,
               std::vector<float>& topk_weights, std::vector<int32_t>& expert_counts,
               StageTimes& times, cudaStream_t stream);

 private:
  MoeConfig config_;
  DType router_dtype_;
  int device_ = 0;  // where the weights and buffers live
  cublasHandle_t cublas_ = nullptr;
  cuda::ExpertsRunner experts_;
  cuda::DeviceBuffer router_, router_bias_, correction_bias_, w13_, w2_;
  cuda::DeviceBuffer hidden_, out_, logits_, ids_, weights_, counts_;
  cuda::SharedExperts shared_;  // undefined without shared experts
  std::optional<cuda::SharedExpertsWorkspace> shared_workspace_;
  cudaEvent_t shared_start_ = nullptr, shared_end_ = nullptr;  // times the shared experts
};

}  // namespace moe
