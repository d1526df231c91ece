// The public fused_experts: validates every argument once, builds the raw-pointer problem and
// hands it to the chosen backend.
#include "moe/experts.h"

#include <cmath>

#include "kernels/cpu/fused_experts.h"
#include "kernels/cpu/tile_kernel.h"
#include "kernels/reference/experts.h"
#include "moe/error.h"
#include "ops/experts_validation.h"

namespace moe {

void fused_experts(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                   const TensorView& topk_weights, const TensorView& topk_ids,
                   const TensorView& out, const ExpertsOptions& options, StageTimes* times) {
  ValidatedExperts validated =
      validate_experts(hidden, w13, w2, topk_weights, topk_ids, out, options);
  if (times) *times = StageTimes{};
  switch (options.backend) {
    case Backend::kReference:
      reference::fused_experts(validated.problem);
      return;
    case Backend::kAuto:
    case Backend::kCpu: {
      // Plain weights: the call packs the experts the batch touches (a layer packs once instead).
      const CpuIsa isa = resolve_cpu_isa(options.cpu_isa);
      cpu::ExpertsWorkspace workspace;
      const int64_t block_m = options.block_m > 0 ? options.block_m : cpu::kDefaultBlockM;
      cpu::fused_experts(validated.problem, nullptr,
                         cpu::expert_kernels(isa, validated.problem.weight_dtype), block_m,
                         workspace, options.num_threads, times);
      return;
    }
  }
  fail("fused_experts: unsupported backend {}", static_cast<int>(options.backend));
}

Tensor fused_experts(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                     const TensorView& topk_weights, const TensorView& topk_ids,
                     const ExpertsOptions& options, StageTimes* times) {
  check_rank(hidden, "hidden", 2);
  Tensor out(hidden.dtype, hidden.shape);
  fused_experts(hidden, w13, w2, topk_weights, topk_ids, out, options, times);
  return out;
}

}  // namespace moe
