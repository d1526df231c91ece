// One function per concept adds its classes and functions to the _moe_engine module.
#pragma once

#include <nanobind/nanobind.h>

namespace moe::python {

void bind_config(nanobind::module_& m);
void bind_routing(nanobind::module_& m);
void bind_align(nanobind::module_& m);
void bind_experts(nanobind::module_& m);
void bind_layer(nanobind::module_& m);

}  // namespace moe::python
