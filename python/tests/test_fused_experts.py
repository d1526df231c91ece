"""fused_experts on NumPy arrays against the float64 reference in numpy_reference.py.

Random cases print their seed in the test id; rerun one with
  build/venv/bin/python -m pytest python/tests/test_fused_experts.py -k "seed3"
"""

import numpy as np
import pytest

import moe_engine
from numpy_reference import assert_within, experts_bound, experts_reference, make_problem


def check(out, hidden, w13, w2, weights, ids, what, **reference_options):
    expected, magnitude = experts_reference(hidden, w13, w2, weights, ids, **reference_options)
    num_terms = hidden.shape[1] + w2.shape[2] + ids.shape[1] + 8
    bound = experts_bound(expected, magnitude, num_terms, hidden.dtype, np.dtype(w13.dtype).name)
    assert out.dtype == hidden.dtype, what
    assert_within(out, expected, bound, what)


CASES = [
    # (seed, M, H, I, E, k)
    (1, 0, 16, 8, 4, 2),
    (2, 1, 16, 8, 4, 1),
    (3, 5, 32, 24, 6, 2),
    (4, 33, 64, 40, 8, 4),
    (5, 70, 48, 16, 3, 3),
]


@pytest.mark.parametrize("backend", ["auto", "cpu", "reference"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"seed{c[0]}-M{c[1]}-E{c[4]}-k{c[5]}")
def test_matches_reference_f32(case, backend):
    seed, *sizes = case
    hidden, w13, w2, weights, ids = make_problem(seed, *sizes)
    out = moe_engine.fused_experts(hidden, w13, w2, weights, ids, backend=backend)
    assert isinstance(out, np.ndarray)
    check(out, hidden, w13, w2, weights, ids, f"seed {seed} backend {backend}")


@pytest.mark.parametrize("block_m", [1, 3, 16, 64])
def test_block_m_does_not_change_the_result_beyond_rounding(block_m):
    hidden, w13, w2, weights, ids = make_problem(11, 40, 32, 16, 5, 2)
    out = moe_engine.fused_experts(hidden, w13, w2, weights, ids, block_m=block_m, num_threads=2)
    check(out, hidden, w13, w2, weights, ids, f"block_m {block_m}")


def test_float16():
    hidden, w13, w2, weights, ids = make_problem(6, 9, 32, 16, 4, 2, dtype=np.float16)
    out = moe_engine.fused_experts(hidden, w13, w2, weights, ids)
    check(out, hidden, w13, w2, weights, ids, "float16")


def test_bfloat16_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    hidden, w13, w2, weights, ids = make_problem(7, 9, 32, 16, 4, 2,
                                                 dtype=ml_dtypes.bfloat16)
    out = moe_engine.fused_experts(hidden, w13, w2, weights, ids)
    assert out.dtype == ml_dtypes.bfloat16
    check(out, hidden, w13, w2, weights, ids, "bfloat16")


def test_expert_map_skips_experts_of_other_ranks():
    hidden, w13, w2, weights, ids = make_problem(8, 12, 32, 16, 6, 3)
    # Global experts 0, 2 and 4 live elsewhere; 1, 3, 5 are local experts 0, 1, 2.
    expert_map = np.array([-1, 0, -1, 1, -1, 2], dtype=np.int32)
    local_w13, local_w2 = w13[1::2].copy(), w2[1::2].copy()
    out = moe_engine.fused_experts(hidden, local_w13, local_w2, weights, ids,
                                   expert_map=expert_map)
    check(out, hidden, local_w13, local_w2, weights, ids, "expert_map", expert_map=expert_map)


def test_biases():
    hidden, w13, w2, weights, ids = make_problem(9, 10, 32, 16, 4, 2)
    rng = np.random.default_rng(90)
    w1_bias = rng.uniform(-0.5, 0.5, (4, 32)).astype(np.float32)
    w2_bias = rng.uniform(-0.5, 0.5, (4, 32)).astype(np.float32)
    out = moe_engine.fused_experts(hidden, w13, w2, weights, ids, w1_bias=w1_bias,
                                   w2_bias=w2_bias)
    check(out, hidden, w13, w2, weights, ids, "biases", w13_bias=w1_bias, w2_bias=w2_bias)


def test_router_weight_on_input():
    hidden, w13, w2, weights, ids = make_problem(10, 8, 32, 16, 4, 1)
    out = moe_engine.fused_experts(hidden, w13, w2, weights, ids,
                                   apply_router_weight_on_input=True)
    check(out, hidden, w13, w2, weights, ids, "weight on input", weight_on_input=True)


def test_reads_offset_and_read_only_inputs_in_place():
    hidden, w13, w2, weights, ids = make_problem(12, 9, 32, 16, 4, 2)
    # Row 1 onwards of a bigger array: contiguous, but not at the start of its buffer.
    padded = np.concatenate([np.full((1, 32), np.nan, np.float32), hidden])
    rows = padded[1:]
    w13.flags.writeable = False
    out = moe_engine.fused_experts(rows, w13, w2, weights, ids)
    check(out, hidden, w13, w2, weights, ids, "offset rows")
    assert out.flags.writeable and out.flags.c_contiguous


def test_output_is_a_fresh_array():
    hidden, w13, w2, weights, ids = make_problem(13, 4, 16, 8, 3, 2)
    first = moe_engine.fused_experts(hidden, w13, w2, weights, ids)
    second = moe_engine.fused_experts(hidden, w13, w2, weights, ids)
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, second)  # deterministic


def test_errors_name_the_argument():
    hidden, w13, w2, weights, ids = make_problem(14, 4, 16, 8, 3, 2)

    def error(*args, **kwargs):
        with pytest.raises(moe_engine.MoeError) as info:
            moe_engine.fused_experts(*args, **kwargs)
        return str(info.value)

    message = error(hidden, w13[:, :, :15].copy(), w2, weights, ids)
    assert message.startswith("w1:") and "[3, 16, 15]" in message, message
    message = error(hidden, w13, w2[:2].copy(), weights, ids)
    assert message.startswith("w2:"), message
    bad_ids = ids.copy()
    bad_ids[2, 1] = 3
    message = error(hidden, w13, w2, weights, bad_ids)
    assert message.startswith("topk_ids:") and "token 2, slot 1" in message, message
    message = error(hidden.astype(np.float64), w13, w2, weights, ids)
    assert message.startswith("hidden_states:") and "f64" in message, message
    message = error(hidden, w13, w2, weights, ids.astype(np.int64))
    assert message.startswith("topk_ids:") and "i32" in message, message
    message = error(hidden, w13, w2, weights, ids, w1_bias=np.zeros((3, 15), np.float32))
    assert message.startswith("w1_bias:"), message
    message = error(hidden, w13, w2, weights, ids, activation="relu")
    assert message.startswith("activation:") and "silu" in message, message
    message = error(hidden, w13, w2, weights, ids, backend="tpu")
    assert message.startswith("backend:"), message
    message = error(hidden.tolist(), w13, w2, weights, ids)
    assert message.startswith("hidden_states:") and "list" in message, message


def test_non_contiguous_input_is_refused_not_copied():
    hidden, w13, w2, weights, ids = make_problem(15, 4, 16, 8, 3, 2)
    transposed = np.ascontiguousarray(hidden.T).T  # the same values, column-major
    with pytest.raises(moe_engine.MoeError, match=r"^hidden_states: expected a C-contiguous"):
        moe_engine.fused_experts(transposed, w13, w2, weights, ids)
    with pytest.raises(moe_engine.MoeError, match=r"^w1: .*ascontiguousarray"):
        moe_engine.fused_experts(hidden, w13[:, ::2], w2, weights, ids)


def test_misaligned_input_is_refused():
    hidden, w13, w2, weights, ids = make_problem(16, 4, 16, 8, 3, 2)
    buffer = bytearray(hidden.nbytes + 1)
    shifted = np.frombuffer(buffer, np.float32, hidden.size, offset=1).reshape(hidden.shape)
    with pytest.raises(moe_engine.MoeError, match=r"^hidden_states: expected data aligned"):
        moe_engine.fused_experts(shifted, w13, w2, weights, ids)


def test_moe_error_is_a_value_error():
    assert issubclass(moe_engine.MoeError, ValueError)
