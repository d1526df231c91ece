// Which implementation runs a stage.
#pragma once

#include <cstdint>
#include <string_view>

namespace moe {

enum class Backend : uint8_t {
  kAuto,       // chosen from the tensors' device
  kReference,  // the float64 per-expert loop: the oracle, never optimized
  kCpu,        // the optimized CPU kernels
};

std::string_view backend_name(Backend backend);
Backend parse_backend(std::string_view name);  // "auto", "reference", "cpu"; throws moe::Error

}  // namespace moe
