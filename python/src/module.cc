// The _moe_engine extension module: moe_engine's compiled half. Python code imports it through
// the moe_engine package, which re-exports everything here.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "moe/backend.h"
#include "moe/error.h"

namespace nb = nanobind;

NB_MODULE(_moe_engine, m) {
  m.doc() = "moe-engine's Mixture-of-Experts kernels and layers (import moe_engine instead).";
  m.attr("__version__") = MOE_ENGINE_VERSION;
  // A ValueError: moe::Error reports bad arguments (a shape, dtype, id or name) or an unusable
  // file, and code that already catches ValueError for bad arguments keeps working.
  nb::exception<moe::Error>(m, "MoeError", PyExc_ValueError);
  m.def("cuda_available", &moe::cuda_available,
        "Whether this build has the CUDA backend (it was built where nvcc was found).");
  moe::python::bind_config(m);
  moe::python::bind_routing(m);
  moe::python::bind_align(m);
  moe::python::bind_experts(m);
  moe::python::bind_layer(m);
}
