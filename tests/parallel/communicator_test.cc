// The in-process communicator: every byte lands where the splits say, bounded receives report
// their sizes, requests complete in any order, mismatches are errors on the receiver, and a rank
// that never comes makes the others fail within the timeout, naming it.
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "moe/communicator.h"
#include "moe/error.h"
#include "parallel/rank_threads.h"

namespace moe {
namespace {

using testing::all_ranks_succeeded;
using testing::run_rank_threads;

// The byte rank `from` sends rank `to` at position i: distinct per (from, to, i).
uint8_t pattern(int from, int to, int64_t i) {
  return static_cast<uint8_t>(from * 61 + to * 17 + i * 7 + 1);
}

// count[from][to]: a pseudo-random byte count, 0 for some pairs; the same on every rank.
int64_t count_of(int from, int to, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000 + static_cast<uint64_t>(from * 10 + to));
  const int64_t c = static_cast<int64_t>(rng() % 40);
  return c < 8 ? 0 : c;
}

constexpr uint8_t kPoison = 0xEE;

TEST(InProcessCommunicator, AllToAllVPutsEveryByteWhereTheSplitsSay) {
  for (int size = 1; size <= 4; ++size) {
    for (uint64_t seed : {1, 2}) {
      SCOPED_TRACE("size " + std::to_string(size) + " seed " + std::to_string(seed));
      const auto errors = run_rank_threads(size, [&](Communicator& comm) {
        const int me = comm.rank(), N = comm.size();
        std::vector<int64_t> send_counts(N), send_displs(N), recv_counts(N), recv_displs(N);
        int64_t send_total = 0, recv_total = 0;
        // Peers in reverse order in the send buffer, with a 3-byte gap after each receive.
        for (int p = N - 1; p >= 0; --p) {
          send_counts[p] = count_of(me, p, seed);
          send_displs[p] = send_total;
          send_total += send_counts[p];
        }
        for (int p = 0; p < N; ++p) {
          recv_counts[p] = count_of(p, me, seed);
          recv_displs[p] = recv_total;
          recv_total += recv_counts[p] + 3;
        }
        std::vector<uint8_t> send(static_cast<size_t>(send_total)), recv(recv_total, kPoison);
        for (int p = 0; p < N; ++p) {
          for (int64_t i = 0; i < send_counts[p]; ++i) send[send_displs[p] + i] = pattern(me, p, i);
        }
        comm.all_to_all_v(send.data(), {send_counts, send_displs}, recv.data(),
                          {recv_counts, recv_displs});
        for (int p = 0; p < N; ++p) {
          for (int64_t i = 0; i < recv_counts[p]; ++i) {
            ASSERT_EQ(recv[recv_displs[p] + i], pattern(p, me, i)) << "from " << p << " byte " << i;
          }
          for (int64_t i = 0; i < 3; ++i) {
            ASSERT_EQ(recv[recv_displs[p] + recv_counts[p] + i], kPoison) << "gap after " << p;
          }
        }
      });
      EXPECT_TRUE(all_ranks_succeeded(errors));
    }
  }
}

TEST(InProcessCommunicator, BoundedReceivesReportWhatArrived) {
  const auto errors = run_rank_threads(3, [](Communicator& comm) {
    const int me = comm.rank(), N = comm.size();
    constexpr int64_t kBound = 40;
    std::vector<int64_t> send_counts(N), send_displs(N), bounds(N, kBound), slots(N);
    std::vector<int64_t> received(N, -1);
    std::vector<uint8_t> send(N * kBound), recv(N * kBound, kPoison);
    for (int p = 0; p < N; ++p) {
      send_counts[p] = count_of(me, p, 5);
      send_displs[p] = p * kBound;
      slots[p] = p * kBound;
      for (int64_t i = 0; i < send_counts[p]; ++i) send[p * kBound + i] = pattern(me, p, i);
    }
    comm.start_all_to_all_bounded(send.data(), {send_counts, send_displs}, recv.data(),
                                  {bounds, slots}, received)
        ->wait();
    for (int p = 0; p < N; ++p) {
      ASSERT_EQ(received[p], count_of(p, me, 5)) << "from " << p;
      for (int64_t i = 0; i < received[p]; ++i) ASSERT_EQ(recv[p * kBound + i], pattern(p, me, i));
      for (int64_t i = received[p]; i < kBound; ++i) ASSERT_EQ(recv[p * kBound + i], kPoison);
    }
  });
  EXPECT_TRUE(all_ranks_succeeded(errors));
}

TEST(InProcessCommunicator, RequestsInFlightCompleteInAnyOrder) {
  const auto errors = run_rank_threads(4, [](Communicator& comm) {
    const int me = comm.rank(), N = comm.size();
    std::vector<int64_t> ones(N, 1), by_rank(N);
    std::iota(by_rank.begin(), by_rank.end(), 0);
    std::vector<uint8_t> a_send(N, static_cast<uint8_t>(me)), b_send(N);
    for (int p = 0; p < N; ++p) b_send[p] = static_cast<uint8_t>(100 + me * N + p);
    std::vector<uint8_t> a_recv(N), b_recv(N);
    auto a =
        comm.start_all_to_all_v(a_send.data(), {ones, by_rank}, a_recv.data(), {ones, by_rank});
    auto b =
        comm.start_all_to_all_v(b_send.data(), {ones, by_rank}, b_recv.data(), {ones, by_rank});
    b->wait();
    a->wait();
    for (int p = 0; p < N; ++p) {
      EXPECT_EQ(a_recv[p], p);
      EXPECT_EQ(b_recv[p], 100 + p * N + me);
    }
  });
  EXPECT_TRUE(all_ranks_succeeded(errors));
}

TEST(InProcessCommunicator, AllGatherAndBarrier) {
  const auto errors = run_rank_threads(4, [](Communicator& comm) {
    const int64_t mine[2] = {comm.rank(), 10 * comm.rank()};
    std::vector<int64_t> all(2 * comm.size(), -1);
    comm.barrier();
    comm.all_gather(mine, sizeof mine, all.data());
    for (int p = 0; p < comm.size(); ++p) {
      EXPECT_EQ(all[2 * p], p);
      EXPECT_EQ(all[2 * p + 1], 10 * p);
    }
    comm.barrier();
  });
  EXPECT_TRUE(all_ranks_succeeded(errors));
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
