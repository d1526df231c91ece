// Fault injection on the GPU path under mpirun, one process per GPU: the victim rank ends its
// process (std::_Exit, no MPI_Finalize, no CUDA teardown) in the middle of a step, and every
// other rank must fail that step with a moe::Error naming the stage and the victim within the
// timeout, instead of hanging. tests/parallel/mpi/run_fault_test.sh runs it (with mpirun
// --enable-recovery, so the survivors outlive the victim) and counts the verdicts.
//
//   moe_cuda_ep_fault_test exit VICTIM TIMEOUT_MS [PATH [WHEN]]
//
// PATH: ll (low-latency, the default), ht (high-throughput peer to peer; skipped where the GPUs
// cannot reach each other so) or ht_nccl (high-throughput forced through NCCL). WHEN:
// after-dispatch (the default: the victim's dispatch is complete, the survivors wait for its
// combine) or before-dispatch (it dies between two steps, the survivors wait for it in dispatch).
// The waits each case meets, and the words the survivor's error must hold (with 2 ranks the
// peers of an exchange are the victim alone):
//
//   ll, ht       after    the combine flag on the GPU: "timed out waiting for rank V in combine"
//   ll           before   the dispatch flag on the GPU: "... rank V in dispatch"
//   ht           before   the token counts' all-gather through MPI: "failed in dispatch: ... with
//                         ranks [V]"
//   ht_nccl      after    the NCCL all-to-all of the partial rows: "failed in combine: ... with
//                         ranks [V]" (NCCL cannot say which peer of a group is missing)
//   ht_nccl      before   the row counts' exchange through MPI: "failed in dispatch: ... with
//                         ranks [V]"
//
// Peer to peer the survivor never reads the victim's buffer once its combine flag did not come
// (it still publishes its own flag there). The layer's timeout bounds the waits on the GPU, the
// communicators' timeouts (set to the same TIMEOUT_MS once the layer is built) those in MPI and
// NCCL. Each survivor prints "rank R: PASS ..." or "rank R: FAIL ...", waits a moment for the
// others to print, and ends the job with MPI_Abort: after a timeout a peer is in an unknown step,
// and the layer's destructor is a collective the victim can no longer join. Exits 77 on every
// rank (skipped) without two ranks that each have a GPU.
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "moe/cuda_ep_layer.h"
#include "moe/ep_layer.h"
#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "moe/nccl_communicator.h"
#include "parallel/cuda/gpu_per_rank.h"
#include "parallel/cuda/ipc_buffers.h"
#include "parallel/cuda/small_ep_config.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;
using testing::DeviceTensor;

struct FaultCase {
  std::string path;  // ll, ht, ht_nccl
  bool before_dispatch = false;

  bool waits_on_the_gpu() const { return path == "ll" || (path == "ht" && !before_dispatch); }
  const char* stage() const { return before_dispatch ? "dispatch" : "combine"; }
};

FaultCase parse_case(int argc, char** argv) {
  FaultCase c{argc > 4 ? argv[4] : "ll"};
  if (c.path != "ll" && c.path != "ht" && c.path != "ht_nccl") {
    fail("PATH: expected ll, ht or ht_nccl; got {}", c.path);
  }
  const std::string when = argc > 5 ? argv[5] : "after-dispatch";
  if (when != "after-dispatch" && when != "before-dispatch") {
    fail("WHEN: expected after-dispatch or before-dispatch; got {}", when);
  }
  c.before_dispatch = when == "before-dispatch";
  return c;
}

// Whether the survivor's error names what it waited for: the victim's flag on the GPU, or the
// stage and the peers of the exchange in a communicator (every other rank: each token below
// uses experts of every rank).
bool names_the_fault(const std::string& error, const FaultCase& c, int victim, int me, int N) {
  if (c.waits_on_the_gpu()) {
    return error.find(fmt::format("timed out waiting for rank {} in {}", victim, c.stage())) !=
           std::string::npos;
  }
  std::vector<int> others;
  for (int p = 0; p < N; ++p) {
    if (p != me) others.push_back(p);
  }
  return error.find(fmt::format("failed in {}: ", c.stage())) != std::string::npos &&
         error.find(fmt::format("with ranks [{}]", fmt::join(others, ", "))) != std::string::npos;
}

int run(MpiSession& session, int victim, int timeout_ms, const FaultCase& c) {
  const int me = session.world_rank();
  std::unique_ptr<Communicator> world = make_mpi_communicator();
  world->set_timeout(std::chrono::seconds(60));  // set-up; the faulty step gets timeout_ms
  const std::optional<int> gpu = testing::gpu_of_this_rank(*world);
  if (!gpu) return testing::kSkipped;
  if (cudaSetDevice(*gpu) != cudaSuccess) fail("cudaSetDevice({})", *gpu);
  if (victim < 0 || victim >= world->size()) {
    fail("VICTIM: expected a rank in [0, {}); got {}", world->size(), victim);
  }
  if (c.path == "ht" && !cuda::ep::ipc_reachable(*world)) {  // a collective: alike on every rank
    if (me == 0) std::printf("SKIP: ht: the GPUs cannot reach each other peer to peer\n");
    std::fflush(stdout);
    return testing::kSkipped;
  }
  std::unique_ptr<Communicator> nccl;
  if (c.path == "ht_nccl") nccl = make_nccl_communicator(*world, {.device = *gpu});

  const MoeConfig config = testing::small_ep_config();
  const LayerWeights full = synthetic_layer_weights(config, DType::kBF16, 7);
  const ExpertMap map = ExpertMap::contiguous(config.routing.num_experts, world->size());
  CudaEpOptions options;
  options.dispatcher =
      c.path == "ll" ? DispatcherKind::kLowLatency : DispatcherKind::kHighThroughput;
  options.high_throughput_over_nccl = c.path == "ht_nccl";
  options.low_latency_capacity = 16;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  CudaEpLayer layer(config, local_layer_weights(full, map, me), map, *world, nccl.get(), options);

  // Every token uses experts of every rank, so each rank waits for each peer in both stages.
  const int64_t M = 16, k = config.routing.top_k, H = config.experts.hidden_size;
  Tensor ids(DType::kI32, {M, k});
  for (int64_t i = 0; i < M * k; ++i) {
    ids.data<int32_t>()[i] = static_cast<int32_t>((i * 5) % config.routing.num_experts);
  }
  const DeviceTensor hidden(testing::random_normal(DType::kBF16, {M, H}, me)), d_ids(ids);
  const DeviceTensor weights(testing::random_normal(DType::kF32, {M, k}, me, 0.3f));
  const DeviceTensor out = DeviceTensor::empty_like(DType::kBF16, {M, H});
  layer.forward_routed(hidden, d_ids, weights, out);  // a healthy step first (sizes the buffers)
  for (Communicator* comm : {world.get(), nccl.get()}) {
    if (comm != nullptr) comm->set_timeout(std::chrono::milliseconds(timeout_ms));
  }

  if (me == victim && c.before_dispatch) {
    std::fprintf(stderr, "rank %d: victim: exit now, before dispatch\n", me);
    std::_Exit(3);
  }
  const auto start = Clock::now();
  std::string error;
  try {
    layer.dispatch(hidden, d_ids, weights);
    if (me == victim) {
      // Its dispatch is complete (it saw every peer's rows): the peers wait for its combine.
      if (cudaStreamSynchronize(static_cast<cudaStream_t>(layer.stream())) != cudaSuccess) {
        fail("cudaStreamSynchronize (victim's dispatch)");
      }
      std::fprintf(stderr, "rank %d: victim: exit now, after dispatch\n", me);
      std::_Exit(3);
    }
    layer.experts();
    layer.combine(out);
    layer.finish_step();
  } catch (const Error& e) {
    error = e.what();
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const bool named = names_the_fault(error, c, victim, me, world->size());
  // One wait of at most the timeout; what runs around it takes milliseconds here.
  const bool in_time = ms < timeout_ms + 3000;
  const bool pass = named && in_time;
  std::printf("rank %d: %s after %.0f ms (%s, victim exits %s dispatch, timeout %d ms): %s\n", me,
              pass ? "PASS" : "FAIL", ms, c.path.c_str(), c.before_dispatch ? "before" : "after",
              timeout_ms, error.empty() ? "no error" : error.c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  session.abort(pass ? 0 : 1);
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  if (argc < 4 || argc > 6 || std::string(argv[1]) != "exit") {
    std::fprintf(
        stderr,
        "usage: %s exit VICTIM TIMEOUT_MS [ll|ht|ht_nccl [after-dispatch|before-dispatch]]\n",
        argv[0]);
    return 2;
  }
  try {
    const moe::FaultCase c = moe::parse_case(argc, argv);
    return moe::run(session, std::atoi(argv[2]), std::atoi(argv[3]), c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", session.world_rank(), e.what());
    session.abort(1);
  }
}
