// Return-code checks for the CUDA runtime and cuBLAS. Every call whose status can fail goes
// through one of these, so a failure becomes a moe::Error naming the call, never a silent skip.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace moe::cuda {

// Throws moe::Error "CUDA error in <what>: <name> (<description>)" unless status is success.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);

// Checks the launch just made on the calling thread (bad configuration, missing image).
void check_launch(const char* kernel);

}  // namespace moe::cuda
