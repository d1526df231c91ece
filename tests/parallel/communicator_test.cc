// The in-process communicator: every byte lands where the splits say, bounded receives report
// their sizes, requests complete in any order, mismatches are errors on the receiver, and a rank
// that never comes makes the others fail within the timeout, naming it.
#include <chrono>

#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "moe/communicator.h"
#include "moe/error.h"
#include "parallel/communicator_cases.h"
#include "parallel/rank_threads.h"

namespace moe {
namespace {

using testing::all_ranks_succeeded;
using testing::run_rank_threads;

TEST(InProcessCommunicator, AllToAllVPutsEveryByteWhereTheSplitsSay) {
  for (int size = 1; size <= 4; ++size) {
    for (uint64_t seed : {1, 2}) {
      EXPECT_TRUE(all_ranks_succeeded(run_rank_threads(
          size, [&](Communicator& comm) { testing::check_all_to_all_v(comm, seed); })));
    }
  }
}

TEST(InProcessCommunicator, BoundedReceivesReportWhatArrived) {
  for (int size = 1; size <= 4; ++size) {
    EXPECT_TRUE(all_ranks_succeeded(run_rank_threads(
        size, [](Communicator& comm) { testing::check_all_to_all_bounded(comm, 5); })));
  }
}

TEST(InProcessCommunicator, RequestsInFlightCompleteInAnyOrder) {
  EXPECT_TRUE(all_ranks_succeeded(run_rank_threads(4, testing::check_requests_in_flight)));
}

TEST(InProcessCommunicator, AllGatherAndBarrier) {
  EXPECT_TRUE(all_ranks_succeeded(run_rank_threads(4, testing::check_all_gather_and_barrier)));
}

TEST(InProcessCommunicator, HostsAreNumberedByTheirLowestRank) {
  const auto errors = run_rank_threads(5,
                                       [](Communicator& comm) {
                                         EXPECT_EQ(comm.num_hosts(), 3);
                                         for (int r = 0; r < 5; ++r)
                                           EXPECT_EQ(comm.host_of(r), r / 2);
                                         EXPECT_TRUE(comm.same_host(2, 3));
                                         EXPECT_FALSE(comm.same_host(1, 2));
                                       },
                                       {.ranks_per_host = 2});
  EXPECT_TRUE(all_ranks_succeeded(errors));
}

TEST(InProcessCommunicator, CountMismatchIsAnErrorOnTheReceiver) {
  const auto errors = run_rank_threads(2, [](Communicator& comm) {
    std::vector<int64_t> send_counts = {4, 4}, displs = {0, 4};
    std::vector<int64_t> recv_counts = {4, comm.rank() == 0 ? int64_t{3} : int64_t{4}};
    std::vector<char> send(8, 'x'), recv(8);
    comm.all_to_all_v(send.data(), {send_counts, displs}, recv.data(), {recv_counts, displs});
  });
  EXPECT_NE(errors[0].find("rank 1 sends 4 bytes; expected exactly 3"), std::string::npos)
      << errors[0];
  EXPECT_EQ(errors[1], "");
}

TEST(InProcessCommunicator, AMissingRankTimesOutTheOthersAndNamesIt) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  std::vector<std::string> later(3);
  const auto errors = run_rank_threads(3,
                                       [&](Communicator& comm) {
                                         if (comm.rank() == 1) return;  // never joins
                                         try {
                                           comm.barrier();
                                         } catch (const Error&) {
                                           EXPECT_TRUE(comm.failed());
                                           later[comm.rank()] =
                                               testing::error_message([&] { comm.barrier(); });
                                           throw;
                                         }
                                       },
                                       {.timeout = milliseconds(300)});
  const double seconds = duration<double>(steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "the timeout did not bound the wait";
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("timed out after 300 ms"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("ranks [1] never started it"), std::string::npos) << errors[r];
    EXPECT_NE(later[r].find("failed earlier"), std::string::npos) << later[r];
  }
  EXPECT_EQ(errors[1], "");
}

TEST(InProcessCommunicator, RejectsBadArguments) {
  auto comms = make_in_process_group(2);
  Communicator& comm = *comms[0];
  testing::expect_error([&] { comm.set_timeout(std::chrono::milliseconds(0)); },
                        {"timeout", "> 0", "0 ms"});
  const std::vector<int64_t> one = {1}, two = {1, 1}, negative = {-1, 0};
  testing::expect_error(
      [&] {
        comm.all_to_all_v(nullptr, {one, one}, nullptr, {two, two});
      },
      {"all_to_all_v", "send", "2 peers", "got 1"});
  testing::expect_error(
      [&] {
        comm.all_to_all_v(nullptr, {negative, two}, nullptr, {two, two});
      },
      {"all_to_all_v", ">= 0", "-1"});
  EXPECT_THROW(make_in_process_group(0), Error);
  EXPECT_FALSE(comm.failed());
}

}  // namespace
}  // namespace moe
