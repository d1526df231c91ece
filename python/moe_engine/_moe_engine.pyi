# Type stubs for the compiled module, written by hand; test_stubs.py checks that they declare
# exactly the module's names and parameters. Docstrings live in the module (help()).
from os import PathLike
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

# A NumPy array, a PyTorch tensor, or anything else exporting DLPack or the buffer protocol.
ArrayLike = Any
# A NumPy array, or a PyTorch tensor when the main input was one.
Array = Any

__version__: str

class MoeError(ValueError): ...

class MoeConfig:
    @property
    def name(self) -> str: ...
    @property
    def model_type(self) -> str: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def scoring(self) -> str: ...
    @property
    def renormalize(self) -> bool: ...
    @property
    def num_groups(self) -> int: ...
    @property
    def topk_groups(self) -> int: ...
    @property
    def has_correction_bias(self) -> bool: ...
    @property
    def has_router_bias(self) -> bool: ...
    @property
    def routed_scaling_factor(self) -> float: ...
    @property
    def apply_router_weight_on_input(self) -> bool: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def activation(self) -> str: ...
    @property
    def has_expert_bias(self) -> bool: ...
    @property
    def shared_intermediate_size(self) -> int: ...
    @property
    def shared_gate(self) -> bool: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_moe_layers(self) -> int: ...
    def replace(self, **changes: Any) -> MoeConfig: ...

def cuda_available() -> bool: ...
def preset_config(name: str) -> MoeConfig: ...
def preset_names() -> list[str]: ...

class MoeLayer:
    @staticmethod
    def synthetic(
        preset: Union[str, PathLike[str], MoeConfig],
        dtype: str = "bf16",
        seed: int = 0,
        *,
        backend: str = "auto",
        num_threads: int = 0,
        block_m: int = 0,
    ) -> MoeLayer: ...
    @staticmethod
    def from_checkpoint(
        dir: Union[str, PathLike[str]],
        layer: Optional[int] = None,
        *,
        dtype: str = "f32",
        backend: str = "auto",
        num_threads: int = 0,
        block_m: int = 0,
    ) -> MoeLayer: ...
    def forward(
        self, hidden: ArrayLike, *, out: Optional[ArrayLike] = None, stream: Optional[int] = None
    ) -> Array: ...
    @property
    def config(self) -> MoeConfig: ...
    @property
    def weights(self) -> dict[str, npt.NDArray[Any]]: ...
    @property
    def last_stage_times(self) -> dict[str, float]: ...
    @property
    def last_topk_ids(self) -> npt.NDArray[np.int32]: ...
    @property
    def last_topk_weights(self) -> npt.NDArray[np.float32]: ...
    @property
    def last_expert_counts(self) -> npt.NDArray[np.int32]: ...

def route(
    hidden_states: ArrayLike,
    router_weight: ArrayLike,
    *,
    top_k: int,
    scoring: str = "softmax",
    renormalize: bool = False,
    num_groups: int = 1,
    topk_groups: int = 1,
    correction_bias: Optional[ArrayLike] = None,
    router_bias: Optional[ArrayLike] = None,
    routed_scaling_factor: float = 1.0,
    backend: str = "auto",
    num_threads: int = 0,
    out: Optional[tuple[ArrayLike, ArrayLike]] = None,
    stream: Optional[int] = None,
) -> tuple[Array, Array]: ...
def align_block_size(
    topk_ids: ArrayLike,
    num_experts: int,
    block_m: int,
    expert_map: Optional[ArrayLike] = None,
    *,
    stream: Optional[int] = None,
) -> tuple[Array, Array, int]: ...
def fused_experts(
    hidden_states: ArrayLike,
    w1: ArrayLike,
    w2: ArrayLike,
    topk_weights: ArrayLike,
    topk_ids: ArrayLike,
    *,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    w1_bias: Optional[ArrayLike] = None,
    w2_bias: Optional[ArrayLike] = None,
    expert_map: Optional[ArrayLike] = None,
    block_m: int = 0,
    backend: str = "auto",
    num_threads: int = 0,
    out: Optional[ArrayLike] = None,
    stream: Optional[int] = None,
) -> Array: ...
