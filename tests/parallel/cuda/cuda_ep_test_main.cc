// The main of the GPU expert-parallel tests, run under mpirun with one process per GPU of one
// host. Skips (exit 77, which ctest reports as skipped) on every rank unless there are at least
// two ranks and every rank of a host has its own GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "moe/nccl_communicator.h"
#include "parallel/cuda/cuda_ep_world.h"
#include "parallel/cuda/gpu_per_rank.h"
#include "parallel/rank_failure_printer.h"

namespace moe::testing {
namespace {

Communicator* g_host = nullptr;
Communicator* g_nccl = nullptr;

}  // namespace

Communicator& host_world() { return *g_host; }
Communicator& nccl_world() { return *g_nccl; }

}  // namespace moe::testing

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int me = session.world_rank();
  int status = 1;
  try {
    std::unique_ptr<moe::Communicator> world = moe::make_mpi_communicator();
    world->set_timeout(std::chrono::seconds(60));
    const std::optional<int> gpu = moe::testing::gpu_of_this_rank(*world);
    if (!gpu) return moe::testing::kSkipped;
    const int local_index = *gpu;
    if (cudaSetDevice(local_index) != cudaSuccess) moe::fail("cudaSetDevice({})", local_index);
    std::unique_ptr<moe::Communicator> nccl =
        moe::make_nccl_communicator(*world, {.device = local_index});
    moe::testing::g_host = world.get();
    moe::testing::g_nccl = nccl.get();
    if (me > 0) moe::testing::print_only_failures_of_this_rank(me);
    const int result = RUN_ALL_TESTS();
    std::vector<int> all(static_cast<size_t>(world->size()));
    world->all_gather(&result, sizeof result, all.data());
    status = 0;
    for (int s : all) status = std::max(status, s);
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    session.abort(1);
  }
  return status;
}
