// How moe::Error reaches Python: as moe_engine.MoeError (a ValueError), speaking the Python
// API's argument names.
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>

#include "moe/error.h"

namespace moe::python {

// The C++ API names some arguments differently from the Python one (w13 for vLLM's w1, hidden
// for hidden_states, config.top_k for the top_k keyword); its messages start with "<name>: ".
// Rethrows `error` with the Python name when its message starts with one of the C++ names.
using ArgumentNames = std::initializer_list<std::pair<std::string_view, std::string_view>>;
[[noreturn]] void rethrow_renamed(const Error& error, ArgumentNames names);

}  // namespace moe::python
