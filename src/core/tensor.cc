#include "moe/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "moe/error.h"

namespace moe {

std::string shape_string(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

namespace {

int64_t product(const Shape& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

// Every extent >= 0, and the product of the extents (zeros counted as ones) times the dtype's size
// within int64: then no count or stride computed from the shape wraps around, which would let a
// small buffer pass for a huge tensor, and every later bound check with it.
void check_extents(const Shape& shape, DType dtype) {
  for (int64_t extent : shape) {
    if (extent < 0) fail("tensor shape: extents must be >= 0; got {}", shape_string(shape));
  }
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t extent : shape) {
    if (__builtin_mul_overflow(bytes, std::max<int64_t>(extent, 1), &bytes)) {
      fail(
          "tensor shape: expected extents whose product (zeros counted as ones) times {} bytes "
          "fits in int64; got {}",
          dtype_size(dtype), shape_string(shape));
    }
  }
}

}  // namespace

TensorView::TensorView(void* data, DType dtype, Shape shape, Device device)
    : data(data), dtype(dtype), shape(std::move(shape)), device(device) {
  check_extents(this->shape, this->dtype);
}

TensorView::TensorView(void* data, DType dtype, Shape shape, Shape strides, Device device)
    : data(data),
      dtype(dtype),
      shape(std::move(shape)),
      strides(std::move(strides)),
      device(device) {
  check_extents(this->shape, this->dtype);
  if (!this->strides.empty() && this->strides.size() != this->shape.size()) {
    fail("tensor strides: expected {} strides (one per axis); got {}", this->shape.size(),
         this->strides.size());
  }
}

int64_t TensorView::size(int64_t axis) const {
  if (axis < 0 || axis >= dim()) fail("tensor axis: expected 0..{}; got {}", dim() - 1, axis);
  return shape[static_cast<size_t>(axis)];
}

int64_t TensorView::numel() const { return product(shape); }

int64_t TensorView::stride(int64_t axis) const {
  if (axis < 0 || axis >= dim()) fail("tensor axis: expected 0..{}; got {}", dim() - 1, axis);
  if (!strides.empty()) return strides[static_cast<size_t>(axis)];
  int64_t stride = 1;
  for (int64_t i = dim() - 1; i > axis; --i) stride *= shape[static_cast<size_t>(i)];
  return stride;
}

bool TensorView::is_contiguous() const {
  if (strides.empty()) return true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    const size_t axis = static_cast<size_t>(i);
    if (shape[axis] != 1 && strides[axis] != expected) return false;
    expected *= shape[axis];
  }
  return true;
}

void Tensor::Free::operator()(void* p) const { std::free(p); }

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  check_extents(shape_, dtype_);
  constexpr size_t kAlignment = 64;
  const size_t bytes = nbytes();
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* memory = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (memory == nullptr) fail("tensor allocation: could not allocate {} bytes", bytes);
  data_ = std::shared_ptr<void>(memory, Free{});
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor tensor(dtype, std::move(shape));
  std::memset(tensor.data<void>(), 0, tensor.nbytes());
  return tensor;
}

Tensor Tensor::copy_of(const TensorView& view, DType dtype) {
  check_device(view, "tensor copy source", Device::kCpu);
  check_contiguous(view, "tensor copy source");
  Tensor tensor(dtype, view.shape);
  const size_t count = static_cast<size_t>(view.numel());
  if (view.dtype == dtype) {
    if (count) std::memcpy(tensor.data<void>(), view.data, tensor.nbytes());
  } else if (is_floating(view.dtype) && is_floating(dtype)) {
    std::vector<float> staging(count);
    convert_to_f32(view.data, view.dtype, staging.data(), count);
    convert_from_f32(staging.data(), dtype, tensor.data<void>(), count);
  } else {
    fail("tensor copy: cannot convert {} to {}", dtype_name(view.dtype), dtype_name(dtype));
  }
  return tensor;
}

TensorView Tensor::view() const { return TensorView(data_.get(), dtype_, shape_); }

int64_t Tensor::numel() const { return product(shape_); }

void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  for (DType dtype : allowed) {
    if (t.dtype == dtype) return;
  }
  std::string expected;
  for (DType dtype : allowed) {
    if (!expected.empty()) expected += " or ";
    expected += dtype_name(dtype);
  }
  fail("{}: expected dtype {}; got {}", name, expected, dtype_name(t.dtype));
}

void check_shape(const TensorView& t, const char* name, const Shape& expected) {
  if (t.shape != expected) {
    fail("{}: expected shape {}; got {}", name, shape_string(expected), shape_string(t.shape));
  }
}

void check_rank(const TensorView& t, const char* name, int64_t rank) {
  if (t.dim() != rank) {
    fail("{}: expected a {}-D tensor; got shape {}", name, rank, shape_string(t.shape));
  }
}

void check_contiguous(const TensorView& t, const char* name) {
  if (!t.is_contiguous()) {
    fail("{}: expected a contiguous row-major tensor; got shape {} with strides {}", name,
         shape_string(t.shape), shape_string(t.strides));
  }
}

void check_device(const TensorView& t, const char* name, Device device) {
  if (t.device != device) {
    fail("{}: expected a tensor on the {}; got one on the {}", name,
         device == Device::kCpu ? "CPU" : "GPU", t.device == Device::kCpu ? "CPU" : "GPU");
  }
}

}  // namespace moe
