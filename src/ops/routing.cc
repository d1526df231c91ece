// The public routing entry points (include/moe/routing.h): validate every argument once, then
// run one backend's kernels, which trust their inputs. Tests: tests/routing/.
#include "moe/routing.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/routing.h"
#include "kernels/reference/routing.h"
#include "moe/cpu_isa.h"
#include "moe/error.h"

#ifdef MOE_WITH_CUDA
#include "kernels/cuda/check.h"
#include "kernels/cuda/routing.h"
#include "ops/cublas_handles.h"
#include "ops/cuda_stream_scratch.h"
#endif

namespace moe {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

void check_config(const RoutingConfig& c) {
  if (c.num_experts < 1 || c.num_experts > kMaxInt32) {
    fail("config.num_experts: expected 1..{}; got {}", kMaxInt32, c.num_experts);
  }
  if (c.top_k < 1 || c.top_k > c.num_experts) {
    fail("config.top_k: expected 1 <= top_k <= num_experts ({}); got {}", c.num_experts, c.top_k);
  }
  if (c.num_groups < 1 || c.num_experts % c.num_groups != 0) {
    fail("config.num_groups: expected a divisor of num_experts ({}); got {}", c.num_experts,
         c.num_groups);
  }
  if (c.topk_groups < 1 || c.topk_groups > c.num_groups) {
    fail("config.topk_groups: expected 1 <= topk_groups <= num_groups ({}); got {}", c.num_groups,
         c.topk_groups);
  }
  const int64_t group_size = c.num_experts / c.num_groups;
  if (c.top_k > c.topk_groups * group_size) {
    fail(
        "config.top_k: expected at most the {} experts of the kept groups (topk_groups {} x {} "
        "experts per group); got {}",
        c.topk_groups * group_size, c.topk_groups, group_size, c.top_k);
  }
  if (c.scoring != ScoringFunc::kSoftmax && c.scoring != ScoringFunc::kSigmoid) {
    fail("config.scoring: expected softmax or sigmoid; got value {}", static_cast<int>(c.scoring));
  }
  if (!std::isfinite(c.routed_scaling_factor)) {
    fail("config.routed_scaling_factor: expected a finite number; got {}", c.routed_scaling_factor);
  }
}

// Device, dtype, shape, layout and a data pointer for every element.
void check_tensor(const TensorView& t, const char* name, Device device,
                  std::initializer_list<DType> dtypes, const Shape& shape) {
  check_device(t, name, device);
  check_dtype(t, name, dtypes);
  check_shape(t, name, shape);
  check_contiguous(t, name);
  if (t.numel() > 0 && t.data == nullptr)
    fail("{}: expected data for {} elements; got null", name, t.numel());
}

// A per-expert bias that must be given exactly when `flag` in the config is set.
void check_bias(const TensorView& bias, const char* name, bool expected, const char* flag,
                int64_t num_experts, Device device) {
  if (!expected) {
    if (!bias.empty()) {
      fail("{}: given, but config.{} is false; set it or leave {} empty", name, flag, name);
    }
    return;
  }
  if (bias.empty()) {
    fail("{}: config.{} is set, so expected an f32 tensor of shape [{}]; got none", name, flag,
         num_experts);
  }
  check_tensor(bias, name, device, {DType::kF32}, {num_experts});
}

void check_outputs(const RoutingConfig& c, int64_t num_tokens, const TensorView& topk_ids,
                   const TensorView& topk_weights, const TensorView& expert_counts, Device device) {
  if (num_tokens > kMaxInt32 / c.top_k) {
    fail(
        "topk_ids: expected at most {} (token, expert) pairs, the int32 pair-id range; got {} "
        "tokens x k {}",
        kMaxInt32, num_tokens, c.top_k);
  }
  check_tensor(topk_ids, "topk_ids", device, {DType::kI32}, {num_tokens, c.top_k});
  check_tensor(topk_weights, "topk_weights", device, {DType::kF32}, {num_tokens, c.top_k});
  if (!expert_counts.empty()) {
    check_tensor(expert_counts, "expert_counts", device, {DType::kI32}, {c.num_experts});
  }
}

// The backend that runs a call: the one asked for, which must suit where the tensors live.
Backend resolve_backend(Backend requested, Device device, const char* input) {
  if (device == Device::kCuda) {
    if (requested != Backend::kAuto && requested != Backend::kCuda) {
      fail("backend: {} is on the GPU, so expected auto or cuda; got {}", input,
           backend_name(requested));
    }
    if (!cuda_available()) {
      fail(
          "{}: a GPU tensor, but this build has no CUDA backend (configure with "
          "MOE_WITH_CUDA=ON)",
          input);
    }
    return Backend::kCuda;
  }
  if (requested == Backend::kCuda) {
    fail("backend: cuda needs tensors in GPU memory; {} is on the CPU", input);
  }
  return requested == Backend::kAuto ? Backend::kCpu : requested;
}

// One validated call: either the router operands (route) or precomputed logits (select_experts).
struct Job {
  const RoutingConfig& config;
  int64_t num_tokens;
  const TensorView* hidden;         // [M, H]; null for select_experts
  const TensorView* router_weight;  // [E, H]; null for select_experts
  const float* router_bias;         // [E] or null
  const float* logits;              // [M, E]; null for route
  const float* correction_bias;     // [E] or null
  int32_t* topk_ids;                // [M, k]
  float* topk_weights;              // [M, k]
  int32_t* expert_counts;           // [E] or null
  int num_threads;
  void* cuda_stream;  // cudaStream_t of the CUDA backend
};

void run_cpu(const Job& job) {
  const RoutingConfig& c = job.config;
  if (c.num_experts > cpu::kMaxExperts) {
    fail(
        "config.num_experts: the cpu backend supports up to {} experts; got {} (try backend "
        "reference)",
        cpu::kMaxExperts, c.num_experts);
  }
  std::vector<float> computed;  // [M, E] router logits
  const float* logits = job.logits;
  // An empty batch (a layer checking its weights) packs nothing.
  if (job.hidden && job.num_tokens > 0) {
    const int64_t H = job.hidden->size(1);
    computed.resize(static_cast<size_t>(job.num_tokens * c.num_experts));
    // A layer packs its router once. A single call converts the weights as it goes when they
    // pass through it once anyway, and packs them first when they would pass several times.
    const cpu::RouterKernel kernel = cpu::router_kernel(resolve_cpu_isa());
    const TensorView& weight = *job.router_weight;
    if (job.num_tokens <= cpu::kRouterBlockTokens) {
      cpu::router_logits_unpacked(kernel, job.hidden->data, job.hidden->dtype, weight.data,
                                  weight.dtype, job.router_bias, job.num_tokens, H, c.num_experts,
                                  computed.data(), job.num_threads);
    } else {
      const Tensor panels =
          cpu::pack_router_weight(weight.data, weight.dtype, c.num_experts, H, job.num_threads);
      cpu::router_logits(kernel, job.hidden->data, job.hidden->dtype, panels.data<float>(),
                         job.router_bias, job.num_tokens, H, c.num_experts, computed.data(),
                         job.num_threads);
    }
    logits = computed.data();
  }
  cpu::select_experts(c, logits, job.num_tokens, job.correction_bias, job.topk_ids,
                      job.topk_weights, job.num_threads);
  if (job.expert_counts) {
    cpu::count_experts(job.topk_ids, job.num_tokens * c.top_k, c.num_experts, job.expert_counts);
  }
}

void run_reference(const Job& job) {
  const RoutingConfig& c = job.config;
  std::vector<double> logits(static_cast<size_t>(job.num_tokens * c.num_experts));  // [M, E]
  if (job.hidden) {
    reference::router_logits(job.hidden->data, job.hidden->dtype, job.router_weight->data,
                             job.router_weight->dtype, job.router_bias, job.num_tokens,
                             job.hidden->size(1), c.num_experts, logits.data());
  } else {
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = job.logits[i];
  }
  reference::select_experts(c, logits.data(), job.num_tokens, job.correction_bias, job.topk_ids,
                            job.topk_weights);
  if (job.expert_counts) {
    reference::count_experts(job.topk_ids, job.num_tokens * c.top_k, c.num_experts,
                             job.expert_counts);
  }
}

#ifdef MOE_WITH_CUDA
// What the GPU kernels take; refused here, before anything is queued.
void check_cuda_support(const Job& job) {
  const RoutingConfig& c = job.config;
  if (c.num_experts > cuda::kMaxRoutedExperts || c.top_k > cuda::kMaxTopK ||
      c.num_groups > cuda::kMaxGroups) {
    fail(
        "config: routing on CUDA supports up to {} experts, top-{} and {} groups; got {} "
        "experts, top-{}, {} groups",
        cuda::kMaxRoutedExperts, cuda::kMaxTopK, cuda::kMaxGroups, c.num_experts, c.top_k,
        c.num_groups);
  }
  if (job.hidden == nullptr) return;
  const DType hidden = job.hidden->dtype, router = job.router_weight->dtype;
  if (hidden != router || (hidden != DType::kBF16 && hidden != DType::kF32)) {
    fail(
        "router_weight: the CUDA router GEMM takes hidden and router_weight both bf16 or both "
        "f32; got hidden {}, router_weight {}",
        dtype_name(hidden), dtype_name(router));
  }
  // cuBLAS takes int extents.
  if (job.hidden->size(1) > std::numeric_limits<int>::max()) {
    fail("hidden: the CUDA router GEMM takes a hidden size up to {}; got {}",
         std::numeric_limits<int>::max(), job.hidden->size(1));
  }
}

// Router GEMM (cuBLAS) into logits scratch that lives on the stream, then the fused select
// kernel, which adds the router bias. The scratch is stream-ordered, so calls on several streams
// never share it.
void run_cuda(const Job& job) {
  check_cuda_support(job);
  const RoutingConfig& c = job.config;
  const auto stream = static_cast<cudaStream_t>(job.cuda_stream);
  if (job.expert_counts) {
    cuda::check(cudaMemsetAsync(job.expert_counts, 0, c.num_experts * sizeof(int32_t), stream),
                "cudaMemsetAsync (expert_counts)");
  }
  if (job.num_tokens == 0) return;
  cuda::SelectArgs args;
  args.logits = job.logits;
  CudaStreamScratch logits(job.hidden ? job.num_tokens * c.num_experts * sizeof(float) : 0, stream,
                           "cudaMallocAsync (logits)");
  if (job.hidden) {
    cuda::router_gemm(cublas_handle(stream), job.hidden->data, job.router_weight->data,
                      job.hidden->dtype, job.num_tokens, job.hidden->size(1), c.num_experts,
                      logits.as<float>(), stream);
    args.logits = logits.as<float>();
    args.router_bias = job.router_bias;
  }
  args.correction_bias = job.correction_bias;
  args.num_tokens = job.num_tokens;
  args.topk_ids = job.topk_ids;
  args.topk_weights = job.topk_weights;
  args.expert_counts = job.expert_counts;
  cuda::select_experts(c, args, stream);
}
#endif

void run(Backend backend, const Job& job) {
  switch (backend) {
    case Backend::kAuto:  // resolved before; kept for the switch's completeness
    case Backend::kCpu:
      return run_cpu(job);
    case Backend::kReference:
      return run_reference(job);
    case Backend::kCuda:
#ifdef MOE_WITH_CUDA
      return run_cuda(job);
#else
      break;
#endif
  }
  fail("backend: unsupported backend for routing: {} ({})", backend_name(backend),
       static_cast<int>(backend));
}

}  // namespace

void select_experts(const RoutingConfig& config, const TensorView& logits,
                    const RoutingInputs& inputs, const TensorView& topk_ids,
                    const TensorView& topk_weights, const TensorView& expert_counts,
                    Backend backend, int num_threads, void* cuda_stream) {
  check_config(config);
  check_rank(logits, "logits", 2);
  const Device device = logits.device;
  const int64_t num_tokens = logits.size(0);
  if (logits.size(1) != config.num_experts) {
    fail("logits: expected shape [M, num_experts] = [{}, {}]; got {}", num_tokens,
         config.num_experts, shape_string(logits.shape));
  }
  check_tensor(logits, "logits", device, {DType::kF32}, {num_tokens, config.num_experts});
  check_bias(inputs.correction_bias, "correction_bias", config.has_correction_bias,
             "has_correction_bias", config.num_experts, device);
  if (!inputs.router_bias.empty()) {
    fail(
        "router_bias: select_experts takes logits that already include the router bias; got a "
        "router_bias tensor (pass it to route() instead, or leave it empty)");
  }
  check_outputs(config, num_tokens, topk_ids, topk_weights, expert_counts, device);
  const Backend chosen = resolve_backend(backend, device, "logits");

  const Job job{config,
                num_tokens,
                nullptr,
                nullptr,
                nullptr,
                logits.as<float>(),
                inputs.correction_bias.as<float>(),
                topk_ids.as<int32_t>(),
                topk_weights.as<float>(),
                expert_counts.as<int32_t>(),
                num_threads,
                cuda_stream};
  run(chosen, job);
}

void route(const RoutingConfig& config, const TensorView& hidden, const TensorView& router_weight,
           const RoutingInputs& inputs, const TensorView& topk_ids, const TensorView& topk_weights,
           const TensorView& expert_counts, Backend backend, int num_threads, void* cuda_stream) {
  check_config(config);
  check_rank(hidden, "hidden", 2);
  check_rank(router_weight, "router_weight", 2);
  const Device device = hidden.device;
  const int64_t num_tokens = hidden.size(0);
  const int64_t hidden_size = hidden.size(1);
  if (router_weight.shape != Shape{config.num_experts, hidden_size}) {
    fail("router_weight: expected shape [num_experts, H] = [{}, {}]; got {}", config.num_experts,
         hidden_size, shape_string(router_weight.shape));
  }
  check_tensor(hidden, "hidden", device, {DType::kF32, DType::kBF16, DType::kF16},
               {num_tokens, hidden_size});
  check_tensor(router_weight, "router_weight", device, {DType::kF32, DType::kBF16, DType::kF16},
               {config.num_experts, hidden_size});
  check_bias(inputs.correction_bias, "correction_bias", config.has_correction_bias,
             "has_correction_bias", config.num_experts, device);
  check_bias(inputs.router_bias, "router_bias", config.has_router_bias, "has_router_bias",
             config.num_experts, device);
  check_outputs(config, num_tokens, topk_ids, topk_weights, expert_counts, device);
  const Backend chosen = resolve_backend(backend, device, "hidden");

  const Job job{config,
                num_tokens,
                &hidden,
                &router_weight,
                inputs.router_bias.as<float>(),
                nullptr,
                inputs.correction_bias.as<float>(),
                topk_ids.as<int32_t>(),
                topk_weights.as<float>(),
                expert_counts.as<int32_t>(),
                num_threads,
                cuda_stream};
  run(chosen, job);
}

RoutingOutput route(const RoutingConfig& config, const TensorView& hidden,
                    const TensorView& router_weight, const RoutingInputs& inputs, Backend backend,
                    int num_threads) {
  check_config(config);
  check_rank(hidden, "hidden", 2);
  if (hidden.device != Device::kCpu) {
    fail(
        "hidden: a GPU tensor, but the allocating route() returns host tensors; pass device "
        "topk_ids and topk_weights to route(config, hidden, router_weight, inputs, topk_ids, "
        "topk_weights, ...)");
  }
  RoutingOutput out{Tensor(DType::kI32, {hidden.size(0), config.top_k}),
                    Tensor(DType::kF32, {hidden.size(0), config.top_k}),
                    Tensor(DType::kI32, {config.num_experts})};
  route(config, hidden, router_weight, inputs, out.topk_ids, out.topk_weights, out.expert_counts,
        backend, num_threads);
  return out;
}

}  // namespace moe
