#include "kernels/cuda/check.h"

#include "moe/error.h"

namespace moe::cuda {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail("CUDA error in {}: {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status));
  }
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail("cuBLAS error in {}: {} ({})", what, cublasGetStatusName(status),
         cublasGetStatusString(status));
  }
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace moe::cuda
