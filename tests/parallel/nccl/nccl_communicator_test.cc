// NCCL between GPUs (one process per GPU): the shared communicator checks through host staging,
// device buffers and the device barrier directly, and the expert-parallel layer's equality with
// the single-process layer with NCCL carrying dispatch and combine.
#include <cuda_runtime.h>

#include <vector>

#include <gtest/gtest.h>

#include "parallel/communicator_cases.h"
#include "parallel/ep_case.h"
#include "parallel/nccl/nccl_world.h"

namespace moe {
namespace {

using testing::nccl_world;
using testing::staged_world;

TEST(NcclCommunicator, SharedChecksThroughHostStaging) {
  for (uint64_t seed : {1, 2, 3}) testing::check_all_to_all_v(staged_world(), seed);
  testing::check_all_to_all_bounded(staged_world(), 5);
  testing::check_requests_in_flight(staged_world());
  testing::check_all_gather_and_barrier(staged_world());
}

TEST(NcclCommunicator, DeviceBuffersAndTheDeviceBarrier) {
  Communicator& comm = nccl_world();
  const int me = comm.rank(), N = comm.size();
  constexpr int64_t kBytes = 1 << 20;  // 1 MiB per peer
  std::vector<int64_t> counts(N, kBytes), displs(N);
  for (int p = 0; p < N; ++p) displs[p] = p * kBytes;
  std::vector<unsigned char> host(static_cast<size_t>(N * kBytes));
  for (int p = 0; p < N; ++p) {
    for (int64_t i = 0; i < kBytes; ++i)
      host[p * kBytes + i] = static_cast<unsigned char>(me * 31 + p * 7 + i);
  }
  void* send = nullptr;
  void* recv = nullptr;
  ASSERT_EQ(cudaMalloc(&send, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, host.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  comm.barrier();
  comm.all_to_all_v(send, {counts, displs}, recv, {counts, displs});
  ASSERT_EQ(cudaMemcpy(host.data(), recv, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int p = 0; p < N; ++p) {
    for (int64_t i = 0; i < kBytes; i += 4099) {
      ASSERT_EQ(host[p * kBytes + i], static_cast<unsigned char>(p * 31 + me * 7 + i))
          << "from " << p << " byte " << i;
    }
  }
  comm.barrier();
  cudaFree(send);
  cudaFree(recv);
}

TEST(NcclEpLayer, EqualsTheSingleProcessLayerWithNcclCarryingTheRows) {
  const int N = staged_world().size();
  for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
    for (bool overlap : {false, true}) {
      testing::EpCase c;
      c.family = "deepseek";
      c.num_ranks = N;
      c.steps = {std::vector<int64_t>(static_cast<size_t>(N), 24)};
      c.options.dispatcher = kind;
      c.options.two_batch_overlap = overlap;
      c.options.low_latency_capacity = 24;
      SCOPED_TRACE(c.describe());
      const testing::EpCaseData data = testing::prepare_ep_case(c);
      testing::EpRankResult result;
      testing::run_ep_rank(c, data, staged_world(), result);
      EXPECT_EQ(result.mismatches, 0) << result.first_mismatch;
    }
  }
}

}  // namespace
}  // namespace moe
