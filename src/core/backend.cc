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
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

Backend parse_backend(std::string_view name) {
  if (name == "auto") return Backend::kAuto;
  if (name == "reference") return Backend::kReference;
  if (name == "cpu") return Backend::kCpu;
  if (name == "cuda") return Backend::kCuda;
  fail("backend: expected one of auto, reference, cpu, cuda; got '{}'", name);
}

bool cuda_available() {
#ifdef MOE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace moe
