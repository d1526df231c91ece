// The main of the NCCL tests, run under mpirun with one process per GPU. MPI carries the NCCL
// unique id. Without a CUDA device for every rank of a host, every rank exits with 77, which ctest
// reports as skipped (SKIP_RETURN_CODE).
#include <chrono>
#include <cstdio>

#include <gtest/gtest.h>

#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "moe/nccl_communicator.h"
#include "parallel/nccl/host_staged_communicator.h"
#include "parallel/nccl/nccl_world.h"
#include "parallel/rank_failure_printer.h"

namespace moe::testing {

namespace {

Communicator* g_nccl = nullptr;
Communicator* g_staged = nullptr;
constexpr int kSkipped = 77;

}  // namespace

Communicator& nccl_world() { return *g_nccl; }
Communicator& staged_world() { return *g_staged; }

}  // namespace moe::testing

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int me = session.world_rank();
  int status = 1;
  try {
    std::unique_ptr<moe::Communicator> world = moe::make_mpi_communicator();
    world->set_timeout(std::chrono::seconds(60));
    int local_ranks = 0;
    for (int r = 0; r < world->size(); ++r) local_ranks += world->same_host(r, me);
    const int devices = moe::cuda_device_count();
    const int mine = devices >= local_ranks ? 1 : 0;
    std::vector<int> all(static_cast<size_t>(world->size()));
    world->all_gather(&mine, sizeof mine, all.data());
    for (int ok : all) {
      if (ok) continue;
      if (me == 0) {
        std::printf(
            "SKIP: every rank needs its own CUDA device; rank %d's host has %d for %d "
            "ranks\n",
            me, devices, local_ranks);
      }
      return moe::testing::kSkipped;
    }
    std::unique_ptr<moe::Communicator> nccl = moe::make_nccl_communicator(*world);
    std::unique_ptr<moe::Communicator> staged = moe::testing::make_host_staged_communicator(*nccl);
    moe::testing::g_nccl = nccl.get();
    moe::testing::g_staged = staged.get();
    if (me > 0) moe::testing::print_only_failures_of_this_rank(me);
    const int result = RUN_ALL_TESTS();
    world->all_gather(&result, sizeof result, all.data());
    status = 0;
    for (int s : all) status = std::max(status, s);
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    session.abort(1);
  }
  return status;
}
