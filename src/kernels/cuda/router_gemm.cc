#include "kernels/cuda/check.h"
#include "kernels/cuda/routing.h"

namespace moe::cuda {

void router_gemm(cublasHandle_t handle, const void* hidden, const void* router_weight, DType dtype,
                 int64_t num_tokens, int64_t hidden_size, int64_t num_experts, float* logits,
                 cudaStream_t stream) {
  if (num_tokens == 0) return;
  check(cublasSetStream(handle, stream), "cublasSetStream");
  const cudaDataType_t type = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const float one = 1.0f, zero = 0.0f;
  // Row-major logits [M, E] is column-major [E, M] = router_weight^T-as-stored · hidden^T.
  check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(num_experts),
                     static_cast<int>(num_tokens), static_cast<int>(hidden_size), &one,
                     router_weight, type, static_cast<int>(hidden_size), hidden, type,
                     static_cast<int>(hidden_size), &zero, logits, CUDA_R_32F,
                     static_cast<int>(num_experts), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (router)");
}

}  // namespace moe::cuda
