// The public fused_experts: validates every argument once, builds the raw-pointer problem and
// hands it to the chosen backend.
#include "moe/experts.h"

#include <cmath>

#include "kernels/cpu/fused_experts.h"
#include "kernels/cpu/tile_kernel.h"
#include "kernels/reference/experts.h"
#include "moe/error.h"
#include "ops/experts_validation.h"

#ifdef MOE_WITH_CUDA
#include <map>
#include <utility>

#include "kernels/cuda/check.h"
#include "kernels/cuda/fused_experts.h"
#include "ops/cuda_plan_choice.h"
#endif

namespace moe {
namespace {

// The backend that runs a call: the one asked for, which must suit where the tensors live.
Backend resolve_backend(Backend requested, Device device) {
  if (device == Device::kCuda) {
    if (requested != Backend::kAuto && requested != Backend::kCuda) {
      fail("backend: tensors are on the GPU, so expected auto or cuda; got {}",
           backend_name(requested));
    }
    if (!cuda_available()) fail("hidden: a CUDA tensor, but this build has no CUDA backend");
    return Backend::kCuda;
  }
  if (requested == Backend::kCuda) {
    fail("backend: cuda needs tensors in GPU memory; hidden is on the CPU");
  }
  return requested == Backend::kAuto ? Backend::kCpu : requested;
}

#ifdef MOE_WITH_CUDA
// One workspace per thread, device and stream, grown to the largest call seen and then reused:
// calls on one stream run in order, while calls queued on two streams may run at once and so
// must not share one. The plan is the tuned one for this GPU and shape where a table has it
// (ops/cuda_plan_choice.h).
void run_cuda(const ExpertsProblem& problem, const ExpertsOptions& options, StageTimes* times) {
  thread_local std::map<std::pair<int, cudaStream_t>, cuda::ExpertsRunner> runners;
  const auto stream = static_cast<cudaStream_t>(options.cuda_stream);
  int device = 0;
  cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  cuda::ExpertsPlan plan = cuda_plans::choose_plan(problem, cuda_plans::device_name(device));
  if (options.block_m > 0 && options.block_m != plan.block_m) {
    // An explicit block_m picks the kernel made for that many rows per block.
    plan.block_m = options.block_m;
    plan.tiny_batch = false;
    if (options.block_m <= cuda::kMaxStreamRows) {
      plan.kernel = cuda::GemmKernel::kStream;
    } else if (cuda::wgmma_available() && cuda::tma_supports_block_m(options.block_m)) {
      plan.kernel = cuda::GemmKernel::kTma;
    } else {
      plan.kernel = cuda::GemmKernel::kMma;
    }
  }
  runners[{device, stream}].run(problem, plan, stream, times);
}
#endif

}  // namespace

void fused_experts(const TensorView& hidden, const TensorView& w13, const TensorView& w2,
                   const TensorView& topk_weights, const TensorView& topk_ids,
                   const TensorView& out, const ExpertsOptions& options, StageTimes* times) {
  ValidatedExperts validated =
      validate_experts(hidden, w13, w2, topk_weights, topk_ids, out, options);
  if (times) *times = StageTimes{};
  switch (resolve_backend(options.backend, hidden.device)) {
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
    case Backend::kCuda:
#ifdef MOE_WITH_CUDA
      run_cuda(validated.problem, options, times);
      return;
#else
      break;
#endif
  }
  fail("fused_experts: unsupported backend {}", backend_name(options.backend));
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
