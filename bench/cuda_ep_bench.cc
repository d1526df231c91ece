// GPU expert parallelism, one process per GPU of one host, under mpirun: dispatch and combine of
// CudaEpLayer on both data paths, Qwen3-30B-A3B and DeepSeek-V3 shapes (routed experts only),
// 128 tokens per rank (decode) and 4096 (prefill), uniform random routing over contiguous experts.
//
// Per case, the slowest rank's median of: dispatch, experts, combine (CUDA events around each
// stage of forward_routed; combine starts after every rank's experts finished), a whole step with
// routing (forward), and for the low-latency path dispatch + experts + combine replayed as one CUDA
// graph. Bandwidth per GPU is the bytes this rank wrote to other GPUs in the stage (rows, ids and
// weights; partial rows back) over the stage's time. Two floors are measured in the same run and
// printed next to it: one NCCL all-to-all of the dispatch's bytes per peer, and a 256 MiB
// cudaMemcpyPeerAsync from every GPU to the next at once (the copy engines' peer bandwidth).
//
// Two-batch row per case: the routed step (forward_routed) against the same tokens as two
// micro-batches with overlap (forward_routed_two_batch, the experts' persistent grids leaving
// --free-sms multiprocessors to the transfers), the slowest rank's medians and the gain; and the
// step's bytes sent by domain (last_stats(): same host, cross host).
//
// Paths: ll (low-latency), ht (high-throughput: peer to peer where every GPU reaches every other,
// else NCCL), nccl (high-throughput forced through NCCL).
//
// Timed steps start together on every GPU (StartLine: a barrier of the GPUs after the host's);
// --start host leaves only the host barrier, whose skew between processes the stages then time.
// The header prints an empty kernel timed the same way: the part of every stage's figure that is
// the events' and the launch's own cost.
//
// Run: mpirun -np 2 build/release/bench/moe_bench_cuda_ep [--tokens 128,4096] [--iterations 20]
//        [--paths ll,ht,nccl] [--models qwen3-30b-a3b,deepseek-v3] [--free-sms 16] [--start gpu]
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fill_random.h"
#include "moe/config.h"
#include "moe/cuda_ep_layer.h"
#include "moe/ep_layer.h"
#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "moe/nccl_communicator.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ipc_buffers.h"
#include "parallel/cuda/peer_barrier.h"

namespace moe {
namespace {

using cuda::check;

// The stream is held this long before each timed step, so the host has queued the whole step.
constexpr int64_t kHoldUs = 200;
constexpr uint64_t kStartTimeoutNs = 10'000'000'000;  // a peer that never lines up: an error

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    if (end > start) items.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double slowest(Communicator& comm, double mine) {
  std::vector<double> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, sizeof mine, all.data());
  return *std::max_element(all.begin(), all.end());
}

class Events {
 public:
  explicit Events(int count) : events_(static_cast<size_t>(count)) {
    for (auto& e : events_) check(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~Events() {
    for (auto& e : events_) cudaEventDestroy(e);
  }
  void mark(int i, void* stream) {
    check(cudaEventRecord(events_[static_cast<size_t>(i)], static_cast<cudaStream_t>(stream)),
          "cudaEventRecord");
  }
  double us(int from, int to) const {
    check(cudaEventSynchronize(events_[static_cast<size_t>(to)]), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events_[static_cast<size_t>(from)],
                               events_[static_cast<size_t>(to)]),
          "cudaEventElapsedTime");
    return ms * 1000.0;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

// Bytes per second of a 256 MiB copy from this GPU to the next rank's, every rank at once.
double peer_copy_bandwidth(Communicator& host, int device, int peer_device) {
  const size_t bytes = size_t{256} << 20;
  cuda::DeviceBuffer source;
  source.reserve(bytes);
  // Without peer access the copy would be staged through host memory.
  const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer_device, 0);
  if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
  } else {
    check(enabled, "cudaDeviceEnablePeerAccess");
  }
  void* target = nullptr;
  check(cudaSetDevice(peer_device), "cudaSetDevice");
  check(cudaMalloc(&target, bytes), "cudaMalloc (peer)");
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  Events events(2);
  std::vector<double> seconds;
  for (int i = 0; i < 6; ++i) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    host.barrier();
    events.mark(0, stream);
    check(cudaMemcpyPeerAsync(target, peer_device, source.data(), device, bytes, stream),
          "cudaMemcpyPeerAsync");
    events.mark(1, stream);
    if (i > 0) seconds.push_back(events.us(0, 1) * 1e-6);
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
  check(cudaSetDevice(peer_device), "cudaSetDevice");
  cudaFree(target);
  check(cudaSetDevice(device), "cudaSetDevice");
  return static_cast<double>(bytes) / slowest(host, median(seconds));
}

// Seconds of one NCCL all-to-all moving `bytes_per_peer` to every other rank.
double nccl_all_to_all_seconds(Communicator& host, Communicator& nccl, int64_t bytes_per_peer) {
  const int N = nccl.size();
  cuda::DeviceBuffer send, recv;
  send.reserve(static_cast<size_t>(std::max<int64_t>(bytes_per_peer * N, 1)));
  recv.reserve(static_cast<size_t>(std::max<int64_t>(bytes_per_peer * N, 1)));
  std::vector<int64_t> counts(static_cast<size_t>(N), bytes_per_peer), displs(counts.size());
  for (int p = 0; p < N; ++p) displs[static_cast<size_t>(p)] = p * bytes_per_peer;
  counts[static_cast<size_t>(nccl.rank())] = 0;  // as the layer: nothing to itself on the wire
  std::vector<double> seconds;
  for (int i = 0; i < 8; ++i) {
    host.barrier();
    const auto start = std::chrono::steady_clock::now();
    nccl.all_to_all_v(send.data(), {counts, displs}, recv.data(), {counts, displs});
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 1) seconds.push_back(s);
  }
  return slowest(host, median(seconds));
}

// Lines the ranks' streams up before a timed step: the host barrier, the hold while the host
// queues the step, then (where the GPUs reach each other through CUDA IPC) a barrier of the GPUs
// themselves. Without it a stage that waits for a peer also times the skew between the processes'
// host barrier exits, several microseconds and noisy: as much as a decode-size stage itself.
class StartLine {
 public:
  StartLine(Communicator& host, bool on_gpus) : host_(host) {
    if (on_gpus && cuda::ep::ipc_reachable(host)) gpus_.emplace(host, kStartTimeoutNs);
  }
  const char* name() const { return gpus_ ? "GPU barrier" : "host barrier"; }

  void before_step(cudaStream_t stream) {
    if (gpus_) gpus_->throw_if_timed_out();
    check(cudaStreamSynchronize(stream), "sync");
    host_.barrier();
    cuda::ep::hold_stream(kHoldUs, stream);
    if (gpus_) gpus_->arrive_and_wait(stream);
  }

 private:
  Communicator& host_;
  std::optional<cuda::ep::PeerBarrier> gpus_;
};

// Slowest rank's median of an empty kernel timed as the stages are (after the start line, between
// two events): the least any stage can read, the events' and the launch's own cost.
double empty_stage_us(Communicator& host, StartLine& start, int iterations) {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  Events events(2);
  std::vector<double> times;
  for (int i = 0; i < iterations + 3; ++i) {
    start.before_step(stream);
    events.mark(0, stream);
    cuda::ep::hold_stream(0, stream);
    events.mark(1, stream);
    if (i >= 3) times.push_back(events.us(0, 1));
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
  return slowest(host, median(times));
}

struct Case {
  std::string model;
  int64_t tokens;
  std::string path;  // ll, ht or nccl
};

// Slowest rank's median GPU time of `step` (queued after the stream hold), in microseconds.
template <typename Step>
double median_step_us(Communicator& host, StartLine& start, CudaEpLayer& layer, int iterations,
                      Step step) {
  auto stream = static_cast<cudaStream_t>(layer.stream());
  std::vector<double> times;
  for (int i = 0; i < iterations + 3; ++i) {
    start.before_step(stream);
    step();
    if (i >= 3) times.push_back(layer.last_stats().total_us);
  }
  return slowest(host, median(times));
}

void run_case(Communicator& host, Communicator& nccl, StartLine& start, const Case& c,
              int iterations, double peer_bandwidth, int free_sms) {
  const int me = host.rank(), N = host.size();
  MoeConfig config = preset_config(c.model);
  config.experts.shared_intermediate_size = 0;  // routed experts: what expert parallelism moves
  config.experts.shared_gate = false;
  const int64_t H = config.experts.hidden_size, E = config.routing.num_experts;
  const int64_t k = config.routing.top_k, M = c.tokens;
  CudaEpOptions options;
  options.dispatcher =
      c.path == "nccl" ? DispatcherKind::kHighThroughput : parse_dispatcher(c.path);
  options.high_throughput_over_nccl = c.path == "nccl";
  options.low_latency_capacity = M;  // a rank never sends one peer more rows than its tokens
  options.two_batch_overlap = true;
  options.overlap_free_multiprocessors = free_sms;
  CudaEpLayer layer =
      CudaEpLayer::synthetic(config, ExpertMap::contiguous(E, N), host, &nccl, options, 1);

  cuda::DeviceBuffer hidden, out, ids, weights;
  hidden.reserve(static_cast<size_t>(M * H) * 2);
  out.reserve(static_cast<size_t>(M * H) * 2);
  cuda::fill_normal_bf16(hidden.data(), M * H, 10 + static_cast<uint64_t>(me), 1.0f, nullptr);
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(me));
  std::vector<int32_t> host_ids(static_cast<size_t>(M * k));
  std::vector<int32_t> experts(static_cast<size_t>(E));
  for (int64_t t = 0; t < M; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    std::copy(experts.begin(), experts.begin() + k, host_ids.begin() + t * k);
  }
  const std::vector<float> host_weights(host_ids.size(), 1.0f / static_cast<float>(k));
  ids.reserve(host_ids.size() * sizeof(int32_t));
  weights.reserve(host_weights.size() * sizeof(float));
  check(cudaMemcpy(ids.data(), host_ids.data(), host_ids.size() * 4, cudaMemcpyHostToDevice),
        "cudaMemcpy");
  check(cudaMemcpy(weights.data(), host_weights.data(), host_weights.size() * 4,
                   cudaMemcpyHostToDevice),
        "cudaMemcpy");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const TensorView v_hidden(hidden.data(), DType::kBF16, {M, H}, Device::kCuda);
  const TensorView v_out(out.data(), DType::kBF16, {M, H}, Device::kCuda);
  const TensorView v_ids(ids.data(), DType::kI32, {M, k}, Device::kCuda);
  const TensorView v_weights(weights.data(), DType::kF32, {M, k}, Device::kCuda);

  auto stream = static_cast<cudaStream_t>(layer.stream());
  Events events(5);
  std::vector<double> dispatch, experts_us, combine, step, graph_step;
  CudaEpStats stats;
  for (int i = 0; i < iterations + 3; ++i) {  // three warm-up steps size every buffer
    start.before_step(stream);                // the stages below are queued before they start
    events.mark(0, layer.stream());
    layer.dispatch(v_hidden, v_ids, v_weights);
    events.mark(1, layer.stream());
    layer.experts();
    events.mark(2, layer.stream());
    // Combine starts once every rank's experts are done, so its time is the exchange's and not
    // the other rank's lag (ranks' experts differ by up to a few percent: at DeepSeek-V3's
    // milliseconds, more than the exchange itself).
    start.before_step(stream);
    events.mark(3, layer.stream());
    layer.combine(v_out);
    events.mark(4, layer.stream());
    layer.finish_step();
    stats = layer.last_stats();
    if (i < 3) continue;
    dispatch.push_back(events.us(0, 1));
    experts_us.push_back(events.us(1, 2));
    combine.push_back(events.us(3, 4));
  }
  for (int i = 0; i < iterations + 3; ++i) {
    start.before_step(stream);
    layer.forward(v_hidden, v_out);
    if (i >= 3) step.push_back(layer.last_stats().total_us);
  }
  // The low-latency step (dispatch, experts, combine) as one CUDA graph: no launch gaps.
  if (options.dispatcher == DispatcherKind::kLowLatency) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    layer.dispatch(v_hidden, v_ids, v_weights);
    layer.experts();
    layer.combine(v_out);
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int i = 0; i < iterations + 3; ++i) {
      start.before_step(stream);
      events.mark(0, stream);
      check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      events.mark(1, stream);
      layer.finish_step();
      if (i >= 3) graph_step.push_back(events.us(0, 1));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  int64_t dispatch_bytes = 0, combine_bytes = 0, max_peer_bytes = 0;
  for (int p = 0; p < N; ++p) {
    if (p == me) continue;
    const int64_t out_bytes = stats.rows_sent[static_cast<size_t>(p)] * (H * 2 + k * 8);
    dispatch_bytes += out_bytes;
    max_peer_bytes = std::max(max_peer_bytes, out_bytes);
    combine_bytes += stats.rows_received[static_cast<size_t>(p)] * H * 2;
  }
  const double d_us = slowest(host, median(dispatch)), c_us = slowest(host, median(combine));
  const double x_us = slowest(host, median(experts_us)), s_us = slowest(host, median(step));
  const double g_us = slowest(host, median(graph_step));
  const double nccl_s = nccl_all_to_all_seconds(host, nccl, max_peer_bytes);
  const double d_gbs = slowest(host, -dispatch_bytes / (d_us * 1e3)) * -1;  // the slowest GPU
  const double c_gbs = slowest(host, -combine_bytes / (c_us * 1e3)) * -1;
  const double nccl_gbs = slowest(host, -dispatch_bytes / (nccl_s * 1e9)) * -1;
  if (me == 0) {
    std::printf(
        "%-14s %6lld %-4s | %8.1f %7.1f | %8.1f %7.1f | %9.1f %9.1f %11s | %8.1f %7.1f | "
        "%5.0f%% %5.0f%% | %5.0f%%\n",
        c.model.c_str(), static_cast<long long>(M), c.path.c_str(), d_us, d_gbs, c_us, c_gbs, x_us,
        s_us, graph_step.empty() ? "-" : fmt::format("{:.1f}", g_us).c_str(), nccl_s * 1e6,
        nccl_gbs, 100 * d_gbs / (peer_bandwidth / 1e9), 100 * c_gbs / (peer_bandwidth / 1e9),
        100 * d_gbs / std::max(nccl_gbs, 1e-9));
  }

  const double one_us = median_step_us(host, start, layer, iterations, [&] {
    layer.forward_routed(v_hidden, v_ids, v_weights, v_out);
  });
  const double two_us = median_step_us(host, start, layer, iterations, [&] {
    layer.forward_routed_two_batch(v_hidden, v_ids, v_weights, v_out);
  });
  const CudaEpStats& two = layer.last_stats();
  if (me == 0) {
    int device = 0, sms = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
          "cudaDeviceGetAttribute");
    std::printf(
        "  two-batch: one batch %.1f us, two micro-batches %.1f us (experts on %d of %d SMs): "
        "gain %.1f%%; rank 0 sent %lld bytes to its host's GPUs, %lld to other hosts\n",
        one_us, two_us, std::max(1, sms - free_sms), sms, 100 * (one_us - two_us) / one_us,
        static_cast<long long>(two.sent.same_host), static_cast<long long>(two.sent.cross_host));
  }
}

int run(int argc, char** argv) {
  std::vector<int64_t> tokens = {128, 4096};
  std::vector<std::string> models = {"qwen3-30b-a3b", "deepseek-v3"};
  std::vector<std::string> paths = {"ll", "ht", "nccl"};
  int iterations = 20;
  int free_sms = 16;
  bool start_on_gpus = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--iterations") {
      iterations = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "--tokens") {
      tokens.clear();
      for (const std::string& t : split(value)) tokens.push_back(std::atoll(t.c_str()));
    } else if (flag == "--models") {
      models = split(value);
    } else if (flag == "--paths") {
      paths = split(value);
    } else if (flag == "--free-sms") {
      free_sms = std::max(0, std::atoi(value.c_str()));
    } else if (flag == "--start") {
      if (value != "gpu" && value != "host") {
        fail("moe_bench_cuda_ep: --start must be gpu or host, got '{}'", value);
      }
      start_on_gpus = value == "gpu";
    } else {
      fail(
          "moe_bench_cuda_ep: unknown flag '{}' (--tokens, --iterations, --paths, --models, "
          "--free-sms, --start)",
          flag);
    }
  }
  for (const std::string& p : paths) {
    if (p != "nccl") parse_dispatcher(p);  // throws on an unknown path before any case runs
  }
  std::unique_ptr<Communicator> host = make_mpi_communicator();
  host->set_timeout(std::chrono::seconds(120));
  const int me = host->rank(), N = host->size();
  int local_index = 0;
  for (int r = 0; r < me; ++r) local_index += host->same_host(r, me);
  const int devices = cuda_device_count();
  if (devices < 1) fail("moe_bench_cuda_ep: rank {} sees no CUDA device", me);
  const int device = local_index % devices;
  check(cudaSetDevice(device), "cudaSetDevice");
  std::unique_ptr<Communicator> nccl = make_nccl_communicator(*host, {.device = device});
  const int peer_device = (device + 1) % devices;
  const double peer =
      N > 1 && peer_device != device ? peer_copy_bandwidth(*host, device, peer_device) : 0.0;
  StartLine start(*host, start_on_gpus);
  const double empty_us = empty_stage_us(*host, start, iterations);
  if (me == 0) {
    std::printf(
        "%d ranks; peer copy (cudaMemcpyPeerAsync 256 MiB, all GPUs at once): %.1f GB/s; timed "
        "steps start at a %s; an empty kernel timed as a stage: %.1f us\n",
        N, peer / 1e9, start.name(), empty_us);
    std::printf(
        "model          tokens path | dispatch    GB/s |  combine    GB/s |   experts      step "
        "graph d+x+c | nccl a2a    GB/s | disp%% comb%% | disp\n"
        "                 /rank     |       us   /GPU  |       us   /GPU  |        us        us "
        "         us |       us   /GPU  | of peer copy | /a2a\n");
  }
  for (const std::string& model : models) {
    for (int64_t t : tokens) {
      for (const std::string& p : paths) {
        run_case(*host, *nccl, start, {model, t, p}, iterations, peer, free_sms);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  try {
    return moe::run(argc, argv);
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", session.world_rank(), e.what());
    session.abort(1);
  }
}
