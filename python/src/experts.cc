// fused_experts(): the experts half of a MoE layer, with vLLM's argument order and meaning.
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.h"
#include "devices.h"
#include "errors.h"
#include "moe/experts.h"
#include "names.h"
#include "tensors.h"

namespace moe::python {

namespace nb = nanobind;

namespace {

// vLLM's names for what the C++ API calls hidden, w13 and w13_bias.
const ArgumentNames kExpertsNames = {
    {"hidden", "hidden_states"}, {"w13", "w1"}, {"w13_bias", "w1_bias"}};

nb::object fused_experts_py(nb::handle hidden_states, nb::handle w1, nb::handle w2,
                            nb::handle topk_weights, nb::handle topk_ids,
                            const std::string& activation, bool apply_router_weight_on_input,
                            nb::handle w1_bias, nb::handle w2_bias, nb::handle expert_map,
                            int64_t block_m, const std::string& backend, int num_threads,
                            nb::handle out, nb::handle stream) {
  const ArrayArg hidden = borrow_array(hidden_states, "hidden_states");
  const ArrayArg w13 = borrow_array(w1, "w1");
  const ArrayArg w2_arg = borrow_array(w2, "w2");
  const ArrayArg weights = borrow_array(topk_weights, "topk_weights");
  const ArrayArg ids = borrow_array(topk_ids, "topk_ids");
  const ArrayArg b13 = borrow_optional(w1_bias, "w1_bias");
  const ArrayArg b2 = borrow_optional(w2_bias, "w2_bias");
  const ArrayArg map = borrow_optional(expert_map, "expert_map");
  const ArrayArg given_out = out.is_none() ? ArrayArg{} : borrow_output(out, "out");
  const CallDevice call = call_device(
      {&hidden, &w13, &w2_arg, &weights, &ids, &b13, &b2, &map, &given_out}, hidden_states, stream);
  const DeviceScope scope(call);

  ExpertsOptions options;
  options.activation = parse_activation(activation, "activation");
  options.apply_router_weight_on_input = apply_router_weight_on_input;
  options.w13_bias = b13.view;
  options.w2_bias = b2.view;
  options.expert_map = map.view;
  options.block_m = block_m;
  options.backend = parse_backend(backend);
  options.num_threads = num_threads;
  options.cuda_stream = call.stream;

  // The result goes into out=, or a new array on hidden's device (checked like out= would be).
  nb::object result = nb::borrow(out);
  TensorView out_view = given_out.view;
  if (out.is_none()) {
    check_rank(hidden.view, "hidden_states", 2);
    check_dtype(hidden.view, "hidden_states", {DType::kF32, DType::kBF16, DType::kF16});
    NewArray fresh = new_array(hidden.view.dtype, hidden.view.shape, call, hidden_states);
    result = std::move(fresh.object);
    out_view = fresh.view;
  }
  try {
    nb::gil_scoped_release release;
    fused_experts(hidden.view, w13.view, w2_arg.view, weights.view, ids.view, out_view, options);
  } catch (const Error& e) {
    rethrow_renamed(e, kExpertsNames);
  }
  return result;
}

}  // namespace

void bind_experts(nb::module_& m) {
  m.def("fused_experts", &fused_experts_py, nb::arg("hidden_states"), nb::arg("w1"), nb::arg("w2"),
        nb::arg("topk_weights"), nb::arg("topk_ids"), nb::kw_only(), nb::arg("activation") = "silu",
        nb::arg("apply_router_weight_on_input") = false, nb::arg("w1_bias") = nb::none(),
        nb::arg("w2_bias") = nb::none(), nb::arg("expert_map") = nb::none(), nb::arg("block_m") = 0,
        nb::arg("backend") = "auto", nb::arg("num_threads") = 0, nb::arg("out") = nb::none(),
        nb::arg("stream") = nb::none(),
        R"(Runs the experts of a MoE layer on routed tokens, as vLLM's fused_experts.

hidden_states [M, H] float32/bfloat16/float16; w1 [E, 2I, H] (gate rows, then up rows) and
w2 [E, H, I] of one float dtype; topk_weights [M, k] float32; topk_ids [M, k] int32 (global
expert ids). For each token t and slot j with expert e = topk_ids[t, j]:
  h = act(w1[e, :I] @ x, w1[e, I:] @ x),  y = w2[e] @ h,  out[t] += topk_weights[t, j] * y
(with apply_router_weight_on_input, x is scaled by the weight instead of y). activation is
"silu" (silu(gate) * up), "gelu", "gelu_tanh" or "clamped_swiglu" (vLLM's "swigluoai").
w1_bias [E, 2I] and w2_bias [E, H] are optional; expert_map [E_global] int32 maps global ids to
local ones (-1: not on this rank, contributes zero). block_m 0 and num_threads 0 let the
backend choose; backend is "auto", "cpu", "reference" (the float64 oracle) or "cuda".

CUDA tensors (all on one GPU) run on the CUDA backend (bf16, SiLU, no biases so far) on `stream`
(a cudaStream_t as an int; default: torch's current stream for a torch hidden_states, else the
legacy default stream 0); the call returns once the work is queued.

Writes out [M, H] (hidden_states' dtype and device) when given and returns it; otherwise returns
a new one: a torch tensor for a torch hidden_states, else a NumPy array (or, for another CUDA
array, a DLPack array in GPU memory).)");
}

}  // namespace moe::python
