"""PyTorch CUDA tensors: every function on the GPU against the CPU engine on the same inputs
(bf16: relative error under 1e-2 of the output's largest magnitude), results written in place
(out=) or as new tensors on the input's GPU, the stream, and errors raised before anything runs.
Skipped without PyTorch, a GPU or a build with the CUDA backend."""

import numpy as np
import pytest

import moe_engine

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and moe_engine.cuda_available()),
    reason="needs a CUDA device and moe_engine built with CUDA")

H, I, E, K = 256, 128, 32, 4
BF16_TOLERANCE = 1e-2


def relative_error(got, expected):
    got, expected = got.float().cpu(), expected.float().cpu()
    return ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def experts_problem(M, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, H, generator=g).to(torch.bfloat16)
    w13 = (torch.randn(E, 2 * I, H, generator=g) / H**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) / I**0.5).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(M)]).int()
    weights = torch.rand(M, K, generator=g)
    return hidden, w13, w2, weights, ids


def cuda(*tensors):
    return [t.cuda() for t in tensors]


@pytest.mark.parametrize("M", [1, 7, 300])
def test_fused_experts_matches_the_cpu(M):
    problem = experts_problem(M, 1 + M)
    out = moe_engine.fused_experts(*cuda(*problem))
    assert out.device.type == "cuda" and out.dtype == torch.bfloat16 and out.shape == (M, H)
    expected = moe_engine.fused_experts(*problem)
    assert relative_error(out, expected) < BF16_TOLERANCE


def test_fused_experts_writes_out_in_place():
    problem = cuda(*experts_problem(9, 2))
    out = torch.full((9, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    result = moe_engine.fused_experts(*problem, out=out)
    assert result is out and result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, moe_engine.fused_experts(*problem), rtol=0, atol=0)


def test_fused_experts_on_a_side_stream():
    problem = cuda(*experts_problem(33, 3))
    expected = moe_engine.fused_experts(*problem)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # torch's current stream is the default
        on_current = moe_engine.fused_experts(*problem)
    explicit = torch.empty_like(expected)
    moe_engine.fused_experts(*problem, out=explicit, stream=side.cuda_stream)
    side.synchronize()
    torch.testing.assert_close(on_current, expected, rtol=0, atol=0)
    torch.testing.assert_close(explicit, expected, rtol=0, atol=0)


class ForeignCudaArray:
    """A CUDA array that is not a torch tensor: only the DLPack protocol."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


def test_other_cuda_arrays_get_dlpack_results_in_gpu_memory():
    problem = cuda(*experts_problem(5, 4))
    result = moe_engine.fused_experts(*[ForeignCudaArray(t) for t in problem])
    assert not isinstance(result, torch.Tensor)
    torch.testing.assert_close(torch.from_dlpack(result), moe_engine.fused_experts(*problem),
                               rtol=0, atol=0)


def route_inputs(M, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(M, H, generator=g).to(dtype)
    router = (torch.randn(E, H, generator=g) / H**0.5).to(dtype)
    return hidden, router


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("M", [0, 1, 300])
def test_route_matches_the_cpu(M, dtype):
    hidden, router = route_inputs(M, 5 + M, dtype)
    ids, weights = moe_engine.route(*cuda(hidden, router), top_k=K, renormalize=True)
    assert ids.device.type == "cuda" and ids.dtype == torch.int32 and ids.shape == (M, K)
    assert weights.device.type == "cuda" and weights.dtype == torch.float32
    want_ids, want_weights = moe_engine.route(hidden, router, top_k=K, renormalize=True)
    ids, weights = ids.cpu(), weights.cpu()
    if M == 0:
        assert want_ids.shape == ids.shape and want_weights.shape == weights.shape
        return
    # cuBLAS sums the logits in another order than the CPU: a swap is allowed only between two
    # experts whose exact logits are within a few f32 roundings of each other.
    logits = hidden.double() @ router.double().T
    bound = H * 2.0**-24 * (hidden.double().abs() @ router.double().abs().T).max().item()
    same = ids == want_ids
    for t, j in zip(*torch.nonzero(~same, as_tuple=True)):
        gap = (logits[t, ids[t, j]] - logits[t, want_ids[t, j]]).abs().item()
        assert gap <= 2 * bound, f"token {t}, slot {j}: logit gap {gap} > {2 * bound}"
    # A softmax weight moves by at most twice the logits' error, renormalizing by as much again.
    torch.testing.assert_close(weights[same], want_weights[same], rtol=4 * bound + 1e-6,
                               atol=1e-7)


def test_route_writes_out_in_place():
    hidden, router = cuda(*route_inputs(12, 6, torch.bfloat16))
    ids = torch.full((12, K), -1, dtype=torch.int32, device="cuda")
    weights = torch.full((12, K), float("nan"), device="cuda")
    got_ids, got_weights = moe_engine.route(hidden, router, top_k=K, out=(ids, weights))
    assert got_ids is ids and got_weights is weights
    assert ids.data_ptr() == got_ids.data_ptr() and weights.data_ptr() == got_weights.data_ptr()
    want_ids, want_weights = moe_engine.route(hidden, router, top_k=K)
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)


@pytest.mark.parametrize("M,block_m,with_map", [(0, 16, False), (1, 16, False), (77, 7, True),
                                                 (1000, 64, False), (513, 128, True)])
def test_align_block_size_matches_the_cpu(M, block_m, with_map):
    g = torch.Generator().manual_seed(M + block_m)
    ids = torch.randint(0, E, (M, K), generator=g, dtype=torch.int32)
    expert_map = None
    if with_map:
        local = torch.arange(E, dtype=torch.int32) % 3 != 1
        expert_map = torch.where(local, torch.cumsum(local.int(), 0, dtype=torch.int32) - 1,
                                 torch.tensor(-1, dtype=torch.int32))
    sorted_ids, expert_ids, n = moe_engine.align_block_size(
        ids.cuda(), E, block_m, None if expert_map is None else expert_map.cuda())
    want_sorted, want_experts, want_n = moe_engine.align_block_size(ids, E, block_m, expert_map)
    assert n == want_n and sorted_ids.device.type == "cuda"
    assert torch.equal(sorted_ids.cpu(), want_sorted)
    assert torch.equal(expert_ids.cpu(), want_experts)


def layer_config():
    return moe_engine.preset_config("qwen3-30b-a3b").replace(
        hidden_size=H, intermediate_size=I, num_experts=E, top_k=K)


@pytest.mark.parametrize("M", [1, 7, 300])
def test_layer_matches_the_cpu_layer(M):
    gpu = moe_engine.MoeLayer.synthetic(layer_config(), dtype="bf16", seed=3, backend="cuda")
    cpu = moe_engine.MoeLayer.synthetic(layer_config(), dtype="bf16", seed=3, backend="cpu")
    hidden = torch.randn(M, H, generator=torch.Generator().manual_seed(M)).to(torch.bfloat16)
    out = gpu.forward(hidden.cuda())
    assert out.device.type == "cuda" and out.dtype == torch.bfloat16 and out.shape == (M, H)
    expected = cpu.forward(hidden)
    np.testing.assert_array_equal(gpu.last_topk_ids, cpu.last_topk_ids)
    assert relative_error(out, expected) < BF16_TOLERANCE
    given = torch.empty_like(hidden, device="cuda")
    result = gpu.forward(hidden.cuda(), out=given)
    assert result is given and result.data_ptr() == given.data_ptr()
    torch.testing.assert_close(given, out, rtol=0, atol=0)


def test_mixed_devices_name_the_argument():
    hidden, w13, w2, weights, ids = experts_problem(3, 7)
    with pytest.raises(moe_engine.MoeError, match=r"^w1: expected a tensor on the GPU; got one "
                                                  r"on the CPU"):
        moe_engine.fused_experts(hidden.cuda(), w13, *cuda(w2, weights, ids))
    with pytest.raises(moe_engine.MoeError, match=r"^out: expected a tensor on the GPU"):
        moe_engine.fused_experts(*cuda(hidden, w13, w2, weights, ids),
                                 out=torch.empty_like(hidden))
    h, r = route_inputs(3, 8, torch.bfloat16)
    with pytest.raises(moe_engine.MoeError, match=r"^router_weight: expected a tensor on the "
                                                  r"GPU; got one on the CPU"):
        moe_engine.route(h.cuda(), r, top_k=K)


def test_non_contiguous_cuda_tensors_are_refused():
    hidden, w13, w2, weights, ids = cuda(*experts_problem(4, 9))
    wide = torch.empty(4, 2 * H, dtype=torch.bfloat16, device="cuda")[:, :H]
    with pytest.raises(moe_engine.MoeError, match=r"^hidden_states: expected a C-contiguous "
                                                  r"array"):
        moe_engine.fused_experts(wide, w13, w2, weights, ids)
    with pytest.raises(moe_engine.MoeError, match=r"^topk_ids: expected a C-contiguous array"):
        moe_engine.align_block_size(ids.T, E, 16)


def test_errors_come_before_anything_runs():
    hidden, w13, w2, weights, ids = cuda(*experts_problem(4, 10))
    out = torch.full((4, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(moe_engine.MoeError, match=r"^w2: expected shape"):
        moe_engine.fused_experts(hidden, w13, w2[:, :, 1:].contiguous(), weights, ids, out=out)
    with pytest.raises(moe_engine.MoeError, match=r"fused_experts on CUDA: expected bf16"):
        moe_engine.fused_experts(hidden.float(), w13, w2, weights, ids, out=out.float())
    with pytest.raises(moe_engine.MoeError, match=r"^router_weight: the CUDA router GEMM takes"):
        moe_engine.route(hidden.half(), w13[0, :E].contiguous(), top_k=K)
    torch.cuda.synchronize()
    assert out.isnan().all()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_gpu_are_refused():
    hidden, w13, w2, weights, ids = cuda(*experts_problem(4, 11))
    with pytest.raises(moe_engine.MoeError, match=r"^w1: expected a tensor on cuda:0, where "
                                                  r"hidden_states is; got one on cuda:1"):
        moe_engine.fused_experts(hidden, w13.to("cuda:1"), w2, weights, ids)
    layer = moe_engine.MoeLayer.synthetic(layer_config(), dtype="bf16", backend="cuda")
    with pytest.raises(moe_engine.MoeError, match=r"^hidden: the layer's weights are on GPU 0, "
                                                  r"but this call runs on GPU 1"):
        layer.forward(hidden.to("cuda:1"))
    # The whole call ran on the tensors' GPU and then gave the current device back.
    assert torch.cuda.current_device() == 0
    on_one = moe_engine.fused_experts(*[t.to("cuda:1") for t in (hidden, w13, w2, weights, ids)])
    assert on_one.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    torch.testing.assert_close(on_one.cpu(), moe_engine.fused_experts(hidden, w13, w2, weights,
                                                                      ids).cpu(), rtol=0, atol=0)
