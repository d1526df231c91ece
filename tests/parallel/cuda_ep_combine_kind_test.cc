// The GPU expert-parallel layer's combine choice (a pure function: runs without a GPU): names,
// and the MOE_EP_COMBINE override that only the default (kAuto) reads, with its error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/expect_error.h"
#include "moe/cuda_ep_layer.h"
#include "moe/error.h"

namespace moe::testing {
namespace {

// Sets MOE_EP_COMBINE (or unsets it, for null) for the lifetime of the object, then restores it.
class ScopedCombineEnv {
 public:
  explicit ScopedCombineEnv(const char* value) {
    if (const char* old = std::getenv("MOE_EP_COMBINE")) saved_ = old, had_ = true;
    if (value != nullptr) {
      setenv("MOE_EP_COMBINE", value, 1);
    } else {
      unsetenv("MOE_EP_COMBINE");
    }
  }
  ~ScopedCombineEnv() {
    if (had_) {
      setenv("MOE_EP_COMBINE", saved_.c_str(), 1);
    } else {
      unsetenv("MOE_EP_COMBINE");
    }
  }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST(CudaEpCombineKind, NamesRoundTrip) {
  for (CombineKind kind : {CombineKind::kAuto, CombineKind::kPush, CombineKind::kPull}) {
    EXPECT_EQ(parse_combine_kind(combine_kind_name(kind)), kind);
  }
  expect_error([] { parse_combine_kind("both"); }, {"combine", "push, pull or auto", "'both'"});
}

TEST(CudaEpCombineKind, DefaultIsPushUnlessTheEnvironmentSaysPull) {
  {
    const ScopedCombineEnv unset(nullptr);
    EXPECT_EQ(resolve_combine_kind(CombineKind::kAuto), CombineKind::kPush);
  }
  for (const char* push : {"", "auto", "push"}) {
    const ScopedCombineEnv env(push);
    EXPECT_EQ(resolve_combine_kind(CombineKind::kAuto), CombineKind::kPush) << "'" << push << "'";
  }
  const ScopedCombineEnv pull("pull");
  EXPECT_EQ(resolve_combine_kind(CombineKind::kAuto), CombineKind::kPull);
}

TEST(CudaEpCombineKind, AnExplicitChoiceWinsOverTheEnvironment) {
  const ScopedCombineEnv push("push");
  EXPECT_EQ(resolve_combine_kind(CombineKind::kPull), CombineKind::kPull);
  const ScopedCombineEnv pull("pull");
  EXPECT_EQ(resolve_combine_kind(CombineKind::kPush), CombineKind::kPush);
}

TEST(CudaEpCombineKind, ABadEnvironmentValueIsNamed) {
  const ScopedCombineEnv bad("PULL");
  expect_error([] { resolve_combine_kind(CombineKind::kAuto); },
               {"MOE_EP_COMBINE", "push, pull or auto", "'PULL'"});
  // Only the default reads it.
  EXPECT_EQ(resolve_combine_kind(CombineKind::kPush), CombineKind::kPush);
}

}  // namespace
}  // namespace moe::testing
