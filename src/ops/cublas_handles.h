// cuBLAS handles for the public calls that run on a caller's stream (route() on the GPU).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace moe {

// A handle bound to `stream`, one per calling thread, current device and stream: a handle is not
// safe to share between threads, and cuBLAS's workspace of one handle must not serve two streams
// that may run at once. Created on first use and kept until the thread exits.
cublasHandle_t cublas_handle(cudaStream_t stream);

}  // namespace moe
