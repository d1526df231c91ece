#include "ops/cublas_handles.h"

#include <map>
#include <utility>

#include "kernels/cuda/check.h"

namespace moe {
namespace {

class Handle {
 public:
  Handle() { cuda::check(cublasCreate(&handle_), "cublasCreate"); }
  ~Handle() {
    if (handle_ != nullptr) cublasDestroy(handle_);  // nothing to report from a destructor
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

cublasHandle_t cublas_handle(cudaStream_t stream) {
  thread_local std::map<std::pair<int, cudaStream_t>, Handle> handles;
  int device = 0;
  cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  const cublasHandle_t handle = handles[{device, stream}].get();
  cuda::check(cublasSetStream(handle, stream), "cublasSetStream");
  return handle;
}

}  // namespace moe
