// route(): vLLM-style routing of hidden states to their top-k experts.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>
#include <tuple>

#include "bindings.h"
#include "devices.h"
#include "errors.h"
#include "moe/routing.h"
#include "names.h"
#include "tensors.h"

namespace moe::python {

namespace nb = nanobind;

namespace {

// The routing config's fields are keyword arguments here.
const ArgumentNames kRouteNames = {{"hidden", "hidden_states"},
                                   {"config.top_k", "top_k"},
                                   {"config.num_groups", "num_groups"},
                                   {"config.topk_groups", "topk_groups"},
                                   {"config.routed_scaling_factor", "routed_scaling_factor"}};

std::tuple<nb::object, nb::object> route_py(nb::handle hidden_states, nb::handle router_weight,
                                            int64_t top_k, const std::string& scoring,
                                            bool renormalize, int64_t num_groups,
                                            int64_t topk_groups, nb::handle correction_bias,
                                            nb::handle router_bias, float routed_scaling_factor,
                                            const std::string& backend, int num_threads,
                                            nb::handle out, nb::handle stream) {
  const ArrayArg hidden = borrow_array(hidden_states, "hidden_states");
  const ArrayArg router = borrow_array(router_weight, "router_weight");
  const ArrayArg correction = borrow_optional(correction_bias, "correction_bias");
  const ArrayArg bias = borrow_optional(router_bias, "router_bias");
  ArrayArg out_ids, out_weights;
  if (!out.is_none()) {
    if (!nb::isinstance<nb::tuple>(out) || nb::len(out) != 2) {
      fail("out: expected a tuple (topk_ids, topk_weights); got {}",
           nb::cast<std::string>(nb::repr(out)));
    }
    out_ids = borrow_output(out[0], "topk_ids");
    out_weights = borrow_output(out[1], "topk_weights");
  }
  const CallDevice call = call_device(
      {&hidden, &router, &correction, &bias, &out_ids, &out_weights}, hidden_states, stream);
  const DeviceScope scope(call);
  // E comes from the router's rows, so its rank is checked before it is read.
  check_rank(router.view, "router_weight", 2);
  if (router.view.size(0) < 1) {
    fail("router_weight: expected [num_experts, H] with num_experts >= 1; got shape {}",
         shape_string(router.view.shape));
  }

  RoutingConfig config;
  config.num_experts = router.view.size(0);
  config.top_k = top_k;
  config.scoring = parse_scoring(scoring, "scoring");
  config.renormalize = renormalize;
  config.num_groups = num_groups;
  config.topk_groups = topk_groups;
  config.has_correction_bias = !correction.view.empty();
  config.has_router_bias = !bias.view.empty();
  config.routed_scaling_factor = routed_scaling_factor;
  const RoutingInputs inputs{correction.view, bias.view};
  const Backend chosen = parse_backend(backend);

  // The results go into out=, or new arrays on hidden's device (checked like out= would be).
  nb::object ids_object, weights_object;
  if (out.is_none()) {
    check_rank(hidden.view, "hidden_states", 2);
    // Sizes the results, so it is checked before they are allocated.
    if (top_k < 1 || top_k > config.num_experts) {
      fail("top_k: expected 1 <= top_k <= num_experts ({}); got {}", config.num_experts, top_k);
    }
    const Shape shape{hidden.view.size(0), top_k};
    NewArray ids = new_array(DType::kI32, shape, call, hidden_states);
    NewArray weights = new_array(DType::kF32, shape, call, hidden_states);
    ids_object = std::move(ids.object);
    weights_object = std::move(weights.object);
    out_ids.view = ids.view;
    out_weights.view = weights.view;
  } else {
    ids_object = out[0];
    weights_object = out[1];
  }
  try {
    nb::gil_scoped_release release;
    route(config, hidden.view, router.view, inputs, out_ids.view, out_weights.view, {}, chosen,
          num_threads, call.stream);
  } catch (const Error& e) {
    rethrow_renamed(e, kRouteNames);
  }
  return {ids_object, weights_object};
}

}  // namespace

void bind_routing(nb::module_& m) {
  m.def("route", &route_py, nb::arg("hidden_states"), nb::arg("router_weight"), nb::kw_only(),
        nb::arg("top_k"), nb::arg("scoring") = "softmax", nb::arg("renormalize") = false,
        nb::arg("num_groups") = 1, nb::arg("topk_groups") = 1,
        nb::arg("correction_bias") = nb::none(), nb::arg("router_bias") = nb::none(),
        nb::arg("routed_scaling_factor") = 1.0f, nb::arg("backend") = "auto",
        nb::arg("num_threads") = 0, nb::arg("out") = nb::none(), nb::arg("stream") = nb::none(),
        R"(Routes each token to its top-k experts.

logits = hidden_states [M, H] @ router_weight [E, H]^T (+ router_bias [E] f32); scores are
softmax or sigmoid of the logits; correction_bias [E] f32 is added to the scores for selection
only (DeepSeek-V3); with num_groups > 1 a token first keeps its topk_groups best groups. The
weights are the unbiased scores of the chosen experts, divided by their sum when renormalize,
then multiplied by routed_scaling_factor. Ties go to the lower expert id.

CUDA tensors (all on one GPU) run on the CUDA backend (bf16 or float32 hidden_states and
router_weight of one dtype, up to 512 experts, top-16) on `stream` (a cudaStream_t as an int;
default: torch's current stream for a torch hidden_states, else the legacy default stream 0);
the call returns once the work is queued.

Returns (topk_ids [M, top_k] int32, topk_weights [M, top_k] float32), each token's experts in
descending score: the arrays of out=(topk_ids, topk_weights) when given, else new ones on
hidden_states' device (torch tensors for a torch hidden_states, else NumPy arrays, or DLPack
arrays in GPU memory for another CUDA array).)");
}

}  // namespace moe::python
