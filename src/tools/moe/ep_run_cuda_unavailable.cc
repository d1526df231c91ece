// run_ep_cuda in a build without GPU expert parallelism (MOE_WITH_CUDA_EP off).
#include "moe/error.h"
#include "tools/moe/ep_run.h"

namespace moe::cli {

void run_ep_cuda(const EpRunOptions&) {
  fail(
      "--ep --device cuda: this moe was built without GPU expert parallelism (moe::cuda_ep needs "
      "the CUDA toolkit with NCCL and MPI: configure with MOE_WITH_CUDA_EP=ON where nvcc, nccl.h "
      "and OpenMPI are found); run --ep --device cpu instead");
}

}  // namespace moe::cli
