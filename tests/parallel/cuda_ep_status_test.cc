// The error messages of the GPU expert-parallel kernels' status (a pure function: runs without a
// GPU): every count over the capacity, who reported an overflow, and what a timed-out wait saw;
// and of an exchange through a communicator that failed inside a step.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/cuda/ep_status.h"

namespace moe::cuda::ep {
namespace {

TEST(CudaEpStatus, ClearStatusHasNoMessage) { EXPECT_EQ(format_status(Status{}, 0, 2, 8), ""); }

TEST(CudaEpStatus, OverflowNamesEveryCountOverTheCapacity) {
  Status status;
  status.bits = kStatusOverflow;
  status.step = 5;
  status.needed_to[1] = 20;   // this rank (0) needed 20 rows for rank 1
  status.needed_to[2] = 3;    // within the capacity: not named
  status.needed_from[2] = 9;  // rank 2 needed 9 rows for this rank
  const std::string message = format_status(status, 0, 3, 8);
  EXPECT_NE(message.find("step 5 on rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("capacity of 8 rows"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0 needed 20 rows for rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 2 needed 9 rows for rank 0"), std::string::npos) << message;
  EXPECT_EQ(message.find("needed 3 rows"), std::string::npos) << message;
}

TEST(CudaEpStatus, OverflowSeenElsewhereNamesTheReporter) {
  Status status;
  status.bits = kStatusPeerOverflow;
  status.step = 2;
  status.overflow_reported_by = 3;
  const std::string message = format_status(status, 1, 4, 16);
  EXPECT_NE(message.find("capacity of 16 rows"), std::string::npos) << message;
  EXPECT_NE(message.find("reported by rank 3"), std::string::npos) << message;
}

TEST(CudaEpStatus, TimeoutSaysWhatTheFlagHeld) {
  Status status;
  status.bits = kStatusCombineTimeout;
  status.step = 7;
  status.timeout_peer = 1;
  status.timeout_expected_step = 7;
  status.timeout_last_flag = (uint64_t{6} << 32) | kOverflowSeenBit | 31;
  const std::string message = format_status(status, 0, 2, 8);
  EXPECT_NE(message.find("timed out waiting for rank 1 in combine"), std::string::npos) << message;
  EXPECT_NE(message.find("expected step 7, its flag held step 6 count 31"), std::string::npos)
      << message;
}

TEST(CudaEpStatus, FailedExchangeNamesStepStagePeersAndCause) {
  const std::vector<int> peers = {1, 3};
  const std::string message = format_exchange_failure(
      4, 2, "combine", "the nccl all-to-all of the partial rows", peers,
      "NCCL: rank 2 timed out after 2000 ms in operation #9 (communicator aborted)");
  EXPECT_EQ(message,
            "expert-parallel step 4 on rank 2 failed in combine: the nccl all-to-all of the "
            "partial rows with ranks [1, 3] did not complete: NCCL: rank 2 timed out after 2000 "
            "ms in operation #9 (communicator aborted)");
}

}  // namespace
}  // namespace moe::cuda::ep
