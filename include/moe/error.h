// moe::Error: the one exception type the library throws on bad input or a failed system call.
// Messages name the argument, what was expected and what was given.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace moe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws moe::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace moe
