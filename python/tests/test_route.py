"""route() against the NumPy softmax/sigmoid top-k reference in numpy_reference.py.

Hidden states and router weights are small integers, so the logits are exact in the engine's
float32 as in float64: expert choices must match exactly, ties included (equal logits give
equal scores, and ties go to the lower expert id). Weights differ by rounding only: softmax
rounds each of E exponentials and their sum, renormalizing rounds k more terms, scaling one,
so the relative error is below (E + k + 8) float32 unit roundoffs.
"""

import numpy as np
import pytest

import moe_engine
from numpy_reference import UNIT_ROUNDOFF, route_reference


def integer_problem(seed, num_tokens, hidden_size, num_experts):
    rng = np.random.default_rng(seed)
    hidden = rng.integers(-2, 3, (num_tokens, hidden_size)).astype(np.float32)
    router = rng.integers(-2, 3, (num_experts, hidden_size)).astype(np.float32)
    return hidden, router


def check(hidden, router, top_k, **options):
    ids, weights = moe_engine.route(hidden, router, top_k=top_k, **options)
    reference_options = {k: v for k, v in options.items() if k not in ("backend", "num_threads")}
    expected_ids, expected_weights = route_reference(hidden, router, top_k, **reference_options)
    assert ids.dtype == np.int32 and weights.dtype == np.float32
    assert ids.shape == weights.shape == (hidden.shape[0], top_k)
    np.testing.assert_array_equal(ids, expected_ids)
    rtol = (router.shape[0] + top_k + 8) * UNIT_ROUNDOFF["float32"]
    np.testing.assert_allclose(weights, expected_weights, rtol=rtol, atol=0)


@pytest.mark.parametrize("backend", ["auto", "cpu", "reference"])
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("num_tokens", [0, 1, 13, 64])
def test_softmax_top_k(num_tokens, renormalize, backend):
    hidden, router = integer_problem(num_tokens, num_tokens, 16, 12)
    check(hidden, router, 4, renormalize=renormalize, backend=backend)


def test_ties_go_to_the_lower_expert_id():
    hidden = np.ones((2, 4), np.float32)
    router = np.ones((6, 4), np.float32)  # every expert scores the same
    ids, weights = moe_engine.route(hidden, router, top_k=3)
    np.testing.assert_array_equal(ids, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_allclose(weights, np.full((2, 3), 1 / 6), rtol=1e-6)


def test_sigmoid_with_scaling():
    hidden, router = integer_problem(3, 20, 8, 10)
    check(hidden, router, 2, scoring="sigmoid", renormalize=True, routed_scaling_factor=2.5)


@pytest.mark.parametrize("with_bias", [False, True])
def test_group_limited_top_k(with_bias):
    # DeepSeek-V3's shape in small: 16 experts in 8 groups, 4 groups kept, top-8.
    hidden, router = integer_problem(4, 25, 8, 16)
    rng = np.random.default_rng(40)
    bias = (rng.integers(-8, 9, 16) / 64).astype(np.float32) if with_bias else None
    check(hidden, router, 8, scoring="sigmoid", renormalize=True, num_groups=8, topk_groups=4,
          correction_bias=bias, routed_scaling_factor=2.5)


def test_router_bias_shifts_the_logits():
    hidden, router = integer_problem(5, 6, 8, 5)
    bias = np.array([0, 0, 0, 100, 0], np.float32)
    ids, _ = moe_engine.route(hidden, router, top_k=1, router_bias=bias)
    np.testing.assert_array_equal(ids, np.full((6, 1), 3))


def test_bfloat16_hidden_states():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    hidden, router = integer_problem(6, 9, 16, 8)  # small integers are exact in bf16
    check(hidden.astype(ml_dtypes.bfloat16), router.astype(ml_dtypes.bfloat16), 2)


def test_errors_name_the_argument():
    hidden, router = integer_problem(7, 4, 8, 6)
    with pytest.raises(moe_engine.MoeError, match=r"^top_k: .*got 7"):
        moe_engine.route(hidden, router, top_k=7)
    with pytest.raises(moe_engine.MoeError, match=r"^router_weight: .*\[6, 8\].*\[6, 7\]"):
        moe_engine.route(hidden, router[:, :7].copy(), top_k=2)
    with pytest.raises(moe_engine.MoeError, match=r"^router_weight: expected a 2-D"):
        moe_engine.route(hidden, router[0], top_k=2)
    with pytest.raises(moe_engine.MoeError, match=r"^scoring: .*\"tanh\""):
        moe_engine.route(hidden, router, top_k=2, scoring="tanh")
    with pytest.raises(moe_engine.MoeError, match=r"^num_groups: "):
        moe_engine.route(hidden, router, top_k=2, num_groups=4)
    with pytest.raises(moe_engine.MoeError, match=r"^correction_bias: .*\[6\]"):
        moe_engine.route(hidden, router, top_k=2, correction_bias=np.zeros(5, np.float32))
    with pytest.raises(moe_engine.MoeError, match=r"^hidden_states: .*f64"):
        moe_engine.route(hidden.astype(np.float64), router, top_k=2)
    with pytest.raises(TypeError):
        moe_engine.route(hidden, router, 2)  # top_k is keyword-only
