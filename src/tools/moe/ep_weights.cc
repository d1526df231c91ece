#include "tools/moe/ep_weights.h"

#include <optional>

#include <fmt/format.h>

#include "moe/checkpoint.h"
#include "moe/ep_layer.h"

namespace moe::cli {

EpLayerWeights load_ep_layer_weights(const EpRunOptions& o, DType dtype, int num_ranks, int rank,
                                     bool with_whole_layer) {
  std::optional<Checkpoint> checkpoint;
  if (!o.checkpoint.empty()) checkpoint.emplace(Checkpoint::open(o.checkpoint));
  MoeConfig config = checkpoint              ? checkpoint->config()
                     : o.config_path.empty() ? preset_config(o.preset)
                                             : load_hf_config(o.config_path);
  ExpertMap map = ep_expert_map(o.ep, config.routing.num_experts, num_ranks);
  if (checkpoint) {
    const int64_t layer = o.layer >= 0 ? o.layer : config.first_moe_layer();
    LayerWeights whole = load_moe_layer(*checkpoint, layer, dtype);
    LayerWeights local = local_layer_weights(whole, map, rank);
    if (!with_whole_layer) whole = LayerWeights{};
    return {std::move(config), fmt::format("layer {} of {}", layer, o.checkpoint), std::move(map),
            std::move(local), std::move(whole)};
  }
  LayerWeights local = synthetic_layer_weights(config, dtype, o.seed, map.local_experts(rank));
  LayerWeights whole;
  if (with_whole_layer) whole = synthetic_layer_weights(config, dtype, o.seed);
  return {std::move(config), "synthetic weights", std::move(map), std::move(local),
          std::move(whole)};
}

}  // namespace moe::cli
