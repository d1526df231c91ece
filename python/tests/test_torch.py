"""PyTorch tensors in, PyTorch tensors out: the same results as the NumPy path, bf16 without
ml_dtypes, and clear errors for what the CPU engine cannot read."""

import numpy as np
import pytest

import moe_engine
from numpy_reference import assert_within, experts_bound, experts_reference, make_problem

torch = pytest.importorskip("torch")


def as_torch(*arrays):
    return [torch.from_numpy(a) for a in arrays]


def test_fused_experts_returns_torch_with_the_numpy_result():
    problem = make_problem(21, 11, 32, 16, 5, 2)
    out = moe_engine.fused_experts(*as_torch(*problem))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert out.device.type == "cpu" and out.is_contiguous()
    np.testing.assert_array_equal(out.numpy(), moe_engine.fused_experts(*problem))


def test_fused_experts_bfloat16():
    hidden, w13, w2, weights, ids = make_problem(22, 9, 32, 16, 4, 2)
    hidden_bf16 = torch.from_numpy(hidden).to(torch.bfloat16)
    w13_bf16 = torch.from_numpy(w13).to(torch.bfloat16)
    w2_bf16 = torch.from_numpy(w2).to(torch.bfloat16)
    out = moe_engine.fused_experts(hidden_bf16, w13_bf16, w2_bf16, *as_torch(weights, ids))
    assert out.dtype == torch.bfloat16
    # The reference sees the same bf16 values, widened exactly.
    exact = [t.float().numpy() for t in (hidden_bf16, w13_bf16, w2_bf16)]
    expected, magnitude = experts_reference(*exact, weights, ids)
    bound = experts_bound(expected, magnitude, 32 + 16 + 2 + 8, "bfloat16", "bfloat16")
    assert_within(out.float().numpy(), expected, bound, "torch bfloat16")


def test_route_and_align_return_torch():
    rng = np.random.default_rng(23)
    hidden = rng.standard_normal((8, 16)).astype(np.float32)
    router = rng.standard_normal((6, 16)).astype(np.float32)
    ids, weights = moe_engine.route(*as_torch(hidden, router), top_k=2, renormalize=True)
    np_ids, np_weights = moe_engine.route(hidden, router, top_k=2, renormalize=True)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    np.testing.assert_array_equal(ids.numpy(), np_ids)
    np.testing.assert_array_equal(weights.numpy(), np_weights)
    sorted_ids, expert_ids, n = moe_engine.align_block_size(ids, 6, 4)
    assert isinstance(sorted_ids, torch.Tensor) and isinstance(expert_ids, torch.Tensor)
    assert sorted_ids.numel() == n


def test_layer_forward_torch():
    config = moe_engine.preset_config("qwen3-30b-a3b").replace(hidden_size=32,
                                                               intermediate_size=16)
    layer = moe_engine.MoeLayer.synthetic(config, dtype="bf16")
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(24))
    out = layer.forward(hidden)
    assert isinstance(out, torch.Tensor) and out.shape == (5, 32)
    np.testing.assert_array_equal(out.numpy(), layer.forward(hidden.numpy()))
    out_bf16 = layer.forward(hidden.to(torch.bfloat16))
    assert out_bf16.dtype == torch.bfloat16


def test_errors():
    hidden, w13, w2, weights, ids = as_torch(*make_problem(25, 4, 16, 8, 3, 2))
    with pytest.raises(moe_engine.MoeError, match=r"^hidden_states: .*\.contiguous\(\)"):
        moe_engine.fused_experts(hidden.T.contiguous().T, w13, w2, weights, ids)
    # torch.topk returns int64 ids; the engine takes int32, as vLLM's kernels do.
    with pytest.raises(moe_engine.MoeError, match=r"^topk_ids: expected dtype i32; got i64"):
        moe_engine.fused_experts(hidden, w13, w2, weights, ids.long())


def test_inputs_that_require_grad_are_read_without_autograd():
    problem = make_problem(27, 4, 16, 8, 3, 2)
    hidden, *rest = as_torch(*problem)
    out = moe_engine.fused_experts(hidden.requires_grad_(), *rest)
    assert not out.requires_grad and out.grad_fn is None
    np.testing.assert_array_equal(out.numpy(), moe_engine.fused_experts(*problem))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_are_refused_where_they_cannot_run():
    hidden, w13, w2, weights, ids = as_torch(*make_problem(26, 4, 16, 8, 3, 2))
    if moe_engine.cuda_available():
        # One call runs on one device: a CPU weight beside a GPU hidden_states is named.
        with pytest.raises(moe_engine.MoeError, match=r"^w1: expected a tensor on the GPU"):
            moe_engine.fused_experts(hidden.cuda(), w13, w2, weights, ids)
        return
    with pytest.raises(moe_engine.MoeError, match=r"^hidden_states: .*CUDA backend is not built"):
        moe_engine.fused_experts(hidden.cuda(), w13, w2, weights, ids)
    with pytest.raises(moe_engine.MoeError, match=r"^w1: .*CUDA backend is not built"):
        moe_engine.fused_experts(hidden, w13.cuda(), w2, weights, ids)
