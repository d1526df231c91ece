// Which implementation runs a stage.
#pragma once

#include <cstdint>
#include <string_view>

namespace moe {

enum class Backend : uint8_t {
  kAuto,       // chosen from the tensors' device
  kReference,  // the float64 per-expert loop: the oracle, never optimized
  kCpu,        // the optimized CPU kernels
  kCuda,       // the CUDA kernels (tensors in GPU memory; needs a build with MOE_WITH_CUDA)
};

// Whether this build has the CUDA backend.
bool cuda_available();

std::string_view backend_name(Backend backend);
Backend parse_backend(std::string_view name);  // "auto", "reference", "cpu", "cuda"

}  // namespace moe
