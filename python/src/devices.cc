#include "devices.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "moe/error.h"

#ifdef MOE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moe::python {

using namespace nb::literals;

namespace {

#ifdef MOE_WITH_CUDA
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail("CUDA error in {}: {} ({})", what, cudaGetErrorName(status), cudaGetErrorString(status));
  }
}

// A DLPack producer can say "cuda:1" of any pointer; the driver knows where the memory is.
void check_memory(const ArrayArg& array) {
  if (array.view.numel() == 0) return;  // nothing is read or written
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, array.view.data);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clears the error, so later calls do not report it again
    fail("{}: a CUDA array, but the CUDA runtime cannot tell where its memory is: {} ({})",
         array.name, cudaGetErrorName(status), cudaGetErrorString(status));
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    fail("{}: DLPack says it is on cuda:{}, but its memory is not GPU memory", array.name,
         array.device_id);
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != array.device_id) {
    fail("{}: DLPack says it is on cuda:{}, but its memory is on GPU {}", array.name,
         array.device_id, attributes.device);
  }
}

bool is_torch_tensor(nb::handle obj) { return framework_of(obj) == Framework::kTorch; }

// PyTorch's current stream on `gpu`, read through its Python API so that the extension needs no
// PyTorch headers or libraries.
void* torch_current_stream(int gpu) {
  nb::object torch = nb::module_::import_("torch");
  const auto handle =
      nb::cast<uintptr_t>(torch.attr("cuda").attr("current_stream")(gpu).attr("cuda_stream"));
  return reinterpret_cast<void*>(handle);
}

// A DLPack array over GPU memory that `owner` keeps alive.
nb::object gpu_array(const TensorView& view, nb::handle owner, int gpu) {
  nb::dlpack::dtype dlpack_dtype = nb::dtype<int32_t>();
  switch (view.dtype) {
    case DType::kF32:
      dlpack_dtype = nb::dtype<float>();
      break;
    case DType::kBF16:
      dlpack_dtype = {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
      break;
    case DType::kF16:
      dlpack_dtype = {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
      break;
    case DType::kI32:
      break;
    default:
      fail("array export: unsupported dtype {}", dtype_name(view.dtype));
  }
  const std::vector<size_t> extents(view.shape.begin(), view.shape.end());
  return nb::ndarray<>(view.data, extents.size(), extents.data(), owner, nullptr, dlpack_dtype,
                       nb::device::cuda::value, gpu)
      .cast();
}
#endif

}  // namespace

CallDevice call_device(std::initializer_list<const ArrayArg*> arrays, nb::handle main,
                       nb::handle stream) {
  CallDevice call;
  const ArrayArg* first = *arrays.begin();
  call.device = first->view.device;
#ifdef MOE_WITH_CUDA
  const ArrayArg* first_gpu = nullptr;
#endif
  for (const ArrayArg* array : arrays) {
    if (array->view.empty() || array->view.device != Device::kCuda) continue;
#ifdef MOE_WITH_CUDA
    if (first_gpu == nullptr) {
      first_gpu = array;
    } else if (array->device_id != first_gpu->device_id) {
      fail("{}: expected a tensor on cuda:{}, where {} is; got one on cuda:{}", array->name,
           first_gpu->device_id, first_gpu->name, array->device_id);
    }
    check_memory(*array);
#else
    fail(
        "{}: a CUDA tensor, but this build of moe_engine has no CUDA backend (it was built "
        "where nvcc was not found); pass a CPU tensor (tensor.cpu()) or rebuild with CUDA",
        array->name);
#endif
  }
  if (call.device != Device::kCuda) return call;
  call.gpu = first->device_id;
#ifdef MOE_WITH_CUDA
  if (!stream.is_none()) {
    call.stream = reinterpret_cast<void*>(nb::cast<uintptr_t>(stream));
  } else if (is_torch_tensor(main)) {
    call.stream = torch_current_stream(call.gpu);
  }
#endif
  return call;
}

DeviceScope::DeviceScope(const CallDevice& call) {
#ifdef MOE_WITH_CUDA
  if (call.device != Device::kCuda) return;
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current == call.gpu) return;
  check_cuda(cudaSetDevice(call.gpu), "cudaSetDevice");
  previous_ = current;
#endif
}

DeviceScope::~DeviceScope() {
#ifdef MOE_WITH_CUDA
  if (previous_ >= 0) cudaSetDevice(previous_);  // nothing to report from a destructor
#endif
}

NewArray new_array(DType dtype, const Shape& shape, const CallDevice& call, nb::handle main) {
  const Framework framework = framework_of(main);
  if (call.device == Device::kCpu) {
    Tensor tensor(dtype, shape);
    const TensorView view = tensor.view();
    return {to_python(std::move(tensor), framework), view, {}};
  }
#ifdef MOE_WITH_CUDA
  if (framework == Framework::kTorch) {
    nb::object torch = nb::module_::import_("torch");
    nb::list extents;
    for (int64_t extent : shape) extents.append(extent);
    nb::object tensor =
        torch.attr("empty")(nb::tuple(extents), "dtype"_a = torch.attr(framework_dtype_name(dtype)),
                            "device"_a = main.attr("device"));
    ArrayArg arg = borrow_output(tensor, "out");
    return {std::move(tensor), arg.view, {}};
  }
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  void* data = nullptr;
  check_cuda(cudaMalloc(&data, std::max<size_t>(count * dtype_size(dtype), 1)), "cudaMalloc");
  nb::capsule owner(data, [](void* p) noexcept { cudaFree(p); });
  const TensorView view(data, dtype, shape, Device::kCuda);
  return {gpu_array(view, owner, call.gpu), view, owner};
#else
  fail("out: a CUDA result, but this build of moe_engine has no CUDA backend");
#endif
}

nb::object leading(const NewArray& array, int64_t count, const CallDevice& call) {
  if (!array.gpu_owner.is_valid()) {
    return nb::object(array.object[nb::slice(nb::int_(0), nb::int_(count), nb::none())]);
  }
#ifdef MOE_WITH_CUDA
  TensorView view = array.view;
  view.shape = {count};
  return gpu_array(view, array.gpu_owner, call.gpu);
#else
  fail("leading: a GPU array, but this build of moe_engine has no CUDA backend");
#endif
}
void synchronize(const CallDevice& call) {
#ifdef MOE_WITH_CUDA
  if (call.device != Device::kCuda) return;
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(call.stream)),
             "cudaStreamSynchronize");
#endif
}

void copy_to_host(const CallDevice& call, const int32_t* device_data, int32_t* host, size_t count) {
#ifdef MOE_WITH_CUDA
  check_cuda(cudaMemcpyAsync(host, device_data, count * sizeof(int32_t), cudaMemcpyDeviceToHost,
                             static_cast<cudaStream_t>(call.stream)),
             "cudaMemcpyAsync");
  synchronize(call);
#else
  fail("copy_to_host: this build of moe_engine has no CUDA backend");
#endif
}

}  // namespace moe::python
