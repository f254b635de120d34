"""Tests for companion.attention: oracles (a float64 loop from the formula,
F.scaled_dot_product_attention, nn.MultiheadAttention, torch's causal biases),
hypothesis properties, empty inputs, and the bad-input table that tests/test_contract.py
runs (the chapter's checkers are tested in tests/checks/test_checks_attention.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.bias import causal_lower_right

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
    softmax_scale,
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
    """softmax(q·k * scale) v for one (L, D) problem, from the formula, in float64
    NumPy."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    out = np.zeros((q.shape[0], v.shape[1]))
    for i in range(q.shape[0]):
        scores = [
            sum(q[i, d] * k[j, d] for d in range(q.shape[1])) * scale
            for j in range(k.shape[0])
        ]
        keep = [j for j in range(k.shape[0]) if allowed[i][j]]
        top = max(scores[j] for j in keep)
        e = {j: math.exp(scores[j] - top) for j in keep}
        total = sum(e.values())
        for j in keep:
            out[i] += e[j] / total * v[j]
    return out


# ---- oracle tests --------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_loop(causal):
    q, k, v = qkv(4, 6, source=5, dv=3, dtype=torch.float64)
    allowed = causal_mask(4, 5).tolist() if causal else [[True] * 5] * 4
    expected = loop_attention(q, k, v, allowed, 1 / math.sqrt(6))
    got = scaled_dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


MASK_CASES = [
    "none",
    "bool",
    "bool_broadcast",
    "float",
    "causal",
    "causal_long_keys",
    "scale",
]


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
    tol = (
        {"atol": 2e-2, "rtol": 2e-2}
        if dtype == torch.bfloat16
        else {"atol": 1e-5, "rtol": 1e-5}
    )
    torch.testing.assert_close(got, expected, **tol)


def test_weights_match_explicit_softmax():
    q, k, _ = qkv(2, 5, 8, source=6)
    mask = torch.rand(5, 6, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 2] = True
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(
        attention_weights(q, k, mask=mask), torch.softmax(scores, dim=-1)
    )


def test_bottom_right_matches_torch_causal_lower_right(device):
    q, k, v = qkv(1, 2, 4, 8, source=7, device=device)
    bias = causal_lower_right(4, 7)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    mask = causal_mask(4, 7, alignment="bottom_right", device=device)
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, mask=mask), expected
    )


@pytest.mark.parametrize(("length", "source"), [(4, 4), (3, 6), (6, 3)])
def test_causal_mask_alignments(length, source):
    ones = torch.ones(length, source, dtype=torch.bool)
    assert torch.equal(causal_mask(length, source), ones.tril())
    lower_right = ones.tril(diagonal=source - length)
    if (
        length <= source
    ):  # torch warns that its lower-right bias gives NaN rows otherwise
        assert torch.equal(
            lower_right, causal_lower_right(length, source)._materialize()
        )
    assert torch.equal(
        causal_mask(length, source, alignment="bottom_right"), lower_right
    )


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
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k, v, mask=float_mask), out
    )


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
    torch.testing.assert_close(
        general_score(q2, k2, weight=identity), dot_score(q2, k2)
    )
    torch.testing.assert_close(dot_score(q2, k2), torch.einsum("bld,bsd->bls", q2, k2))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masks", ["none", "bool", "float", "causal"])
def test_multi_head_matches_torch(bias, masks, device):
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(
        16, 4, bias=bias, batch_first=True, device=device
    )
    ours = MultiHeadAttention(16, 4, bias=bias, device=device).load_torch_weights(
        theirs
    )
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
        padding[1, 3:] = float(
            "-inf"
        )  # float, like attn_mask: torch deprecates mixing types
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


@pytest.mark.parametrize(
    "option", [{"add_zero_attn": True}, {"add_bias_kv": True}, {"dropout": 0.5}]
)
def test_refused_torch_options_change_torchs_output(option):
    """The options load_torch_weights refuses are ones whose output this module cannot
    give: with the same packed weights copied by hand, torch's output differs."""
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True, **option)
    plain = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        plain.in_proj_weight.copy_(theirs.in_proj_weight)
        plain.in_proj_bias.copy_(theirs.in_proj_bias)
        plain.out_proj.weight.copy_(theirs.out_proj.weight)
        plain.out_proj.bias.copy_(theirs.out_proj.bias)
    ours = MultiHeadAttention(8, 2).load_torch_weights(plain)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    theirs.train()  # dropout acts in training mode only
    with torch.no_grad():
        gap = (theirs(x, x, x, need_weights=False)[0] - ours(x, x, x)).abs().max()
    assert gap > 1e-2  # add_zero_attn: 0.078 in the review; far above rounding


def test_load_torch_weights_from_a_sequence_first_module():
    """batch_first=False changes only the layout of torch's inputs, not its weights."""
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2)  # batch_first=False: (L, B, D)
    ours = MultiHeadAttention(8, 2).load_torch_weights(theirs)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    seq_first = x.transpose(0, 1)
    with torch.no_grad():
        expected = theirs(seq_first, seq_first, seq_first, need_weights=False)[0]
        torch.testing.assert_close(ours(x, x, x), expected.transpose(0, 1))


def test_multi_head_is_thin_and_splits_heads_like_torch():
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    ours = MultiHeadAttention(8, 2).load_torch_weights(theirs)
    x = torch.randn(1, 4, 8)
    _, per_head = theirs(
        x, x, x, need_weights=True, average_attn_weights=False
    )  # (B, H, L, S)
    q = ours.q_proj(x).view(1, 4, 2, 4).transpose(1, 2)
    k = ours.k_proj(x).view(1, 4, 2, 4).transpose(1, 2)
    torch.testing.assert_close(attention_weights(q, k), per_head)


# ---- tiled attention and memory ------------------------------------------------------


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

    assert (
        measure_peak_memory(lambda: torch.empty(250).fill_(0.0), device="cpu") == 1000
    )
    assert measure_peak_memory(two_live, device="cpu") == 8000


def test_measure_peak_memory_ignores_views_of_existing_tensors():
    x = torch.randn(
        3, 1, 1, 512, 64
    )  # q, k, v in one storage, made before the measurement
    assert (
        measure_peak_memory(
            lambda: (x[0], x[1, ..., 100:200, :], x.view(-1)), device="cpu"
        )
        == 0
    )
    assert (
        measure_peak_memory(lambda: x.add_(1.0), device="cpu") == 0
    )  # in place: no new memory
    # a view of the shared storage must not be charged the whole storage: peaks are the
    # same
    qa, ka, va = x
    q, k, v = qa.clone(), ka.clone(), va.clone()
    shared = measure_peak_memory(
        lambda: tiled_attention(qa, ka, va, block_size=64), device="cpu"
    )
    separate = measure_peak_memory(
        lambda: tiled_attention(q, k, v, block_size=64), device="cpu"
    )
    assert shared == separate
    # the tiled peak is the (L, d) output plus a few (block, block) and (block, d) tiles
    out_bytes = q.numel() * 4
    assert out_bytes < separate < out_bytes + 8 * 64 * 64 * 4


def test_measure_peak_memory_keeps_a_storage_while_a_view_of_it_lives():
    """4-D matmul returns a view (_unsafe_view) of a bmm result that dies at once: the
    storage
    must stay counted as long as the returned view holds it."""
    a, b = torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32)
    kept = []

    def scores_then_more() -> None:
        kept.append(a @ b.transpose(-2, -1))  # (1, 2, 64, 64): 32 KiB, alive to the end
        kept.append(
            torch.empty(1000).fill_(0.0)
        )  # 4000 bytes more while the scores live

    peak = measure_peak_memory(scores_then_more, device="cpu")
    assert peak >= 2 * 64 * 64 * 4 + 4000


def test_tiled_memory_is_a_small_fraction_of_the_score_matrix():
    q, k, v = qkv(1, 1, 1024, 16)
    score_matrix = 1024 * 1024 * 4
    full = measure_peak_memory(
        lambda: scaled_dot_product_attention(q, k, v), device="cpu"
    )
    tiled = measure_peak_memory(
        lambda: tiled_attention(q, k, v, block_size=64), device="cpu"
    )
    assert full >= 2 * score_matrix  # scores and weights coexist
    assert tiled <= score_matrix / 20


# ---- properties ----------------------------------------------------------------------

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
    torch.testing.assert_close(
        scaled_dot_product_attention(q, k[:, p_key], v[:, p_key]), out
    )


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


# ---- bad inputs: the contract (run by tests/test_contract.py) ------------------------

_q, _k, _v = qkv(2, 4, 8, source=5, dv=3)
_meta = torch.empty(2, 5, 8, device="meta")
_mha = MultiHeadAttention(8, 2)
_x = torch.randn(2, 3, 8)
_w = {
    "query_weight": torch.ones(4, 8),
    "key_weight": torch.ones(4, 8),
    "v": torch.ones(4),
}
_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _sdpa(**override):
    args = {"query": _q, "key": _k, "value": _v, **override}
    return lambda: scaled_dot_product_attention(
        args.pop("query"), args.pop("key"), args.pop("value"), **args
    )


SDPA = "scaled_dot_product_attention"
BAD_INPUTS = [
    (
        "softmax_scale",
        lambda: softmax_scale([[1.0]]),
        TypeError,
        r"^query must be a torch.Tensor, got a list",
    ),
    (
        "softmax_scale",
        lambda: softmax_scale(torch.zeros(3, 4), scale=0.0),
        ValueError,
        r"^scale must be a real number > 0, got 0.0",
    ),
    (
        "softmax_scale",
        lambda: softmax_scale(torch.zeros(3, 4), scale="0.5"),
        TypeError,
        r"^scale must be a real number",
    ),
    (
        "softmax_scale",
        lambda: softmax_scale(torch.zeros(3, 0)),
        ValueError,
        r"^query must have a last size D >= 1 .* got shape \(3, 0\)",
    ),
    (
        SDPA,
        _sdpa(backend="flash"),
        ValueError,
        r"^backend must be one of 'torch', 'triton'",
    ),
    (
        SDPA,
        _sdpa(backend="triton", mask=torch.ones(4, 5, dtype=torch.bool)),
        ValueError,
        r"^mask must be None with backend='triton'",
    ),
    # type, dtype family, rank, meta tensors
    (
        SDPA,
        _sdpa(query=_q.numpy()),
        TypeError,
        "query must be a torch.Tensor, got a ndarray",
    ),
    (
        SDPA,
        _sdpa(query=_q.long()),
        TypeError,
        "query must be a floating-point tensor, got",
    ),
    (
        SDPA,
        _sdpa(query=_q.to(torch.complex64)),
        TypeError,
        "query must be a floating-point",
    ),
    (
        SDPA,
        _sdpa(query=torch.randn(8)),
        ValueError,
        "query must have at least 2 dimensions",
    ),
    (
        SDPA,
        _sdpa(key=_meta),
        ValueError,
        "key must hold values, got a tensor on the 'meta'",
    ),
    # dtypes and shapes that do not fit together
    (
        SDPA,
        _sdpa(key=_k.double()),
        TypeError,
        "key must have query's dtype torch.float32",
    ),
    (SDPA, _sdpa(value=_v.double()), TypeError, "value must have query's dtype"),
    (
        SDPA,
        _sdpa(key=torch.randn(2, 5, 7)),
        ValueError,
        "query and key must have the same",
    ),
    (
        SDPA,
        _sdpa(value=torch.randn(2, 6, 3)),
        ValueError,
        "key and value must have the same",
    ),
    (
        SDPA,
        _sdpa(key=torch.randn(3, 5, 8), value=torch.randn(3, 5, 3)),
        ValueError,
        "query, key and value must broadcast",
    ),
    (SDPA, _sdpa(value=None), TypeError, "value must be a torch.Tensor, got None"),
    # head dim 0: the default scale 1/sqrt(D) does not exist
    (
        SDPA,
        _sdpa(query=torch.randn(2, 4, 0), key=torch.randn(2, 5, 0)),
        ValueError,
        "query must have a positive feature width D",
    ),
    # masks: bool or floating only, the scores' shape, not with is_causal
    (
        SDPA,
        _sdpa(mask=torch.ones(4, 5, dtype=torch.int64)),
        TypeError,
        "mask must be a bool",
    ),
    (
        SDPA,
        _sdpa(mask=torch.ones(4, 5, dtype=torch.uint8)),
        TypeError,
        "mask must be a bool",
    ),
    (SDPA, _sdpa(mask=[[True]]), TypeError, "mask must be a torch.Tensor, got a list"),
    (
        SDPA,
        _sdpa(mask=torch.ones(4, 6, dtype=torch.bool)),
        ValueError,
        "mask must broadcast",
    ),
    (
        SDPA,
        _sdpa(mask=torch.ones(4, 5, dtype=torch.bool), is_causal=True),
        ValueError,
        "mask must be None when is_causal=True",
    ),
    # flags and numbers
    (SDPA, _sdpa(is_causal=1), TypeError, "is_causal must be a bool, got 1"),
    (SDPA, _sdpa(is_causal="yes"), TypeError, "is_causal must be a bool, got 'yes'"),
    (SDPA, _sdpa(scale="0.5"), TypeError, "scale must be a real number, got '0.5'"),
    (SDPA, _sdpa(scale=1j), TypeError, "scale must be a real number, got 1j"),
    (SDPA, _sdpa(scale=0.0), ValueError, "scale must be a real number > 0, got 0.0"),
    (SDPA, _sdpa(scale=float("nan")), ValueError, "scale must be a finite real number"),
    pytest.param(
        SDPA,
        lambda: scaled_dot_product_attention(_q, _k.cuda(), _v),
        ValueError,
        "key must be on query's device cpu",
        marks=_cuda,
    ),
    pytest.param(
        SDPA,
        lambda: scaled_dot_product_attention(_q, _k, _v, mask=torch.ones(4, 5).cuda()),
        ValueError,
        "mask must be on query's device cpu",
        marks=_cuda,
    ),
    (
        "attention_weights",
        lambda: attention_weights(_q, _k, mask=torch.ones(3, 3, dtype=torch.bool)),
        ValueError,
        r"mask must broadcast to the scores' shape \(\.\.\., L, S\) \(2, 4, 5\)",
    ),
    (
        "attention_weights",
        lambda: attention_weights(_q, _k.half()),
        TypeError,
        "key must have",
    ),
    (
        "attention_weights",
        lambda: attention_weights(_q, _k, mask=torch.ones(4, 5, dtype=torch.int32)),
        TypeError,
        "mask must be a bool or floating tensor, got a tensor of dtype torch.int32",
    ),
    (
        "attention_weights",
        lambda: attention_weights(_q, _k, is_causal=None),
        TypeError,
        "is_c",
    ),
    # the scores before the Transformer
    (
        "dot_score",
        lambda: dot_score(_q, _k.double()),
        TypeError,
        "key must have query's dtype",
    ),
    (
        "dot_score",
        lambda: dot_score(_q, torch.randn(3, 5, 8)),
        ValueError,
        "must broadcast",
    ),
    (
        "dot_score",
        lambda: dot_score(_q, torch.randn(2, 5, 7)),
        ValueError,
        "query and key",
    ),
    (
        "dot_score",
        lambda: dot_score(_q.tolist(), _k),
        TypeError,
        "query must be a torch.Tensor",
    ),
    (
        "general_score",
        lambda: general_score(_q, _k, weight=torch.eye(3)),
        ValueError,
        r"weight must have shape \(Dq, Dk\) \(8, 8\), got shape \(3, 3\)",
    ),
    (
        "general_score",
        lambda: general_score(_q, _k, weight=torch.eye(8).double()),
        TypeError,
        "weight must have query's dtype",
    ),
    (
        "general_score",
        lambda: general_score(_q, _k.double(), weight=torch.eye(8)),
        TypeError,
        "key must have query's dtype",
    ),
    (
        "general_score",
        lambda: general_score(_q, torch.randn(3, 5, 8), weight=torch.eye(8)),
        ValueError,
        "query and key must broadcast",
    ),
    (
        "general_score",
        lambda: general_score(_q, _k, weight=torch.ones(8)),
        ValueError,
        "weight must have 2 dimensions",
    ),
    (
        "additive_score",
        lambda: additive_score(_q, _k, **{**_w, "key_weight": torch.ones(5, 8)}),
        ValueError,
        "key_weight must have shape",
    ),
    (
        "additive_score",
        lambda: additive_score(_q, _k, **{**_w, "v": torch.ones(1, 4)}),
        ValueError,
        "v must have 1 dimensions",
    ),
    (
        "additive_score",
        lambda: additive_score(
            _q, _k, **{**_w, "query_weight": torch.ones(4, 8).double()}
        ),
        TypeError,
        "query_weight must have query's dtype",
    ),
    (
        "additive_score",
        lambda: additive_score(_q, _k.double(), **_w),
        TypeError,
        "key must have query's dtype",
    ),
    (
        "concat_score",
        lambda: concat_score(_q, _k, weight=torch.ones(4, 8), v=torch.ones(4)),
        ValueError,
        r"weight must have shape \(A, Dq \+ Dk\) \(4, 16\)",
    ),
    (
        "concat_score",
        lambda: concat_score(
            _q, _k, weight=torch.ones(4, 16), v=torch.ones(4).double()
        ),
        TypeError,
        "v must have query's dtype",
    ),
    (
        "concat_score",
        lambda: concat_score(
            _q, torch.randn(3, 5, 8), weight=torch.ones(4, 16), v=torch.ones(4)
        ),
        ValueError,
        "query and key must broadcast",
    ),
    # masks and their arguments
    (
        "causal_mask",
        lambda: causal_mask(-1, 3),
        ValueError,
        "query_length must be an int >= 0",
    ),
    (
        "causal_mask",
        lambda: causal_mask(3, True),
        TypeError,
        "key_length must be an int, got T",
    ),
    (
        "causal_mask",
        lambda: causal_mask(3.0, 3),
        TypeError,
        "query_length must be an int, got",
    ),
    (
        "causal_mask",
        lambda: causal_mask(3, 3, alignment="top"),
        ValueError,
        "alignment must be one of 'top_left', 'bottom_right', got 'top'",
    ),
    (
        "causal_mask",
        lambda: causal_mask(3, 3, device="gpu"),
        ValueError,
        "device must be a dev",
    ),
    (
        "causal_mask",
        lambda: causal_mask(3, 3, device="cuda:9"),
        ValueError,
        "device must be a",
    ),
    (
        "causal_mask",
        lambda: causal_mask(3, 3, device=0),
        TypeError,
        "device must be a torch.de",
    ),
    # tiled attention
    (
        "tiled_attention",
        lambda: tiled_attention(_q, _k, _v, block_size=0),
        ValueError,
        "block_s",
    ),
    (
        "tiled_attention",
        lambda: tiled_attention(_q, _k, _v, block_size=2.0),
        TypeError,
        "block",
    ),
    (
        "tiled_attention",
        lambda: tiled_attention(_q, _k, None, block_size=2),
        TypeError,
        "value must be a torch.Tensor, got None",
    ),
    (
        "tiled_attention",
        lambda: tiled_attention(_q, _k, _v, block_size=2, is_causal=None),
        TypeError,
        "is_causal must be a bool",
    ),
    (
        "tiled_attention",
        lambda: tiled_attention(_q, _k.double(), _v, block_size=2),
        TypeError,
        "key",
    ),
    (
        "tiled_attention",
        lambda: tiled_attention(
            torch.randn(2, 4, 0), torch.randn(2, 5, 0), _v, block_size=2
        ),
        ValueError,
        "query must have a positive feature width D",
    ),
    (
        "tiled_attention",
        lambda: tiled_attention(_q, _k, _v, block_size=2, scale=-1),
        ValueError,
        "scale",
    ),
    # nn.MultiheadAttention's masks
    (
        "mask_from_torch_mha",
        lambda: mask_from_torch_mha(key_padding_mask=torch.ones(5, dtype=torch.bool)),
        ValueError,
        r"key_padding_mask must have 2 dimensions, got shape \(5,\)",
    ),
    (
        "mask_from_torch_mha",
        lambda: mask_from_torch_mha(attn_mask=torch.ones(4, 5, dtype=torch.int64)),
        TypeError,
        "attn_mask must be a bool or floating tensor, got a tensor of dtype "
        "torch.int64",
    ),
    (
        "mask_from_torch_mha",
        lambda: mask_from_torch_mha(attn_mask=[[True]]),
        TypeError,
        "attn_mask must be a torch.Tensor",
    ),
    (
        "mask_from_torch_mha",
        lambda: mask_from_torch_mha(
            attn_mask=torch.ones(4, 5, dtype=torch.bool),
            key_padding_mask=torch.ones(2, 6, dtype=torch.bool),
        ),
        ValueError,
        "attn_mask and key_padding_mask must have the same key-length \\(S\\) size",
    ),
    # the multi-head module: arguments checked before any projection runs
    (
        "MultiHeadAttention",
        lambda: MultiHeadAttention(10, 4),
        ValueError,
        "num_heads must divide embed_dim, got embed_dim=10, num_heads=4",
    ),
    (
        "MultiHeadAttention",
        lambda: MultiHeadAttention(8, 0),
        ValueError,
        "num_heads must be a po",
    ),
    (
        "MultiHeadAttention",
        lambda: MultiHeadAttention(8.0, 2),
        TypeError,
        "embed_dim must be an",
    ),
    (
        "MultiHeadAttention",
        lambda: MultiHeadAttention(8, 2, bias=1),
        TypeError,
        "bias must be a",
    ),
    (
        "MultiHeadAttention",
        lambda: MultiHeadAttention(8, 2, dtype="float32"),
        TypeError,
        "dtype must be a torch.dtype such as torch.float32, got the string 'float32'",
    ),
    (
        "MultiHeadAttention",
        lambda: MultiHeadAttention(8, 2, dtype=torch.int64),
        TypeError,
        "dtype must be a floating torch.dtype",
    ),
    (
        "MultiHeadAttention",
        lambda: MultiHeadAttention(8, 2, device="cuda:9"),
        ValueError,
        "device must be a device this machine has",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_q[None], _q[None], _q[None]),
        ValueError,
        r"query must have 3 dimensions, got shape \(1, 2, 4, 8\)",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x[..., :6], _x, _x),
        ValueError,
        r"query must have size 8 \(embed_dim\) in dimension -1, got shape \(2, 3, 6\)",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x.double(), _x.double(), _x.double()),
        TypeError,
        "query must have q_proj.weight's dtype torch.float32",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x, _x[:1], _x[:1]),
        ValueError,
        r"query and key must have the same batch \(B\) size",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x, _x, _x[:, :2]),
        ValueError,
        r"key and value must have the same length \(S\) size",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x, _x, _x, mask=torch.ones(3, 3, dtype=torch.int64)),
        TypeError,
        "mask must be a bool or floating tensor",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x, _x, _x, mask=torch.ones(3, 4, dtype=torch.bool)),
        ValueError,
        r"mask must broadcast to the scores' shape \(\.\.\., L, S\) \(2, 2, 3, 3\)",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x, _x, _x, is_causal="no"),
        TypeError,
        "is_causal must be a bool",
    ),
    (
        "MultiHeadAttention.forward",
        lambda: _mha(_x.tolist(), _x, _x),
        TypeError,
        "query must be a torch.Tensor, got a list",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(torch.nn.Linear(8, 8)),
        TypeError,
        "module must be a MultiheadAttention, got a Linear",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(
            torch.nn.MultiheadAttention(8, 4)
        ),
        ValueError,
        "module must have embed_dim=8, num_heads=2",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(
            torch.nn.MultiheadAttention(8, 2, bias=False)
        ),
        ValueError,
        "module must have bias=True like this module, got bias=False",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(
            torch.nn.MultiheadAttention(8, 2, kdim=4)
        ),
        ValueError,
        r"module must pack q, k, v in in_proj_weight \(equal query, key and value "
        r"widths\), got kdim=4, vdim=8",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(
            torch.nn.MultiheadAttention(8, 2, add_bias_kv=True)
        ),
        ValueError,
        "module must have add_bias_kv=False, add_zero_attn=False and dropout=0.0 "
        r"\(this module has no extra key and value and no dropout\), got "
        "add_bias_kv=True$",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(
            torch.nn.MultiheadAttention(8, 2, add_zero_attn=True)
        ),
        ValueError,
        "module must have add_bias_kv=False, .* got add_zero_attn=True$",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(
            torch.nn.MultiheadAttention(8, 2, dropout=0.1)
        ),
        ValueError,
        "module must have add_bias_kv=False, .* got dropout=0.1$",
    ),
    (
        "MultiHeadAttention.load_torch_weights",
        lambda: MultiHeadAttention(8, 2).load_torch_weights(
            torch.nn.MultiheadAttention(
                8, 2, add_bias_kv=True, add_zero_attn=True, dropout=0.5
            )
        ),
        ValueError,
        "got add_bias_kv=True, add_zero_attn=True, dropout=0.5$",
    ),
    # measuring memory
    (
        "measure_peak_memory",
        lambda: measure_peak_memory(3, device="cpu"),
        TypeError,
        "fn must",
    ),
    (
        "measure_peak_memory",
        lambda: measure_peak_memory(lambda: None, device="gpu"),
        ValueError,
        "device must be a device such as 'cpu' or 'cuda', got 'gpu'",
    ),
    (
        "measure_peak_memory",
        lambda: measure_peak_memory(lambda: None, device=0),
        TypeError,
        "device must be a torch.device or a device string, got 0",
    ),
    (
        "measure_peak_memory",
        lambda: measure_peak_memory(lambda: None, device="cuda:9"),
        ValueError,
        "device must be a device this machine has",
    ),
]


# ---- empty inputs give their natural answer ------------------------------------------


def test_no_keys_give_zero_outputs_like_a_fully_masked_row():
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 0, 8), torch.randn(2, 0, 3)
    assert attention_weights(q, k).shape == (2, 4, 0)
    for out in (
        scaled_dot_product_attention(q, k, v),
        scaled_dot_product_attention(q, k, v, is_causal=True),
        tiled_attention(q, k, v, block_size=2),
    ):
        assert torch.equal(out, torch.zeros(2, 4, 3))
    assert dot_score(q, k).shape == (2, 4, 0)


def test_no_queries_give_empty_outputs():
    q, k, v = torch.randn(2, 0, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 3)
    assert scaled_dot_product_attention(q, k, v).shape == (2, 0, 3)
    assert tiled_attention(q, k, v, block_size=2).shape == (2, 0, 3)
    assert causal_mask(0, 5).shape == (0, 5)
    assert causal_mask(3, 0, alignment="bottom_right").shape == (3, 0)


def test_dot_score_of_width_zero_is_the_empty_sum():
    assert torch.equal(
        dot_score(torch.randn(3, 0), torch.randn(4, 0)), torch.zeros(3, 4)
    )


def test_masks_of_two_float_dtypes_combine_in_the_wider_one():
    combined = mask_from_torch_mha(
        attn_mask=torch.zeros(2, 3, dtype=torch.float16),
        key_padding_mask=torch.zeros(1, 3, dtype=torch.float64),
    )
    assert combined.dtype == torch.float64 and combined.shape == (1, 1, 2, 3)


def test_mask_from_torch_mha_inverts_and_combines():
    blocked = torch.tensor([[False, True], [False, False]])
    padding = torch.tensor([[False, False], [False, True]])
    assert mask_from_torch_mha() is None
    assert torch.equal(mask_from_torch_mha(attn_mask=blocked), ~blocked)
    both = mask_from_torch_mha(attn_mask=blocked, key_padding_mask=padding)
    assert torch.equal(both[1, 0], torch.tensor([[True, False], [True, False]]))
    additive = mask_from_torch_mha(
        attn_mask=torch.zeros(2, 2), key_padding_mask=padding
    )
    assert (
        additive.dtype == torch.float32 and torch.isneginf(additive[1, 0, :, 1]).all()
    )


# ---- valid random inputs never raise -------------------------------------------------


@st.composite
def valid_calls(draw):
    """Any valid shapes (empty L or S included), dtypes, masks, flags and scales."""
    batch = draw(st.lists(st.integers(1, 2), max_size=2))
    length, source = draw(st.integers(0, 5)), draw(st.integers(0, 5))
    width, dv = draw(st.integers(1, 6)), draw(st.integers(0, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(*batch, length, width, generator=gen).to(dtype)
    k = torch.randn(*batch, source, width, generator=gen).to(dtype)
    v = torch.randn(*batch, source, dv, generator=gen).to(dtype)
    kind = draw(st.sampled_from(["none", "bool", "float", "causal"]))
    mask = None
    if kind == "bool":
        mask = torch.rand(length, source, generator=gen) > 0.5
    elif kind == "float":
        mask = torch.randn(length, source, generator=gen).to(dtype)
    scale = draw(st.one_of(st.none(), st.floats(0.01, 10.0), st.integers(1, 3)))
    return q, k, v, mask, kind == "causal", scale, draw(st.integers(1, 4))


@given(valid_calls())
def test_valid_random_inputs_never_raise(call):
    q, k, v, mask, causal, scale, block = call
    out = scaled_dot_product_attention(
        q, k, v, mask=mask, is_causal=causal, scale=scale
    )
    assert (
        out.shape == (*out.shape[:-2], q.shape[-2], v.shape[-1])
        and out.dtype == q.dtype
    )
    weights = attention_weights(q, k, mask=mask, is_causal=causal, scale=scale)
    assert weights.shape[-2:] == (q.shape[-2], k.shape[-2])
    tiled = tiled_attention(q, k, v, block_size=block, is_causal=causal, scale=scale)
    assert tiled.shape == out.shape
    assert dot_score(q, k).shape == weights.shape
    assert (
        causal_mask(q.shape[-2], k.shape[-2], alignment="bottom_right").dtype
        == torch.bool
    )


@given(
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(0, 4),
    st.booleans(),
    st.booleans(),
)
def test_valid_multi_head_calls_never_raise(heads, per_head, length, bias, causal):
    mha = MultiHeadAttention(heads * per_head, heads, bias=bias, dtype=torch.float64)
    x = torch.randn(2, length, heads * per_head, dtype=torch.float64)
    mask = None if causal else torch.ones(length, length, dtype=torch.bool)
    assert mha(x, x, x, mask=mask, is_causal=causal).shape == x.shape


# ---- the softmax scale -----------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 8, 64, 96])
def test_softmax_scale_is_torchs_default(d) -> None:
    """Attention computed with ``softmax_scale(query)`` passed as ``scale`` equals
    torch's own default (``scale=None``); an explicit scale passes through unchanged."""
    q, k, v = (torch.randn(2, 3, 5, d, dtype=torch.float64) for _ in range(3))
    assert softmax_scale(q) == 1.0 / math.sqrt(d)
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, scale=softmax_scale(q)),
        F.scaled_dot_product_attention(q, k, v),
    )
    assert softmax_scale(q, 0.25) == 0.25
    assert softmax_scale(torch.zeros(0, d)) == 1.0 / math.sqrt(d)  # only D is read
