#include "common/expect_error.h"

#include <gtest/gtest.h>

#include "moe/error.h"

namespace moe::testing {

std::string error_message(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no moe::Error thrown)";
}

void expect_error(const std::function<void()>& call, const std::vector<std::string>& parts) {
  const std::string message = error_message(call);
  for (const std::string& part : parts) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
}

}  // namespace moe::testing
