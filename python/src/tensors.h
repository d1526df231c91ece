// The edge between Python arrays and moe::TensorView.
//
// Inputs arrive as any object nanobind can read through DLPack or the buffer protocol (NumPy
// arrays, PyTorch tensors, ...), in host or CUDA memory, and are borrowed without a copy: the
// TensorView points into the caller's memory for the length of one call. Outputs are
// moe::Tensors handed to Python without a copy either (the array's owner is a capsule that frees
// the Tensor), or arrays the caller passed as out=, or new GPU arrays (devices.h).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "moe/tensor.h"

namespace moe::python {

namespace nb = nanobind;

// A borrowed array: `array` (an input) or `writable` (an output) keeps the producer's memory
// alive while `view` is in use.
struct ArrayArg {
  nb::ndarray<nb::ro> array;
  nb::ndarray<> writable;
  TensorView view;    // contiguous (strides left empty), on the CPU or a GPU
  int device_id = 0;  // the GPU's ordinal, for a view on the GPU
  const char* name = nullptr;
};

// Reads `obj` as a contiguous array in host or CUDA memory; throws moe::Error naming `name` for
// objects that are not arrays, unsupported dtypes, other devices, non-contiguous or misaligned
// data. A NumPy array of ml_dtypes.bfloat16 is read as bf16.
ArrayArg borrow_array(nb::handle obj, const char* name);
// The same, with None giving an empty view.
ArrayArg borrow_optional(nb::handle obj, const char* name);
// An array the call writes (out=): the same checks, and it must be writable.
ArrayArg borrow_output(nb::handle obj, const char* name);

// Which kind of array a function returns: PyTorch tensors for PyTorch inputs, NumPy otherwise.
enum class Framework { kNumpy, kTorch };
Framework framework_of(nb::handle obj);

// Hands `tensor` to Python as an array of `framework`, without copying. A bf16 result for NumPy
// becomes an ml_dtypes.bfloat16 array.
nb::object to_python(Tensor tensor, Framework framework);
// The name of `dtype` in NumPy and PyTorch ("float32", "bfloat16", "float16", "int32", ...).
const char* framework_dtype_name(DType dtype);
// A read-only NumPy view of `view`, whose memory `owner` keeps alive.
nb::object numpy_view(const TensorView& view, nb::handle owner);

}  // namespace moe::python
