#include "kernels/cuda/device_buffer.h"

#include <utility>

#include "kernels/cuda/check.h"

namespace moe::cuda {

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);  // nothing to report from a destructor
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(capacity_, other.capacity_);
  return *this;
}

void DeviceBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  if (data_ != nullptr) check(cudaFree(data_), "cudaFree");
  data_ = nullptr;
  capacity_ = 0;
  check(cudaMalloc(&data_, bytes), "cudaMalloc (workspace)");
  capacity_ = bytes;
}

}  // namespace moe::cuda
