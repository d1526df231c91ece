// The edge between Python arrays and moe::TensorView.
//
// Inputs arrive as any object nanobind can read through DLPack or the buffer protocol (NumPy
// arrays, PyTorch tensors, ...) and are borrowed without a copy: the TensorView points into the
// caller's memory for the length of one call. Outputs are moe::Tensors handed to Python without
// a copy either: the array's owner is a capsule that frees the Tensor.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "moe/tensor.h"

namespace moe::python {

namespace nb = nanobind;

// A borrowed input: `array` keeps the producer's memory alive while `view` is in use.
struct ArrayArg {
  nb::ndarray<nb::ro> array;
  TensorView view;  // CPU, contiguous (strides left empty)
};

// Reads `obj` as a contiguous CPU array; throws moe::Error naming `name` for objects that are
// not arrays, unsupported dtypes, CUDA or other devices, non-contiguous or misaligned data.
// A NumPy array of ml_dtypes.bfloat16 is read as bf16.
ArrayArg borrow_array(nb::handle obj, const char* name);
// The same, with None giving an empty view.
ArrayArg borrow_optional(nb::handle obj, const char* name);

// Which kind of array a function returns: PyTorch tensors for PyTorch inputs, NumPy otherwise.
enum class Framework { kNumpy, kTorch };
Framework framework_of(nb::handle obj);

// Hands `tensor` to Python as an array of `framework`, without copying. A bf16 result for NumPy
// becomes an ml_dtypes.bfloat16 array.
nb::object to_python(Tensor tensor, Framework framework);
// A read-only NumPy view of `view`, whose memory `owner` keeps alive.
nb::object numpy_view(const TensorView& view, nb::handle owner);

}  // namespace moe::python
