// Bad input to the public routing API: a moe::Error whose message names the argument.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moe/error.h"
#include "moe/routing.h"

namespace moe {
namespace {

// A valid route() call (M = 3, H = 4, E = 8, k = 2) that each test breaks in one place.
struct Call {
  RoutingConfig config;
  std::vector<float> hidden = std::vector<float>(3 * 4, 0.5f);
  std::vector<float> weight = std::vector<float>(8 * 4, 0.25f);
  std::vector<float> bias = std::vector<float>(8, 0.0f);
  std::vector<int32_t> ids = std::vector<int32_t>(3 * 2);
  std::vector<float> weights = std::vector<float>(3 * 2);
  std::vector<int32_t> counts = std::vector<int32_t>(8);
  TensorView hidden_view{hidden.data(), DType::kF32, {3, 4}};
  TensorView weight_view{weight.data(), DType::kF32, {8, 4}};
  TensorView ids_view{ids.data(), DType::kI32, {3, 2}};
  TensorView weights_view{weights.data(), DType::kF32, {3, 2}};
  TensorView counts_view{counts.data(), DType::kI32, {8}};
  RoutingInputs inputs;

  Call() {
    config.num_experts = 8;
    config.top_k = 2;
  }
  void route_it() {
    route(config, hidden_view, weight_view, inputs, ids_view, weights_view, counts_view);
  }
  void select_it() {
    select_experts(config, TensorView(weight.data(), DType::kF32, {3, 8}), inputs, ids_view,
                   weights_view, counts_view);
  }
};

// Runs `f` and expects a moe::Error whose message contains every one of `needles`.
template <typename F>
void expect_error(F f, std::vector<std::string> needles) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos)
          << "message '" << message << "' lacks '" << needle << "'";
    }
    return;
  }
  ADD_FAILURE() << "no moe::Error thrown";
}

TEST(RoutingErrors, ValidCallsPass) {
  Call call;
  call.route_it();
  call.select_it();
}

TEST(RoutingErrors, WrongHiddenShape) {
  Call call;
  call.hidden_view = TensorView(call.hidden.data(), DType::kF32, {12});
  expect_error([&] { call.route_it(); }, {"hidden", "2-D", "[12]"});
}

TEST(RoutingErrors, RouterWeightShapeMustMatchHiddenAndExperts) {
  Call call;
  call.weight_view = TensorView(call.weight.data(), DType::kF32, {4, 8});
  expect_error([&] { call.route_it(); }, {"router_weight", "[8, 4]", "[4, 8]"});
}

TEST(RoutingErrors, WrongOutputShape) {
  Call call;
  call.ids_view = TensorView(call.ids.data(), DType::kI32, {2, 3});
  expect_error([&] { call.route_it(); }, {"topk_ids", "[3, 2]", "[2, 3]"});
  Call counts;
  counts.counts_view = TensorView(counts.counts.data(), DType::kI32, {4});
  expect_error([&] { counts.route_it(); }, {"expert_counts", "[8]", "[4]"});
}

TEST(RoutingErrors, WrongDtype) {
  Call call;
  call.weights_view.dtype = DType::kBF16;
  expect_error([&] { call.route_it(); }, {"topk_weights", "f32", "bf16"});
  Call ids;
  ids.ids_view.dtype = DType::kF32;
  expect_error([&] { ids.route_it(); }, {"topk_ids", "i32", "f32"});
  Call hidden;
  hidden.hidden_view.dtype = DType::kI32;
  expect_error([&] { hidden.route_it(); }, {"hidden", "f32 or bf16 or f16", "i32"});
}

TEST(RoutingErrors, NonContiguousInput) {
  Call call;
  call.hidden_view = TensorView(call.hidden.data(), DType::kF32, {3, 2}, {4, 2}, Device::kCpu);
  call.weight_view = TensorView(call.weight.data(), DType::kF32, {8, 2});
  expect_error([&] { call.route_it(); }, {"hidden", "contiguous"});
}

TEST(RoutingErrors, TopKAboveExperts) {
  Call call;
  call.config.top_k = 9;
  expect_error([&] { call.route_it(); }, {"top_k", "num_experts (8)", "9"});
}

TEST(RoutingErrors, GroupsMustDivideExperts) {
  Call call;
  call.config.num_groups = 3;
  expect_error([&] { call.route_it(); }, {"num_groups", "divisor", "8", "3"});
}

TEST(RoutingErrors, TopKMustFitInTheKeptGroups) {
  Call call;
  call.config.num_groups = 4;
  call.config.topk_groups = 1;
  call.config.top_k = 3;
  expect_error([&] { call.route_it(); }, {"top_k", "kept groups", "2", "3"});
  Call groups;
  groups.config.num_groups = 4;
  groups.config.topk_groups = 5;
  expect_error([&] { groups.route_it(); }, {"topk_groups", "num_groups (4)", "5"});
}

TEST(RoutingErrors, MissingCorrectionBias) {
  Call call;
  call.config.has_correction_bias = true;
  expect_error([&] { call.route_it(); }, {"correction_bias", "has_correction_bias", "[8]"});
  expect_error([&] { call.select_it(); }, {"correction_bias", "has_correction_bias"});
}

TEST(RoutingErrors, UnexpectedOrMisshapenBias) {
  Call call;
  call.inputs.correction_bias = TensorView(call.bias.data(), DType::kF32, {8});
  expect_error([&] { call.route_it(); }, {"correction_bias", "has_correction_bias is false"});
  Call shape;
  shape.config.has_router_bias = true;
  shape.inputs.router_bias = TensorView(shape.bias.data(), DType::kF32, {7});
  expect_error([&] { shape.route_it(); }, {"router_bias", "[8]", "[7]"});
  Call select;
  select.inputs.router_bias = TensorView(select.bias.data(), DType::kF32, {8});
  expect_error([&] { select.select_it(); }, {"router_bias", "route()"});
}

TEST(RoutingErrors, LogitsMustHaveOneColumnPerExpert) {
  Call call;
  expect_error(
      [&] {
        select_experts(call.config, TensorView(call.weight.data(), DType::kF32, {4, 8}),
                       call.inputs, call.ids_view, call.weights_view);
      },
      {"topk_ids", "[4, 2]", "[3, 2]"});
  expect_error(
      [&] {
        select_experts(call.config, TensorView(call.weight.data(), DType::kF32, {3, 6}),
                       call.inputs, call.ids_view, call.weights_view);
      },
      {"logits", "[3, 8]", "[3, 6]"});
}

TEST(RoutingErrors, DeviceAndBackend) {
  // hidden's device is the call's; every other tensor must share it (checked before any launch).
  Call call;
  call.hidden_view.device = Device::kCuda;
  expect_error([&] { call.route_it(); }, {"router_weight", "expected a tensor on the GPU", "CPU"});
  Call weight_on_gpu;
  weight_on_gpu.weight_view.device = Device::kCuda;
  expect_error([&] { weight_on_gpu.route_it(); },
               {"router_weight", "expected a tensor on the CPU", "GPU"});
  Call cuda_on_host;
  expect_error(
      [&] {
        route(cuda_on_host.config, cuda_on_host.hidden_view, cuda_on_host.weight_view,
              cuda_on_host.inputs, cuda_on_host.ids_view, cuda_on_host.weights_view,
              cuda_on_host.counts_view, Backend::kCuda);
      },
      {"backend", "cuda needs tensors in GPU memory"});
  Call backend;
  expect_error(
      [&] {
        route(backend.config, backend.hidden_view, backend.weight_view, backend.inputs,
              backend.ids_view, backend.weights_view, backend.counts_view,
              static_cast<Backend>(42));
      },
      {"unsupported backend", "42"});
}

TEST(RoutingErrors, CpuBackendExpertLimit) {
  Call call;
  call.config.num_experts = 5000;
  std::vector<float> weight(5000 * 4, 0.0f);
  std::vector<int32_t> counts(5000);
  call.weight_view = TensorView(weight.data(), DType::kF32, {5000, 4});
  call.counts_view = TensorView(counts.data(), DType::kI32, {5000});
  expect_error([&] { call.route_it(); }, {"num_experts", "4096", "5000", "reference"});
  route(call.config, call.hidden_view, call.weight_view, call.inputs, call.ids_view,
        call.weights_view, call.counts_view, Backend::kReference);
}

}  // namespace
}  // namespace moe
