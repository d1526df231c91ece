// Tensor views (borrowed memory) and owning tensors.
//
// A TensorView is a pointer, a dtype, a shape, element strides and a device. Views never own
// memory; a Tensor owns a contiguous host buffer and hands out views of it. Kernels take raw
// pointers; views exist so the API edge can check shapes, dtypes and strides once.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "moe/dtype.h"

namespace moe {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& shape);  // "[3, 4]"

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Shape strides;  // in elements; empty means contiguous row-major
  Device device = Device::kCpu;

  TensorView() = default;
  // Both constructors throw moe::Error for a negative extent, or for extents whose product (zeros
  // counted as ones) in bytes overflows int64.
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::kCpu);
  TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device);

  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t size(int64_t axis) const;  // throws moe::Error when axis is out of range
  int64_t numel() const;
  int64_t stride(int64_t axis) const;
  bool is_contiguous() const;
  bool empty() const { return data == nullptr && shape.empty(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// A contiguous host tensor that owns its memory (64-byte aligned, uninitialized on creation).
class Tensor {
 public:
  Tensor() = default;
  // Throws moe::Error as TensorView's constructors do, and when the memory cannot be allocated.
  Tensor(DType dtype, Shape shape);

  static Tensor zeros(DType dtype, Shape shape);
  // A copy of `view` (which must be on the CPU), converted to `dtype`.
  static Tensor copy_of(const TensorView& view, DType dtype);

  TensorView view() const;
  operator TensorView() const { return view(); }

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t size(int64_t axis) const { return view().size(axis); }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr; }

  template <typename T>
  T* data() const {
    return static_cast<T*>(data_.get());
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::shared_ptr<void> data_;
};

// Checks used at the API edge; each throws moe::Error naming `name`.
void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
void check_shape(const TensorView& t, const char* name, const Shape& expected);
void check_rank(const TensorView& t, const char* name, int64_t rank);
void check_contiguous(const TensorView& t, const char* name);
void check_device(const TensorView& t, const char* name, Device device);

}  // namespace moe
