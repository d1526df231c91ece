// The layer every rank of `moe run --ep` holds, on the CPU and on GPUs alike: the config (a
// preset, a config.json or a checkpoint's), the expert map of the --ep settings, the weights of
// this rank's slots (synthetic, or cut from the checkpoint's layer) and, where a rank checks the
// others, the whole layer.
#pragma once

#include <string>

#include "moe/config.h"
#include "moe/expert_map.h"
#include "moe/layer.h"
#include "tools/moe/ep_run.h"

namespace moe::cli {

struct EpLayerWeights {
  MoeConfig config;
  std::string source;  // "synthetic weights" or "layer L of DIR"
  ExpertMap map;
  LayerWeights local;  // this rank's slots, in its local slot order
  LayerWeights whole;  // every expert; undefined unless asked for
};

// Reads --checkpoint, --config or --preset and builds this rank's weights in `dtype`, and the
// whole layer too when `with_whole_layer`. Synthetic weights are drawn from --seed for the rank's
// experts only, so they equal the whole layer's cut to them. Throws moe::Error naming the file
// or option.
EpLayerWeights load_ep_layer_weights(const EpRunOptions& options, DType dtype, int num_ranks,
                                     int rank, bool with_whole_layer);

}  // namespace moe::cli
