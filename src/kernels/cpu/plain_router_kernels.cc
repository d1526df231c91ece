// The plain router path: router_tile.h compiled for the library's own target, on any CPU. Its
// multiply-adds round twice, the product and then the sum: this file is compiled with
// -ffp-contract=off (src/kernels/cpu/CMakeLists.txt), so that no build fuses some of them and not
// others, and the plain path gives the same bits in every build. Tested by
// tests/routing/router_logits_test.cc.
#include "kernels/cpu/router_tile.h"

namespace moe::cpu {

namespace {

struct PlainMadd {
  template <typename Floats>
  static void madd(Floats& acc, float x, const Floats& w) {
    acc += x * w;
  }
};

}  // namespace

RouterKernel plain_router_kernel() { return router_kernel_for<PlainRouterShape, PlainMadd>(); }

}  // namespace moe::cpu
