// load_moe_layer: one decoder layer's MoE tensors, checked, turned into the engine's orientation
// (gate rows then up rows, [out, in]), converted to the weight dtype and stacked over experts.
// Every tensor is checked before any is converted, so the conversion itself, which runs on all
// cores, cannot fail on bad input. Also MoeLayer::from_checkpoint, built on it.
#include <exception>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/moe_tensor_names.h"
#include "checkpoint/stored_matrix.h"
#include "moe/checkpoint.h"
#include "moe/error.h"
#include "moe/layer.h"

namespace moe {

namespace {

// How a stored matrix becomes an [out_rows, in_cols] block of the engine's layout.
struct Orientation {
  int64_t out_rows = 0;
  int64_t in_cols = 0;
  bool transposed = false;   // stored [in_cols, out_rows] (x @ W) rather than [out_rows, in_cols]
  bool interleaved = false;  // stored output axis alternates gate and up rather than gate, then up
};

// One stored matrix and where its engine-oriented values go: element `offset` of `dst`.
struct Placement {
  StoredMatrix source;
  Orientation orientation;
  Tensor* dst = nullptr;
  int64_t offset = 0;
};

// The stored output row that becomes engine row `row` (gate rows first, then up rows).
int64_t stored_row(int64_t row, int64_t out_rows, bool interleaved) {
  if (!interleaved) return row;
  const int64_t half = out_rows / 2;
  return row < half ? 2 * row : 2 * (row - half) + 1;
}

void place(const Placement& p, std::vector<float>& stored, std::vector<float>& oriented) {
  const Orientation& o = p.orientation;
  const size_t count = static_cast<size_t>(o.out_rows * o.in_cols);
  stored.resize(count);
  dequantize(p.source, stored.data());
  const float* engine = stored.data();
  if (o.transposed || o.interleaved) {
    oriented.resize(count);
    for (int64_t r = 0; r < o.out_rows; ++r) {
      const int64_t s = stored_row(r, o.out_rows, o.interleaved);
      float* row = oriented.data() + r * o.in_cols;
      for (int64_t c = 0; c < o.in_cols; ++c) {
        row[c] = o.transposed ? stored[c * o.out_rows + s] : stored[s * o.in_cols + c];
      }
    }
    engine = oriented.data();
  }
  char* out = p.dst->data<char>() + p.offset * static_cast<int64_t>(dtype_size(p.dst->dtype()));
  convert_from_f32(engine, p.dst->dtype(), out, count);
}

// Runs the placements on every core. Nothing here should throw after the checks, but an
// exception (out of memory) must not escape an OpenMP region, so the first one is carried out.
void place_all(const std::vector<Placement>& placements) {
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const int64_t count = static_cast<int64_t>(placements.size());
#pragma omp parallel
  {
    std::vector<float> stored, oriented;  // reused across this thread's matrices
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < count; ++i) {
      try {
        place(placements[static_cast<size_t>(i)], stored, oriented);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
}

// "1-3, 5, 7-47": the MoE layers, for the message about a dense one.
std::string moe_layer_list(const std::vector<bool>& is_moe) {
  std::string list;
  const int64_t n = static_cast<int64_t>(is_moe.size());
  for (int64_t first = 0; first < n; ++first) {
    if (!is_moe[first]) continue;
    int64_t last = first;
    while (last + 1 < n && is_moe[last + 1]) ++last;
    if (!list.empty()) list += ", ";
    list += first == last ? std::to_string(first) : fmt::format("{}-{}", first, last);
    first = last;
  }
  return list;
}

void check_layer(const Checkpoint& checkpoint, int64_t layer) {
  const MoeConfig& config = checkpoint.config();
  if (layer < 0 || layer >= config.num_layers) {
    fail("layer {}: expected 0..{} (checkpoint {} has {} decoder layers)", layer,
         config.num_layers - 1, checkpoint.dir(), config.num_layers);
  }
  if (!config.is_moe_layer[static_cast<size_t>(layer)]) {
    fail("layer {} of checkpoint {} is dense (a plain MLP, no experts); its MoE layers are {}",
         layer, checkpoint.dir(), moe_layer_list(config.is_moe_layer));
  }
}

// Collects the placements of one layer, checking each tensor as it is named.
class PlacementList {
 public:
  explicit PlacementList(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {}

  // Tensor `name` of shape `stored` into `dst` from element `offset` on, one matrix after another.
  void add(const std::string& name, const Shape& stored, const char* meaning,
           const Orientation& orientation, Tensor& dst, int64_t offset = 0) {
    const int64_t size = orientation.out_rows * orientation.in_cols;
    for (StoredMatrix& matrix : stored_matrices(checkpoint_, name, stored, meaning)) {
      placements_.push_back({std::move(matrix), orientation, &dst, offset});
      offset += size;
    }
  }

  // The MXFP4 pair <name>_blocks / <name>_scales of logical shape `stored` [E, out, in].
  void add_mxfp4(const std::string& name, const Shape& stored, const char* meaning,
                 const Orientation& orientation, Tensor& dst) {
    int64_t offset = 0;
    for (StoredMatrix& matrix : mxfp4_matrices(checkpoint_, name, stored, meaning)) {
      placements_.push_back({std::move(matrix), orientation, &dst, offset});
      offset += orientation.out_rows * orientation.in_cols;
    }
  }

  // A [E, 2I] bias whose rows interleave gate and up: each row is placed on its own, as a
  // transposed [1, 2I] matrix, so that the row permutation applies along 2I.
  void add_interleaved_rows(const std::string& name, const Shape& stored, const char* meaning,
                            Tensor& dst) {
    const int64_t rows = stored[0], cols = stored[1];
    const StoredMatrix whole = stored_matrices(checkpoint_, name, stored, meaning).front();
    if (whole.encoding != StoredEncoding::kFloat) {
      fail("tensor \"{}\" in {}: fp8 biases are not supported", name, checkpoint_.file_of(name));
    }
    const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(whole.values.dtype);
    for (int64_t r = 0; r < rows; ++r) {
      StoredMatrix row;
      row.values = TensorView(static_cast<char*>(whole.values.data) + r * row_bytes,
                              whole.values.dtype, {1, cols});
      placements_.push_back({row, Orientation{cols, 1, true, true}, &dst, r * cols});
    }
  }

  const std::vector<Placement>& placements() const { return placements_; }

 private:
  const Checkpoint& checkpoint_;
  std::vector<Placement> placements_;
};

}  // namespace

LayerWeights load_moe_layer(const Checkpoint& checkpoint, int64_t layer, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16 && dtype != DType::kF16) {
    fail("load_moe_layer: dtype {}: expected f32, bf16 or f16", dtype_name(dtype));
  }
  check_layer(checkpoint, layer);
  const MoeConfig& config = checkpoint.config();
  const MoeTensorNames names = find_moe_tensor_names(checkpoint, layer);
  const int64_t E = config.routing.num_experts, H = config.experts.hidden_size;
  const int64_t I = config.experts.intermediate_size;
  const int64_t Is = config.experts.shared_intermediate_size;

  LayerWeights w;
  PlacementList list(checkpoint);
  w.router = Tensor(dtype, {E, H});
  list.add(names.router, {E, H}, "[E, H]", {E, H}, w.router);
  if (!names.router_bias.empty()) {
    w.router_bias = Tensor(DType::kF32, {E});
    list.add(names.router_bias, {E}, "[E]", {1, E}, w.router_bias);
  }
  if (!names.correction_bias.empty()) {
    w.correction_bias = Tensor(DType::kF32, {E});
    list.add(names.correction_bias, {E}, "[E]", {1, E}, w.correction_bias);
  }

  w.w13 = Tensor(dtype, {E, 2 * I, H});
  w.w2 = Tensor(dtype, {E, H, I});
  if (names.mxfp4) {
    list.add_mxfp4(names.fused_gate_up, {E, 2 * I, H}, "[E, 2I, H]",
                   {2 * I, H, false, names.interleaved}, w.w13);
    list.add_mxfp4(names.fused_down, {E, H, I}, "[E, H, I]", {H, I, false, false}, w.w2);
  } else if (names.fused()) {
    const bool t = names.transposed;
    list.add(names.fused_gate_up, t ? Shape{E, H, 2 * I} : Shape{E, 2 * I, H},
             t ? "[E, H, 2I]" : "[E, 2I, H]", {2 * I, H, t, names.interleaved}, w.w13);
    list.add(names.fused_down, t ? Shape{E, I, H} : Shape{E, H, I}, t ? "[E, I, H]" : "[E, H, I]",
             {H, I, t, false}, w.w2);
  } else {
    for (int64_t e = 0; e < E; ++e) {
      list.add(names.expert(e, names.gate_proj), {I, H}, "[I, H]", {I, H}, w.w13, e * 2 * I * H);
      list.add(names.expert(e, names.up_proj), {I, H}, "[I, H]", {I, H}, w.w13,
               e * 2 * I * H + I * H);
      list.add(names.expert(e, names.down_proj), {H, I}, "[H, I]", {H, I}, w.w2, e * H * I);
    }
  }

  if (!names.fused_gate_up_bias.empty()) {  // fused experts only, MXFP4 ones included
    w.w13_bias = Tensor(DType::kF32, {E, 2 * I});
    w.w2_bias = Tensor(DType::kF32, {E, H});
    if (names.interleaved) {
      list.add_interleaved_rows(names.fused_gate_up_bias, {E, 2 * I}, "[E, 2I]", w.w13_bias);
    } else {
      list.add(names.fused_gate_up_bias, {E, 2 * I}, "[E, 2I]", {E, 2 * I}, w.w13_bias);
    }
    list.add(names.fused_down_bias, {E, H}, "[E, H]", {E, H}, w.w2_bias);
  }

  if (!names.shared_prefix.empty()) {
    w.shared_w13 = Tensor(dtype, {2 * Is, H});
    w.shared_w2 = Tensor(dtype, {H, Is});
    list.add(names.shared_prefix + "gate_proj.weight", {Is, H}, "[Is, H]", {Is, H}, w.shared_w13);
    list.add(names.shared_prefix + "up_proj.weight", {Is, H}, "[Is, H]", {Is, H}, w.shared_w13,
             Is * H);
    list.add(names.shared_prefix + "down_proj.weight", {H, Is}, "[H, Is]", {H, Is}, w.shared_w2);
    if (!names.shared_gate.empty()) {
      w.shared_gate = Tensor(dtype, {1, H});
      list.add(names.shared_gate, {1, H}, "[1, H]", {1, H}, w.shared_gate);
    }
  }

  place_all(list.placements());
  return w;
}

MoeLayer MoeLayer::from_checkpoint(const std::string& dir, int64_t layer, DType dtype,
                                   LayerOptions options) {
  const Checkpoint checkpoint = Checkpoint::open(dir);
  return MoeLayer(checkpoint.config(), load_moe_layer(checkpoint, layer, dtype), options);
}

}  // namespace moe
