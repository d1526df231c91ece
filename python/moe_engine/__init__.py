"""moe_engine: Mixture-of-Experts inference layers on NumPy arrays and PyTorch tensors.

The functions follow vLLM's fused-MoE API (argument order and meaning):

    topk_ids, topk_weights = moe_engine.route(hidden, router_weight, top_k=8, renormalize=True)
    out = moe_engine.fused_experts(hidden, w13, w2, topk_weights, topk_ids)
    sorted_ids, expert_ids, n = moe_engine.align_block_size(topk_ids, num_experts, block_m)

and MoeLayer runs a whole layer (router + experts) with stage timings:

    layer = moe_engine.MoeLayer.synthetic("qwen3-30b-a3b", dtype="bf16")
    out = layer.forward(hidden)
    layer.last_stage_times  # {"route": us, "align": us, ...}

Inputs are read in place (zero-copy) through DLPack: C-contiguous arrays of float32, bfloat16
(torch.bfloat16 or ml_dtypes.bfloat16), float16 or int32, in host memory or on a GPU (CUDA
tensors run on the CUDA backend, on torch's current stream by default). Results go into out=
where given, else are new PyTorch tensors when the main input is one, NumPy arrays otherwise. Bad input raises MoeError (a ValueError)
whose message names the argument, what was expected and what was given.
"""

from ._moe_engine import (
    MoeConfig,
    MoeError,
    MoeLayer,
    __version__,
    align_block_size,
    cuda_available,
    fused_experts,
    preset_config,
    preset_names,
    route,
)

__all__ = [
    "MoeConfig",
    "MoeError",
    "MoeLayer",
    "__version__",
    "align_block_size",
    "cuda_available",
    "fused_experts",
    "preset_config",
    "preset_names",
    "route",
]
