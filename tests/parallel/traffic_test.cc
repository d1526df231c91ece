// The byte counters' pure functions: rows to bytes each way, and bytes by domain from each rank's
// point of view, on one host and on pretended hosts of two ranks.
#include "parallel/traffic.h"

#include <gtest/gtest.h>

#include "moe/error.h"

namespace moe::parallel {
namespace {

TEST(Traffic, BytesToEachPeerAreRowsOutPlusResultsBack) {
  const RowBytes row{.out = 100, .back = 10};
  EXPECT_EQ(bytes_to_each({3, 0, 5}, {1, 7, 0}, row), (std::vector<int64_t>{310, 70, 500}));
  // Swapped: what this rank receives.
  EXPECT_EQ(bytes_to_each({1, 7, 0}, {3, 0, 5}, row), (std::vector<int64_t>{130, 700, 50}));
  EXPECT_THROW(bytes_to_each({1, 2}, {1}, row), Error);
}

TEST(Traffic, OneHostHasNoCrossHostBytes) {
  const auto group = make_in_process_group(3);
  const std::vector<int64_t> per_peer{4, 20, 300};
  for (const auto& comm : group) {
    const TrafficSplit split = split_by_domain(per_peer, *comm);
    EXPECT_EQ(split.self, per_peer[static_cast<size_t>(comm->rank())]);
    EXPECT_EQ(split.same_host, 324 - split.self);
    EXPECT_EQ(split.cross_host, 0);
  }
}

TEST(Traffic, HostsOfTwoRanksSplitSameAndCrossHost) {
  const auto group = make_in_process_group(4, /*ranks_per_host=*/2);
  const std::vector<int64_t> per_peer{1, 20, 300, 4000};
  const TrafficSplit rank1 = split_by_domain(per_peer, *group[1]);
  EXPECT_EQ(rank1.self, 20);
  EXPECT_EQ(rank1.same_host, 1);
  EXPECT_EQ(rank1.cross_host, 4300);
  const TrafficSplit rank2 = split_by_domain(per_peer, *group[2]);
  EXPECT_EQ(rank2.self, 300);
  EXPECT_EQ(rank2.same_host, 4000);
  EXPECT_EQ(rank2.cross_host, 21);
  EXPECT_THROW(split_by_domain({1, 2}, *group[0]), Error);
}

}  // namespace
}  // namespace moe::parallel
