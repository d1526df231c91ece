// Routing traces on disk, and synthetic ones.
//
// File format (safetensors): for each layer L, `layers.L.topk_ids` int32 [num_tokens, top_k],
// `layers.L.step_offsets` int64 [num_steps + 1] (token offsets of each serving step) and, when
// known, `layers.L.source_gpu` int32 [num_tokens]; metadata `format` = "moe-engine routing trace
// 1", `num_layers`, `num_experts`, `top_k`, and `model` (the config's name) when given.
#pragma once

#include <cstdint>
#include <string>

#include "moe/config.h"
#include "moe/placement.h"

namespace moe {

inline constexpr const char* kTraceFormat = "moe-engine routing trace 1";

// Writes `trace` to `path` (atomically, as write_safetensors). Throws moe::Error on an
// inconsistent trace or an I/O failure.
void write_trace(const std::string& path, const RoutingTrace& trace, const std::string& model = "");
// Reads a trace written by write_trace; throws moe::Error naming the file and the tensor on any
// inconsistency (ids out of range, sizes that do not match, a wrong format tag).
RoutingTrace read_trace(const std::string& path);

struct SyntheticTraceOptions {
  int64_t num_layers = 0;  // 0 = the config's MoE layers
  int64_t num_steps = 8;
  int64_t tokens_per_step = 256;
  double zipf_exponent = 1.0;  // expert popularity ~ 1 / rank^s, a separate ranking per layer
  // Probability that a token's next expert comes from the co-selection cluster of its first one
  // (clusters of 2k experts): experts that fire together, as trained routers show.
  double co_selection = 0.5;
  // Popularity ranks rotate by this many positions per step: the hot set drifts over time.
  double drift_per_step = 0.5;
  int64_t num_gpus = 1;  // token t of a step comes from GPU t % num_gpus
  uint64_t seed = 0;
};

// A seeded synthetic trace for `config`: Zipf-skewed popularity per layer, correlated
// co-selection, drift over steps. The same options give the same trace on every machine.
RoutingTrace synthesize_trace(const MoeConfig& config, const SyntheticTraceOptions& options);

}  // namespace moe
