// The GPU --ep commands (run_ep_cuda, bench_ep_cuda) in a build without GPU expert parallelism
// (MOE_WITH_CUDA_EP off): each says what it needs.
#include "moe/error.h"
#include "tools/moe/ep_bench.h"
#include "tools/moe/ep_run.h"

namespace moe::cli {

namespace {

[[noreturn]] void fail_without_cuda_ep(const char* command) {
  fail(
      "{} --ep --device cuda: this moe was built without GPU expert parallelism (moe::cuda_ep "
      "needs the CUDA toolkit with NCCL and MPI: configure with MOE_WITH_CUDA_EP=ON where nvcc, "
      "nccl.h and OpenMPI are found); run --ep --device cpu instead",
      command);
}

}  // namespace

void run_ep_cuda(const EpRunOptions&) { fail_without_cuda_ep("moe run"); }

void bench_ep_cuda(const EpBenchOptions&) { fail_without_cuda_ep("moe bench"); }

}  // namespace moe::cli
