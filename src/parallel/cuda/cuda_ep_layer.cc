// CudaEpLayer (moe/cuda_ep_layer.h): the layer's device weights and routing, the experts on the
// received rows, and one of the two data paths (data_path.h) around them, on one stream.
#include "moe/cuda_ep_layer.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <optional>
#include <string>

#include "kernels/cuda/align_block_size.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fill_random.h"
#include "kernels/cuda/fused_experts.h"
#include "kernels/cuda/routing.h"
#include "kernels/cuda/shared_experts.h"
#include "moe/error.h"
#include "ops/cuda_plan_choice.h"
#include "parallel/cuda/data_path.h"
#include "parallel/cuda/ipc_buffers.h"
#include "parallel/cuda/replica_choice.h"
#include "parallel/cuda/served_pairs.h"
#include "parallel/dispatch_plan.h"
#include "parallel/traffic.h"

namespace moe {

using cuda::check;

namespace {

void upload(cuda::DeviceBuffer& buffer, const Tensor& host) {
  buffer.reserve(std::max<size_t>(host.nbytes(), 1));
  check(cudaMemcpy(buffer.data(), host.data<void>(), host.nbytes(), cudaMemcpyHostToDevice),
        "cudaMemcpy (layer weights)");
}

void check_config(const MoeConfig& config, const ExpertMap& map, const Communicator& host,
                  const CudaEpOptions& options) {
  const RoutingConfig& r = config.routing;
  const ExpertsConfig& x = config.experts;
  if (r.num_experts > cuda::kMaxRoutedExperts || r.top_k > cuda::kMaxTopK ||
      r.num_groups > cuda::kMaxGroups) {
    fail("CudaEpLayer: routing supports up to {} experts, top-{} and {} groups; got {}, top-{}, {}",
         cuda::kMaxRoutedExperts, cuda::kMaxTopK, cuda::kMaxGroups, r.num_experts, r.top_k,
         r.num_groups);
  }
  if (x.activation != Activation::kSilu || x.has_bias || r.apply_weight_on_input) {
    fail(
        "CudaEpLayer: runs SiLU-gated experts without biases or the weight on the input so far; "
        "this config ({}) needs one of them",
        config.model_type);
  }
  if (x.hidden_size % 8 != 0) {
    fail("CudaEpLayer: H must be a multiple of 8 (rows move as 16-byte vectors); got {}",
         x.hidden_size);
  }
  if (map.num_experts() != r.num_experts || map.num_slots() > cuda::kMaxAlignExperts) {
    fail(
        "CudaEpLayer: the expert map must hold the config's {} experts in at most {} slots; got "
        "{} slots for {} experts",
        r.num_experts, cuda::kMaxAlignExperts, map.num_slots(), map.num_experts());
  }
  if (map.num_ranks() != host.size()) {
    fail("CudaEpLayer: the expert map is for {} ranks, the communicator has {}", map.num_ranks(),
         host.size());
  }
  if (host.device() != Device::kCpu) {
    fail("CudaEpLayer: `host` must be a host-memory communicator (MPI); got '{}'", host.name());
  }
  // Both paths go through the dispatch kernel, whose per-destination arrays hold kMaxRanks.
  if (host.size() > cuda::ep::kMaxRanks) {
    fail("CudaEpLayer: the GPU dispatch connects up to {} ranks; got {}", cuda::ep::kMaxRanks,
         host.size());
  }
  if (options.dispatcher == DispatcherKind::kLowLatency) {
    if (options.low_latency_capacity < 1) {
      fail("CudaEpLayer: low_latency_capacity must be >= 1; got {}", options.low_latency_capacity);
    }
  }
  if (options.timeout.count() <= 0) {
    fail("CudaEpLayer: timeout must be > 0 ms; got {}", options.timeout.count());
  }
}

void check_tokens(const TensorView& t, const char* name, DType dtype, int64_t rows, int64_t cols) {
  check_device(t, name, Device::kCuda);
  check_dtype(t, name, {dtype});
  if (t.dim() != 2 || t.size(0) != rows || t.size(1) != cols || !t.is_contiguous()) {
    fail("CudaEpLayer: {} must be a contiguous [{}, {}] tensor; got {}", name, rows, cols,
         shape_string(t.shape));
  }
}

// hidden [M, H] bf16 with its routing, ids [M, k] int32 and weights [M, k] f32, on the GPU; M.
int64_t check_routed_tokens(const MoeConfig& config, const TensorView& hidden,
                            const TensorView& topk_ids, const TensorView& topk_weights) {
  const int64_t M = hidden.dim() == 2 ? hidden.size(0) : -1;
  const int64_t H = config.experts.hidden_size, k = config.routing.top_k;
  check_tokens(hidden, "hidden", DType::kBF16, M, H);
  check_tokens(topk_ids, "topk_ids", DType::kI32, M, k);
  check_tokens(topk_weights, "topk_weights", DType::kF32, M, k);
  return M;
}

// A whole step's tensors, checked before any of it is queued: the routed tokens, out [M, H] bf16
// on the GPU, and (with shared experts, which read hidden after combine wrote out) hidden and out
// apart. Returns M.
int64_t check_step(const MoeConfig& config, const cuda::SharedExperts& shared,
                   const TensorView& hidden, const TensorView& topk_ids,
                   const TensorView& topk_weights, const TensorView& out) {
  const int64_t M = check_routed_tokens(config, hidden, topk_ids, topk_weights);
  check_tokens(out, "out", DType::kBF16, M, config.experts.hidden_size);
  if (shared.defined()) shared.check_args(hidden.data, M, out.data);
  return M;
}

// Makes `device` current without a call when it already is (cheap, and nothing but queries while
// a stream is being captured).
void use_device(int device) {
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check(cudaSetDevice(device), "cudaSetDevice");
}

// Elapsed microseconds between the events of one step: 0 before route, 1 before dispatch, 2
// before the experts, 3 before combine, 4 before the shared experts, 5 at the end.
class StepEvents {
 public:
  StepEvents() {
    for (auto& e : events_) check(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~StepEvents() {
    for (auto& e : events_) cudaEventDestroy(e);
  }
  void mark(int i, cudaStream_t stream) {
    check(cudaEventRecord(events_[i], stream), "cudaEventRecord");
  }
  double us(int from, int to) const {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events_[from], events_[to]), "cudaEventElapsedTime");
    return ms * 1000.0;
  }

 private:
  std::array<cudaEvent_t, 6> events_{};
};

// An event for ordering work across streams (no timing).
class StreamEvent {
 public:
  StreamEvent() {
    check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~StreamEvent() { cudaEventDestroy(event_); }
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(cudaStream_t stream) { check(cudaEventRecord(event_, stream), "cudaEventRecord"); }
  // `stream` waits for the work queued before the latest record().
  void wait_on(cudaStream_t stream) const {
    check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// Row `first` of a [M, row_bytes] batch (one micro-batch's part of it).
const void* rows_from(const void* data, int64_t first, int64_t row_bytes) {
  return static_cast<const char*>(data) + first * row_bytes;
}
void* rows_from(void* data, int64_t first, int64_t row_bytes) {
  return static_cast<char*>(data) + first * row_bytes;
}

}  // namespace

// One micro-batch's stream, data path (buffers, flags and step numbers of its own) and experts'
// workspace. A one-batch step runs on lane 0; two-batch steps on both.
struct Lane {
  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda::ep::DataPath> path;
  cuda::ExpertsRunner experts;
  cuda::DeviceBuffer slot_ids;   // replica choice: each pair's slot
  const void* hidden = nullptr;  // this lane's step's own token rows, for the shared experts
  int64_t num_tokens = 0;
  std::optional<cuda::SharedExpertsWorkspace> shared;  // with shared experts
  cuda::DeviceBuffer served_pairs;  // [local slots] int32: pairs counted in this lane's step
  bool counted = false;             // this lane's step queued the count
};

struct CudaEpLayer::State {
  ExpertMap map;
  Communicator& host;
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  int64_t num_local = 0;
  cuda::DeviceBuffer router, router_bias, correction_bias, w13, w2;
  cuda::SharedExperts shared;  // every rank's copy, run on its own tokens; undefined without
  cuda::DeviceBuffer kernel_map, rank_of_slot;  // [S] each
  // Replica choice (replica_choice.h): the candidates' table, and each pair's slot. Skipped when
  // slot s holds expert s for every s (the ids are the slots).
  bool choose_slots = false;
  int32_t max_candidates = 1;
  cuda::DeviceBuffer candidate_offsets, candidates;
  cuda::DeviceBuffer logits, ids, weights;
  std::string device_name;
  int multiprocessors = 0;
  std::array<Lane, 2> lanes;  // lanes[1] only with two_batch_overlap
  int lanes_in_step = 1;      // what finish_step reports
  bool count_pairs = false;   // count_served_pairs
  CudaEpStats stats;
  int64_t num_tokens = 0;
  StepEvents events;
  // Two-batch steps: lane 0 dispatched / its experts done / combined; lane 1 dispatched / done.
  StreamEvent dispatched0, experts0, combined0, dispatched1, done1;

  State(ExpertMap m, Communicator& h) : map(std::move(m)), host(h) {}
  // Everything but the expert weights and the router: stream, maps, the data path.
  void connect(const MoeConfig& config, const CudaEpOptions& options, Communicator* device_comm);
  // The stages of one micro-batch on its lane's stream; experts also counts the served pairs
  // when count_pairs is on.
  void dispatch(Lane& lane, const MoeConfig& config, const void* hidden, const int32_t* ids,
                const float* weights, int64_t num_tokens);
  void experts(Lane& lane, const MoeConfig& config, const CudaEpOptions& options,
               int max_multiprocessors);
  // After the lane's combine: out [lane's tokens, H] += the shared experts of its own rows.
  void add_shared(Lane& lane, void* out);
  ~State() {
    for (Lane& lane : lanes) {
      lane.path.reset();    // a collective: before the stream goes
      lane.shared.reset();  // its cuBLAS handle is bound to the stream
      if (lane.stream != nullptr) cudaStreamDestroy(lane.stream);
    }
    if (cublas != nullptr) cublasDestroy(cublas);
  }
};

CudaEpLayer::CudaEpLayer(MoeConfig config, CudaEpOptions options, std::unique_ptr<State> state)
    : config_(std::move(config)), options_(options), state_(std::move(state)) {}

CudaEpLayer::CudaEpLayer(MoeConfig config, const LayerWeights& w, ExpertMap map, Communicator& host,
                         Communicator* device, CudaEpOptions options)
    : config_(std::move(config)), options_(options) {
  check_config(config_, map, host, options_);
  const int64_t E = config_.routing.num_experts, H = config_.experts.hidden_size;
  const int64_t I = config_.experts.intermediate_size;
  const int64_t L = static_cast<int64_t>(map.local_slots(host.rank()).size());
  if (w.router.dtype() != DType::kBF16 || w.w13.dtype() != DType::kBF16 ||
      w.w2.dtype() != DType::kBF16) {
    fail("CudaEpLayer: expected bf16 router, w13 and w2; got {}, {}, {}",
         dtype_name(w.router.dtype()), dtype_name(w.w13.dtype()), dtype_name(w.w2.dtype()));
  }
  if (w.router.shape() != Shape{E, H} || w.w13.shape() != Shape{L, 2 * I, H} ||
      w.w2.shape() != Shape{L, H, I}) {
    fail(
        "CudaEpLayer: rank {} holds {} slots: expected router [{}, {}], w13 [{}, {}, {}], w2 "
        "[{}, {}, {}]; got {}, {}, {}",
        host.rank(), L, E, H, L, 2 * I, H, L, H, I, shape_string(w.router.shape()),
        shape_string(w.w13.shape()), shape_string(w.w2.shape()));
  }
  const int64_t Is = config_.experts.shared_intermediate_size;
  if (Is > 0 && (w.shared_w13.shape() != Shape{2 * Is, H} || w.shared_w2.shape() != Shape{H, Is} ||
                 w.shared_gate.defined() != config_.experts.shared_gate)) {
    fail(
        "CudaEpLayer: the config's shared experts need shared_w13 [{}, {}], shared_w2 [{}, {}] "
        "and {}; got {}, {} and {}",
        2 * Is, H, H, Is, config_.experts.shared_gate ? "a shared_gate [1, H]" : "no shared_gate",
        shape_string(w.shared_w13.shape()), shape_string(w.shared_w2.shape()),
        w.shared_gate.defined() ? "a shared_gate" : "no shared_gate");
  }
  state_ = std::make_unique<State>(std::move(map), host);
  if (Is > 0) state_->shared = cuda::SharedExperts(w.shared_w13, w.shared_w2, w.shared_gate);
  upload(state_->router, w.router);
  upload(state_->w13, w.w13);
  upload(state_->w2, w.w2);
  if (w.router_bias.defined()) upload(state_->router_bias, w.router_bias);
  if (w.correction_bias.defined()) upload(state_->correction_bias, w.correction_bias);
  state_->connect(config_, options_, device);
}

CudaEpLayer CudaEpLayer::synthetic(MoeConfig config, ExpertMap map, Communicator& host,
                                   Communicator* device, CudaEpOptions options, uint64_t seed) {
  check_config(config, map, host, options);
  const int64_t E = config.routing.num_experts, H = config.experts.hidden_size;
  const int64_t I = config.experts.intermediate_size;
  const int64_t L = static_cast<int64_t>(map.local_slots(host.rank()).size());
  auto state = std::make_unique<State>(std::move(map), host);
  const auto fill = [&](cuda::DeviceBuffer& buffer, int64_t count, uint64_t id, int64_t fan_in) {
    buffer.reserve(static_cast<size_t>(count) * 2);
    cuda::fill_normal_bf16(buffer.data(), count, seed * 16 + id,
                           1.0f / std::sqrt(static_cast<float>(fan_in)), nullptr);
  };
  fill(state->router, E * H, 0, H);
  fill(state->w13, L * 2 * I * H, 1 + static_cast<uint64_t>(host.rank()) * 2, H);
  fill(state->w2, L * H * I, 2 + static_cast<uint64_t>(host.rank()) * 2, I);
  if (config.routing.has_router_bias) {
    state->router_bias.reserve(static_cast<size_t>(E) * sizeof(float));
    check(cudaMemset(state->router_bias.data(), 0, E * sizeof(float)), "cudaMemset");
  }
  if (config.routing.has_correction_bias) {
    state->correction_bias.reserve(static_cast<size_t>(E) * sizeof(float));
    check(cudaMemset(state->correction_bias.data(), 0, E * sizeof(float)), "cudaMemset");
  }
  if (config.experts.shared_intermediate_size > 0) {
    // The same on every rank, as a real layer's shared experts are.
    state->shared = cuda::SharedExperts::random(H, config.experts.shared_intermediate_size,
                                                config.experts.shared_gate, seed);
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (synthetic weights)");
  state->connect(config, options, device);
  return CudaEpLayer(std::move(config), options, std::move(state));
}

void CudaEpLayer::State::connect(const MoeConfig& config, const CudaEpOptions& options,
                                 Communicator* device_comm) {
  State& s = *this;
  const int me = s.host.rank(), N = s.host.size();
  const int64_t E = config.routing.num_experts, S = s.map.num_slots();
  check(cudaGetDevice(&s.device), "cudaGetDevice");
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, s.device), "cudaGetDeviceProperties");
  s.device_name = properties.name;
  s.multiprocessors = properties.multiProcessorCount;
  check(cublasCreate(&s.cublas), "cublasCreate");
  s.num_local = static_cast<int64_t>(s.map.local_slots(me).size());

  // Pairs travel and are served under their slot ids: the kernels' maps are over slots.
  const std::vector<int32_t> kernel_map = s.map.kernel_expert_map(me);
  std::vector<int32_t> rank_of(static_cast<size_t>(S));
  for (int64_t slot = 0; slot < S; ++slot) {
    rank_of[static_cast<size_t>(slot)] = s.map.rank_of_slot(slot);
    s.choose_slots |= s.map.expert_of_slot(slot) != slot;
  }
  s.choose_slots |= S != E;
  const auto to_device = [](cuda::DeviceBuffer& buffer, const std::vector<int32_t>& values,
                            const char* what) {
    buffer.reserve(std::max<size_t>(values.size(), 1) * sizeof(int32_t));
    check(cudaMemcpy(buffer.data(), values.data(), values.size() * sizeof(int32_t),
                     cudaMemcpyHostToDevice),
          what);
  };
  to_device(s.kernel_map, kernel_map, "cudaMemcpy (expert map)");
  to_device(s.rank_of_slot, rank_of, "cudaMemcpy (slot ranks)");
  if (s.choose_slots) {
    std::vector<int> host_of_rank(static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) host_of_rank[static_cast<size_t>(r)] = s.host.host_of(r);
    const parallel::ReplicaCandidates table = parallel::replica_candidates(s.map, me, host_of_rank);
    s.max_candidates = table.max_count();
    to_device(s.candidate_offsets, table.offsets, "cudaMemcpy (replica candidates)");
    to_device(s.candidates, table.slots, "cudaMemcpy (replica candidates)");
  }

  cuda::ep::PathShape shape;
  shape.num_ranks = N;
  shape.rank = me;
  shape.hidden_size = config.experts.hidden_size;
  shape.top_k = config.routing.top_k;
  shape.num_experts = S;
  shape.rank_of_expert = static_cast<const int32_t*>(s.rank_of_slot.data());
  const auto timeout_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(options.timeout).count());
  const bool peer_high_throughput = options.dispatcher == DispatcherKind::kHighThroughput &&
                                    !options.high_throughput_over_nccl &&
                                    cuda::ep::ipc_reachable(s.host);
  if (options.dispatcher == DispatcherKind::kHighThroughput && !peer_high_throughput &&
      device_comm == nullptr) {
    fail(
        "CudaEpLayer: the high-throughput path needs a device communicator (NCCL) where the "
        "GPUs cannot reach each other peer to peer (or with high_throughput_over_nccl); got none");
  }
  // Each lane's path is a collective, built in lane order on every rank. Over NCCL both lanes
  // share the device communicator, whose calls the path waits for on the host: they run in the
  // host's order, the same on every rank.
  for (int l = 0; l < (options.two_batch_overlap ? 2 : 1); ++l) {
    Lane& lane = s.lanes[static_cast<size_t>(l)];
    check(cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (s.shared.defined()) lane.shared.emplace();
    if (options.dispatcher == DispatcherKind::kLowLatency) {
      lane.path =
          cuda::ep::make_low_latency_path(s.host, shape, options.low_latency_capacity, timeout_ns);
    } else if (peer_high_throughput) {
      lane.path = cuda::ep::make_peer_high_throughput_path(s.host, shape, timeout_ns);
    } else {
      lane.path = cuda::ep::make_high_throughput_path(s.host, *device_comm, shape);
    }
  }
}

CudaEpLayer::~CudaEpLayer() = default;
CudaEpLayer::CudaEpLayer(CudaEpLayer&&) noexcept = default;
CudaEpLayer& CudaEpLayer::operator=(CudaEpLayer&&) noexcept = default;

void* CudaEpLayer::stream() const { return state_->lanes[0].stream; }
void CudaEpLayer::count_served_pairs(bool on) { state_->count_pairs = on; }
const ExpertMap& CudaEpLayer::expert_map() const { return state_->map; }
const CudaEpStats& CudaEpLayer::last_stats() const { return state_->stats; }

void CudaEpLayer::State::dispatch(Lane& lane, const MoeConfig& config, const void* hidden,
                                  const int32_t* ids, const float* weights, int64_t num_tokens) {
  const int64_t k = config.routing.top_k;
  lane.hidden = hidden;
  lane.num_tokens = num_tokens;
  lane.counted = false;
  if (choose_slots) {
    // Grows only with M: a step replayed in a graph finds the buffer in place.
    lane.slot_ids.reserve(static_cast<size_t>(std::max<int64_t>(num_tokens * k, 1)) *
                          sizeof(int32_t));
    cuda::ep::ReplicaChoiceArgs choice;
    choice.topk_ids = ids;
    choice.num_pairs = num_tokens * k;
    choice.num_experts = config.routing.num_experts;
    choice.candidate_offsets = static_cast<const int32_t*>(candidate_offsets.data());
    choice.candidates = static_cast<const int32_t*>(candidates.data());
    choice.max_candidates = max_candidates;
    choice.rank = host.rank();
    choice.slot_ids = static_cast<int32_t*>(lane.slot_ids.data());
    cuda::ep::choose_replicas(choice, lane.stream);
    ids = choice.slot_ids;
  }
  lane.path->dispatch({hidden, ids, weights, num_tokens}, lane.stream);
}

void CudaEpLayer::State::experts(Lane& lane, const MoeConfig& config, const CudaEpOptions& options,
                                 int max_multiprocessors) {
  const cuda::ep::ReceivedRows in = lane.path->received();
  ExpertsProblem problem;
  problem.num_tokens = in.num_rows;
  problem.hidden_size = config.experts.hidden_size;
  problem.intermediate_size = config.experts.intermediate_size;
  problem.top_k = config.routing.top_k;
  problem.num_experts = map.num_slots();  // the received ids are slots
  problem.num_local_experts = num_local;
  problem.hidden = in.rows;
  problem.hidden_dtype = DType::kBF16;
  problem.w13 = w13.data();
  problem.w2 = w2.data();
  problem.weight_dtype = DType::kBF16;
  problem.topk_ids = in.ids;
  problem.topk_weights = in.weights;
  problem.expert_map = static_cast<const int32_t*>(kernel_map.data());
  problem.out = in.partial;
  cuda::ExpertsPlan plan = cuda_plans::choose_plan(problem, device_name);
  if (options.block_m > 0) {
    plan.block_m = options.block_m;
    plan.tiny_batch = false;
    plan.kernel = options.block_m <= cuda::kMaxStreamRows ? cuda::GemmKernel::kStream
                  : cuda::wgmma_available() && cuda::wgmma_supports_block_m(options.block_m)
                      ? cuda::GemmKernel::kWgmma
                      : cuda::GemmKernel::kMma;
  }
  plan.max_multiprocessors = max_multiprocessors;
  lane.experts.run(problem, plan, lane.stream);
  if (!count_pairs) return;
  // The experts read in.ids in place; a peer may overwrite them only after this rank's combine.
  lane.served_pairs.reserve(static_cast<size_t>(std::max<int64_t>(num_local, 1)) * sizeof(int32_t));
  check(cudaMemsetAsync(lane.served_pairs.data(), 0,
                        static_cast<size_t>(num_local) * sizeof(int32_t), lane.stream),
        "cudaMemsetAsync (served pairs)");
  cuda::ep::ServedPairsArgs count;
  count.ids = in.ids;
  count.num_ids = in.num_rows * problem.top_k;
  count.local_of_slot = static_cast<const int32_t*>(kernel_map.data());
  count.num_slots = map.num_slots();
  count.counts = static_cast<int32_t*>(lane.served_pairs.data());
  cuda::ep::count_served_pairs(count, lane.stream);
  lane.counted = true;
}

void CudaEpLayer::State::add_shared(Lane& lane, void* out) {
  if (shared.defined()) shared.run(lane.hidden, lane.num_tokens, out, *lane.shared, lane.stream);
}

void CudaEpLayer::dispatch(const TensorView& hidden, const TensorView& topk_ids,
                           const TensorView& topk_weights) {
  const int64_t M = check_routed_tokens(config_, hidden, topk_ids, topk_weights);
  State& s = *state_;
  use_device(s.device);
  s.num_tokens = M;
  s.lanes_in_step = 1;
  s.dispatch(s.lanes[0], config_, hidden.data, static_cast<const int32_t*>(topk_ids.data),
             static_cast<const float*>(topk_weights.data), M);
}

void CudaEpLayer::experts() { state_->experts(state_->lanes[0], config_, options_, 0); }

void CudaEpLayer::combine(const TensorView& out) {
  State& s = *state_;
  Lane& lane = s.lanes[0];
  check_tokens(out, "out", DType::kBF16, s.num_tokens, config_.experts.hidden_size);
  if (s.shared.defined()) s.shared.check_args(lane.hidden, s.num_tokens, out.data);
  lane.path->combine(out.data, lane.stream);
  s.add_shared(lane, out.data);
}

void CudaEpLayer::two_batch_step(const TensorView& hidden, const TensorView& topk_ids,
                                 const TensorView& topk_weights, const TensorView& out) {
  if (!options_.two_batch_overlap) {
    fail("CudaEpLayer: a two-batch step needs CudaEpOptions::two_batch_overlap at construction");
  }
  const int64_t M = check_step(config_, state_->shared, hidden, topk_ids, topk_weights, out);
  const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
  State& s = *state_;
  use_device(s.device);
  s.num_tokens = M;
  s.lanes_in_step = 2;
  Lane &first = s.lanes[0], &second = s.lanes[1];
  const int64_t split = (M + 1) / 2;  // micro-batch 1 may be empty: it still runs its step
  const int cap = options_.overlap_free_multiprocessors > 0
                      ? std::max(1, s.multiprocessors - options_.overlap_free_multiprocessors)
                      : 0;
  const auto ids = static_cast<const int32_t*>(topk_ids.data);
  const auto weights = static_cast<const float*>(topk_weights.data);
  // Host order and event edges are the same on every rank, so each lane's data path sees its
  // steps in one order everywhere; transfers run dispatch 0, dispatch 1, combine 0, combine 1,
  // each after the one before (over NCCL, whose calls the path waits for on the host, in host
  // order on the shared communicator), and the experts one lane after the other.
  s.dispatch(first, config_, hidden.data, ids, weights, split);
  s.dispatched0.record(first.stream);
  s.experts(first, config_, options_, cap);
  s.experts0.record(first.stream);

  s.dispatched0.wait_on(second.stream);  // also after everything queued before this step
  s.dispatch(second, config_, rows_from(hidden.data, split, H * 2), ids + split * k,
             weights + split * k, M - split);
  s.dispatched1.record(second.stream);
  s.experts0.wait_on(second.stream);
  s.experts(second, config_, options_, cap);

  s.dispatched1.wait_on(first.stream);
  first.path->combine(out.data, first.stream);
  s.combined0.record(first.stream);
  s.add_shared(first, out.data);  // beside combine 1: other rows, its own workspace
  s.combined0.wait_on(second.stream);
  void* second_out = rows_from(out.data, split, H * 2);
  second.path->combine(second_out, second.stream);
  s.add_shared(second, second_out);
  s.done1.record(second.stream);
  s.done1.wait_on(first.stream);  // the step ends on stream()
}

void CudaEpLayer::finish_step() {
  State& s = *state_;
  const int N = s.host.size(), me = s.host.rank();
  for (int l = 0; l < s.lanes_in_step; ++l) {
    const Lane& lane = s.lanes[static_cast<size_t>(l)];
    const cuda::ep::Status status = lane.path->read_status(lane.stream);
    if (status.bits != 0) {
      const std::string message =
          cuda::ep::format_status(status, me, N, options_.low_latency_capacity);
      // Overflow fails this step on every rank alike and leaves the buffers consistent: the next
      // step may run. A timeout leaves a peer in an unknown step: nothing after it is valid.
      const bool timed_out =
          (status.bits & (cuda::ep::kStatusDispatchTimeout | cuda::ep::kStatusCombineTimeout)) != 0;
      if (!timed_out) {
        // The other micro-batch's overflow (if any) is cleared too: the step failed as a whole.
        for (int o = 0; o < s.lanes_in_step; ++o) {
          const Lane& other = s.lanes[static_cast<size_t>(o)];
          const cuda::ep::Status other_status = other.path->read_status(other.stream);
          if ((other_status.bits &
               (cuda::ep::kStatusDispatchTimeout | cuda::ep::kStatusCombineTimeout)) == 0) {
            other.path->clear_status(other.stream);
          }
        }
      }
      fail("{}{}", s.lanes_in_step == 2 ? fmt::format("micro-batch {}: ", l) : std::string(),
           message);
    }
  }
  s.stats = CudaEpStats{};
  s.stats.num_tokens = s.num_tokens;
  s.stats.rows_sent.assign(static_cast<size_t>(N), 0);
  s.stats.rows_received.assign(static_cast<size_t>(N), 0);
  for (int l = 0; l < s.lanes_in_step; ++l) {
    const Lane& lane = s.lanes[static_cast<size_t>(l)];
    const std::vector<int64_t> sent = lane.path->rows_sent(lane.stream);
    const std::vector<int64_t> received = lane.path->rows_received(lane.stream);
    for (size_t p = 0; p < static_cast<size_t>(N); ++p) {
      s.stats.rows_sent[p] += sent[p];
      s.stats.rows_received[p] += received[p];
    }
  }
  const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
  const parallel::RowBytes row_bytes{H * 2 + k * 8, H * 2};  // out: row, ids, weights; back: row
  s.stats.bytes_sent = parallel::bytes_to_each(s.stats.rows_sent, s.stats.rows_received, row_bytes);
  s.stats.bytes_received =
      parallel::bytes_to_each(s.stats.rows_received, s.stats.rows_sent, row_bytes);
  s.stats.sent = parallel::split_by_domain(s.stats.bytes_sent, s.host);
  s.stats.received = parallel::split_by_domain(s.stats.bytes_received, s.host);
  s.stats.bytes_to_peers = s.stats.sent.same_host + s.stats.sent.cross_host;
  bool counted = true;
  for (int l = 0; l < s.lanes_in_step; ++l)
    counted = counted && s.lanes[static_cast<size_t>(l)].counted;
  if (!counted) return;
  s.stats.pairs_per_local_slot.assign(static_cast<size_t>(s.num_local), 0);
  std::vector<int32_t> lane_pairs(static_cast<size_t>(s.num_local));
  for (int l = 0; l < s.lanes_in_step; ++l) {
    const Lane& lane = s.lanes[static_cast<size_t>(l)];
    check(cudaMemcpyAsync(lane_pairs.data(), lane.served_pairs.data(),
                          lane_pairs.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, lane.stream),
          "cudaMemcpyAsync (served pairs)");
    check(cudaStreamSynchronize(lane.stream), "cudaStreamSynchronize (served pairs)");
    for (size_t i = 0; i < lane_pairs.size(); ++i) s.stats.pairs_per_local_slot[i] += lane_pairs[i];
  }
}

void CudaEpLayer::forward_routed(const TensorView& hidden, const TensorView& topk_ids,
                                 const TensorView& topk_weights, const TensorView& out) {
  check_step(config_, state_->shared, hidden, topk_ids, topk_weights, out);
  State& s = *state_;
  use_device(s.device);
  Lane& lane = s.lanes[0];
  s.events.mark(1, lane.stream);
  dispatch(hidden, topk_ids, topk_weights);
  s.events.mark(2, lane.stream);
  experts();
  s.events.mark(3, lane.stream);
  lane.path->combine(out.data, lane.stream);
  s.events.mark(4, lane.stream);
  s.add_shared(lane, out.data);
  s.events.mark(5, lane.stream);
  finish_step();
  s.stats.dispatch_us = s.events.us(1, 2);
  s.stats.experts_us = s.events.us(2, 3);
  s.stats.combine_us = s.events.us(3, 4);
  s.stats.shared_us = s.events.us(4, 5);
  s.stats.total_us = s.events.us(1, 5);
}

void CudaEpLayer::forward_routed_two_batch(const TensorView& hidden, const TensorView& topk_ids,
                                           const TensorView& topk_weights, const TensorView& out) {
  State& s = *state_;
  use_device(s.device);
  s.events.mark(1, s.lanes[0].stream);
  two_batch_step(hidden, topk_ids, topk_weights, out);
  s.events.mark(5, s.lanes[0].stream);
  finish_step();
  s.stats.total_us = s.events.us(1, 5);
}

// The router and top-k of `hidden` on stream(), into the layer's ids and weights.
std::pair<TensorView, TensorView> CudaEpLayer::route(const TensorView& hidden) {
  State& s = *state_;
  const RoutingConfig& r = config_.routing;
  const int64_t M = hidden.dim() == 2 ? hidden.size(0) : -1;
  const int64_t H = config_.experts.hidden_size, E = r.num_experts, k = r.top_k;
  check_tokens(hidden, "hidden", DType::kBF16, M, H);
  use_device(s.device);
  const cudaStream_t stream = s.lanes[0].stream;
  s.logits.reserve(static_cast<size_t>(std::max<int64_t>(M * E, 1)) * sizeof(float));
  s.ids.reserve(static_cast<size_t>(std::max<int64_t>(M * k, 1)) * sizeof(int32_t));
  s.weights.reserve(static_cast<size_t>(std::max<int64_t>(M * k, 1)) * sizeof(float));
  s.events.mark(0, stream);
  cuda::router_gemm(s.cublas, hidden.data, s.router.data(), DType::kBF16, M, H, E,
                    static_cast<float*>(s.logits.data()), stream);
  cuda::SelectArgs select;
  select.logits = static_cast<const float*>(s.logits.data());
  select.router_bias =
      r.has_router_bias ? static_cast<const float*>(s.router_bias.data()) : nullptr;
  select.correction_bias =
      r.has_correction_bias ? static_cast<const float*>(s.correction_bias.data()) : nullptr;
  select.num_tokens = M;
  select.topk_ids = static_cast<int32_t*>(s.ids.data());
  select.topk_weights = static_cast<float*>(s.weights.data());
  cuda::select_experts(r, select, stream);
  return {TensorView(s.ids.data(), DType::kI32, {M, k}, Device::kCuda),
          TensorView(s.weights.data(), DType::kF32, {M, k}, Device::kCuda)};
}

void CudaEpLayer::forward(const TensorView& hidden, const TensorView& out) {
  const auto [ids, weights] = route(hidden);
  forward_routed(hidden, ids, weights, out);
  State& s = *state_;
  s.stats.route_us = s.events.us(0, 1);
  s.stats.total_us = s.events.us(0, 5);
}

void CudaEpLayer::forward_two_batch(const TensorView& hidden, const TensorView& out) {
  const auto [ids, weights] = route(hidden);
  forward_routed_two_batch(hidden, ids, weights, out);
  State& s = *state_;
  s.stats.route_us = s.events.us(0, 1);
  s.stats.total_us = s.events.us(0, 5);
}

}  // namespace moe
