// CombineKind (moe/cuda_ep_layer.h): its names, and the one place MOE_EP_COMBINE is read.
#include <cstdlib>
#include <string>

#include "moe/cuda_ep_layer.h"
#include "moe/error.h"

namespace moe {

const char* combine_kind_name(CombineKind kind) {
  switch (kind) {
    case CombineKind::kAuto:
      return "auto";
    case CombineKind::kPush:
      return "push";
    case CombineKind::kPull:
      return "pull";
  }
  return "unknown";
}

CombineKind parse_combine_kind(const std::string& name) {
  if (name == "auto") return CombineKind::kAuto;
  if (name == "push") return CombineKind::kPush;
  if (name == "pull") return CombineKind::kPull;
  fail("combine: expected push, pull or auto; got '{}'", name);
}

CombineKind resolve_combine_kind(CombineKind requested) {
  if (requested != CombineKind::kAuto) return requested;
  const char* forced = std::getenv("MOE_EP_COMBINE");
  if (forced == nullptr || *forced == '\0') return CombineKind::kPush;
  const std::string value = forced;
  if (value != "push" && value != "pull" && value != "auto") {
    fail("MOE_EP_COMBINE: expected push, pull or auto; got '{}'", value);
  }
  const CombineKind kind = parse_combine_kind(value);
  return kind == CombineKind::kAuto ? CombineKind::kPush : kind;
}

}  // namespace moe
