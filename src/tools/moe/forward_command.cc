// `moe forward`: the MoE block of one decoder layer of a Hugging Face checkpoint (router, routed
// experts, shared experts: everything between the post-attention norm and the residual add) on
// the hidden states of a safetensors file. Writes the output and the routing to another, so the
// engine can be compared tensor by tensor with other implementations.
#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "moe/checkpoint.h"
#include "moe/ep_layer.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "moe/safetensors.h"
#include "tools/moe/commands.h"
#include "tools/moe/ep_options.h"

namespace moe::cli {

namespace {

constexpr const char* kHiddenName = "hidden_states";

struct ForwardOptions {
  std::string checkpoint;
  int64_t layer = 0;
  bool layer_given = false;  // otherwise the first MoE layer
  std::string input;
  std::string output;
  std::string dtype;  // empty: the input's dtype
  int threads = 0;
  std::string backend = "cpu";
  std::string device = "cpu";  // cuda: the layer runs on the GPU (backend cuda)
  EpSettings ep;
};

// The weights' dtype: as asked, else the input's when the kernels take it, else f32.
DType weight_dtype(const std::string& asked, DType input) {
  if (!asked.empty()) return parse_dtype(asked);
  const bool kernel_dtype = input == DType::kF32 || input == DType::kBF16 || input == DType::kF16;
  return kernel_dtype ? input : DType::kF32;
}

// What every run of the command reads: the checkpoint, its layer and the input.
struct ForwardInputs {
  explicit ForwardInputs(const ForwardOptions& o)
      : checkpoint(Checkpoint::open(o.checkpoint)), input(SafetensorsFile::open(o.input)) {
    const MoeConfig& config = checkpoint.config();
    layer = o.layer_given ? o.layer : config.first_moe_layer();
    hidden = input.tensor(kHiddenName);
    const int64_t H = config.experts.hidden_size;
    if (hidden.dim() != 2 || hidden.size(1) != H || !is_floating(hidden.dtype)) {
      fail(
          "{}: \"{}\": expected a float tensor [M, {}] (the checkpoint's hidden size); got {} "
          "{}",
          o.input, kHiddenName, H, dtype_name(hidden.dtype), shape_string(hidden.shape));
    }
    dtype = weight_dtype(o.dtype, hidden.dtype);
  }

  void write(const ForwardOptions& o, Backend backend, const Tensor& out, const Tensor& topk_ids,
             const Tensor& topk_weights) const {
    write_safetensors(o.output,
                      {{kHiddenName, out}, {"topk_ids", topk_ids}, {"topk_weights", topk_weights}},
                      {{"layer", std::to_string(layer)},
                       {"model_type", checkpoint.config().model_type},
                       {"dtype", std::string(dtype_name(dtype))},
                       {"backend", std::string(backend_name(backend))}});
  }

  Checkpoint checkpoint;
  SafetensorsFile input;
  int64_t layer = 0;
  TensorView hidden;
  DType dtype = DType::kF32;
};

void forward(const ForwardOptions& o) {
  if (o.threads < 0) fail("--threads: expected >= 0 (0 = all cores); got {}", o.threads);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  const ForwardInputs in(o);
  LayerOptions options;
  options.backend = parse_backend(o.backend);
  if (o.device == "cuda") {
    if (o.backend != "cpu" && o.backend != "cuda") {
      fail("--device cuda runs the cuda backend; got --backend {}", o.backend);
    }
    options.backend = Backend::kCuda;
  }
  options.num_threads = o.threads;
  MoeLayer moe_layer(in.checkpoint.config(), load_moe_layer(in.checkpoint, in.layer, in.dtype),
                     options);
  const Tensor out = moe_layer.forward(Tensor::copy_of(in.hidden, in.dtype));
  in.write(o, options.backend, out, Tensor::copy_of(moe_layer.last_topk_ids(), DType::kI32),
           Tensor::copy_of(moe_layer.last_topk_weights(), DType::kF32));
  fmt::print("moe forward: layer {} ({}) on {} tokens, {} weights, {} backend -> {}\n", in.layer,
             in.checkpoint.config().model_type, in.hidden.size(0), dtype_name(in.dtype),
             backend_name(options.backend), o.output);
}

// Rows [first, first + count) of every rank's `part` stacked in rank order on rank 0.
Tensor gather_on_rank0(Communicator& comm, const Tensor& part, int64_t total_rows,
                       const std::vector<int64_t>& first_row) {
  const int N = comm.size();
  const int64_t width = part.numel() / std::max<int64_t>(part.size(0), 1);
  const int64_t row_bytes = width * static_cast<int64_t>(dtype_size(part.dtype()));
  std::vector<int64_t> send_counts(N, 0), zeros(N, 0), recv_counts(N, 0), recv_displs(N, 0);
  send_counts[0] = static_cast<int64_t>(part.nbytes());
  Tensor all;
  if (comm.rank() == 0) {
    all = Tensor(part.dtype(), {total_rows, width});
    for (int p = 0; p < N; ++p) {
      recv_counts[p] = (first_row[p + 1] - first_row[p]) * row_bytes;
      recv_displs[p] = first_row[p] * row_bytes;
    }
  }
  comm.all_to_all_v(part.data<void>(), {send_counts, zeros},
                    all.defined() ? all.data<void>() : nullptr, {recv_counts, recv_displs});
  return all;
}

// --ep: every rank takes an equal share of the rows and holds its experts; rank 0 gathers the
// rows back and writes the very file the single-process run writes.
void forward_ep(const ForwardOptions& o) {
  if (o.backend != "cpu") fail("--ep: expected the cpu backend; got --backend {}", o.backend);
  if (o.device != "cpu") fail("--ep: expected the cpu device; got --device {}", o.device);
  if (o.threads < 0) fail("--threads: expected >= 0 (0 = all cores); got {}", o.threads);
  run_as_mpi_rank(o.ep, [&](Communicator& comm) {
    if (o.threads > 0) omp_set_num_threads(o.threads);
    const ForwardInputs in(o);
    const MoeConfig& config = in.checkpoint.config();
    const int N = comm.size(), me = comm.rank();
    const int64_t M = in.hidden.size(0), H = config.experts.hidden_size;
    std::vector<int64_t> first_row(static_cast<size_t>(N + 1));
    for (int r = 0; r <= N; ++r) first_row[r] = M * r / N;
    const int64_t count = first_row[me + 1] - first_row[me];

    const ExpertMap map = ep_expert_map(o.ep, config.routing.num_experts, N);
    EpMoeLayer layer(
        config, local_layer_weights(load_moe_layer(in.checkpoint, in.layer, in.dtype), map, me),
        map, comm, ep_options(o.ep, (M + N - 1) / N, o.threads, 0));
    const TensorView mine(static_cast<char*>(in.hidden.data) +
                              first_row[me] * H * static_cast<int64_t>(dtype_size(in.hidden.dtype)),
                          in.hidden.dtype, {count, H});
    const Tensor out = layer.forward(Tensor::copy_of(mine, in.dtype));
    const Tensor all_out = gather_on_rank0(comm, out, M, first_row);
    const Tensor all_ids =
        gather_on_rank0(comm, Tensor::copy_of(layer.last_topk_ids(), DType::kI32), M, first_row);
    const Tensor all_weights = gather_on_rank0(
        comm, Tensor::copy_of(layer.last_topk_weights(), DType::kF32), M, first_row);
    if (me != 0) return;
    in.write(o, Backend::kCpu, all_out, all_ids, all_weights);
    fmt::print(
        "moe forward --ep: layer {} ({}) on {} tokens over {} ranks ({} dispatcher), {} weights, "
        "{} backend -> {}\n",
        in.layer, config.model_type, M, N, o.ep.dispatcher, dtype_name(in.dtype), o.backend,
        o.output);
  });
}

}  // namespace

void add_forward_command(CLI::App& app) {
  auto options = std::make_shared<ForwardOptions>();
  CLI::App* cmd = app.add_subcommand(
      "forward",
      "Run the MoE block of one layer of a Hugging Face checkpoint on the tensor \"hidden_states\" "
      "[M, H] of a safetensors file; write \"hidden_states\", \"topk_ids\" and \"topk_weights\"");
  cmd->add_option("--checkpoint", options->checkpoint,
                  "Checkpoint folder: config.json and model.safetensors or its sharded index")
      ->required();
  CLI::Option* layer =
      cmd->add_option("--layer", options->layer, "Decoder layer (default: the first MoE layer)");
  cmd->add_option("--input", options->input, "Safetensors file holding \"hidden_states\" [M, H]")
      ->required();
  cmd->add_option("--output", options->output, "Safetensors file to write")->required();
  cmd->add_option("--dtype", options->dtype,
                  "Weights and computation: f32, bf16 or f16 (default: the input's dtype)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  cmd->add_option("--threads", options->threads, "Worker threads (0 = all cores)")
      ->capture_default_str();
  cmd->add_option("--backend", options->backend,
                  "cpu, reference (the float64 oracle) or cuda (same as --device cuda)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "reference", "cuda"}));
  cmd->add_option("--device", options->device,
                  "cpu, or cuda: the GPU (bf16 weights; see docs/cuda.md for what it runs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  add_ep_options(cmd, options->ep);
  cmd->callback([options, layer] {
    options->layer_given = layer->count() > 0;
    if (options->ep.enabled) {
      forward_ep(*options);
    } else {
      forward(*options);
    }
  });
}

}  // namespace moe::cli
