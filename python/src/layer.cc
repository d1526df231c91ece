// MoeLayer: router + expert weights + experts kernel, owned by Python.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "bindings.h"
#include "devices.h"
#include "moe/checkpoint.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "tensors.h"

namespace moe::python {

namespace nb = nanobind;

namespace {

// forward() releases the GIL while it computes, so two Python threads could reach one layer at
// once; the mutex keeps them from sharing its workspace and its record of the last call.
struct PyLayer {
  explicit PyLayer(MoeLayer moe_layer) : layer(std::move(moe_layer)) {}
  MoeLayer layer;
  std::mutex mutex;
  // The cpu backend keeps the expert weights packed only; `weights` unpacks them once, here.
  std::optional<LayerWeights> unpacked;
};

// Every way of building a layer ends here, so each gets the same options and checks.
std::unique_ptr<PyLayer> make_layer(MoeConfig config, LayerWeights weights,
                                    const std::string& backend, int num_threads, int64_t block_m) {
  LayerOptions options;
  options.backend = parse_backend(backend);
  options.num_threads = num_threads;
  options.block_m = block_m;
  return std::make_unique<PyLayer>(MoeLayer(std::move(config), std::move(weights), options));
}

// A preset name, a config.json path (str or os.PathLike) or a MoeConfig.
MoeConfig config_from(nb::handle preset) {
  MoeConfig config;
  if (nb::try_cast(preset, config)) return config;
  if (nb::hasattr(preset, "__fspath__")) {
    return resolve_config(nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(preset)));
  }
  if (nb::isinstance<nb::str>(preset)) return resolve_config(nb::cast<std::string>(preset));
  fail("preset: expected a preset name, a config.json path or a MoeConfig; got {}",
       nb::cast<std::string>(nb::type_name(preset.type())));
}

// The weights' dtype of a layer built here: f32, bf16 or f16.
DType layer_dtype(const std::string& dtype_name) {
  const DType dtype = parse_dtype(dtype_name);
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    fail("dtype: expected \"f32\", \"bf16\" or \"f16\"; got \"{}\"", dtype_name);
  }
  return dtype;
}

std::unique_ptr<PyLayer> synthetic(nb::handle preset, const std::string& dtype_name, uint64_t seed,
                                   const std::string& backend, int num_threads, int64_t block_m) {
  const MoeConfig config = config_from(preset);
  const DType dtype = layer_dtype(dtype_name);
  // Checked before any weight is generated: sizes come straight from the caller.
  validate(config);
  LayerWeights weights;
  {
    nb::gil_scoped_release release;
    weights = synthetic_layer_weights(config, dtype, seed);
  }
  return make_layer(config, std::move(weights), backend, num_threads, block_m);
}

// Layer `layer` (None: the first MoE layer) of the Hugging Face checkpoint in folder `dir` (str or
// os.PathLike).
std::unique_ptr<PyLayer> from_checkpoint(nb::handle dir, std::optional<int64_t> layer,
                                         const std::string& dtype_name, const std::string& backend,
                                         int num_threads, int64_t block_m) {
  if (!nb::isinstance<nb::str>(dir) && !nb::hasattr(dir, "__fspath__")) {
    fail("dir: expected a checkpoint folder path (str or os.PathLike); got {}",
         nb::cast<std::string>(nb::type_name(dir.type())));
  }
  const std::string path = nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(dir));
  const DType dtype = layer_dtype(dtype_name);
  MoeConfig config;
  LayerWeights weights;
  {
    nb::gil_scoped_release release;
    const Checkpoint checkpoint = Checkpoint::open(path);
    config = checkpoint.config();
    weights = load_moe_layer(checkpoint, layer.value_or(config.first_moe_layer()), dtype);
  }
  return make_layer(std::move(config), std::move(weights), backend, num_threads, block_m);
}

// Runs `f` under the layer's mutex, without the GIL while waiting or computing.
template <typename F>
auto locked(PyLayer& self, F&& f) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(self.mutex);
  return f();
}

nb::object forward(PyLayer& self, nb::handle hidden, nb::handle out, nb::handle stream) {
  const ArrayArg input = borrow_array(hidden, "hidden");
  ArrayArg given_out = out.is_none() ? ArrayArg{} : borrow_output(out, "out");
  const CallDevice call = call_device({&input, &given_out}, hidden, stream);
  const DeviceScope scope(call);
  nb::object result = nb::borrow(out);
  if (out.is_none()) {
    // Sized from hidden before the layer has checked it, so its rank and dtype come first.
    check_rank(input.view, "hidden", 2);
    check_dtype(input.view, "hidden", {DType::kF32, DType::kBF16, DType::kF16});
    NewArray fresh = new_array(input.view.dtype, input.view.shape, call, hidden);
    result = std::move(fresh.object);
    given_out.view = fresh.view;
  }
  locked(self, [&] { self.layer.forward(input.view, given_out.view, call.stream); });
  return result;
}

// The layer reuses these buffers on the next forward, so Python gets copies.
nb::object last_copy(PyLayer& self, TensorView (MoeLayer::*buffer)() const) {
  Tensor copy = locked(self, [&] {
    const TensorView view = (self.layer.*buffer)();
    return Tensor::copy_of(view, view.dtype);
  });
  return to_python(std::move(copy), Framework::kNumpy);
}

nb::dict last_stage_times(PyLayer& self) {
  const StageTimes t = locked(self, [&] { return self.layer.last_stage_times(); });
  nb::dict times;
  times["route"] = t.route_us;
  times["align"] = t.align_us;
  times["gemm1"] = t.gemm1_us;
  times["act"] = t.act_us;
  times["gemm2"] = t.gemm2_us;
  times["sum"] = t.sum_us;
  times["shared"] = t.shared_us;
  return times;
}

// Read-only views; each keeps the layer alive. The expert weights of a cpu layer are unpacked
// copies made on first use; the rest are zero-copy.
nb::dict weights(nb::handle self_object) {
  PyLayer& self = nb::cast<PyLayer&>(self_object);
  const LayerWeights& w = locked(self, [&]() -> const LayerWeights& {
    if (!self.unpacked) self.unpacked = self.layer.unpacked_weights();
    return *self.unpacked;
  });
  nb::dict views;
  const std::pair<const char*, const Tensor*> named[] = {{"router", &w.router},
                                                         {"router_bias", &w.router_bias},
                                                         {"correction_bias", &w.correction_bias},
                                                         {"w13", &w.w13},
                                                         {"w2", &w.w2},
                                                         {"w13_bias", &w.w13_bias},
                                                         {"w2_bias", &w.w2_bias},
                                                         {"shared_w13", &w.shared_w13},
                                                         {"shared_w2", &w.shared_w2},
                                                         {"shared_gate", &w.shared_gate}};
  for (const auto& [name, tensor] : named) {
    if (tensor->defined()) views[name] = numpy_view(tensor->view(), self_object);
  }
  return views;
}

}  // namespace

void bind_layer(nb::module_& m) {
  nb::class_<PyLayer>(m, "MoeLayer",
                      "One MoE layer: router, expert weights and experts kernel, with a "
                      "workspace reused across calls. Build one with MoeLayer.synthetic() or "
                      "MoeLayer.from_checkpoint().")
      .def_static("synthetic", &synthetic, nb::arg("preset"), nb::arg("dtype") = "bf16",
                  nb::arg("seed") = 0, nb::kw_only(), nb::arg("backend") = "auto",
                  nb::arg("num_threads") = 0, nb::arg("block_m") = 0,
                  R"(A layer with deterministic synthetic weights, scaled like a trained model's.

preset is a preset name (see preset_names()), a path to a config.json or a checkpoint folder
holding one, or a MoeConfig. dtype ("f32", "bf16" or "f16") is the weights' type; the same seed
gives the same weights on every machine. backend ("auto", "cpu", "reference" or "cuda": the
weights go to the current GPU, bf16 SiLU layers only so far), num_threads
(0: all cores) and block_m (0: the backend's choice) apply to every forward.)")
      .def_static("from_checkpoint", &from_checkpoint, nb::arg("dir"),
                  nb::arg("layer") = nb::none(), nb::kw_only(), nb::arg("dtype") = "f32",
                  nb::arg("backend") = "auto", nb::arg("num_threads") = 0, nb::arg("block_m") = 0,
                  R"(The MoE block of decoder layer `layer` of a Hugging Face checkpoint.

dir is the checkpoint folder (str or os.PathLike): config.json and model.safetensors, or shards
listed by model.safetensors.index.json. layer is 0-based; None picks the first MoE layer. dtype
("f32", "bf16" or "f16") is the weights' type once loaded (biases stay f32; fp8 weights are
dequantized). backend, num_threads and block_m are as for synthetic(). Raises MoeError naming the
file or tensor at fault, or listing the MoE layers when `layer` is dense or out of range.)")
      .def("forward", &forward, nb::arg("hidden"), nb::kw_only(), nb::arg("out") = nb::none(),
           nb::arg("stream") = nb::none(),
           R"(hidden [M, H] float32/bfloat16/float16 -> out [M, H] of the same dtype and device.

Writes out when given and returns it; otherwise returns a new array: a torch tensor for a torch
hidden, else a NumPy array (or a DLPack array in GPU memory for another CUDA array). A layer
built with backend="cuda" keeps its weights on the GPU that was current when it was built and
takes bf16 hidden in host memory or on that GPU; it runs on `stream` (a cudaStream_t as an int;
default: torch's current stream for a torch hidden, else the legacy default stream 0) and waits
for it before returning, since it records the routing and stage times on the host.)")
      .def_prop_ro(
          "config", [](PyLayer& self) { return self.layer.config(); }, "The layer's MoeConfig.")
      .def_prop_ro("weights", &weights,
                   "dict of name -> read-only NumPy array of the layer's weights (router, w13 "
                   "[E, 2I, H], w2 [E, H, I], and the optional biases and shared experts). "
                   "A cpu layer keeps its expert weights packed for its kernels; those are "
                   "unpacked once, on first use.")
      .def_prop_ro("last_stage_times", &last_stage_times,
                   "Wall time of each stage of the last forward, in microseconds: route, align, "
                   "gemm1, act, gemm2, sum, shared.")
      .def_prop_ro(
          "last_topk_ids", [](PyLayer& self) { return last_copy(self, &MoeLayer::last_topk_ids); },
          "The experts the last forward chose: [M, k] int32 NumPy array (a copy).")
      .def_prop_ro(
          "last_topk_weights",
          [](PyLayer& self) { return last_copy(self, &MoeLayer::last_topk_weights); },
          "The router weights of the last forward: [M, k] float32 NumPy array (a copy).")
      .def_prop_ro(
          "last_expert_counts",
          [](PyLayer& self) { return last_copy(self, &MoeLayer::last_expert_counts); },
          "Pairs per expert in the last forward: [E] int32 NumPy array (a copy).");
}

}  // namespace moe::python
