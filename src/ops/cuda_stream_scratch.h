// Device scratch that lives on one stream (cudaMallocAsync, freed on the same stream), for the
// CUDA paths of the public calls that own no workspace. Calls on several streams never share it,
// and it is freed on the stream also when a later step of the call throws.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernels/cuda/check.h"

namespace moe {

class CudaStreamScratch {
 public:
  // `what` names the scratch in the error if the allocation fails.
  CudaStreamScratch(size_t bytes, cudaStream_t stream, const char* what) : stream_(stream) {
    if (bytes > 0) cuda::check(cudaMallocAsync(&data_, bytes, stream), what);
  }
  ~CudaStreamScratch() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);  // nothing to report from a destructor
  }
  CudaStreamScratch(const CudaStreamScratch&) = delete;
  CudaStreamScratch& operator=(const CudaStreamScratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace moe
