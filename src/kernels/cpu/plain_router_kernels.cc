// The plain router path: router_tile.h compiled for the library's own target (SSE2 on the x86-64
// baseline, where the multiply-adds round twice; -march=native on an FMA machine fuses them as the
// other paths do). Runs on any CPU. Tested by tests/routing/router_logits_test.cc.
#include "kernels/cpu/router_tile.h"

namespace moe::cpu {

RouterKernel plain_router_kernel() { return router_kernel_for<PlainRouterShape>(); }

}  // namespace moe::cpu
