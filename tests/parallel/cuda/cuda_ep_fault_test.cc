// Fault injection on the GPU path under mpirun, one process per GPU: the victim rank ends its
// process (std::_Exit, no MPI_Finalize, no CUDA teardown) in the middle of a low-latency step,
// right after its dispatch, and every other rank must fail that step with a moe::Error naming
// the victim and the stage (combine: the victim never returns its partial rows) within the
// layer's timeout, instead of hanging. tests/parallel/mpi/run_fault_test.sh runs it (with
// mpirun --enable-recovery, so the survivors outlive the victim) and counts the verdicts.
//
//   moe_cuda_ep_fault_test exit VICTIM TIMEOUT_MS
//
// Each survivor prints "rank R: PASS ..." or "rank R: FAIL ...", waits a moment for the others
// to print, and ends the job with MPI_Abort: after a timeout a peer is in an unknown step, and
// the layer's destructor is a collective the victim can no longer join. Exits 77 on every rank
// (skipped) without two ranks that each have a GPU.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "moe/cuda_ep_layer.h"
#include "moe/ep_layer.h"
#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "parallel/cuda/gpu_per_rank.h"
#include "parallel/cuda/small_ep_config.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;
using testing::DeviceTensor;

int run(MpiSession& session, int victim, int timeout_ms) {
  const int me = session.world_rank();
  std::unique_ptr<Communicator> world = make_mpi_communicator();
  world->set_timeout(std::chrono::seconds(60));  // construction only: the steps use no MPI
  const std::optional<int> gpu = testing::gpu_of_this_rank(*world);
  if (!gpu) return testing::kSkipped;
  if (cudaSetDevice(*gpu) != cudaSuccess) fail("cudaSetDevice({})", *gpu);
  if (victim < 0 || victim >= world->size()) {
    fail("VICTIM: expected a rank in [0, {}); got {}", world->size(), victim);
  }

  const MoeConfig config = testing::small_ep_config();
  const LayerWeights full = synthetic_layer_weights(config, DType::kBF16, 7);
  const ExpertMap map = ExpertMap::contiguous(config.routing.num_experts, world->size());
  CudaEpOptions options;
  options.dispatcher = DispatcherKind::kLowLatency;
  options.low_latency_capacity = 16;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  CudaEpLayer layer(config, local_layer_weights(full, map, me), map, *world, nullptr, options);

  // Every token uses experts of every rank, so each rank waits for each peer in both stages.
  const int64_t M = 16, k = config.routing.top_k, H = config.experts.hidden_size;
  Tensor ids(DType::kI32, {M, k});
  for (int64_t i = 0; i < M * k; ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>((i * 5) % config.routing.num_experts);
  }
  const DeviceTensor hidden(testing::random_normal(DType::kBF16, {M, H}, me)), d_ids(ids);
  const DeviceTensor weights(testing::random_normal(DType::kF32, {M, k}, me, 0.3f));
  const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, {M, H});
  layer.forward_routed(hidden, d_ids, weights, out);  // a healthy step first

  const auto start = Clock::now();
  layer.dispatch(hidden, d_ids, weights);
  if (me == victim) {
    // Its dispatch is complete (it saw every peer's rows): the peers wait for its combine.
    if (cudaStreamSynchronize(static_cast<cudaStream_t>(layer.stream())) != cudaSuccess) {
      fail("cudaStreamSynchronize (victim's dispatch)");
    }
    std::fprintf(stderr, "rank %d: victim: exit now, after dispatch\n", me);
    std::_Exit(3);
  }
  std::string error;
  try {
    layer.experts();
    layer.combine(out);
    layer.finish_step();
  } catch (const Error& e) {
    error = e.what();
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const bool named = error.find(fmt::format("timed out waiting for rank {} in combine", victim)) !=
                     std::string::npos;
  // The combine wait starts once this rank's dispatch and experts ran (milliseconds here).
  const bool in_time = ms < timeout_ms + 3000;
  const bool pass = named && in_time;
  std::printf("rank %d: %s after %.0f ms (timeout %d ms): %s\n", me, pass ? "PASS" : "FAIL", ms,
              timeout_ms, error.empty() ? "no error" : error.c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  session.abort(pass ? 0 : 1);
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  if (argc != 4 || std::string(argv[1]) != "exit") {
    std::fprintf(stderr, "usage: %s exit VICTIM TIMEOUT_MS\n", argv[0]);
    return 2;
  }
  try {
    return moe::run(session, std::atoi(argv[2]), std::atoi(argv[3]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", session.world_rank(), e.what());
    session.abort(1);
  }
}
