// The main of the tests run under mpirun: one MPI communicator for the whole program, gtest's
// output from rank 0 (the other ranks print only their failures, prefixed by their rank), and an
// exit status every rank agrees on.
#include <chrono>
#include <cstdio>

#include <gtest/gtest.h>

#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "parallel/mpi/mpi_world.h"
#include "parallel/rank_failure_printer.h"

namespace moe::testing {

namespace {

Communicator* g_world = nullptr;

}  // namespace

Communicator& mpi_world() { return *g_world; }

}  // namespace moe::testing

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int status = 1;
  try {
    std::unique_ptr<moe::Communicator> world = moe::make_mpi_communicator();
    world->set_timeout(std::chrono::seconds(20));
    moe::testing::g_world = world.get();
    if (session.world_rank() > 0)
      moe::testing::print_only_failures_of_this_rank(session.world_rank());
    const int mine = RUN_ALL_TESTS();
    std::vector<int> all(static_cast<size_t>(world->size()));
    world->all_gather(&mine, sizeof mine, all.data());
    status = 0;
    for (int s : all) status = std::max(status, s);
  } catch (const moe::Error& e) {
    // A collective failed (a peer timed out or died): the job cannot finalize cleanly.
    std::fprintf(stderr, "rank %d: %s\n", session.world_rank(), e.what());
    session.abort(1);
  }
  return status;
}
