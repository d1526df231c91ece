// MoeConfig as an immutable Python value: the MoE-layer fields as read-only properties, and
// replace(**changes) for variants (a small layer for a test, another expert count).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "moe/config.h"
#include "moe/error.h"
#include "names.h"

namespace moe::python {

namespace nb = nanobind;

namespace {

// One row per Python field. `set` is null for fields that follow from the rest of the model
// (layer counts), which a variant of one MoE layer has no reason to change.
struct Field {
  const char* name;
  const char* doc;
  nb::object (*get)(const MoeConfig&);
  void (*set)(MoeConfig&, nb::handle);
};

const Field kFields[] = {
    {"name", "Preset name, or model_type for a config.json.",
     [](const MoeConfig& c) -> nb::object { return nb::str(c.name.c_str()); },
     [](MoeConfig& c, nb::handle v) { c.name = nb::cast<std::string>(v); }},
    {"model_type", "Hugging Face model_type (\"qwen3_moe\", \"deepseek_v3\", ...).",
     [](const MoeConfig& c) -> nb::object { return nb::str(c.model_type.c_str()); },
     [](MoeConfig& c, nb::handle v) { c.model_type = nb::cast<std::string>(v); }},
    {"num_experts", "E, routed experts.",
     [](const MoeConfig& c) { return nb::cast(c.routing.num_experts); },
     [](MoeConfig& c, nb::handle v) { c.routing.num_experts = nb::cast<int64_t>(v); }},
    {"top_k", "k, experts per token.", [](const MoeConfig& c) { return nb::cast(c.routing.top_k); },
     [](MoeConfig& c, nb::handle v) { c.routing.top_k = nb::cast<int64_t>(v); }},
    {"scoring", "\"softmax\" or \"sigmoid\".",
     [](const MoeConfig& c) -> nb::object {
       return nb::str(std::string(scoring_name(c.routing.scoring)).c_str());
     },
     [](MoeConfig& c, nb::handle v) {
       c.routing.scoring = parse_scoring(nb::cast<std::string>(v), "scoring");
     }},
    {"renormalize", "Whether the k kept weights are divided by their sum.",
     [](const MoeConfig& c) { return nb::cast(c.routing.renormalize); },
     [](MoeConfig& c, nb::handle v) { c.routing.renormalize = nb::cast<bool>(v); }},
    {"num_groups", "Expert groups of group-limited top-k (1: no groups).",
     [](const MoeConfig& c) { return nb::cast(c.routing.num_groups); },
     [](MoeConfig& c, nb::handle v) { c.routing.num_groups = nb::cast<int64_t>(v); }},
    {"topk_groups", "Groups a token may pick its experts from.",
     [](const MoeConfig& c) { return nb::cast(c.routing.topk_groups); },
     [](MoeConfig& c, nb::handle v) { c.routing.topk_groups = nb::cast<int64_t>(v); }},
    {"has_correction_bias", "Whether a selection-only score bias is used (DeepSeek-V3).",
     [](const MoeConfig& c) { return nb::cast(c.routing.has_correction_bias); },
     [](MoeConfig& c, nb::handle v) { c.routing.has_correction_bias = nb::cast<bool>(v); }},
    {"has_router_bias", "Whether the router logits get a bias (gpt-oss).",
     [](const MoeConfig& c) { return nb::cast(c.routing.has_router_bias); },
     [](MoeConfig& c, nb::handle v) { c.routing.has_router_bias = nb::cast<bool>(v); }},
    {"routed_scaling_factor", "Multiplies the routed experts' weights.",
     [](const MoeConfig& c) { return nb::cast(c.routing.routed_scaling_factor); },
     [](MoeConfig& c, nb::handle v) { c.routing.routed_scaling_factor = nb::cast<float>(v); }},
    {"apply_router_weight_on_input",
     "Whether the router weight scales the expert's input (Llama-4).",
     [](const MoeConfig& c) { return nb::cast(c.routing.apply_weight_on_input); },
     [](MoeConfig& c, nb::handle v) { c.routing.apply_weight_on_input = nb::cast<bool>(v); }},
    {"hidden_size", "H.", [](const MoeConfig& c) { return nb::cast(c.experts.hidden_size); },
     [](MoeConfig& c, nb::handle v) { c.experts.hidden_size = nb::cast<int64_t>(v); }},
    {"intermediate_size", "I, per routed expert.",
     [](const MoeConfig& c) { return nb::cast(c.experts.intermediate_size); },
     [](MoeConfig& c, nb::handle v) { c.experts.intermediate_size = nb::cast<int64_t>(v); }},
    {"activation", "\"silu\", \"gelu\", \"gelu_tanh\" or \"clamped_swiglu\".",
     [](const MoeConfig& c) -> nb::object {
       return nb::str(std::string(activation_name(c.experts.activation)).c_str());
     },
     [](MoeConfig& c, nb::handle v) {
       c.experts.activation = parse_activation(nb::cast<std::string>(v), "activation");
     }},
    {"has_expert_bias", "Whether both expert projections have biases (gpt-oss).",
     [](const MoeConfig& c) { return nb::cast(c.experts.has_bias); },
     [](MoeConfig& c, nb::handle v) { c.experts.has_bias = nb::cast<bool>(v); }},
    {"shared_intermediate_size", "Intermediate size of the shared experts (0: none).",
     [](const MoeConfig& c) { return nb::cast(c.experts.shared_intermediate_size); },
     [](MoeConfig& c, nb::handle v) { c.experts.shared_intermediate_size = nb::cast<int64_t>(v); }},
    {"shared_gate", "Whether the shared experts' output is scaled by a sigmoid gate (Qwen2-MoE).",
     [](const MoeConfig& c) { return nb::cast(c.experts.shared_gate); },
     [](MoeConfig& c, nb::handle v) { c.experts.shared_gate = nb::cast<bool>(v); }},
    {"num_layers", "Decoder layers of the whole model.",
     [](const MoeConfig& c) { return nb::cast(c.num_layers); }, nullptr},
    {"num_moe_layers", "Decoder layers whose FFN is a MoE layer.",
     [](const MoeConfig& c) { return nb::cast(c.num_moe_layers()); }, nullptr},
};

const Field* find_field(std::string_view name) {
  for (const Field& field : kFields) {
    if (name == field.name && field.set != nullptr) return &field;
  }
  return nullptr;
}

std::string replaceable_names() {
  std::string names;
  for (const Field& field : kFields) {
    if (field.set == nullptr) continue;
    if (!names.empty()) names += ", ";
    names += field.name;
  }
  return names;
}

MoeConfig replace(const MoeConfig& config, const nb::kwargs& changes) {
  MoeConfig changed = config;
  for (auto [key, value] : changes) {
    const std::string name = nb::cast<std::string>(key);
    const Field* field = find_field(name);
    if (field == nullptr) {
      fail("{}: not a field replace() can change; expected one of {}", name, replaceable_names());
    }
    try {
      field->set(changed, value);
    } catch (const nb::cast_error&) {
      fail("{}: expected a value like {}; got {}", name,
           nb::cast<std::string>(nb::repr(field->get(config))),
           nb::cast<std::string>(nb::repr(value)));
    }
  }
  validate(changed);
  return changed;
}

std::string repr(const MoeConfig& config) {
  std::string text = "MoeConfig(";
  for (const Field& field : kFields) {
    if (&field != kFields) text += ", ";
    text += field.name;
    text += '=';
    text += nb::cast<std::string>(nb::repr(field.get(config)));
  }
  return text + ")";
}

}  // namespace

void bind_config(nb::module_& m) {
  nb::class_<MoeConfig> cls(m, "MoeConfig",
                            "The shape of a model's MoE layers: routing, experts and layer "
                            "counts. Immutable; replace() returns a changed copy.");
  for (const Field& field : kFields) {
    cls.def_prop_ro(field.name, field.get, field.doc);
  }
  cls.def("replace", &replace,
          "A copy with the given fields changed (keywords named like the properties), "
          "validated: replace(hidden_size=64, num_experts=8).");
  cls.def("__repr__", &repr);

  m.def(
      "preset_config", [](const std::string& name) { return preset_config(name); }, nb::arg("name"),
      "The built-in configuration `name` (see preset_names()); raises MoeError listing the "
      "presets for an unknown name.");
  m.def("preset_names", &preset_names, "The names of the built-in presets.");
}

}  // namespace moe::python
