// An output buffer for kernel tests: poisoned (all bytes 0xff: NaN for floats, -1 for int32)
// before the kernel runs, so an element it forgot to write shows, and followed by a guard region
// whose bytes must be unchanged afterwards, so a write past the end shows.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "moe/tensor.h"

namespace moe::testing {

template <typename T>
class GuardedBuffer {
 public:
  static constexpr int64_t kGuardElements = 64;
  static constexpr unsigned char kGuardByte = 0x5a;

  explicit GuardedBuffer(int64_t size) : size_(size), storage_(size + kGuardElements) {
    std::memset(storage_.data(), 0xff, static_cast<size_t>(size_) * sizeof(T));
    std::memset(storage_.data() + size_, kGuardByte, kGuardElements * sizeof(T));
  }

  T* data() { return storage_.data(); }
  const T* data() const { return storage_.data(); }
  T operator[](int64_t i) const { return storage_[static_cast<size_t>(i)]; }
  int64_t size() const { return size_; }
  TensorView view(DType dtype, Shape shape) { return TensorView(data(), dtype, std::move(shape)); }

  bool guard_intact() const {
    const auto* guard = reinterpret_cast<const unsigned char*>(storage_.data() + size_);
    for (size_t i = 0; i < kGuardElements * sizeof(T); ++i) {
      if (guard[i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  int64_t size_;
  std::vector<T> storage_;
};

}  // namespace moe::testing
