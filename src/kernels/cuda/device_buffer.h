// Owning GPU memory that grows on demand and never shrinks, so a workspace reserved once for
// the largest batch is reused without allocation (and so stays valid inside a CUDA graph).
#pragma once

#include <cstddef>

namespace moe::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  // Makes room for `bytes`; reallocates (dropping the contents) only when it must grow.
  void reserve(size_t bytes);
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace moe::cuda
