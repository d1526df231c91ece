// The shared communicator checks (communicator_cases.h) on MPI processes, and hosts as MPI
// reports them. Failures (a bound exceeded, a peer that dies or stalls) are in mpi_fault_test.cc,
// since they leave the communicator unusable.
#include <gtest/gtest.h>

#include "parallel/communicator_cases.h"
#include "parallel/mpi/mpi_world.h"

namespace moe {
namespace {

using testing::mpi_world;

TEST(MpiCommunicator, AllToAllVPutsEveryByteWhereTheSplitsSay) {
  for (uint64_t seed : {1, 2, 3}) testing::check_all_to_all_v(mpi_world(), seed);
}

TEST(MpiCommunicator, BoundedReceivesReportWhatArrived) {
  testing::check_all_to_all_bounded(mpi_world(), 5);
}

TEST(MpiCommunicator, RequestsInFlightCompleteInAnyOrder) {
  testing::check_requests_in_flight(mpi_world());
}

TEST(MpiCommunicator, AllGatherAndBarrier) { testing::check_all_gather_and_barrier(mpi_world()); }

TEST(MpiCommunicator, OneHostOnThisMachine) {
  Communicator& world = mpi_world();
  EXPECT_EQ(world.name(), "mpi");
  EXPECT_EQ(world.num_hosts(), 1);
  for (int r = 0; r < world.size(); ++r) EXPECT_TRUE(world.same_host(0, r));
}

}  // namespace
}  // namespace moe
