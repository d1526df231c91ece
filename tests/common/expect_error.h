// Checks on the moe::Error a call throws, shared by the tests of bad input.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace moe::testing {

// The message of the moe::Error `call` throws ("(no moe::Error thrown)" when it returns).
std::string error_message(const std::function<void()>& call);

// Expects `call` to throw moe::Error whose message contains each of `parts`.
void expect_error(const std::function<void()>& call, const std::vector<std::string>& parts);

}  // namespace moe::testing
