// Where one Python call runs: on the CPU, or on one GPU and a CUDA stream.
//
// Every CUDA array of a call must sit on one GPU; that GPU is made current for the call (and the
// previous one restored after), as PyTorch's own operators do. The stream is the caller's
// `stream` (a cudaStream_t as an int), else PyTorch's current stream on that GPU when the main
// input is a torch tensor, else the legacy default stream (0). Work is queued on it and the call
// returns without waiting, except where a result has to be read on the host.
#pragma once

#include <nanobind/nanobind.h>

#include <initializer_list>

#include "moe/tensor.h"
#include "tensors.h"

namespace moe::python {

namespace nb = nanobind;

struct CallDevice {
  Device device = Device::kCpu;  // of the main input; the C++ API checks the others against it
  int gpu = 0;                   // the GPU's ordinal, when device is kCuda
  void* stream = nullptr;        // cudaStream_t, when device is kCuda
};

// `arrays` starts with the main input; empty (None) arrays are skipped. Throws moe::Error naming
// the first array on another GPU than the main input's, or whose memory is not where its DLPack
// device says, or any CUDA array when this build has no CUDA backend. Needs the GIL.
CallDevice call_device(std::initializer_list<const ArrayArg*> arrays, nb::handle main,
                       nb::handle stream);

// Makes the call's GPU current while it lives; does nothing for a CPU call.
class DeviceScope {
 public:
  explicit DeviceScope(const CallDevice& call);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

// A new array of `dtype` and `shape` on the call's device, zero-copy as `view`: a torch tensor
// from PyTorch's allocator (on main's device) for a torch main input; otherwise a moe::Tensor as
// a NumPy array on the CPU, or GPU memory from cudaMalloc (freed by cudaFree, which waits for the
// device) exported through DLPack.
struct NewArray {
  nb::object object;
  TensorView view;
  nb::object gpu_owner;  // the cudaMalloc capsule, for a GPU array that is not a torch tensor
};
NewArray new_array(DType dtype, const Shape& shape, const CallDevice& call, nb::handle main);

// The first `count` entries of a 1-D new array, as a view of the same memory.
nb::object leading(const NewArray& array, int64_t count, const CallDevice& call);

// Blocks until the work queued on the call's stream is done (a CPU call returns at once).
void synchronize(const CallDevice& call);

// Copies `count` int32 values from the GPU at `device_data` into `host`, on the call's stream,
// and waits for them.
void copy_to_host(const CallDevice& call, const int32_t* device_data, int32_t* host, size_t count);

}  // namespace moe::python
