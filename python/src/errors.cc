#include "errors.h"

#include <string>

namespace moe::python {

void rethrow_renamed(const Error& error, ArgumentNames names) {
  const std::string_view message = error.what();
  for (const auto& [cpp_name, python_name] : names) {
    // Match the whole name: "w13_bias: ..." must not turn into "w1_bias" through "w13".
    if (message.size() > cpp_name.size() && message.substr(0, cpp_name.size()) == cpp_name &&
        message[cpp_name.size()] == ':') {
      throw Error(std::string(python_name) + std::string(message.substr(cpp_name.size())));
    }
  }
  throw error;
}

}  // namespace moe::python
