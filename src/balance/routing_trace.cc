// Helpers that complete a RoutingTrace.
#include <limits>

#include "moe/error.h"
#include "moe/placement.h"

namespace moe {

void assign_sources_round_robin(RoutingTrace& trace, int64_t num_gpus) {
  if (num_gpus < 1 || num_gpus > std::numeric_limits<int32_t>::max()) {
    fail("num_gpus: expected 1..{}; got {}", std::numeric_limits<int32_t>::max(), num_gpus);
  }
  if (trace.top_k < 1) fail("trace.top_k: expected >= 1; got {}", trace.top_k);
  for (size_t l = 0; l < trace.layers.size(); ++l) {
    TraceLayer& layer = trace.layers[l];
    const int64_t num_ids = static_cast<int64_t>(layer.topk_ids.size());
    if (num_ids % trace.top_k != 0) {
      fail(
          "trace.layers[{}].topk_ids: expected [num_tokens, top_k = {}] entries, a multiple of "
          "{}; got {}",
          l, trace.top_k, trace.top_k, num_ids);
    }
    layer.source_gpu.resize(static_cast<size_t>(num_ids / trace.top_k));
    for (size_t t = 0; t < layer.source_gpu.size(); ++t) {
      layer.source_gpu[t] = static_cast<int32_t>(static_cast<int64_t>(t) % num_gpus);
    }
  }
}

}  // namespace moe
