// The GPU half of MoeLayer (backend kCuda): the layer's weights copied to device memory once,
// then route (cuBLAS router GEMM + fused select) and the experts on one stream, over buffers
// that grow to the largest batch and are then reused.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fused_experts.h"
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

  // hidden and out bf16 [M, H], both on the CPU or both on the GPU. Leaves the batch's routing
  // in topk_ids / topk_weights / expert_counts (host, resized to fit).
  void forward(const TensorView& hidden, const TensorView& out, std::vector<int32_t>& topk_ids,
               std::vector<float>& topk_weights, std::vector<int32_t>& expert_counts,
               StageTimes& times);

 private:
  MoeConfig config_;
  DType router_dtype_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cuda::ExpertsRunner experts_;
  cuda::DeviceBuffer router_, router_bias_, correction_bias_, w13_, w2_;
  cuda::DeviceBuffer hidden_, out_, logits_, ids_, weights_, counts_;
};

}  // namespace moe
