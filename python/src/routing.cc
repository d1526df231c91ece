// route(): vLLM-style routing of hidden states to their top-k experts.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>
#include <tuple>

#include "bindings.h"
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
                                            const std::string& backend, int num_threads) {
  const ArrayArg hidden = borrow_array(hidden_states, "hidden_states");
  const ArrayArg router = borrow_array(router_weight, "router_weight");
  const ArrayArg correction = borrow_optional(correction_bias, "correction_bias");
  const ArrayArg bias = borrow_optional(router_bias, "router_bias");
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

  RoutingOutput out;
  try {
    nb::gil_scoped_release release;
    out = route(config, hidden.view, router.view, inputs, chosen, num_threads);
  } catch (const Error& e) {
    rethrow_renamed(e, kRouteNames);
  }
  const Framework framework = framework_of(hidden_states);
  return {to_python(std::move(out.topk_ids), framework),
          to_python(std::move(out.topk_weights), framework)};
}

}  // namespace

void bind_routing(nb::module_& m) {
  m.def("route", &route_py, nb::arg("hidden_states"), nb::arg("router_weight"), nb::kw_only(),
        nb::arg("top_k"), nb::arg("scoring") = "softmax", nb::arg("renormalize") = false,
        nb::arg("num_groups") = 1, nb::arg("topk_groups") = 1,
        nb::arg("correction_bias") = nb::none(), nb::arg("router_bias") = nb::none(),
        nb::arg("routed_scaling_factor") = 1.0f, nb::arg("backend") = "auto",
        nb::arg("num_threads") = 0,
        R"(Routes each token to its top-k experts.

logits = hidden_states [M, H] @ router_weight [E, H]^T (+ router_bias [E] f32); scores are
softmax or sigmoid of the logits; correction_bias [E] f32 is added to the scores for selection
only (DeepSeek-V3); with num_groups > 1 a token first keeps its topk_groups best groups. The
weights are the unbiased scores of the chosen experts, divided by their sum when renormalize,
then multiplied by routed_scaling_factor. Ties go to the lower expert id.

Returns (topk_ids [M, top_k] int32, topk_weights [M, top_k] float32), each token's experts in
descending score, as torch tensors for a torch hidden_states, else as NumPy arrays.)");
}

}  // namespace moe::python
