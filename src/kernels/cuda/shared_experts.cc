#include "kernels/cuda/shared_experts.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/fill_random.h"
#include "kernels/cuda/fused_experts.h"
#include "moe/error.h"

namespace moe::cuda {
namespace {

// The workspace cuBLAS's documentation recommends for Hopper (older GPUs use less of it).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// gate_up and act of one chunk stay under this: DeepSeek-V3 (Is 2048) runs 6553 rows per chunk,
// Qwen2-57B-A14B (Is 20480) 655. Each chunk reads the weights once, so even 655 rows make 655
// flops per weight byte, above the ~200 of an H200's bf16 peak over its memory bandwidth.
constexpr int64_t kChunkBytes = int64_t{128} << 20;

int64_t chunk_tokens(int64_t num_tokens, int64_t intermediate_size) {
  const int64_t row_bytes = intermediate_size * (2 * sizeof(float) + sizeof(uint16_t));
  return std::min({num_tokens, kChunkTokens, std::max<int64_t>(1, kChunkBytes / row_bytes)});
}

void upload(DeviceBuffer& buffer, const TensorView& host) {
  buffer.reserve(std::max<size_t>(host.nbytes(), 1));
  check(cudaMemcpy(buffer.data(), host.data, host.nbytes(), cudaMemcpyHostToDevice),
        "cudaMemcpy (shared-expert weights)");
}

void check_weight(const TensorView& t, const char* name) {
  check_device(t, name, Device::kCpu);
  check_dtype(t, name, {DType::kBF16});
  check_contiguous(t, name);
}

// Dimensions cuBLAS takes as int.
void check_cublas_size(int64_t value, const char* what) {
  if (value > INT_MAX) fail("shared experts on CUDA: {} must fit in an int; got {}", what, value);
}

}  // namespace

SharedExpertsWorkspace::SharedExpertsWorkspace() { check(cublasCreate(&cublas_), "cublasCreate"); }

SharedExpertsWorkspace::~SharedExpertsWorkspace() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);  // nothing to report from a destructor
}

size_t SharedExpertsWorkspace::bytes() const {
  return cublas_workspace_.capacity() + gate_up_.capacity() + act_.capacity();
}

SharedExperts::SharedExperts(const TensorView& w13, const TensorView& w2, const TensorView& gate) {
  check_weight(w13, "shared_w13");
  check_rank(w13, "shared_w13", 2);
  const int64_t two_is = w13.size(0), H = w13.size(1);
  if (two_is < 2 || two_is % 2 != 0 || H < 1) {
    fail("shared_w13: expected [2 * Is, H] with Is >= 1 and H >= 1; got {}",
         shape_string(w13.shape));
  }
  check_cublas_size(two_is, "2 * Is");
  check_cublas_size(H, "H");
  check_weight(w2, "shared_w2");
  check_shape(w2, "shared_w2", {H, two_is / 2});
  if (!gate.empty()) {
    check_weight(gate, "shared_gate");
    if (gate.numel() != H || gate.dim() > 2 || (gate.dim() == 2 && gate.size(0) != 1)) {
      fail("shared_gate: expected shape [1, {}] or [{}]; got {}", H, H, shape_string(gate.shape));
    }
  }
  hidden_size_ = H;
  intermediate_size_ = two_is / 2;
  gated_ = !gate.empty();
  upload(w13_, w13);
  upload(w2_, w2);
  if (gated_) upload(gate_, gate);
}

SharedExperts SharedExperts::random(int64_t hidden_size, int64_t intermediate_size, bool gated,
                                    uint64_t seed) {
  if (hidden_size < 1 || intermediate_size < 1) {
    fail("shared experts: expected H >= 1 and Is >= 1; got H {}, Is {}", hidden_size,
         intermediate_size);
  }
  check_cublas_size(2 * intermediate_size, "2 * Is");
  check_cublas_size(hidden_size, "H");
  SharedExperts s;
  s.hidden_size_ = hidden_size;
  s.intermediate_size_ = intermediate_size;
  s.gated_ = gated;
  const auto fill = [&](DeviceBuffer& buffer, int64_t count, uint64_t id, int64_t fan_in) {
    buffer.reserve(static_cast<size_t>(count) * 2);
    fill_normal_bf16(buffer.data(), count, seed * 4 + id,
                     1.0f / std::sqrt(static_cast<float>(fan_in)), nullptr);
  };
  fill(s.w13_, 2 * intermediate_size * hidden_size, 0, hidden_size);
  fill(s.w2_, hidden_size * intermediate_size, 1, intermediate_size);
  if (gated) fill(s.gate_, hidden_size, 2, hidden_size);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (shared-expert weights)");
  return s;
}

void SharedExperts::check_args(const void* hidden, int64_t num_tokens, const void* out) const {
  if (!defined()) fail("shared experts on CUDA: this layer has none to run");
  if (num_tokens < 0) fail("shared experts on CUDA: expected num_tokens >= 0; got {}", num_tokens);
  if (num_tokens == 0) return;
  if (hidden == nullptr || out == nullptr) {
    fail("shared experts on CUDA: expected hidden and out in device memory; got a null pointer");
  }
  const auto hidden_address = reinterpret_cast<uintptr_t>(hidden);
  const auto out_address = reinterpret_cast<uintptr_t>(out);
  const auto batch_bytes = static_cast<uintptr_t>(num_tokens * hidden_size_ * 2);
  if (hidden_address < out_address + batch_bytes && out_address < hidden_address + batch_bytes) {
    fail(
        "shared experts on CUDA: expected hidden and out not to overlap (out gets the routed sum "
        "before the shared experts read hidden); got {} bytes each from {} and {}",
        batch_bytes, hidden, out);
  }
}

void SharedExperts::run(const void* hidden, int64_t num_tokens, void* out,
                        SharedExpertsWorkspace& workspace, cudaStream_t stream) const {
  check_args(hidden, num_tokens, out);
  if (num_tokens == 0) return;
  const int64_t H = hidden_size_, Is = intermediate_size_;
  const auto* hidden_bytes = static_cast<const char*>(hidden);
  const int64_t chunk = chunk_tokens(num_tokens, Is);
  workspace.cublas_workspace_.reserve(kCublasWorkspaceBytes);
  workspace.gate_up_.reserve(static_cast<size_t>(chunk * 2 * Is) * sizeof(float));
  workspace.act_.reserve(static_cast<size_t>(chunk * Is) * 2);
  const cublasHandle_t handle = workspace.cublas_;
  // cublasSetStream drops a workspace set before it, so the workspace follows it.
  check(cublasSetStream(handle, stream), "cublasSetStream");
  check(cublasSetWorkspace(handle, workspace.cublas_workspace_.data(), kCublasWorkspaceBytes),
        "cublasSetWorkspace");
  auto* gate_up = static_cast<float*>(workspace.gate_up_.data());
  void* act = workspace.act_.data();
  const float one = 1.0f, zero = 0.0f;

  for (int64_t t0 = 0; t0 < num_tokens; t0 += chunk) {
    const int64_t m = std::min(chunk, num_tokens - t0);
    const void* rows = hidden_bytes + t0 * H * 2;
    // Row-major gate_up [m, 2 Is] is column-major [2 Is, m] = w13 (column-major [H, 2 Is],
    // transposed) · hidden^T (column-major [H, m]).
    check(
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(2 * Is),
                     static_cast<int>(m), static_cast<int>(H), &one, w13_.data(), CUDA_R_16BF,
                     static_cast<int>(H), rows, CUDA_R_16BF, static_cast<int>(H), &zero, gate_up,
                     CUDA_R_32F, static_cast<int>(2 * Is), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (shared gemm1)");

    SharedActivationArgs a;
    a.gate_up = gate_up;
    a.hidden = rows;
    a.gate = gated_ ? gate_.data() : nullptr;
    a.num_tokens = m;
    a.hidden_size = H;
    a.intermediate_size = Is;
    a.act = act;
    shared_activation(a, stream);

    // Row-major out [m, H] is column-major [H, m] = w2 (column-major [Is, H], transposed) ·
    // act^T (column-major [Is, m]); beta = 1 adds it to the routed sum already there.
    check(
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(H), static_cast<int>(m),
                     static_cast<int>(Is), &one, w2_.data(), CUDA_R_16BF, static_cast<int>(Is), act,
                     CUDA_R_16BF, static_cast<int>(Is), &one, static_cast<char*>(out) + t0 * H * 2,
                     CUDA_R_16BF, static_cast<int>(H), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (shared gemm2)");
  }
}

}  // namespace moe::cuda
