// The strings the Python API takes for the engine's enums.
#pragma once

#include <string_view>

#include "moe/config.h"

namespace moe::python {

// "softmax" or "sigmoid"; throws moe::Error naming `argument`.
ScoringFunc parse_scoring(std::string_view name, const char* argument);
// "silu", "gelu", "gelu_tanh", "clamped_swiglu" (also as vLLM's "swigluoai"); throws moe::Error
// naming `argument`.
Activation parse_activation(std::string_view name, const char* argument);

}  // namespace moe::python
