// cuda::SharedExperts against the reference backend: the routed sum from fused_experts on the GPU,
// then the shared experts added into it on the same stream, compared with the reference's routed
// plus shared experts in f32 (bf16 relative error under 1e-2, as every CUDA experts test). Gated
// (Qwen2-MoE) and not (DeepSeek-V3), Is != I and above one block of columns, H a multiple of 8 and
// not (the gate's unaligned loads), M = 0, 1, odd, and more rows than one chunk. Then the refusals:
// weights of the wrong dtype, shape or device before anything is allocated, and overlapping
// hidden and out before anything is queued.
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "experts/experts_case.h"
#include "kernels/cuda/fused_experts.h"
#include "kernels/cuda/shared_experts.h"
#include "moe/experts.h"

namespace moe {
namespace {

using testing::DeviceTensor;
using testing::expect_error;
using testing::ExpertsCase;
using testing::ExpertsInputs;

constexpr double kBf16Tolerance = 1e-2;

ExpertsCase shared_case(int64_t M, int64_t H, int64_t Is, bool gated, uint64_t seed) {
  ExpertsCase c;
  c.num_tokens = M;
  c.hidden_size = H;
  c.intermediate_size = 24;
  c.num_experts = 8;
  c.top_k = 2;
  c.dtype = DType::kBF16;
  c.weight_dtype = DType::kBF16;
  c.shared_intermediate_size = Is;
  c.shared_gate = gated;
  c.seed = seed;
  return c;
}

// The routed experts through the public call, then the shared experts added to their output.
Tensor run_routed_then_shared(const ExpertsInputs& in) {
  const DeviceTensor hidden(in.hidden), w13(in.w13), w2(in.w2), weights(in.topk_weights),
      ids(in.topk_ids);
  // NaN-poisoned: a row the routed sum left unwritten stays NaN through the shared add.
  const DeviceTensor out = DeviceTensor::empty_like(in.hidden.dtype(), in.hidden.shape());
  ExpertsOptions routed = in.options;
  routed.shared = {};
  const int64_t M = in.hidden.size(0);
  if (M > 0) fused_experts(hidden, w13, w2, weights, ids, out, routed);
  const cuda::SharedExperts shared(in.shared_w13, in.shared_w2, in.shared_gate);
  cuda::SharedExpertsWorkspace workspace;
  shared.run(hidden.view().data, M, out.view().data, workspace, nullptr);
  return out.to_host();
}

void expect_matches_reference(const ExpertsCase& c) {
  SCOPED_TRACE(c.describe());
  const ExpertsInputs in = make_inputs(c);
  const Tensor got = run_routed_then_shared(in);
  const testing::Comparison cmp =
      testing::compare(Tensor::copy_of(got, DType::kF32), run_reference_f32(in));
  EXPECT_FALSE(cmp.nan_mismatch) << cmp.describe();
  EXPECT_LT(cmp.max_rel_error, kBf16Tolerance) << cmp.describe();
}

class CudaSharedExperts : public testing::GpuTest {};

TEST_F(CudaSharedExperts, MatchTheReferenceAfterTheRoutedSum) {
  struct Shape {
    int64_t H, Is;
    bool gated;
  };
  // 1100 columns take two blocks per token; H 70 is not a multiple of 8.
  for (const Shape& s : {Shape{64, 48, true}, Shape{64, 48, false}, Shape{70, 40, true},
                         Shape{128, 1100, true}, Shape{96, 1100, false}}) {
    for (int64_t M : {0, 1, 7, 33}) {
      expect_matches_reference(shared_case(M, s.H, s.Is, s.gated, static_cast<uint64_t>(M + s.Is)));
    }
  }
}

TEST_F(CudaSharedExperts, MatchTheReferenceOverSeveralChunks) {
  // Three rows past the first chunk of kChunkTokens (the small Is leaves the token cap binding).
  expect_matches_reference(shared_case(cuda::kChunkTokens + 3, 64, 48, true, 5));
}

TEST_F(CudaSharedExperts, RefuseOverlappingHiddenAndOutBeforeQueueing) {
  const ExpertsInputs in = make_inputs(shared_case(4, 64, 48, true, 1));
  const cuda::SharedExperts shared(in.shared_w13, in.shared_w2, in.shared_gate);
  cuda::SharedExpertsWorkspace workspace;
  const DeviceTensor hidden(in.hidden);
  void* rows = hidden.view().data;
  expect_error([&] { shared.run(rows, 4, rows, workspace, nullptr); },
               {"hidden and out not to overlap"});
  expect_error([&] { shared.run(rows, 4, static_cast<char*>(rows) + 64 * 2, workspace, nullptr); },
               {"hidden and out not to overlap"});
  expect_error([&] { shared.run(rows, -1, rows, workspace, nullptr); }, {"num_tokens >= 0", "-1"});
  EXPECT_EQ(workspace.bytes(), 0u) << "nothing allocated for refused calls";
  expect_error([&] { cuda::SharedExperts().run(rows, 1, nullptr, workspace, nullptr); },
               {"has none to run"});
}

// Refused before any CUDA call, so these run on machines without a GPU too.
TEST(CudaSharedExpertsWeights, AreRefusedByNameBeforeAnythingIsAllocated) {
  const int64_t H = 64, Is = 48;
  const Tensor w13 = testing::random_normal(DType::kBF16, {2 * Is, H}, 1);
  const Tensor w2 = testing::random_normal(DType::kBF16, {H, Is}, 2);
  const Tensor gate = testing::random_normal(DType::kBF16, {1, H}, 3);
  const Tensor w13_f32 = Tensor::copy_of(w13, DType::kF32);
  expect_error([&] { const cuda::SharedExperts s(w13_f32, w2, gate); },
               {"shared_w13", "expected dtype bf16", "got f32"});
  const Tensor odd = testing::random_normal(DType::kBF16, {2 * Is - 1, H}, 4);
  expect_error([&] { const cuda::SharedExperts s(odd, w2, gate); },
               {"shared_w13", "[2 * Is, H]", "[95, 64]"});
  const Tensor w2_wrong = testing::random_normal(DType::kBF16, {H, Is + 1}, 5);
  expect_error([&] { const cuda::SharedExperts s(w13, w2_wrong, gate); },
               {"shared_w2", "[64, 48]", "[64, 49]"});
  const Tensor gate_wrong = testing::random_normal(DType::kBF16, {2, H}, 6);
  expect_error([&] { const cuda::SharedExperts s(w13, w2, gate_wrong); },
               {"shared_gate", "[1, 64] or [64]", "[2, 64]"});
  const TensorView on_gpu(w13.data<void>(), DType::kBF16, w13.shape(), Device::kCuda);
  expect_error([&] { const cuda::SharedExperts s(on_gpu, w2, gate); },
               {"shared_w13", "on the CPU", "on the GPU"});
}

}  // namespace
}  // namespace moe
