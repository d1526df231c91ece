// MoeLayer: route, then the experts, over buffers that live as long as the layer.
#include "moe/layer.h"

#include <algorithm>
#include <chrono>

#include "kernels/cpu/assign_replicas.h"
#include "kernels/cpu/fused_experts.h"
#include "kernels/cpu/layer_router.h"
#include "kernels/cpu/routing.h"
#include "kernels/cpu/threads.h"
#include "kernels/reference/experts.h"
#include "layer/layer_checks.h"
#include "moe/error.h"
#include "moe/routing.h"

#ifdef MOE_WITH_CUDA
#include "layer/cuda_layer.h"
#endif

namespace moe {

struct MoeLayer::State {
  ValidatedExperts experts;  // weights checked once; the batch fields are set per call
  DType weight_dtype = DType::kF32;
  // cpu backend: the expert weights packed at construction, and the kernels of the chosen path.
  CpuIsa isa = CpuIsa::kAuto;
  cpu::PackedExperts packed;
  cpu::ExpertKernels kernels;
  cpu::ExpertsWorkspace workspace;
  // cpu backend: the router weight packed once, with its kernels.
  cpu::LayerRouter router;
  std::vector<int32_t> topk_ids;       // [M, k]
  std::vector<float> topk_weights;     // [M, k]
  std::vector<int32_t> expert_counts;  // [E]
  std::vector<float> logits;           // [M, E], cpu backend
  int64_t num_tokens = 0;

  // Replicas; slot_experts is empty while every expert has exactly one slot.
  std::vector<int32_t> slot_experts;   // [num_slots]: logical expert of each slot
  std::vector<int32_t> expert_slots;   // [E, max_replicas]: slot of each replica
  std::vector<int32_t> replica_count;  // [E]
  int64_t max_replicas = 0;
  std::vector<int32_t> slot_ids;      // [M, k]: the slot serving each pair
  std::vector<int32_t> next_replica;  // [E], assign_replicas scratch
  std::vector<int32_t> slot_counts;   // [num_slots]

#ifdef MOE_WITH_CUDA
  std::unique_ptr<CudaLayer> cuda;  // backend kCuda: weights and buffers on the GPU
#endif
};

int64_t LayerWeights::nbytes() const {
  int64_t total = 0;
  for (const Tensor* t : {&router, &router_bias, &correction_bias, &w13, &w2, &w13_bias, &w2_bias,
                          &shared_w13, &shared_w2, &shared_gate}) {
    if (t->defined()) total += static_cast<int64_t>(t->nbytes());
  }
  return total;
}

namespace {

double microseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

MoeLayer::MoeLayer(MoeConfig config, LayerWeights weights, LayerOptions options)
    : config_(std::move(config)), weights_(std::move(weights)), options_(options) {
  validate(config_);
  state_ = std::make_unique<State>();
  state_->experts =
      validate_layer_weights(config_, weights_, options_, config_.routing.num_experts);
  state_->weight_dtype = weights_.w13.dtype();
  if (options_.backend == Backend::kCuda) {
    // The GPU keeps its own copy of the weights; the host copy stays for weights().
#ifdef MOE_WITH_CUDA
    state_->cuda = std::make_unique<CudaLayer>(config_, weights_);
#else
    fail("backend: cuda, but this build has no CUDA backend (configure with MOE_WITH_CUDA=ON)");
#endif
  } else if (options_.backend != Backend::kReference) {
    State& s = *state_;
    s.isa = resolve_cpu_isa(options_.cpu_isa);
    s.kernels = cpu::expert_kernels(s.isa, s.weight_dtype);
    s.packed =
        cpu::PackedExperts::pack(s.experts.problem, cpu::resolve_num_threads(options_.num_threads));
    // Only the packed copy stays with the layer.
    for (Tensor* plain : {&weights_.w13, &weights_.w2, &weights_.shared_w13, &weights_.shared_w2}) {
      *plain = Tensor();
    }
    ExpertsProblem& pb = s.experts.problem;
    pb.w13 = pb.w2 = pb.shared_w13 = pb.shared_w2 = nullptr;
  }
  state_->expert_counts.assign(static_cast<size_t>(config_.routing.num_experts), 0);
  // The router weights go through route()'s own checks once, on an empty batch; forward then
  // calls the kernels directly.
  route_batch_checked(
      TensorView(nullptr, weights_.router.dtype(), {0, config_.experts.hidden_size}));
  if (options_.backend != Backend::kCuda && options_.backend != Backend::kReference) {
    State& s = *state_;
    s.router = cpu::LayerRouter(s.isa, weights_.router.data<void>(), weights_.router.dtype(),
                                config_.routing.num_experts, config_.experts.hidden_size,
                                cpu::resolve_num_threads(options_.num_threads));
  }
}

MoeLayer::~MoeLayer() = default;
MoeLayer::MoeLayer(MoeLayer&&) noexcept = default;
MoeLayer& MoeLayer::operator=(MoeLayer&&) noexcept = default;

void MoeLayer::route_batch_checked(const TensorView& hidden) {
  RoutingInputs inputs;
  if (weights_.correction_bias.defined()) inputs.correction_bias = weights_.correction_bias;
  if (weights_.router_bias.defined()) inputs.router_bias = weights_.router_bias;
  // The CUDA layer routes on the GPU; the host check of its weights is the CPU's.
  const Backend backend = options_.backend == Backend::kCuda ? Backend::kCpu : options_.backend;
  route(config_.routing, hidden, weights_.router, inputs, last_topk_ids(), last_topk_weights(),
        last_expert_counts(), backend, options_.num_threads);
}

void MoeLayer::route_batch(const TensorView& hidden) {
  State& s = *state_;
  const RoutingConfig& r = config_.routing;
  if (options_.backend == Backend::kReference) {
    route_batch_checked(hidden);
    return;
  }
  // The cpu kernels directly, over the layer's own buffers: no allocation once warmed up.
  const int64_t M = s.num_tokens;
  if (static_cast<int64_t>(s.logits.size()) < M * r.num_experts) {
    s.logits.resize(static_cast<size_t>(M * r.num_experts));
  }
  const float* router_bias =
      weights_.router_bias.defined() ? weights_.router_bias.data<float>() : nullptr;
  const float* correction_bias =
      weights_.correction_bias.defined() ? weights_.correction_bias.data<float>() : nullptr;
  s.router.logits(hidden.data, hidden.dtype, router_bias, M, s.logits.data(), options_.num_threads);
  cpu::select_experts(r, s.logits.data(), M, correction_bias, s.topk_ids.data(),
                      s.topk_weights.data(), options_.num_threads);
  cpu::count_experts(s.topk_ids.data(), M * r.top_k, r.num_experts, s.expert_counts.data());
}

void MoeLayer::forward(const TensorView& hidden, const TensorView& out, void* cuda_stream) {
  const int64_t H = config_.experts.hidden_size, k = config_.routing.top_k;
#ifdef MOE_WITH_CUDA
  if (state_->cuda) {
    // Host or device tensors; the CUDA layer copies host ones in and out.
    check_rank(hidden, "hidden", 2);
    if (hidden.size(1) != H) {
      fail("hidden: expected [M, {}] (the layer's hidden size); got {}", H,
           shape_string(hidden.shape));
    }
    check_contiguous(hidden, "hidden");
    check_contiguous(out, "out");
    check_dtype(out, "out", {hidden.dtype});
    check_shape(out, "out", hidden.shape);
    state_->num_tokens = hidden.size(0);
    times_ = StageTimes{};
    state_->cuda->forward(hidden, out, state_->topk_ids, state_->topk_weights,
                          state_->expert_counts, times_, static_cast<cudaStream_t>(cuda_stream));
    return;
  }
#endif
  check_cpu_layer_tokens(hidden, out, H, k);

  State& s = *state_;
  const int64_t M = hidden.size(0);
  s.num_tokens = M;
  if (static_cast<int64_t>(s.topk_ids.size()) < M * k) {
    s.topk_ids.resize(static_cast<size_t>(M * k));
    s.topk_weights.resize(static_cast<size_t>(M * k));
  }
  times_ = StageTimes{};

  const auto route_start = std::chrono::steady_clock::now();
  route_batch(hidden);
  times_.route_us = microseconds_since(route_start);

  run_experts(hidden, s.topk_ids.data(), s.topk_weights.data(), out);
}

void MoeLayer::run_experts(const TensorView& hidden, const int32_t* topk_ids,
                           const float* topk_weights, const TensorView& out) {
  State& s = *state_;
  const int64_t M = hidden.size(0), k = config_.routing.top_k;
  ExpertsProblem problem = s.experts.problem;
  problem.num_tokens = M;
  problem.hidden = hidden.data;
  problem.hidden_dtype = hidden.dtype;
  problem.topk_ids = topk_ids;
  if (!s.slot_experts.empty()) {
    // The experts see slots: each slot's weights are those of the logical expert it holds.
    const int64_t num_slots = static_cast<int64_t>(s.slot_experts.size());
    if (static_cast<int64_t>(s.slot_ids.size()) < M * k) s.slot_ids.resize(M * k);
    cpu::assign_replicas(topk_ids, M * k, config_.routing.num_experts, s.expert_slots.data(),
                         s.max_replicas, s.replica_count.data(), s.slot_ids.data(),
                         s.next_replica.data());
    cpu::count_experts(s.slot_ids.data(), M * k, num_slots, s.slot_counts.data());
    problem.topk_ids = s.slot_ids.data();
    problem.num_experts = num_slots;
    problem.expert_map = s.slot_experts.data();
  }
  problem.topk_weights = topk_weights;
  problem.out = out.data;
  switch (options_.backend) {
    case Backend::kReference: {
      // The reference does not split its stages; its whole experts time is reported as gemm1.
      const auto start = std::chrono::steady_clock::now();
      reference::fused_experts(problem);
      times_.gemm1_us = microseconds_since(start);
      return;
    }
    case Backend::kAuto:
    case Backend::kCpu: {
      const int64_t block_m = options_.block_m > 0 ? options_.block_m : cpu::kDefaultBlockM;
      const cpu::PackedExpertsView packed = s.packed.view();
      cpu::fused_experts(problem, &packed, s.kernels, block_m, s.workspace, options_.num_threads,
                         &times_);
      return;
    }
    case Backend::kCuda:
      break;  // a CUDA layer runs whole in CudaLayer::forward
  }
  fail("MoeLayer: the {} backend is not available for layers yet", backend_name(options_.backend));
}

void MoeLayer::forward_experts(const TensorView& hidden, const TensorView& topk_ids,
                               const TensorView& topk_weights, const TensorView& out) {
  const int64_t H = config_.experts.hidden_size, E = config_.routing.num_experts;
  const int64_t k = config_.routing.top_k;
  if (options_.backend == Backend::kCuda) {
    fail("forward_experts: not implemented on the CUDA backend yet; use forward()");
  }
  check_cpu_layer_tokens(hidden, out, H, k);
  check_cpu_layer_routing(topk_ids, topk_weights, hidden.size(0), k, E);
  times_ = StageTimes{};
  run_experts(hidden, topk_ids.as<int32_t>(), topk_weights.as<float>(), out);
}

Tensor MoeLayer::forward(const TensorView& hidden) {
  check_rank(hidden, "hidden", 2);
  if (hidden.device != Device::kCpu) {
    fail(
        "hidden: a GPU tensor, but forward(hidden) returns a host tensor; pass a device out to "
        "forward(hidden, out, cuda_stream)");
  }
  Tensor out(hidden.dtype, hidden.shape);
  forward(hidden, out);
  return out;
}

void MoeLayer::set_replicas(const std::vector<int32_t>& slot_experts) {
  if (options_.backend == Backend::kCuda) {
    fail("set_replicas: replicas are not implemented on the CUDA backend yet");
  }
  State& s = *state_;
  const int64_t E = config_.routing.num_experts;
  std::vector<int32_t> count(static_cast<size_t>(E), 0);
  for (size_t slot = 0; slot < slot_experts.size(); ++slot) {
    const int32_t expert = slot_experts[slot];
    if (expert < 0 || expert >= E) {
      fail("set_replicas: expected logical expert ids in [0, {}); got {} in slot {}", E, expert,
           slot);
    }
    ++count[static_cast<size_t>(expert)];
  }
  const int64_t max_replicas =
      slot_experts.empty() ? 0 : *std::max_element(count.begin(), count.end());
  if (!slot_experts.empty()) {
    for (int64_t e = 0; e < E; ++e) {
      if (count[static_cast<size_t>(e)] == 0) {
        fail("set_replicas: expected every expert in at least one slot; expert {} has none", e);
      }
    }
  }
  // Replica r of an expert is its r-th slot in slot order.
  std::vector<int32_t> expert_slots(static_cast<size_t>(E * max_replicas), -1);
  std::vector<int32_t> filled(static_cast<size_t>(E), 0);
  for (size_t slot = 0; slot < slot_experts.size(); ++slot) {
    const int32_t expert = slot_experts[slot];
    expert_slots[expert * max_replicas + filled[expert]++] = static_cast<int32_t>(slot);
  }
  s.slot_experts = slot_experts;
  s.expert_slots = std::move(expert_slots);
  s.replica_count = std::move(count);
  s.max_replicas = max_replicas;
  s.next_replica.assign(static_cast<size_t>(E), 0);
  s.slot_counts.assign(slot_experts.size(), 0);
}

LayerWeights MoeLayer::unpacked_weights() const {
  LayerWeights w = weights_;
  if (!state_->packed.nbytes()) return w;
  w.w13 = state_->packed.unpack_w13();
  w.w2 = state_->packed.unpack_w2();
  w.shared_w13 = state_->packed.unpack_shared_w13();
  w.shared_w2 = state_->packed.unpack_shared_w2();
  return w;
}

DType MoeLayer::weight_dtype() const { return state_->weight_dtype; }

CpuIsa MoeLayer::cpu_isa() const { return state_->isa; }

int64_t MoeLayer::num_slots() const {
  return state_->slot_experts.empty() ? config_.routing.num_experts
                                      : static_cast<int64_t>(state_->slot_experts.size());
}

TensorView MoeLayer::last_slot_counts() const {
  if (state_->slot_experts.empty()) return last_expert_counts();
  return TensorView(state_->slot_counts.data(), DType::kI32, {num_slots()});
}

TensorView MoeLayer::last_topk_ids() const {
  return TensorView(state_->topk_ids.data(), DType::kI32,
                    {state_->num_tokens, config_.routing.top_k});
}

TensorView MoeLayer::last_topk_weights() const {
  return TensorView(state_->topk_weights.data(), DType::kF32,
                    {state_->num_tokens, config_.routing.top_k});
}

TensorView MoeLayer::last_expert_counts() const {
  return TensorView(state_->expert_counts.data(), DType::kI32, {config_.routing.num_experts});
}

}  // namespace moe
