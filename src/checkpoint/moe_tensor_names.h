// Where a decoder layer's MoE tensors sit in a Hugging Face checkpoint, and how its fused experts
// are laid out. Families name the block, the router and the experts differently, and recent
// transformers fuse per-expert projections into 3-D tensors; the orientation of those is fixed per
// family (it cannot be told from the shape: [E, 2I, H] and [E, H, 2I] coincide when H = 2I).
#pragma once

#include <cstdint>
#include <string>

#include "moe/checkpoint.h"

namespace moe {

struct MoeTensorNames {
  std::string router;           // [E, H]
  std::string router_bias;      // [E]; empty unless the config has a router bias
  std::string correction_bias;  // [E]; empty unless the config has a correction bias

  // Fused experts (fused_gate_up not empty): gate_up [E, 2I, H] and down [E, H, I] as the
  // engine has them, or [E, H, 2I] and [E, I, H] when `transposed` (x @ W instead of x · W^T).
  // With `interleaved`, gate and up alternate along 2I (gate = [..., 0::2], up = [..., 1::2])
  // instead of gate taking the first half.
  std::string fused_gate_up;
  std::string fused_down;
  std::string fused_gate_up_bias;  // [E, 2I], ordered like gate_up's 2I; when the config has biases
  std::string fused_down_bias;     // [E, H]
  bool transposed = false;
  bool interleaved = false;
  // MXFP4 experts: fused_gate_up and fused_down name the pairs <name>_blocks and <name>_scales,
  // which hold [E, 2I, H] and [E, H, I] (out, in) whatever the family; `transposed` is false.
  bool mxfp4 = false;

  // Per-expert experts: expert_prefix + e + "." + gate_proj / up_proj / down_proj + ".weight",
  // nn.Linear weights [I, H], [I, H] and [H, I].
  std::string expert_prefix;
  std::string gate_proj, up_proj, down_proj;

  // Shared experts: shared_prefix + "gate_proj.weight" [Is, H], "up_proj.weight" [Is, H],
  // "down_proj.weight" [H, Is]; empty when the config has none. shared_gate [1, H] when gated.
  std::string shared_prefix;
  std::string shared_gate;

  bool fused() const { return !fused_gate_up.empty(); }
  std::string expert(int64_t expert, const std::string& projection) const;
};

// The names of decoder layer `layer`'s MoE tensors in `checkpoint`, found by probing for the
// router and the first expert under each naming scheme the families use. Throws moe::Error
// listing the names it looked for when none is there.
MoeTensorNames find_moe_tensor_names(const Checkpoint& checkpoint, int64_t layer);

}  // namespace moe
