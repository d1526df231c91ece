"""MoeLayer and MoeConfig: shapes, the record of the last call, and the error of the optimized
backend bounded against backend="reference" (both layers share weights through the seed)."""

import threading

import numpy as np
import pytest

import moe_engine
from numpy_reference import UNIT_ROUNDOFF, assert_within, experts_bound, experts_reference


def small(preset):
    """The preset's routing, with layer sizes that build in milliseconds."""
    config = moe_engine.preset_config(preset)
    shared = 24 if config.shared_intermediate_size > 0 else 0
    return config.replace(hidden_size=48, intermediate_size=32, shared_intermediate_size=shared)


def random_hidden(seed, num_tokens, hidden_size, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((num_tokens, hidden_size)).astype(dtype)


def test_preset_config_fields():
    assert "qwen3-30b-a3b" in moe_engine.preset_names()
    config = moe_engine.preset_config("qwen3-30b-a3b")
    assert (config.hidden_size, config.intermediate_size) == (2048, 768)
    assert (config.num_experts, config.top_k) == (128, 8)
    assert config.scoring == "softmax" and config.renormalize and config.activation == "silu"
    assert config.num_moe_layers == config.num_layers == 48
    deepseek = moe_engine.preset_config("deepseek-v3")
    assert deepseek.scoring == "sigmoid" and deepseek.has_correction_bias
    assert (deepseek.num_groups, deepseek.topk_groups) == (8, 4)
    assert deepseek.routed_scaling_factor == pytest.approx(2.5)
    assert "num_experts=128" in repr(config)


def test_config_is_immutable_and_replace_validates():
    config = moe_engine.preset_config("mixtral-8x7b")
    with pytest.raises(AttributeError):
        config.top_k = 3
    changed = config.replace(top_k=1, hidden_size=64)
    assert (changed.top_k, changed.hidden_size, config.top_k) == (1, 64, 2)
    with pytest.raises(moe_engine.MoeError, match="top_k"):
        config.replace(top_k=9)
    with pytest.raises(moe_engine.MoeError, match=r"^num_layers: not a field replace"):
        config.replace(num_layers=3)
    with pytest.raises(moe_engine.MoeError, match=r"^top_k: expected a value like 2; got 'x'"):
        config.replace(top_k="x")
    with pytest.raises(moe_engine.MoeError, match=r"^scoring: "):
        config.replace(scoring="tanh")


def test_unknown_preset_lists_the_presets():
    with pytest.raises(moe_engine.MoeError, match="qwen3-30b-a3b"):
        moe_engine.preset_config("gpt-5")
    with pytest.raises(moe_engine.MoeError, match="qwen3-30b-a3b"):
        moe_engine.MoeLayer.synthetic("gpt-5")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
@pytest.mark.parametrize("num_tokens", [0, 1, 7])
def test_forward_shapes_and_record(num_tokens, dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    config = small("qwen3-30b-a3b")
    layer = moe_engine.MoeLayer.synthetic(config, dtype="bf16", seed=1)
    hidden = random_hidden(2, num_tokens, config.hidden_size, dtype)
    out = layer.forward(hidden)
    assert out.shape == hidden.shape and out.dtype == hidden.dtype
    assert layer.last_topk_ids.shape == (num_tokens, config.top_k)
    assert layer.last_topk_ids.dtype == np.int32
    assert layer.last_topk_weights.shape == (num_tokens, config.top_k)
    counts = layer.last_expert_counts
    assert counts.shape == (config.num_experts,) and counts.sum() == num_tokens * config.top_k
    times = layer.last_stage_times
    assert set(times) == {"route", "align", "gemm1", "act", "gemm2", "sum", "shared"}
    assert all(t >= 0 for t in times.values())


@pytest.mark.parametrize("preset", moe_engine.preset_names())
def test_cpu_backend_within_bound_of_reference(preset):
    config = small(preset)
    cpu = moe_engine.MoeLayer.synthetic(config, dtype="bf16", seed=3, backend="cpu",
                                        num_threads=2)
    reference = moe_engine.MoeLayer.synthetic(config, dtype="bf16", seed=3, backend="reference")
    hidden = random_hidden(4, 19, config.hidden_size)
    got, expected_backend = cpu.forward(hidden), reference.forward(hidden)
    np.testing.assert_array_equal(cpu.last_topk_ids, reference.last_topk_ids)

    # The float64 reference of the experts half, on the routing the layer chose.
    w = cpu.weights
    shared = None
    if "shared_w13" in w:
        shared = (w["shared_w13"], w["shared_w2"], w.get("shared_gate"))
    expected, magnitude = experts_reference(hidden, w["w13"], w["w2"], cpu.last_topk_weights,
                                            cpu.last_topk_ids, shared=shared)
    num_terms = config.hidden_size + config.intermediate_size + config.top_k + 8
    bound = experts_bound(expected, magnitude, num_terms, np.float32, "bfloat16")
    assert_within(got, expected, bound, f"{preset} cpu")
    # The reference backend accumulates in float64 and rounds once to float32.
    assert_within(expected_backend, expected, 2 * UNIT_ROUNDOFF["float32"] * magnitude,
                  f"{preset} reference")


def test_weights_are_read_only_views_that_keep_the_layer_alive():
    layer = moe_engine.MoeLayer.synthetic(small("qwen2-moe-a2.7b"), dtype="f32", seed=5)
    weights = layer.weights
    assert {"router", "w13", "w2", "shared_w13", "shared_w2", "shared_gate"} <= set(weights)
    w13 = weights["w13"]
    config = layer.config
    assert w13.shape == (config.num_experts, 2 * config.intermediate_size, config.hidden_size)
    assert not w13.flags.writeable
    first = w13[0, 0, :4].copy()
    del layer, weights
    np.testing.assert_array_equal(w13[0, 0, :4], first)


def test_same_seed_same_layer():
    config = small("olmoe-1b-7b")
    hidden = random_hidden(6, 5, config.hidden_size)
    a = moe_engine.MoeLayer.synthetic(config, dtype="f32", seed=9).forward(hidden)
    b = moe_engine.MoeLayer.synthetic(config, dtype="f32", seed=9).forward(hidden)
    c = moe_engine.MoeLayer.synthetic(config, dtype="f32", seed=10).forward(hidden)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_threads_sharing_a_layer_get_their_own_results():
    config = small("qwen3-30b-a3b")
    layer = moe_engine.MoeLayer.synthetic(config, dtype="f32", seed=7)
    inputs = [random_hidden(100 + i, 3 + 5 * i, config.hidden_size) for i in range(4)]
    expected = [layer.forward(x) for x in inputs]
    results = [None] * len(inputs)

    def run(i):
        for _ in range(5):
            results[i] = layer.forward(inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_errors_name_the_argument():
    config = small("mixtral-8x7b")
    layer = moe_engine.MoeLayer.synthetic(config, dtype="f32")
    with pytest.raises(moe_engine.MoeError, match=r"^hidden: expected \[M, 48\]"):
        layer.forward(np.zeros((2, 47), np.float32))
    with pytest.raises(moe_engine.MoeError, match=r"^hidden: .*f64"):
        layer.forward(np.zeros((2, 48)))
    with pytest.raises(moe_engine.MoeError, match=r"^dtype: "):
        moe_engine.MoeLayer.synthetic(config, dtype="i32")
    with pytest.raises(moe_engine.MoeError, match=r"^backend: "):
        moe_engine.MoeLayer.synthetic(config, backend="gpu")
    with pytest.raises(moe_engine.MoeError, match=r"^preset: "):
        moe_engine.MoeLayer.synthetic(42)
    with pytest.raises(TypeError):
        moe_engine.MoeLayer()
