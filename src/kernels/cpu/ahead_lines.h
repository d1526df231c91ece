// TileArgs::ahead, a later block's lines, spread evenly over a tile kernel call's steps along k:
// each step asks for its share, so memory keeps streaming the next block while this one computes.
// Used by the fma kernels (fma_tile.h) and the AMX kernel (amx_bf16_tile.h).
//
// NOTE: internal linkage on purpose, as in the kernels that include it: each includer compiles
// its own copy under its own `#pragma GCC target`.
#pragma once

#include <cstdint>

#include "kernels/cpu/tile_kernel.h"

namespace moe::cpu {
namespace {

// The steps are `k_per_step` k each. Nothing at all unless kEnabled (the shape's
// kSpreadsPrefetch, for the fma kernels).
template <bool kEnabled>
class AheadLines {
 public:
  AheadLines(const TileArgs& t, int64_t k_per_step) {
    if constexpr (kEnabled) {
      const int64_t steps = (t.k_end - t.k_begin) / k_per_step;
      panel0_ = static_cast<const char*>(t.ahead0);
      panel1_ = static_cast<const char*>(t.ahead1);
      bytes_ = t.ahead_bytes;
      per_step_ = steps > 0 ? (t.ahead_bytes / 64 + steps - 1) / steps * 64 : 0;
    }
  }
  void step() {
    if constexpr (kEnabled) {
      const int64_t end = offset_ + per_step_ < bytes_ ? offset_ + per_step_ : bytes_;
      for (; offset_ < end; offset_ += 64) {
        __builtin_prefetch(panel0_ + offset_, 0, 2);
        __builtin_prefetch(panel1_ + offset_, 0, 2);
      }
    }
  }

 private:
  const char* panel0_ = nullptr;
  const char* panel1_ = nullptr;
  int64_t bytes_ = 0, per_step_ = 0, offset_ = 0;
};

}  // namespace
}  // namespace moe::cpu
