#include "tensors.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moe/error.h"

namespace moe::python {

namespace {

using Code = nb::dlpack::dtype_code;

constexpr int kDlpackCpu = nb::device::cpu::value;

bool is(nb::dlpack::dtype d, Code code, int bits) {
  return d.code == static_cast<uint8_t>(code) && d.bits == bits && d.lanes == 1;
}

// "float32", "bfloat16", "complex64", ...: the name a user of NumPy or PyTorch recognises.
std::string dlpack_dtype_name(nb::dlpack::dtype d) {
  std::string name;
  switch (static_cast<Code>(d.code)) {
    case Code::Int:
      name = "int";
      break;
    case Code::UInt:
      name = "uint";
      break;
    case Code::Float:
      name = "float";
      break;
    case Code::Bfloat:
      name = "bfloat";
      break;
    case Code::Complex:
      name = "complex";
      break;
    case Code::Bool:
      return "bool";
    default:
      return "DLPack type code " + std::to_string(d.code) + " of " + std::to_string(d.bits) +
             " bits";
  }
  name += std::to_string(d.bits);
  if (d.lanes != 1) name += " x" + std::to_string(d.lanes);
  return name;
}

// Every engine dtype has a DLPack twin, so a wrong dtype reaches the C++ checks, whose messages
// say which dtypes the argument takes.
DType from_dlpack(nb::dlpack::dtype d, const char* name) {
  if (is(d, Code::Float, 32)) return DType::kF32;
  if (is(d, Code::Bfloat, 16)) return DType::kBF16;
  if (is(d, Code::Float, 16)) return DType::kF16;
  if (is(d, Code::Int, 32)) return DType::kI32;
  if (is(d, Code::Float8_E4M3FN, 8)) return DType::kF8E4M3;
  if (is(d, Code::Int, 8)) return DType::kI8;
  if (is(d, Code::UInt, 8)) return DType::kU8;
  if (is(d, Code::Int, 64)) return DType::kI64;
  if (is(d, Code::Float, 64)) return DType::kF64;
  fail("{}: unsupported dtype {}; expected float32, bfloat16, float16 or int32", name,
       dlpack_dtype_name(d));
}

nb::dlpack::dtype to_dlpack(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return nb::dtype<float>();
    case DType::kBF16:
      return {static_cast<uint8_t>(Code::Bfloat), 16, 1};
    case DType::kF16:
      return {static_cast<uint8_t>(Code::Float), 16, 1};
    case DType::kI32:
      return nb::dtype<int32_t>();
    case DType::kF8E4M3:
      return {static_cast<uint8_t>(Code::Float8_E4M3FN), 8, 1};
    case DType::kI8:
      return nb::dtype<int8_t>();
    case DType::kU8:
      return nb::dtype<uint8_t>();
    case DType::kI64:
      return nb::dtype<int64_t>();
    case DType::kF64:
      return nb::dtype<double>();
  }
  fail("array export: unsupported dtype {}", static_cast<int>(dtype));
}

std::string python_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::type_name(obj.type()));
}

// The module `name` if Python has imported it, else an invalid handle. Checking sys.modules
// instead of importing keeps a NumPy-only caller from paying for `import torch`.
nb::handle imported_module(const char* name) {
  return nb::handle(PyDict_GetItemString(PyImport_GetModuleDict(), name));  // borrowed
}

// NumPy cannot export its extension dtypes through DLPack, so an ml_dtypes.bfloat16 array is
// reinterpreted as uint16 (same bits, same strides) and labelled bf16 here.
bool is_numpy_bfloat16(nb::handle obj) {
  nb::handle numpy = imported_module("numpy");
  if (!numpy.is_valid() || !nb::isinstance(obj, numpy.attr("ndarray"))) return false;
  return nb::cast<std::string>(obj.attr("dtype").attr("name")) == "bfloat16";
}

// NumPy's bfloat16 comes from ml_dtypes, an optional dependency.
nb::object numpy_bfloat16() {
  try {
    return nb::module_::import_("ml_dtypes").attr("bfloat16");
  } catch (const nb::python_error&) {
    fail(
        "bf16 result: NumPy has no bfloat16 type without ml_dtypes; pip install ml_dtypes, or "
        "pass float32 or PyTorch input");
  }
}

// The exception a DLPack export raised, for objects nanobind could not read (a tensor that
// requires grad, say): it says what to do better than "not an array" would.
std::string dlpack_refusal(nb::handle obj) {
  if (!nb::hasattr(obj, "__dlpack__")) return "";
  try {
    obj.attr("__dlpack__")();
  } catch (const nb::python_error& e) {
    return std::string(" (its __dlpack__ says: ") + e.what() + ")";
  }
  return "";
}

// Host memory, or CUDA memory (devices.h checks which GPU, and whether this build can use it).
Device device_of(int dlpack_device, const char* name) {
  if (dlpack_device == kDlpackCpu) return Device::kCpu;
  if (dlpack_device == nb::device::cuda::value ||
      dlpack_device == nb::device::cuda_managed::value) {
    return Device::kCuda;
  }
  fail("{}: expected a CPU or CUDA array; got one on DLPack device type {}", name, dlpack_device);
}

template <typename Array>
void check_layout(const Array& array, const Shape& shape, size_t element_bytes, const char* name) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  if (count == 0) return;  // no element is read, so neither strides nor address matter
  if (array.stride_ptr() != nullptr) {
    Shape strides(shape.size());
    int64_t expected = 1;
    bool contiguous = true;
    for (size_t i = shape.size(); i-- > 0;) {
      strides[i] = array.stride(i);
      if (shape[i] != 1 && strides[i] != expected) contiguous = false;
      expected *= shape[i];
    }
    // Copying silently would hide a transposed weight and double its memory; the caller
    // decides whether a copy is what they want.
    if (!contiguous) {
      fail(
          "{}: expected a C-contiguous array; got shape {} with strides {} (in elements); "
          "pass numpy.ascontiguousarray(x) or x.contiguous()",
          name, shape_string(shape), shape_string(strides));
    }
  }
  const auto address = reinterpret_cast<uintptr_t>(array.data());
  if (address % element_bytes != 0) {
    fail("{}: expected data aligned to its {}-byte elements; got address {:#x}", name,
         element_bytes, address);
  }
}

// Fills `arg.view` from `array`, the DLPack import of `obj`.
template <typename Array>
void describe(const Array& array, bool bfloat16, const char* name, ArrayArg& arg) {
  const Device device = device_of(array.device_type(), name);
  const DType dtype = bfloat16 ? DType::kBF16 : from_dlpack(array.dtype(), name);
  Shape shape(array.ndim());
  for (size_t i = 0; i < shape.size(); ++i) shape[i] = static_cast<int64_t>(array.shape(i));
  check_layout(array, shape, dtype_size(dtype), name);
  // The engine never writes through an input view; TensorView just has no const flavour.
  arg.view = TensorView(const_cast<void*>(static_cast<const void*>(array.data())), dtype,
                        std::move(shape), device);
  arg.device_id = array.device_id();
  arg.name = name;
}

[[noreturn]] void refuse(nb::handle obj, const char* name, const char* what) {
  fail("{}: expected {} (anything with __dlpack__ or the buffer protocol); got {}{}", name, what,
       python_type_name(obj), dlpack_refusal(obj));
}

}  // namespace

ArrayArg borrow_array(nb::handle obj, const char* name) {
  nb::object source = nb::borrow(obj);
  const bool bfloat16 = is_numpy_bfloat16(obj);
  if (bfloat16) source = obj.attr("view")("uint16");
  ArrayArg arg;
  if (!nb::try_cast(source, arg.array)) refuse(obj, name, "a NumPy array or a PyTorch tensor");
  describe(arg.array, bfloat16, name, arg);
  return arg;
}

ArrayArg borrow_output(nb::handle obj, const char* name) {
  nb::object source = nb::borrow(obj);
  const bool bfloat16 = is_numpy_bfloat16(obj);
  if (bfloat16) source = obj.attr("view")("uint16");
  ArrayArg arg;
  if (!nb::try_cast(source, arg.writable)) {
    refuse(obj, name, "a writable NumPy array or PyTorch tensor");
  }
  describe(arg.writable, bfloat16, name, arg);
  return arg;
}

ArrayArg borrow_optional(nb::handle obj, const char* name) {
  if (obj.is_none()) return {};
  return borrow_array(obj, name);
}

Framework framework_of(nb::handle obj) {
  nb::handle torch = imported_module("torch");
  if (torch.is_valid() && nb::isinstance(obj, torch.attr("Tensor"))) return Framework::kTorch;
  return Framework::kNumpy;
}

nb::object to_python(Tensor tensor, Framework framework) {
  const std::vector<size_t> shape(tensor.shape().begin(), tensor.shape().end());
  const DType dtype = tensor.dtype();
  auto* owned = new Tensor(std::move(tensor));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  void* data = owned->data<void>();
  if (framework == Framework::kTorch) {
    return nb::ndarray<nb::pytorch>(data, shape.size(), shape.data(), owner, nullptr,
                                    to_dlpack(dtype), kDlpackCpu)
        .cast();
  }
  if (dtype != DType::kBF16) {
    return nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr,
                                  to_dlpack(dtype), kDlpackCpu)
        .cast();
  }
  nb::object bits = nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr,
                                           nb::dtype<uint16_t>(), kDlpackCpu)
                        .cast();
  return bits.attr("view")(numpy_bfloat16());
}

const char* framework_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kI32:
      return "int32";
    default:
      fail("array export: unsupported dtype {}", dtype_name(dtype));
  }
}

nb::object numpy_view(const TensorView& view, nb::handle owner) {
  const std::vector<size_t> shape(view.shape.begin(), view.shape.end());
  const bool bfloat16 = view.dtype == DType::kBF16;
  nb::object array = nb::ndarray<nb::numpy, nb::ro>(
                         view.data, shape.size(), shape.data(), owner, nullptr,
                         bfloat16 ? nb::dtype<uint16_t>() : to_dlpack(view.dtype), kDlpackCpu)
                         .cast();
  if (!bfloat16) return array;
  return array.attr("view")(numpy_bfloat16());
}

}  // namespace moe::python
