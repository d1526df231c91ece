#include "cuda/device_tensor.h"

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace moe::testing {
namespace {

void expect_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

std::shared_ptr<void> device_alloc(size_t bytes) {
  void* data = nullptr;
  expect_ok(cudaMalloc(&data, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return std::shared_ptr<void>(data, [](void* p) { cudaFree(p); });
}

}  // namespace

bool gpu_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

DeviceTensor::DeviceTensor(const TensorView& host)
    : dtype_(host.dtype), shape_(host.shape), data_(device_alloc(host.nbytes())) {
  expect_ok(cudaMemcpy(data_.get(), host.data, host.nbytes(), cudaMemcpyHostToDevice),
            "cudaMemcpy to device");
}

DeviceTensor DeviceTensor::empty_like(DType dtype, Shape shape) {
  DeviceTensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = device_alloc(t.view().nbytes());
  // Poison: any element a kernel forgets to write shows up as NaN (or -1 for ints).
  expect_ok(cudaMemset(t.data_.get(), 0xff, t.view().nbytes()), "cudaMemset");
  return t;
}

TensorView DeviceTensor::view() const {
  return TensorView(data_.get(), dtype_, shape_, Device::kCuda);
}

Tensor DeviceTensor::to_host() const {
  Tensor host(dtype_, shape_);
  expect_ok(cudaDeviceSynchronize(), "kernel execution");
  expect_ok(cudaMemcpy(host.data<void>(), data_.get(), host.nbytes(), cudaMemcpyDeviceToHost),
            "cudaMemcpy to host");
  return host;
}

}  // namespace moe::testing
