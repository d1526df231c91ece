"""Float64 NumPy references for the engine's operations, random problems for them, and error
bounds derived from the math.

Bounds follow the standard model of floating-point arithmetic: a sum of n products computed in
a precision with unit roundoff u, in any order, is off by at most about n * u * (the sum of the
products' absolute values). The references return that sum of absolute values (the
"magnitude") next to each result, so a test can bound every element rather than pick a
tolerance by eye.
"""

import numpy as np

# Unit roundoff: half the distance from 1 to the next number, relative.
UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}


def unit_roundoff(dtype):
    """dtype: a NumPy dtype, or a name ("bfloat16" needs no ml_dtypes that way)."""
    return UNIT_ROUNDOFF[dtype if isinstance(dtype, str) else np.dtype(dtype).name]


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


def silu(x):
    return x * sigmoid(x)


def silu_slope(x):
    s = sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def to_f64(array):
    """Exact: every f32, f16 and bf16 value is a float64."""
    return np.asarray(array).astype(np.float64)


def _mlp(x, w13, w2, b13=None, b2=None):
    """One SwiGLU expert on one row: (y [H], magnitude [H]).

    The magnitude carries the rounding of gemm1 through the activation to first order
    (|d silu(g) u| <= |silu'(g) u| |dg| + |silu(g)| |du|), then through gemm2.
    """
    i = w2.shape[1]
    g, u = w13[:i] @ x, w13[i:] @ x
    g_mag, u_mag = np.abs(w13[:i]) @ np.abs(x), np.abs(w13[i:]) @ np.abs(x)
    if b13 is not None:
        g, u = g + b13[:i], u + b13[i:]
        g_mag, u_mag = g_mag + np.abs(b13[:i]), u_mag + np.abs(b13[i:])
    a = silu(g) * u
    a_mag = np.abs(a) + np.abs(silu_slope(g) * u) * g_mag + np.abs(silu(g)) * u_mag
    y, y_mag = w2 @ a, np.abs(w2) @ a_mag
    if b2 is not None:
        y, y_mag = y + b2, y_mag + np.abs(b2)
    return y, y_mag


def make_problem(seed, num_tokens, hidden_size, intermediate_size, num_experts, top_k,
                 dtype=np.float32):
    """A random fused_experts problem: (hidden, w13, w2, topk_weights, topk_ids).

    Weights are scaled like a trained model's (each projection keeps activations of order one);
    router weights are not normalized, so a weight applied at the wrong place shows.
    """
    rng = np.random.default_rng(seed)
    hidden = rng.standard_normal((num_tokens, hidden_size)).astype(dtype)
    w13 = (rng.standard_normal((num_experts, 2 * intermediate_size, hidden_size))
           / np.sqrt(hidden_size)).astype(dtype)
    w2 = (rng.standard_normal((num_experts, hidden_size, intermediate_size))
          / np.sqrt(intermediate_size)).astype(dtype)
    ids = np.array([rng.choice(num_experts, top_k, replace=False) for _ in range(num_tokens)],
                   dtype=np.int32).reshape(num_tokens, top_k)
    weights = rng.uniform(0.1, 1.5, (num_tokens, top_k)).astype(np.float32)
    return hidden, w13, w2, weights, ids


def experts_reference(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None,
                      w13_bias=None, w2_bias=None, weight_on_input=False, shared=None):
    """fused_experts with silu gating: (out [M, H], magnitude [M, H]) in float64.

    out[t] = sum over j of topk_weights[t, j] * expert(topk_ids[t, j])(hidden[t]), j ascending
    (the weight scales the input instead with weight_on_input); pairs whose expert maps to -1
    contribute nothing. `shared` is an optional (w13, w2, gate or None) always-on expert whose
    output is scaled by sigmoid(hidden · gate) when there is a gate.
    """
    x_all = to_f64(hidden)
    w13, w2 = to_f64(w13), to_f64(w2)
    b13 = None if w13_bias is None else to_f64(w13_bias)
    b2 = None if w2_bias is None else to_f64(w2_bias)
    num_tokens, top_k = np.shape(topk_ids)
    out = np.zeros((num_tokens, w2.shape[1]))
    magnitude = np.zeros_like(out)
    for t in range(num_tokens):
        for j in range(top_k):
            e = int(topk_ids[t, j])
            if expert_map is not None:
                e = int(expert_map[e])
                if e < 0:
                    continue
            weight = float(topk_weights[t, j])
            x = weight * x_all[t] if weight_on_input else x_all[t]
            y, y_mag = _mlp(x, w13[e], w2[e],
                            None if b13 is None else b13[e], None if b2 is None else b2[e])
            scale = 1.0 if weight_on_input else weight
            out[t] += scale * y
            magnitude[t] += abs(scale) * y_mag
        if shared is not None:
            s_w13, s_w2, s_gate = (None if w is None else to_f64(w) for w in shared)
            y, y_mag = _mlp(x_all[t], s_w13, s_w2)
            if s_gate is not None:
                logit = s_gate.reshape(-1) @ x_all[t]
                logit_mag = np.abs(s_gate.reshape(-1)) @ np.abs(x_all[t])
                # sigmoid' <= 1/4 carries the gate logit's rounding.
                y_mag = sigmoid(logit) * y_mag + 0.25 * logit_mag * np.abs(y)
                y = sigmoid(logit) * y
            out[t] += y
            magnitude[t] += y_mag
    return out, magnitude


def experts_bound(expected, magnitude, num_terms, out_dtype, weight_dtype="float32"):
    """Elementwise bound on |got - expected| for f32 accumulation and one rounding to out_dtype.

    num_terms is the longest chain of roundings (H + I + k + a few); the factor 2 covers the
    second-order terms and the few ulps of exp() inside silu. With bf16 weights the engine's
    amx and avx512bf16 paths also round the inputs of both GEMMs to bf16, which moves each
    product by at most one bf16 unit roundoff: one more term per GEMM.
    """
    accumulation = 2 * num_terms * UNIT_ROUNDOFF["float32"] * magnitude
    if weight_dtype == "bfloat16":
        accumulation = accumulation + 2 * UNIT_ROUNDOFF["bfloat16"] * magnitude
    return accumulation + unit_roundoff(out_dtype) * np.abs(expected)


def assert_within(got, expected, bound, what):
    """Fails naming the worst element, expected, got and bound."""
    got = to_f64(got)
    assert got.shape == expected.shape, f"{what}: shape {got.shape}, expected {expected.shape}"
    if got.size == 0:
        return
    assert not np.isnan(got).any(), f"{what}: NaN at {np.argwhere(np.isnan(got))[0]}"
    excess = np.abs(got - expected) - bound
    worst = np.unravel_index(np.argmax(excess), got.shape)
    assert excess[worst] <= 0, (
        f"{what}: worst element {worst}: expected {expected[worst]!r}, got {got[worst]!r}, "
        f"|error| {abs(got[worst] - expected[worst]):.3g} > bound {bound[worst]:.3g}")


def route_reference(hidden, router_weight, top_k, *, scoring="softmax", renormalize=False,
                    num_groups=1, topk_groups=1, correction_bias=None,
                    routed_scaling_factor=1.0):
    """(topk_ids [M, k] int64, topk_weights [M, k] float64), ties to the lower expert id."""
    logits = to_f64(hidden) @ to_f64(router_weight).T
    if scoring == "softmax":
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        scores = shifted / shifted.sum(axis=1, keepdims=True)
    else:
        scores = sigmoid(logits)
    select = scores if correction_bias is None else scores + to_f64(correction_bias)
    num_tokens, num_experts = select.shape
    if num_groups > 1:
        grouped = select.reshape(num_tokens, num_groups, num_experts // num_groups)
        # DeepSeek-V3 scores a group by its two best biased scores, V2 by its best one.
        best = -np.sort(-grouped, axis=2)
        group_scores = best[:, :, :2].sum(axis=2) if correction_bias is not None else best[:, :, 0]
        kept = np.argsort(-group_scores, axis=1, kind="stable")[:, :topk_groups]
        mask = np.zeros((num_tokens, num_groups), dtype=bool)
        np.put_along_axis(mask, kept, True, axis=1)
        select = np.where(np.repeat(mask, num_experts // num_groups, axis=1), select, -np.inf)
    ids = np.argsort(-select, axis=1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(scores, ids, axis=1)
    if renormalize:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return ids, weights * routed_scaling_factor


def align_reference(topk_ids, num_experts, block_m, expert_map=None):
    """(sorted_token_ids, expert_ids) built the obvious way, one expert at a time."""
    flat = np.asarray(topk_ids).reshape(-1)
    sentinel = flat.size
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        pairs = np.flatnonzero(flat == e).tolist()
        if not pairs:
            continue
        num_blocks = -(-len(pairs) // block_m)
        sorted_ids += pairs + [sentinel] * (num_blocks * block_m - len(pairs))
        expert_ids += [e if expert_map is None else int(expert_map[e])] * num_blocks
    return np.array(sorted_ids, dtype=np.int32), np.array(expert_ids, dtype=np.int32)
