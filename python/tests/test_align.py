"""align_block_size(): the block layout, checked against a direct construction and through the
properties the experts kernels rely on."""

import numpy as np
import pytest

import moe_engine
from numpy_reference import align_reference


def random_ids(seed, num_tokens, top_k, num_experts):
    rng = np.random.default_rng(seed)
    ids = [rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)]
    return np.array(ids, dtype=np.int32).reshape(num_tokens, top_k)


def check_invariants(ids, num_experts, block_m, sorted_ids, expert_ids, num_post_padded,
                     expert_map=None):
    flat = ids.reshape(-1)
    sentinel = flat.size
    assert sorted_ids.dtype == expert_ids.dtype == np.int32
    assert num_post_padded == sorted_ids.size and num_post_padded % block_m == 0
    assert expert_ids.size == num_post_padded // block_m
    # Every pair exactly once; everything else is padding.
    real = sorted_ids[sorted_ids != sentinel]
    np.testing.assert_array_equal(np.sort(real), np.arange(sentinel))
    # Each block holds pairs of one expert only, in ascending pair order, experts ascending.
    blocks = sorted_ids.reshape(-1, block_m)
    block_experts = []
    for b, block in enumerate(blocks):
        pairs = block[block != sentinel]
        assert pairs.size > 0, f"block {b} is all padding"
        assert (np.diff(pairs) > 0).all()
        experts = np.unique(flat[pairs])
        assert experts.size == 1, f"block {b} mixes experts {experts}"
        e = int(experts[0])
        block_experts.append(e)
        assert expert_ids[b] == (e if expert_map is None else expert_map[e])
    assert (np.diff(block_experts) >= 0).all()
    # ceil(count / block_m) blocks per expert, none for experts without pairs.
    counts = np.bincount(flat, minlength=num_experts)
    np.testing.assert_array_equal(np.bincount(block_experts, minlength=num_experts),
                                  -(-counts // block_m))


@pytest.mark.parametrize("block_m", [1, 4, 16, 64])
@pytest.mark.parametrize("num_tokens", [0, 1, 7, 100])
def test_layout(num_tokens, block_m):
    ids = random_ids(num_tokens * 31 + block_m, num_tokens, 4, 10)
    sorted_ids, expert_ids, n = moe_engine.align_block_size(ids, 10, block_m)
    check_invariants(ids, 10, block_m, sorted_ids, expert_ids, n)
    expected_sorted, expected_experts = align_reference(ids, 10, block_m)
    np.testing.assert_array_equal(sorted_ids, expected_sorted)
    np.testing.assert_array_equal(expert_ids, expected_experts)


def test_expert_map_marks_experts_of_other_ranks():
    ids = random_ids(5, 30, 3, 8)
    expert_map = np.array([0, -1, 1, -1, 2, -1, 3, -1], dtype=np.int32)
    sorted_ids, expert_ids, n = moe_engine.align_block_size(ids, 8, 4, expert_map)
    check_invariants(ids, 8, 4, sorted_ids, expert_ids, n, expert_map)
    np.testing.assert_array_equal(expert_ids, align_reference(ids, 8, 4, expert_map)[1])
    assert (expert_ids == -1).any()


def test_errors_name_the_argument():
    ids = random_ids(6, 5, 2, 4)
    with pytest.raises(moe_engine.MoeError, match=r"^topk_ids: .*got 4 at flat index"):
        moe_engine.align_block_size(np.where(ids == 0, 4, ids).astype(np.int32), 4, 8)
    with pytest.raises(moe_engine.MoeError, match=r"^block_m: "):
        moe_engine.align_block_size(ids, 4, 0)
    with pytest.raises(moe_engine.MoeError, match=r"^num_experts: "):
        moe_engine.align_block_size(ids, 0, 8)
    with pytest.raises(moe_engine.MoeError, match=r"^topk_ids: .*i32.*i64"):
        moe_engine.align_block_size(ids.astype(np.int64), 4, 8)
    with pytest.raises(moe_engine.MoeError, match=r"^expert_map: "):
        moe_engine.align_block_size(ids, 4, 8, np.zeros(3, np.int32))
