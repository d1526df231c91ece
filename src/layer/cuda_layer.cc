#include "layer/cuda_layer.h"

#include <chrono>

#include "kernels/cuda/check.h"
#include "kernels/cuda/routing.h"
#include "moe/error.h"
#include "ops/cuda_plan_choice.h"

namespace moe {
namespace {

using cuda::check;

void upload(cuda::DeviceBuffer& buffer, const Tensor& host) {
  buffer.reserve(std::max<size_t>(host.nbytes(), 1));
  check(cudaMemcpy(buffer.data(), host.data<void>(), host.nbytes(), cudaMemcpyHostToDevice),
        "cudaMemcpy (layer weights)");
}

void check_supported(const MoeConfig& config, const LayerWeights& w) {
  const RoutingConfig& r = config.routing;
  const ExpertsConfig& x = config.experts;
  if (w.w13.dtype() != DType::kBF16) {
    fail("MoeLayer on CUDA: expected bf16 expert weights; got {}", dtype_name(w.w13.dtype()));
  }
  if (w.router.dtype() != DType::kBF16) {
    fail("MoeLayer on CUDA: expected a bf16 router; got {}", dtype_name(w.router.dtype()));
  }
  if (r.num_experts > cuda::kMaxRoutedExperts || r.top_k > cuda::kMaxTopK ||
      r.num_groups > cuda::kMaxGroups) {
    fail(
        "MoeLayer on CUDA: routing supports up to {} experts, top-{} and {} groups; got {}, "
        "top-{}, {}",
        cuda::kMaxRoutedExperts, cuda::kMaxTopK, cuda::kMaxGroups, r.num_experts, r.top_k,
        r.num_groups);
  }
  if (x.activation != Activation::kSilu || x.has_bias || r.apply_weight_on_input) {
    fail(
        "MoeLayer on CUDA: runs SiLU-gated experts without biases or the weight on the input so "
        "far; this config ({}) needs one of them",
        config.model_type);
  }
}

double since_us(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

CudaLayer::CudaLayer(const MoeConfig& config, const LayerWeights& weights)
    : config_(config), router_dtype_(weights.router.dtype()) {
  check_supported(config, weights);
  check(cudaGetDevice(&device_), "cudaGetDevice");
  if (config.experts.shared_intermediate_size > 0) {
    // First: it checks its weights before anything else is made.
    shared_ = cuda::SharedExperts(weights.shared_w13, weights.shared_w2, weights.shared_gate);
    shared_workspace_.emplace();
  }
  check(cublasCreate(&cublas_), "cublasCreate");
  upload(router_, weights.router);
  upload(w13_, weights.w13);
  upload(w2_, weights.w2);
  if (weights.router_bias.defined()) upload(router_bias_, weights.router_bias);
  if (weights.correction_bias.defined()) upload(correction_bias_, weights.correction_bias);
  if (shared_.defined()) {
    check(cudaEventCreate(&shared_start_), "cudaEventCreate");
    check(cudaEventCreate(&shared_end_), "cudaEventCreate");
  }
}

CudaLayer::~CudaLayer() {
  // Nothing to report from a destructor.
  if (shared_start_ != nullptr) cudaEventDestroy(shared_start_);
  if (shared_end_ != nullptr) cudaEventDestroy(shared_end_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

void CudaLayer::forward(const TensorView& hidden, const TensorView& out,
                        std::vector<int32_t>& topk_ids, std::vector<float>& topk_weights,
                        std::vector<int32_t>& expert_counts, StageTimes& times,
                        cudaStream_t stream) {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device != device_) {
    fail(
        "hidden: the layer's weights are on GPU {}, but this call runs on GPU {} (the current "
        "device); make GPU {} current, or build a layer there",
        device_, device, device_);
  }
  const RoutingConfig& r = config_.routing;
  const int64_t M = hidden.size(0), H = config_.experts.hidden_size, E = r.num_experts;
  const int64_t k = r.top_k;
  check_dtype(hidden, "hidden", {DType::kBF16});
  const bool on_device = hidden.device == Device::kCuda;
  check_device(out, "out", hidden.device);

  const void* hidden_data = hidden.data;
  void* out_data = out.data;
  if (!on_device) {
    hidden_.reserve(std::max<size_t>(hidden.nbytes(), 1));
    out_.reserve(std::max<size_t>(hidden.nbytes(), 1));
    check(cudaMemcpyAsync(hidden_.data(), hidden.data, hidden.nbytes(), cudaMemcpyHostToDevice,
                          stream),
          "cudaMemcpyAsync (hidden)");
    hidden_data = hidden_.data();
    out_data = out_.data();
  }
  if (shared_.defined()) shared_.check_args(hidden_data, M, out_data);
  logits_.reserve(std::max<int64_t>(M * E, 1) * sizeof(float));
  ids_.reserve(std::max<int64_t>(M * k, 1) * sizeof(int32_t));
  weights_.reserve(std::max<int64_t>(M * k, 1) * sizeof(float));
  counts_.reserve(E * sizeof(int32_t));

  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const auto route_start = std::chrono::steady_clock::now();
  cuda::router_gemm(cublas_, hidden_data, router_.data(), router_dtype_, M, H, E,
                    static_cast<float*>(logits_.data()), stream);
  check(cudaMemsetAsync(counts_.data(), 0, E * sizeof(int32_t), stream), "cudaMemsetAsync");
  cuda::SelectArgs select;
  select.logits = static_cast<const float*>(logits_.data());
  select.router_bias = r.has_router_bias ? static_cast<const float*>(router_bias_.data()) : nullptr;
  select.correction_bias =
      r.has_correction_bias ? static_cast<const float*>(correction_bias_.data()) : nullptr;
  select.num_tokens = M;
  select.topk_ids = static_cast<int32_t*>(ids_.data());
  select.topk_weights = static_cast<float*>(weights_.data());
  select.expert_counts = static_cast<int32_t*>(counts_.data());
  cuda::select_experts(r, select, stream);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const double route_us = since_us(route_start);

  ExpertsProblem problem;
  problem.num_tokens = M;
  problem.hidden_size = H;
  problem.intermediate_size = config_.experts.intermediate_size;
  problem.top_k = k;
  problem.num_experts = E;
  problem.num_local_experts = E;
  problem.hidden = hidden_data;
  problem.hidden_dtype = DType::kBF16;
  problem.w13 = w13_.data();
  problem.w2 = w2_.data();
  problem.weight_dtype = DType::kBF16;
  problem.topk_ids = select.topk_ids;
  problem.topk_weights = select.topk_weights;
  problem.out = out_data;
  const cuda::ExpertsPlan plan = cuda_plans::choose_plan(problem, cuda_plans::device_name(device_));
  experts_.run(problem, plan, stream, &times);
  times.route_us = route_us;
  if (shared_.defined()) {
    // Added to the routed sum the experts left in out.
    check(cudaEventRecord(shared_start_, stream), "cudaEventRecord");
    shared_.run(hidden_data, M, out_data, *shared_workspace_, stream);
    check(cudaEventRecord(shared_end_, stream), "cudaEventRecord");
  }

  topk_ids.resize(M * k);
  topk_weights.resize(M * k);
  expert_counts.resize(E);
  check(cudaMemcpyAsync(topk_ids.data(), ids_.data(), M * k * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (topk_ids)");
  check(cudaMemcpyAsync(topk_weights.data(), weights_.data(), M * k * sizeof(float),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (topk_weights)");
  check(cudaMemcpyAsync(expert_counts.data(), counts_.data(), E * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (expert_counts)");
  if (!on_device) {
    check(cudaMemcpyAsync(out.data, out_.data(), out.nbytes(), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (out)");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  if (shared_.defined()) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, shared_start_, shared_end_), "cudaEventElapsedTime");
    times.shared_us = ms * 1000.0;
  }
}

}  // namespace moe
