#include "moe/backend.h"

#include "moe/error.h"

namespace moe {

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kReference:
      return "reference";
    case Backend::kCpu:
      return "cpu";
  }
  return "unknown";
}

Backend parse_backend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "reference") return Backend::kReference;
  if (name == "cpu") return Backend::kCpu;
  fail("backend: expected one of auto, reference, cpu; got '{}'", name);
}

}  // namespace moe
