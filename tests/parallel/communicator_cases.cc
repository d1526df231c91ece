#include "parallel/communicator_cases.h"

#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace moe::testing {

namespace {

// The byte rank `from` sends rank `to` at position i: distinct per (from, to, i).
uint8_t pattern(int from, int to, int64_t i) {
  return static_cast<uint8_t>(from * 61 + to * 17 + i * 7 + 1);
}

// A pseudo-random byte count from `from` to `to`, 0 for some pairs; the same on every rank.
int64_t count_of(int from, int to, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000 + static_cast<uint64_t>(from * 10 + to));
  const int64_t c = static_cast<int64_t>(rng() % 40);
  return c < 8 ? 0 : c;
}

constexpr uint8_t kPoison = 0xEE;

}  // namespace

void check_all_to_all_v(Communicator& comm, uint64_t seed) {
  SCOPED_TRACE("all_to_all_v seed " + std::to_string(seed) + " rank " +
               std::to_string(comm.rank()));
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
}

void check_all_to_all_bounded(Communicator& comm, uint64_t seed) {
  SCOPED_TRACE("all_to_all_bounded rank " + std::to_string(comm.rank()));
  const int me = comm.rank(), N = comm.size();
  constexpr int64_t kBound = 40;
  std::vector<int64_t> send_counts(N), send_displs(N), bounds(N, kBound), slots(N);
  std::vector<int64_t> received(N, -1);
  std::vector<uint8_t> send(N * kBound), recv(N * kBound, kPoison);
  for (int p = 0; p < N; ++p) {
    send_counts[p] = count_of(me, p, seed);
    send_displs[p] = p * kBound;
    slots[p] = p * kBound;
    for (int64_t i = 0; i < send_counts[p]; ++i) send[p * kBound + i] = pattern(me, p, i);
  }
  comm.start_all_to_all_bounded(send.data(), {send_counts, send_displs}, recv.data(),
                                {bounds, slots}, received)
      ->wait();
  for (int p = 0; p < N; ++p) {
    ASSERT_EQ(received[p], count_of(p, me, seed)) << "from " << p;
    for (int64_t i = 0; i < received[p]; ++i) ASSERT_EQ(recv[p * kBound + i], pattern(p, me, i));
    for (int64_t i = received[p]; i < kBound; ++i) ASSERT_EQ(recv[p * kBound + i], kPoison);
  }
}

void check_requests_in_flight(Communicator& comm) {
  const int me = comm.rank(), N = comm.size();
  std::vector<int64_t> ones(N, 1), by_rank(N);
  std::iota(by_rank.begin(), by_rank.end(), 0);
  std::vector<uint8_t> a_send(N, static_cast<uint8_t>(me)), b_send(N);
  for (int p = 0; p < N; ++p) b_send[p] = static_cast<uint8_t>(100 + me * N + p);
  std::vector<uint8_t> a_recv(N), b_recv(N);
  auto a = comm.start_all_to_all_v(a_send.data(), {ones, by_rank}, a_recv.data(), {ones, by_rank});
  auto b = comm.start_all_to_all_v(b_send.data(), {ones, by_rank}, b_recv.data(), {ones, by_rank});
  b->wait();
  a->wait();
  for (int p = 0; p < N; ++p) {
    EXPECT_EQ(a_recv[p], p);
    EXPECT_EQ(b_recv[p], 100 + p * N + me);
  }
}

void check_all_gather_and_barrier(Communicator& comm) {
  const int64_t mine[2] = {comm.rank(), 10 * comm.rank()};
  std::vector<int64_t> all(2 * comm.size(), -1);
  comm.barrier();
  comm.all_gather(mine, sizeof mine, all.data());
  for (int p = 0; p < comm.size(); ++p) {
    EXPECT_EQ(all[2 * p], p);
    EXPECT_EQ(all[2 * p + 1], 10 * p);
  }
  comm.barrier();
}

}  // namespace moe::testing
