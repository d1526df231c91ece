// EpMoeLayer: route, dispatch, experts, combine and sum, per micro-batch, on this rank.
//
// NOTE: bitwise equality with MoeLayer rests on three facts of the cpu kernels. Routing computes
// each token's row alone. Each pair's gemm1/act/gemm2 result depends only on its input row, its
// expert and its router weight (not on the block it shares, the thread or the row's position).
// And moe_sum adds a token's k rows in ascending j and then the shared row, whichever buffer the
// rows sit in. The experts here run the same routed_pair_outputs and shared_expert_outputs on
// the same packed weights and instruction set, and the same moe_sum through the combine index.
#include "moe/ep_layer.h"

#include <chrono>
#include <cstring>

#include "kernels/cpu/fused_experts.h"
#include "kernels/cpu/layer_router.h"
#include "kernels/cpu/moe_sum.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/threads.h"
#include "layer/layer_checks.h"
#include "moe/error.h"
#include "moe/routing.h"
#include "parallel/dispatcher.h"
#include "parallel/traffic.h"

namespace moe {

namespace {

using Clock = std::chrono::steady_clock;

double microseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// Adds the time from construction to destruction to one stage counter.
class StageTimer {
 public:
  explicit StageTimer(double& counter) : counter_(counter), start_(Clock::now()) {}
  ~StageTimer() { counter_ += microseconds_since(start_); }

 private:
  double& counter_;
  Clock::time_point start_;
};

}  // namespace

const char* dispatcher_name(DispatcherKind kind) {
  switch (kind) {
    case DispatcherKind::kHighThroughput:
      return "ht";
    case DispatcherKind::kLowLatency:
      return "ll";
  }
  return "unknown";
}

DispatcherKind parse_dispatcher(const std::string& name) {
  if (name == "ht") return DispatcherKind::kHighThroughput;
  if (name == "ll") return DispatcherKind::kLowLatency;
  fail("dispatcher: expected ht (high-throughput) or ll (low-latency); got '{}'", name);
}

struct EpMoeLayer::State {
  State(Communicator& comm, ExpertMap map) : comm(comm), map(std::move(map)) {}

  Communicator& comm;
  ExpertMap map;
  LayerWeights weights;
  std::vector<int32_t> kernel_map;  // [num_slots]: local index or -1
  ValidatedExperts experts;         // the problem template, weights checked once
  cpu::PackedExperts packed;        // the local and shared experts, as MoeLayer packs them
  cpu::ExpertKernels kernels;       // of the chosen instruction set
  cpu::LayerRouter router;          // the router packed once, as MoeLayer packs it
  int num_threads = 1;
  int64_t block_m = cpu::kDefaultBlockM;

  std::vector<float> logits;        // [M, E]
  std::vector<int32_t> topk_ids;    // [M, k]
  std::vector<float> topk_weights;  // [M, k]
  int64_t num_tokens = 0;

  // One dispatcher and experts workspace per micro-batch, so that one's combine can read its
  // results while the other's experts write theirs; the shared experts have their own.
  std::unique_ptr<parallel::Dispatcher> dispatchers[2];
  cpu::ExpertsWorkspace workspaces[2];
  cpu::ExpertsWorkspace shared_workspace;
  EpStepStats stats;
};

EpMoeLayer::EpMoeLayer(MoeConfig config, LayerWeights local_weights, ExpertMap map,
                       Communicator& comm, EpOptions options)
    : config_(std::move(config)), options_(options) {
  validate(config_);
  const RoutingConfig& r = config_.routing;
  if (map.num_experts() != r.num_experts) {
    fail("EpMoeLayer: expected an expert map over the config's {} experts; got {}", r.num_experts,
         map.num_experts());
  }
  if (map.num_ranks() != comm.size()) {
    fail("EpMoeLayer: expected an expert map over the communicator's {} ranks; got {}", comm.size(),
         map.num_ranks());
  }
  if (comm.device() != Device::kCpu) {
    fail(
        "EpMoeLayer: expected a communicator over host memory; the {} communicator works on "
        "device buffers",
        comm.name());
  }
  if (options_.num_threads < 0)
    fail("EpOptions: num_threads: expected >= 0; got {}", options_.num_threads);
  state_ = std::make_unique<State>(comm, std::move(map));
  State& s = *state_;
  s.weights = std::move(local_weights);
  s.kernel_map = s.map.kernel_expert_map(comm.rank());
  const int64_t num_local = static_cast<int64_t>(s.map.local_slots(comm.rank()).size());
  LayerOptions layer_options{Backend::kCpu, options_.num_threads, options_.block_m};
  s.experts =
      validate_layer_weights(config_, s.weights, layer_options, num_local,
                             TensorView(s.kernel_map.data(), DType::kI32, {s.map.num_slots()}));
  s.num_threads = cpu::resolve_num_threads(options_.num_threads);
  if (options_.block_m > 0) s.block_m = options_.block_m;
  const CpuIsa isa = resolve_cpu_isa(options_.cpu_isa);
  s.kernels = cpu::expert_kernels(isa, s.weights.w13.dtype());
  s.packed = cpu::PackedExperts::pack(s.experts.problem, s.num_threads);
  // Only the packed copy stays with the layer.
  for (Tensor* plain :
       {&s.weights.w13, &s.weights.w2, &s.weights.shared_w13, &s.weights.shared_w2}) {
    *plain = Tensor();
  }
  ExpertsProblem& pb = s.experts.problem;
  pb.w13 = pb.w2 = pb.shared_w13 = pb.shared_w2 = nullptr;
  // The router through route()'s own checks once, on an empty batch.
  RoutingInputs inputs;
  if (s.weights.correction_bias.defined()) inputs.correction_bias = s.weights.correction_bias;
  if (s.weights.router_bias.defined()) inputs.router_bias = s.weights.router_bias;
  const TensorView no_hidden(nullptr, s.weights.router.dtype(), {0, config_.experts.hidden_size});
  route(r, no_hidden, s.weights.router, inputs, TensorView(nullptr, DType::kI32, {0, r.top_k}),
        TensorView(nullptr, DType::kF32, {0, r.top_k}), {}, Backend::kCpu, s.num_threads);
  s.router = cpu::LayerRouter(isa, s.weights.router.data<void>(), s.weights.router.dtype(),
                              r.num_experts, config_.experts.hidden_size, s.num_threads);

  const int num_dispatchers = options_.two_batch_overlap ? 2 : 1;
  for (int i = 0; i < num_dispatchers; ++i) {
    s.dispatchers[i] =
        parallel::make_dispatcher(options_.dispatcher, comm, s.map, config_.experts.hidden_size,
                                  r.top_k, options_.low_latency_capacity, s.num_threads);
  }
}

EpMoeLayer::~EpMoeLayer() = default;
EpMoeLayer::EpMoeLayer(EpMoeLayer&&) noexcept = default;
EpMoeLayer& EpMoeLayer::operator=(EpMoeLayer&&) noexcept = default;

const ExpertMap& EpMoeLayer::expert_map() const { return state_->map; }
Communicator& EpMoeLayer::communicator() const { return state_->comm; }
const EpStepStats& EpMoeLayer::last_stats() const { return state_->stats; }

TensorView EpMoeLayer::last_topk_ids() const {
  return TensorView(state_->topk_ids.data(), DType::kI32,
                    {state_->num_tokens, config_.routing.top_k});
}

TensorView EpMoeLayer::last_topk_weights() const {
  return TensorView(state_->topk_weights.data(), DType::kF32,
                    {state_->num_tokens, config_.routing.top_k});
}

void EpMoeLayer::reset_stats(int64_t num_tokens, DType dtype) {
  State& s = *state_;
  const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
  const size_t N = static_cast<size_t>(s.comm.size());
  EpStepStats& st = s.stats;
  st = EpStepStats{};
  st.num_tokens = num_tokens;
  st.num_pairs = num_tokens * k;
  st.upper_bound_bytes = num_tokens * k * H * static_cast<int64_t>(dtype_size(dtype));
  for (std::vector<int64_t>* v : {&st.dispatch_bytes_sent, &st.dispatch_bytes_received,
                                  &st.combine_bytes_sent, &st.combine_bytes_received}) {
    v->assign(N, 0);
  }
  st.pairs_per_local_slot.assign(s.map.local_slots(s.comm.rank()).size(), 0);
  s.num_tokens = num_tokens;
  if (static_cast<int64_t>(s.topk_ids.size()) < num_tokens * k) {
    s.topk_ids.resize(static_cast<size_t>(num_tokens * k));
    s.topk_weights.resize(static_cast<size_t>(num_tokens * k));
  }
}

void EpMoeLayer::forward(const TensorView& hidden, const TensorView& out) {
  check_cpu_layer_tokens(hidden, out, config_.experts.hidden_size, config_.routing.top_k);
  State& s = *state_;
  const int64_t M = hidden.size(0);
  reset_stats(M, hidden.dtype);
  // Route this rank's tokens, as MoeLayer does, on the cpu kernels directly.
  {
    StageTimer timer(s.stats.route_us);
    const RoutingConfig& r = config_.routing;
    if (static_cast<int64_t>(s.logits.size()) < M * r.num_experts) {
      s.logits.resize(static_cast<size_t>(M * r.num_experts));
    }
    const LayerWeights& w = s.weights;
    s.router.logits(hidden.data, hidden.dtype,
                    w.router_bias.defined() ? w.router_bias.data<float>() : nullptr, M,
                    s.logits.data(), s.num_threads);
    cpu::select_experts(r, s.logits.data(), M,
                        w.correction_bias.defined() ? w.correction_bias.data<float>() : nullptr,
                        s.topk_ids.data(), s.topk_weights.data(), s.num_threads);
  }
  run_routed(hidden, out);
}

void EpMoeLayer::forward_routed(const TensorView& hidden, const TensorView& topk_ids,
                                const TensorView& topk_weights, const TensorView& out) {
  const int64_t k = config_.routing.top_k, E = config_.routing.num_experts;
  check_cpu_layer_tokens(hidden, out, config_.experts.hidden_size, k);
  const int64_t M = hidden.size(0);
  // Untrusted ids are checked here, once, before any peer sees them: the dispatch plan indexes
  // its tables with them.
  check_cpu_layer_routing(topk_ids, topk_weights, M, k, E);
  const auto* ids = static_cast<const int32_t*>(topk_ids.data);
  State& s = *state_;
  reset_stats(M, hidden.dtype);
  // memmove: the caller may pass last_topk_ids() and last_topk_weights() back.
  if (M > 0) {
    std::memmove(s.topk_ids.data(), ids, static_cast<size_t>(M * k) * sizeof(int32_t));
    std::memmove(s.topk_weights.data(), topk_weights.data,
                 static_cast<size_t>(M * k) * sizeof(float));
  }
  run_routed(hidden, out);
}

void EpMoeLayer::run_routed(const TensorView& hidden, const TensorView& out) {
  State& s = *state_;
  const auto start = Clock::now();
  const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k, M = hidden.size(0);
  EpStepStats& st = s.stats;

  // Micro-batches: the whole batch, or its two halves with two-batch overlap.
  const int num_micro = options_.two_batch_overlap ? 2 : 1;
  const int64_t first[2] = {0, (M + 1) / 2};
  const int64_t count[2] = {num_micro == 2 ? (M + 1) / 2 : M, M - (M + 1) / 2};
  const auto input_of = [&](int i) {
    parallel::DispatchInput in;
    in.hidden = hidden.data;
    in.dtype = hidden.dtype;
    in.topk_ids = s.topk_ids.data() + first[i] * k;
    in.topk_weights = s.topk_weights.data() + first[i] * k;
    in.first_token = first[i];
    in.num_tokens = count[i];
    return in;
  };
  const auto run_experts = [&](int i, const parallel::ReceivedPairs& received) {
    StageTimer timer(st.experts_us);
    ExpertsProblem pb = s.experts.problem;
    pb.num_tokens = received.num_pairs;
    pb.top_k = 1;
    pb.hidden = hidden.data;  // unused: every row is read through hidden_row_ptrs
    pb.hidden_dtype = hidden.dtype;
    pb.hidden_row_ptrs = received.row_ptrs;
    pb.topk_ids = received.slots;
    pb.topk_weights = received.weights;
    const cpu::PackedExpertsView packed = s.packed.view();
    return cpu::routed_pair_outputs(pb, &packed, s.kernels, s.block_m, s.workspaces[i],
                                    s.num_threads, nullptr);
  };
  const auto dispatch = [&](int i) {
    StageTimer timer(st.dispatch_us);
    s.dispatchers[i]->start_dispatch(input_of(i), st);
  };
  const auto receive = [&](int i) {
    StageTimer timer(st.dispatch_us);
    return s.dispatchers[i]->finish_dispatch(st);
  };
  const DType results_dtype = cpu::cache3_dtype(out.dtype);
  const auto send_back = [&](int i, const void* results) {
    StageTimer timer(st.combine_us);
    s.dispatchers[i]->start_combine(results, results_dtype, st);
  };
  char* out_rows = static_cast<char*>(out.data);
  const size_t out_bytes = dtype_size(out.dtype);
  const float* shared = nullptr;
  const auto sum = [&](int i) {
    parallel::CombinedPairs combined;
    {
      StageTimer timer(st.combine_us);
      combined = s.dispatchers[i]->finish_combine(st);
    }
    StageTimer timer(st.sum_us);
    cpu::moe_sum(nullptr, combined.pair_rows, combined.dtype,
                 shared ? shared + first[i] * H : nullptr, count[i], k, H,
                 out_rows + first[i] * H * out_bytes, out.dtype, s.num_threads);
  };

  // NOTE: the order of communicator calls is the same on every rank (each micro-batch's
  // dispatch, then its combine); only which local work sits between them changes.
  for (int i = 0; i < num_micro; ++i) dispatch(i);
  for (int i = 0; i < num_micro; ++i) send_back(i, run_experts(i, receive(i)));
  {
    StageTimer timer(st.shared_us);
    ExpertsProblem pb = s.experts.problem;
    pb.num_tokens = M;
    pb.hidden = hidden.data;
    pb.hidden_dtype = hidden.dtype;
    const cpu::PackedExpertsView packed = s.packed.view();
    shared = cpu::shared_expert_outputs(pb, &packed, s.kernels, s.block_m, s.shared_workspace,
                                        s.num_threads, nullptr);
  }
  for (int i = 0; i < num_micro; ++i) sum(i);

  st.dispatch_sent = parallel::split_by_domain(st.dispatch_bytes_sent, s.comm);
  st.combine_sent = parallel::split_by_domain(st.combine_bytes_sent, s.comm);
  st.total_us = st.route_us + microseconds_since(start);
}

Tensor EpMoeLayer::forward(const TensorView& hidden) {
  check_rank(hidden, "hidden", 2);
  Tensor out(hidden.dtype, hidden.shape);
  forward(hidden, out);
  return out;
}

}  // namespace moe
