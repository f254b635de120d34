"""Tests for companion.attention: oracles (a float64 loop from the formula,
F.scaled_dot_product_attention, nn.MultiheadAttention, torch's causal biases), hypothesis
properties, validation tables, and the chapter's checkers both ways."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

from companion import checks
from companion.attention import (
    MultiHeadAttention,
    additive_score,
    attention_weights,
    causal_mask,
    concat_score,
    dot_score,
    general_score,
    mask_from_torch_mha,
    measure_peak_memory,
    scaled_dot_product_attention,
    tiled_attention,
)


def qkv(*shape_q, source=None, dv=None, dtype=torch.float32, device="cpu", seed=0):
    """Random query (..., L, D), key (..., S, D), value (..., S, Dv)."""
    gen = torch.Generator().manual_seed(seed)
    *batch, length, width = shape_q
    source = length if source is None else source
    dv = width if dv is None else dv
    q = torch.randn(*batch, length, width, generator=gen)
    k = torch.randn(*batch, source, width, generator=gen)
    v = torch.randn(*batch, source, dv, generator=gen)
    return (t.to(device=device, dtype=dtype) for t in (q, k, v))


def loop_attention(q, k, v, allowed, scale):
    """softmax(q·k * scale) v for one (L, D) problem, from the formula, in float64 NumPy."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    out = np.zeros((q.shape[0], v.shape[1]))
    for i in range(q.shape[0]):
        scores = [
            sum(q[i, d] * k[j, d] for d in range(q.shape[1])) * scale for j in range(k.shape[0])
        ]
        keep = [j for j in range(k.shape[0]) if allowed[i][j]]
        top = max(scores[j] for j in keep)
        e = {j: math.exp(scores[j] - top) for j in keep}
        total = sum(e.values())
        for j in keep:
            out[i] += e[j] / total * v[j]
    return out


# ---------------------------------------------------------------------------------------------
# Oracle tests
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_loop(causal):
    q, k, v = qkv(4, 6, source=5, dv=3, dtype=torch.float64)
    allowed = causal_mask(4, 5).tolist() if causal else [[True] * 5] * 4
    expected = loop_attention(q, k, v, allowed, 1 / math.sqrt(6))
    got = scaled_dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


MASK_CASES = ["none", "bool", "bool_broadcast", "float", "causal", "causal_long_keys", "scale"]


def _mask_case(case, length, source, device):
    gen = torch.Generator().manual_seed(7)
    if case == "bool":
        mask = torch.rand(length, source, generator=gen) > 0.4
        mask[:, 0] = True  # no fully masked row: torch's backends disagree there
        return {"mask": mask.to(device)}, {"attn_mask": mask.to(device)}
    if case == "bool_broadcast":
        mask = torch.ones(2, 1, 1, source, dtype=torch.bool)
        mask[1, ..., source // 2 :] = False  # padding in the second batch element
        return {"mask": mask.to(device)}, {"attn_mask": mask.to(device)}
    if case == "float":
        mask = torch.randn(2, 1, length, source, generator=gen).to(device)
        return {"mask": mask}, {"attn_mask": mask}
    if case in ("causal", "causal_long_keys"):
        return {"is_causal": True}, {"is_causal": True}
    if case == "scale":
        return {"scale": 0.3}, {"scale": 0.3}
    return {}, {}


@pytest.mark.parametrize("case", MASK_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_sdpa(case, dtype, device):
    source = 9 if case == "causal_long_keys" else 7
    q, k, v = qkv(2, 3, 7, 16, source=source, dv=5, dtype=dtype, device=device)
    ours, theirs = _mask_case(case, 7, source, device)
    expected = F.scaled_dot_product_attention(q, k, v, **theirs)
    got = scaled_dot_product_attention(q, k, v, **ours)
    assert got.dtype == dtype and got.device == expected.device
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(got, expected, **tol)


def test_weights_match_explicit_softmax():
    q, k, _ = qkv(2, 5, 8, source=6)
    mask = torch.rand(5, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 2] = True
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(attention_weights(q, k, mask=mask), torch.softmax(scores, dim=-1))


def test_bottom_right_matches_torch_causal_lower_right(device):
    q, k, v = qkv(1, 2, 4, 8, source=7, device=device)
    bias = causal_lower_right(4, 7)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    mask = causal_mask(4, 7, alignment="bottom_right", device=device)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=mask), expected)


@pytest.mark.parametrize(("length", "source"), [(4, 4), (3, 6), (6, 3)])
def test_causal_mask_alignments(length, source):
    ones = torch.ones(length, source, dtype=torch.bool)
    assert torch.equal(causal_mask(length, source), ones.tril())
    lower_right = ones.tril(diagonal=source - length)
    if length <= source:  # torch warns that its lower-right bias gives NaN rows otherwise
        assert torch.equal(lower_right, causal_lower_right(length, source)._materialize())
    assert torch.equal(causal_mask(length, source, alignment="bottom_right"), lower_right)


def test_fully_masked_row_gives_zero():
    q, k, v = qkv(3, 4, source=5)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    weights = attention_weights(q, k, mask=mask)
    out = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(weights[1], torch.zeros(5))
    assert torch.equal(out[1], torch.zeros(4))
    assert torch.isfinite(out).all()
    float_mask = torch.zeros(3, 5).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask=float_mask), out)


def test_scores_against_loops():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    wq = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    wk = torch.randn(7, 6, generator=gen, dtype=torch.float64)
    a = torch.randn(7, generator=gen, dtype=torch.float64)
    bilinear = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    additive = additive_score(q, k, query_weight=wq, key_weight=wk, v=a)
    general = general_score(q, k, weight=bilinear)
    for i in range(3):
        for j in range(5):
            expected = a @ torch.tanh(wq @ q[i] + wk @ k[j])
            torch.testing.assert_close(additive[i, j], expected)
            torch.testing.assert_close(general[i, j], q[i] @ bilinear @ k[j])
    # Luong's concat is Bahdanau's additive score with W split by columns
    concat = concat_score(q, k, weight=torch.cat([wq, wk], dim=1), v=a)
    torch.testing.assert_close(concat, additive)
    # general with the identity is the dot score
    q2, k2, _ = qkv(2, 3, 4, source=5, dtype=torch.float64)
    identity = torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(general_score(q2, k2, weight=identity), dot_score(q2, k2))
    torch.testing.assert_close(dot_score(q2, k2), torch.einsum("bld,bsd->bls", q2, k2))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masks", ["none", "bool", "float", "causal"])
def test_multi_head_matches_torch(bias, masks, device):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(16, 4, bias=bias, batch_first=True, device=device)
    ours = MultiHeadAttention(16, 4, bias=bias, device=device).load_torch_weights(theirs)
    theirs.eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 16, generator=gen).to(device)
    y = torch.randn(2, 6, 16, generator=gen).to(device)
    kw, mask, is_causal = {}, None, False
    if masks == "bool":
        padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2], device=device)
        blocked = torch.zeros(5, 6, dtype=torch.bool, device=device)
        blocked[:, 1] = True
        kw = {"key_padding_mask": padding, "attn_mask": blocked}
        mask = mask_from_torch_mha(attn_mask=blocked, key_padding_mask=padding)
        assert mask.dtype == torch.bool and mask.shape == (2, 1, 5, 6)
    elif masks == "float":
        additive = torch.randn(5, 6, generator=gen).to(device)
        padding = torch.zeros(2, 6, device=device)
        padding[1, 3:] = float("-inf")  # float, like attn_mask: torch deprecates mixing types
        kw = {"key_padding_mask": padding, "attn_mask": additive}
        mask = mask_from_torch_mha(attn_mask=additive, key_padding_mask=padding)
    with torch.no_grad():
        if masks == "causal":
            blocked = ~torch.ones(5, 5, dtype=torch.bool, device=device).tril()
            expected = theirs(x, x, x, attn_mask=blocked, need_weights=False)[0]
            got = ours(x, x, x, is_causal=True)
        else:
            expected = theirs(x, y, y, need_weights=False, **kw)[0]
            got = ours(x, y, y, mask=mask, is_causal=is_causal)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_multi_head_is_thin_and_splits_heads_like_torch():
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    ours = MultiHeadAttention(8, 2).load_torch_weights(theirs)
    x = torch.randn(1, 4, 8)
    _, per_head = theirs(x, x, x, need_weights=True, average_attn_weights=False)  # (B, H, L, S)
    q = ours.q_proj(x).view(1, 4, 2, 4).transpose(1, 2)
    k = ours.k_proj(x).view(1, 4, 2, 4).transpose(1, 2)
    torch.testing.assert_close(attention_weights(q, k), per_head)


# ---------------------------------------------------------------------------------------------
# Tiled attention and memory
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 3, 8, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("source", [11, 17])
def test_tiled_matches_full(block_size, causal, source, device):
    q, k, v = qkv(2, 2, 13, 8, source=source, dv=5, device=device)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    got = tiled_attention(q, k, v, block_size=block_size, is_causal=causal)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_tiled_bfloat16_and_scale(device):
    q, k, v = qkv(1, 2, 9, 16, dtype=torch.bfloat16, device=device)
    got = tiled_attention(q, k, v, block_size=4, scale=0.5)
    assert got.dtype == torch.bfloat16
    expected = scaled_dot_product_attention(q, k, v, scale=0.5)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_measure_peak_memory_counts_tensors():
    def two_live():
        a = torch.ones(1000)
        b = a * 2  # a and b alive together: 8000 bytes
        del a
        return b + 1  # b and the result: 8000 bytes

    assert measure_peak_memory(lambda: torch.empty(250).fill_(0.0), device="cpu") == 1000
    assert measure_peak_memory(two_live, device="cpu") == 8000


def test_measure_peak_memory_ignores_views_of_existing_tensors():
    x = torch.randn(3, 1, 1, 512, 64)  # q, k, v in one storage, made before the measurement
    assert measure_peak_memory(lambda: (x[0], x[1, ..., 100:200, :], x.view(-1)), device="cpu") == 0
    assert measure_peak_memory(lambda: x.add_(1.0), device="cpu") == 0  # in place: no new memory
    # a view of the shared storage must not be charged the whole storage: peaks are the same
    qa, ka, va = x
    q, k, v = qa.clone(), ka.clone(), va.clone()
    shared = measure_peak_memory(lambda: tiled_attention(qa, ka, va, block_size=64), device="cpu")
    separate = measure_peak_memory(lambda: tiled_attention(q, k, v, block_size=64), device="cpu")
    assert shared == separate
    # the tiled peak is the (L, d) output plus a few (block, block) and (block, d) tiles
    out_bytes = q.numel() * 4
    assert out_bytes < separate < out_bytes + 8 * 64 * 64 * 4


def test_measure_peak_memory_keeps_a_storage_while_a_view_of_it_lives():
    """4-D matmul returns a view (_unsafe_view) of a bmm result that dies at once: the storage
    must stay counted as long as the returned view holds it."""
    a, b = torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32)
    kept = []

    def scores_then_more() -> None:
        kept.append(a @ b.transpose(-2, -1))  # (1, 2, 64, 64): 32 KiB, alive to the end
        kept.append(torch.empty(1000).fill_(0.0))  # 4000 bytes more while the scores live

    peak = measure_peak_memory(scores_then_more, device="cpu")
    assert peak >= 2 * 64 * 64 * 4 + 4000


def test_tiled_memory_is_a_small_fraction_of_the_score_matrix():
    q, k, v = qkv(1, 1, 1024, 16)
    score_matrix = 1024 * 1024 * 4
    full = measure_peak_memory(lambda: scaled_dot_product_attention(q, k, v), device="cpu")
    tiled = measure_peak_memory(lambda: tiled_attention(q, k, v, block_size=64), device="cpu")
    assert full >= 2 * score_matrix  # scores and weights coexist
    assert tiled <= score_matrix / 20


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

dims = st.integers(1, 6)


@st.composite
def problems(draw):
    length, source, width = draw(dims), draw(dims), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, length, width, generator=gen)
    k = torch.randn(2, source, width, generator=gen)
    v = torch.randn(2, source, 3, generator=gen)
    mask = torch.rand(2, length, source, generator=gen) > 0.5
    return q, k, v, mask


@given(problems())
def test_rows_sum_to_one_and_masked_weights_are_zero(problem):
    q, k, _, mask = problem
    weights = attention_weights(q, k, mask=mask)
    sums = weights.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert torch.equal(sums[~has_key], torch.zeros_like(sums[~has_key]))
    assert torch.equal(weights[~mask], torch.zeros_like(weights[~mask]))  # exactly zero


@given(problems(), st.integers(0, 2**16))
def test_permutation_equivariance(problem, seed):
    q, k, v, _ = problem
    gen = torch.Generator().manual_seed(seed)
    p_query = torch.randperm(q.shape[-2], generator=gen)
    p_key = torch.randperm(k.shape[-2], generator=gen)
    out = scaled_dot_product_attention(q, k, v)
    # permuting the queries permutes the outputs (equivariance) ...
    permuted = scaled_dot_product_attention(q[:, p_query], k, v)
    torch.testing.assert_close(permuted, out[:, p_query])
    # ... and permuting the key/value pairs together changes nothing (invariance)
    torch.testing.assert_close(scaled_dot_product_attention(q, k[:, p_key], v[:, p_key]), out)


def test_positions_break_permutation_equivariance():
    from companion.positional import sinusoidal_encoding
    from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

    q, k, v = qkv(1, 6, 8)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    out = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(
        scaled_dot_product_attention(q[:, perm], k[:, perm], v[:, perm]), out[:, perm]
    )
    pe = sinusoidal_encoding(6, 8)
    with_pe = scaled_dot_product_attention(q + pe, k + pe, v)
    moved = scaled_dot_product_attention(q[:, perm] + pe, k[:, perm] + pe, v[:, perm])
    assert (moved - with_pe[:, perm]).abs().max() > 1e-3
    cos, sin = rope_cos_sin(torch.arange(6), rope_frequencies(8))

    def rope_attention(q, k, v):
        return scaled_dot_product_attention(
            apply_rope(q[None], cos, sin)[0], apply_rope(k[None], cos, sin)[0], v
        )

    rotated = rope_attention(q, k, v)
    assert (
        rope_attention(q[:, perm], k[:, perm], v[:, perm]) - rotated[:, perm]
    ).abs().max() > 1e-3


@given(problems(), st.integers(1, 7), st.booleans())
def test_tiled_equals_full(problem, block_size, causal):
    q, k, v, _ = problem
    expected = scaled_dot_product_attention(q, k, v, is_causal=causal)
    got = tiled_attention(q, k, v, block_size=block_size, is_causal=causal)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@given(problems(), st.sampled_from([1e4, -1e4]))
def test_large_logits_stay_finite(problem, big):
    q, k, v, mask = problem
    q = q.clone()
    q[..., 0] = big
    k = k.clone()
    k[..., 0] = 1.0  # scores of size ~1e4 * 1 / sqrt(D), both signs
    for out in (
        attention_weights(q, k, mask=mask),
        scaled_dot_product_attention(q, k, v, mask=mask),
        scaled_dot_product_attention(q * 1e-4 * big, k, v, scale=1.0),
        tiled_attention(q, k, v, block_size=2),
    ):
        assert torch.isfinite(out).all()


# ---------------------------------------------------------------------------------------------
# Validation tables
# ---------------------------------------------------------------------------------------------

_q, _k, _v = qkv(2, 4, 8, source=5, dv=3)

SDPA_BAD = [
    ({"query": _q.numpy()}, TypeError, "query must be a torch.Tensor, got ndarray"),
    ({"query": _q.long()}, TypeError, "query must have a floating-point dtype"),
    ({"query": torch.randn(8)}, ValueError, "query must have at least 2 dimensions"),
    ({"key": _k.double()}, TypeError, "key must have query's dtype torch.float32"),
    ({"value": _v.double()}, TypeError, "value must have query's dtype"),
    ({"key": torch.randn(2, 5, 7)}, ValueError, "query and key must have the same feature width"),
    ({"value": torch.randn(2, 6, 3)}, ValueError, "key and value must have the same length S"),
    ({"key": torch.randn(3, 5, 8), "value": torch.randn(3, 5, 3)}, ValueError, "must broadcast"),
    (
        {"mask": torch.ones(4, 6, dtype=torch.bool)},
        ValueError,
        r"mask must broadcast to .*\(2, 4, 5\)",
    ),
    ({"mask": torch.ones(4, 5, dtype=torch.int64)}, TypeError, "mask must be boolean"),
    ({"mask": [[True]]}, TypeError, "mask must be a torch.Tensor or None"),
    ({"mask": torch.ones(4, 5, dtype=torch.bool), "is_causal": True}, ValueError, "not both"),
    ({"is_causal": 1}, TypeError, "is_causal must be a bool"),
    ({"scale": "0.5"}, TypeError, "scale must be a float or None"),
    ({"scale": 0.0}, ValueError, "scale must be a positive finite number, got 0.0"),
    ({"scale": float("nan")}, ValueError, "scale must be a positive finite number"),
]


@pytest.mark.parametrize(("override", "error", "match"), SDPA_BAD)
def test_sdpa_rejects(override, error, match):
    args = {"query": _q, "key": _k, "value": _v, **override}
    with pytest.raises(error, match=match):
        scaled_dot_product_attention(args.pop("query"), args.pop("key"), args.pop("value"), **args)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: tiled_attention(_q, _k, _v, block_size=0),
            ValueError,
            "block_size must be positive, got 0",
        ),
        (
            lambda: tiled_attention(_q, _k, _v, block_size=2.0),
            TypeError,
            "block_size must be an int",
        ),
        (
            lambda: tiled_attention(_q, _k, _v, block_size=2, is_causal=None),
            TypeError,
            "is_causal must be a bool",
        ),
        (
            lambda: attention_weights(_q, _k, mask=torch.ones(3, 3, dtype=torch.bool)),
            ValueError,
            "mask must broadcast",
        ),
        (lambda: causal_mask(0, 3), ValueError, "query_length must be positive, got 0"),
        (lambda: causal_mask(3, True), TypeError, "key_length must be an int, got bool"),
        (
            lambda: causal_mask(3, 3, alignment="top"),
            ValueError,
            "alignment must be 'top_left' or 'bottom_right'",
        ),
        (
            lambda: general_score(_q, _k, weight=torch.eye(3)),
            ValueError,
            r"weight must have shape \(Dq, Dk\)",
        ),
        (
            lambda: additive_score(
                _q, _k, query_weight=torch.ones(4, 8), key_weight=torch.ones(5, 8), v=torch.ones(4)
            ),
            ValueError,
            "key_weight must have shape",
        ),
        (
            lambda: concat_score(_q, _k, weight=torch.ones(4, 8), v=torch.ones(4)),
            ValueError,
            r"weight must have shape \(A, Dq \+ Dk\)",
        ),
        (
            lambda: MultiHeadAttention(10, 4),
            ValueError,
            "num_heads must divide embed_dim, got embed_dim=10, num_heads=4",
        ),
        (lambda: MultiHeadAttention(8, 0), ValueError, "num_heads must be positive"),
        (lambda: MultiHeadAttention(8.0, 2), TypeError, "embed_dim must be an int"),
        (
            lambda: MultiHeadAttention(8, 2)(_q[None], _q[None], _q[None]),
            ValueError,
            r"query must have shape \(B, length, embed_dim=8\)",
        ),
        (
            lambda: MultiHeadAttention(8, 2).load_torch_weights(torch.nn.Linear(8, 8)),
            TypeError,
            "module must be an nn.MultiheadAttention",
        ),
        (
            lambda: MultiHeadAttention(8, 2).load_torch_weights(torch.nn.MultiheadAttention(8, 4)),
            ValueError,
            "module must have embed_dim=8, num_heads=2",
        ),
        (
            lambda: mask_from_torch_mha(key_padding_mask=torch.ones(5, dtype=torch.bool)),
            ValueError,
            r"key_padding_mask must be a 2-D \(B, S\)",
        ),
        (lambda: measure_peak_memory(3, device="cpu"), TypeError, "fn must be callable"),
    ],
)
def test_other_functions_reject(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_mask_from_torch_mha_inverts_and_combines():
    blocked = torch.tensor([[False, True], [False, False]])
    padding = torch.tensor([[False, False], [False, True]])
    assert mask_from_torch_mha() is None
    assert torch.equal(mask_from_torch_mha(attn_mask=blocked), ~blocked)
    both = mask_from_torch_mha(attn_mask=blocked, key_padding_mask=padding)
    assert torch.equal(both[1, 0], torch.tensor([[True, False], [True, False]]))
    additive = mask_from_torch_mha(attn_mask=torch.zeros(2, 2), key_padding_mask=padding)
    assert additive.dtype == torch.float32 and torch.isneginf(additive[1, 0, :, 1]).all()


# ---------------------------------------------------------------------------------------------
# Checkers, both ways
# ---------------------------------------------------------------------------------------------


def _reject(checker, fn, name):
    with pytest.raises(checks.CheckError) as info:
        checker(fn)
    assert info.value.mistake == name
    assert name in str(info.value)


def test_check_attention_both_ways():
    assert checks.check_attention(
        lambda query, key, value: scaled_dot_product_attention(query, key, value)
    )
    _reject(
        checks.check_attention,
        lambda query, key, value: torch.softmax(query @ key.mT, dim=-1) @ value,
        "missing 1/sqrt(d_k)",
    )
    _reject(
        checks.check_attention,
        lambda query, key, value: (
            torch.softmax(query @ key.mT / query.shape[-1] ** 0.5, dim=-2) @ value
        ),
        "softmax over the wrong axis",
    )
    _reject(
        checks.check_attention,
        lambda query, key, value: torch.softmax(query @ key.mT / query.shape[-1], dim=-1) @ value,
        "divided by d_k instead of sqrt(d_k)",
    )


def test_check_masked_attention_both_ways():
    def ref(query, key, value, mask):
        return scaled_dot_product_attention(query, key, value, mask=mask)

    def after(query, key, value, mask):
        weights = torch.softmax(query @ key.mT / query.shape[-1] ** 0.5, dim=-1)
        return weights.masked_fill(~mask, 0.0) @ value

    def inverted(query, key, value, mask):
        return scaled_dot_product_attention(query, key, value, mask=~mask)

    assert checks.check_masked_attention(ref)
    _reject(checks.check_masked_attention, after, "mask applied after the softmax")
    _reject(checks.check_masked_attention, inverted, "mask inverted")


def test_check_causal_mask_both_ways():
    def make(diagonal):
        return lambda query_length, key_length: torch.ones(
            query_length, key_length, dtype=torch.bool
        ).tril(diagonal)

    assert checks.check_causal_mask(
        lambda query_length, key_length: causal_mask(query_length, key_length)
    )
    _reject(checks.check_causal_mask, make(-1), "causal mask off by one (the diagonal is excluded)")
    _reject(checks.check_causal_mask, make(1), "causal mask off by one (one future key is visible)")

    def bottom_right(query_length, key_length):
        return causal_mask(query_length, key_length, alignment="bottom_right")

    _reject(checks.check_causal_mask, bottom_right, "bottom-right alignment")
    with pytest.raises(checks.CheckError, match="dtype"):
        checks.check_causal_mask(
            lambda query_length, key_length: causal_mask(query_length, key_length).int()
        )


def test_check_split_heads_both_ways():
    assert checks.check_split_heads(
        lambda x, num_heads: x.view(x.shape[0], x.shape[1], num_heads, -1).transpose(1, 2)
    )
    _reject(
        checks.check_split_heads,
        lambda x, num_heads: x.reshape(x.shape[0], num_heads, x.shape[1], -1),
        "reshaped to (B, H, L, E/H) directly",
    )


def test_check_tiled_attention_both_ways():
    assert checks.check_tiled_attention(
        lambda query, key, value, block_size: tiled_attention(
            query, key, value, block_size=block_size
        )
    )
    _reject(
        checks.check_tiled_attention, checks._tiled_without_rescale, "running sums not rescaled"
    )

    def no_max(query, key, value, block_size):
        e = torch.exp(query @ key.mT / query.shape[-1] ** 0.5)
        return (e @ value) / e.sum(-1, keepdim=True)

    with pytest.raises(checks.CheckError, match="NaN or inf"):
        checks.check_tiled_attention(no_max)
