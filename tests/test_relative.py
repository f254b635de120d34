"""Tests for companion.relative: relative biases (Shaw, Transformer-XL, T5) and NoPE.

Oracles: Hugging Face transformers' T5Attention (``_relative_position_bucket`` and
``compute_bias`` with copied weights), built from a small config in code (no download);
float64 loops written from the papers' formulas (Shaw et al. 2018, Dai et al. 2019,
Kazemnejad et al. 2023). The RoPE variants that moved to companion.rope_variants are
tested in ``tests/test_rope_variants.py``; their deprecated aliases here, below.
"""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    TinyTransformer,
)
from companion.relative import (
    PositionFamilyTransformer,
    ShawSelfAttention,
    T5BiasSelfAttention,
    T5RelativeBias,
    TransformerXLSelfAttention,
    nope_position_readout,
    position_family_model,
    rel_shift,
    relative_positions,
    shaw_attention,
    shaw_relative_index,
    shaw_scores,
    t5_relative_bias,
    t5_relative_position_bucket,
    transformer_xl_encoding,
    transformer_xl_scores,
)

_TINY = ModelConfig(vocab_size=8, dim=16, num_heads=2, num_layers=1)
_IDS = torch.randint(8, (2, 5), generator=torch.Generator().manual_seed(0))

transformers = pytest.importorskip("transformers")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore")
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention
    from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()

F64 = torch.float64


# ---- T5 ----------------------------------------------------------------------------------

# every valid combination over a grid: bucket counts odd and even, distances at, just
# past and far beyond the exact buckets, and T5's own (32, 128)
T5_GRID = [
    (bidirectional, num_buckets, max_distance)
    for bidirectional, num_buckets, max_distance in itertools.product(
        (True, False),
        (2, 3, 4, 5, 6, 7, 8, 9, 16, 31, 32, 33, 64, 128),
        (2, 3, 4, 5, 7, 8, 16, 20, 64, 100, 128, 129, 256, 1000),
    )
    if (n := num_buckets // 2 if bidirectional else num_buckets) >= 2
    and max_distance > n // 2
]


def test_t5_bucket_grid_is_large() -> None:
    assert len(T5_GRID) == 272
    assert (True, 32, 128) in T5_GRID and (False, 32, 128) in T5_GRID


def test_t5_bucket_equals_hf_everywhere() -> None:
    rel = torch.arange(-1100, 1101)  # both directions, past every max_distance
    for bidirectional, num_buckets, max_distance in T5_GRID:
        kwargs = dict(
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
        ours = t5_relative_position_bucket(rel, **kwargs)
        theirs = T5Attention._relative_position_bucket(rel, **kwargs)
        assert ours.dtype == torch.int64
        assert torch.equal(ours, theirs), kwargs
        assert int(ours.min()) >= 0 and int(ours.max()) < num_buckets


def test_t5_bucket_int32_and_shapes() -> None:
    rel = relative_positions(7, 300, query_offset=150)
    theirs = T5Attention._relative_position_bucket(rel)
    assert torch.equal(t5_relative_position_bucket(rel.to(torch.int32)), theirs)
    assert t5_relative_position_bucket(torch.zeros(0, 3, dtype=torch.long)).shape == (
        0,
        3,
    )


def _t5_float64(r: int, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's rule written from the formula, in float64 (not T5's float32)."""
    n = num_buckets // 2 if bidirectional else num_buckets
    offset = n if bidirectional and r > 0 else 0
    d = abs(r) if bidirectional else max(-r, 0)
    exact = n // 2
    if d < exact:
        return offset + d
    step = math.log(d / exact) / math.log(max_distance / exact) * (n - exact)
    return offset + min(n - 1, exact + int(step))


def test_t5_bucket_equals_the_formula_at_t5_defaults() -> None:
    rel = torch.arange(-400, 401)
    for bidirectional in (True, False):
        ours = t5_relative_position_bucket(rel, bidirectional=bidirectional)
        formula = [_t5_float64(int(r), bidirectional, 32, 128) for r in rel]
        assert ours.tolist() == formula
    # T5's encoder: exact up to 7, 8 log buckets to 127, then the last bucket
    ours = t5_relative_position_bucket(torch.tensor([-7, -8, -127, -128, -(10**6), 1]))
    assert ours.tolist() == [7, 8, 15, 15, 15, 17]


def test_t5_bucket_float32_decides_exact_boundaries() -> None:
    # where ln(d/e)/ln(max/e)*(n-e) is a whole number in exact arithmetic, float32
    # rounding (T5's and Hugging Face's) decides: 9 causal buckets, max_distance 128
    rel = -torch.tensor([8, 16, 64])
    ours = t5_relative_position_bucket(
        rel, bidirectional=False, num_buckets=9, max_distance=128
    )
    formula = [_t5_float64(int(r), False, 9, 128) for r in rel]
    assert ours.tolist() == [5, 6, 8]
    assert formula == [4, 5, 7]


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "length", "keys", "offset"),
    [(32, 128, 40, 40, 0), (8, 20, 5, 70, 65), (33, 64, 1, 200, 199), (6, 5, 9, 4, 0)],
)
def test_t5_bias_equals_hf_compute_bias(
    is_decoder, num_buckets, max_distance, length, keys, offset
) -> None:
    torch.manual_seed(0)
    config = T5Config(
        d_model=16,
        d_kv=4,
        num_heads=4,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=is_decoder,
    )
    hf = T5Attention(config, has_relative_attention_bias=True)
    torch.nn.init.normal_(hf.relative_attention_bias.weight)
    ours = T5RelativeBias(
        4,
        num_buckets=num_buckets,
        max_distance=max_distance,
        bidirectional=not is_decoder,
    )
    ours.load_state_dict(
        {"relative_attention_bias.weight": hf.relative_attention_bias.weight}
    )
    theirs = hf.compute_bias(length, keys, past_seen_tokens=offset)
    got = ours(length, keys, query_offset=offset)
    assert got.shape == (4, length, keys)
    assert torch.equal(got, theirs[0])
    functional = t5_relative_bias(
        hf.relative_attention_bias.weight.detach(),
        length,
        keys,
        bidirectional=not is_decoder,
        max_distance=max_distance,
        query_offset=offset,
    )
    assert torch.equal(functional, theirs[0].detach())


def test_t5_bias_module_learns_and_reports() -> None:
    module = T5RelativeBias(2, num_buckets=8, max_distance=16, dtype=F64)
    module(3, 5).sum().backward()
    grad = module.relative_attention_bias.weight.grad
    assert grad is not None and grad.dtype == F64
    assert int(grad.sum()) == 2 * 15  # every (head, query, key) counted once
    assert "num_buckets=8" in repr(module)


# ---- Shaw et al. ----------------------------------------------------------------------


def _shaw_loop(q, k, v, wk, wv, offset, causal, scale):
    """z_i = sum_j softmax_j(q_i . (k_j + a_ij) * scale) (v_j + a^V_ij), float64."""
    q, k, v, wk = (t.to(F64) for t in (q, k, v, wk))
    kk = wk.shape[0] // 2
    length, keys = q.shape[-2], k.shape[-2]
    scores = torch.empty(*q.shape[:-2], length, keys, dtype=F64)
    for i in range(length):
        for j in range(keys):
            r = min(max(j - (i + offset), -kk), kk) + kk
            scores[..., i, j] = (q[..., i, :] * (k[..., j, :] + wk[r])).sum(-1) * scale
            if causal and j > i + offset:
                scores[..., i, j] = -math.inf
    weights = scores.softmax(-1)
    out = torch.zeros(*q.shape[:-2], length, v.shape[-1], dtype=F64)
    for i in range(length):
        for j in range(keys):
            r = min(max(j - (i + offset), -kk), kk) + kk
            value = v[..., j, :] + (wv[r].to(F64) if wv is not None else 0)
            out[..., i, :] += weights[..., i, j, None] * value
    return scores, out


@pytest.mark.parametrize(
    ("length", "keys", "kk", "offset", "causal"),
    [(5, 5, 2, 0, False), (5, 5, 2, 0, True), (3, 9, 3, 6, True), (4, 6, 0, 1, False)],
)
def test_shaw_equals_the_float64_loop(length, keys, kk, offset, causal) -> None:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, length, 4, generator=g, dtype=F64)
    k = torch.randn(2, 3, keys, 4, generator=g, dtype=F64)
    v = torch.randn(2, 3, keys, 5, generator=g, dtype=F64)
    wk = torch.randn(2 * kk + 1, 4, generator=g, dtype=F64)
    wv = torch.randn(2 * kk + 1, 5, generator=g, dtype=F64)
    scale = 1 / math.sqrt(4)
    scores, out = _shaw_loop(q, k, v, wk, wv, offset, causal, scale)
    got = shaw_scores(q, k, wk, query_offset=offset)
    finite = torch.isfinite(scores)
    torch.testing.assert_close(got[finite], scores[finite], rtol=1e-12, atol=1e-12)
    z = shaw_attention(q, k, v, wk, wv, is_causal=causal, query_offset=offset)
    torch.testing.assert_close(z, out, rtol=1e-12, atol=1e-12)
    _, out_keys_only = _shaw_loop(q, k, v, wk, None, offset, causal, scale)
    z = shaw_attention(q, k, v, wk, is_causal=causal, query_offset=offset)
    torch.testing.assert_close(z, out_keys_only, rtol=1e-12, atol=1e-12)


def test_shaw_float32_close_and_clipping() -> None:
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    wk, wv = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    got = shaw_attention(q, k, v, wk, wv, scale=0.5)
    _, ref = _shaw_loop(q, k, v, wk, wv, 0, False, 0.5)
    assert got.dtype == torch.float32
    assert (got.to(F64) - ref).abs().max() < 1e-5
    index = shaw_relative_index(1, 8, 2, query_offset=3)
    assert index.tolist() == [[0, 0, 1, 2, 3, 4, 4, 4]]


# ---- Transformer-XL -------------------------------------------------------------------


@pytest.mark.parametrize(("length", "keys"), [(4, 4), (3, 7), (1, 5)])
def test_rel_shift_moves_row_l_left_by_l_minus_1_minus_l(length, keys) -> None:
    x = torch.randn(2, length, keys)
    out = rel_shift(x)
    for row in range(length):
        for j in range(keys):
            source = j + length - 1 - row
            if source < keys:
                assert out[:, row, j].equal(x[:, row, source])


def _xl_loop(q, k, r, u, v, scale):
    """The four terms of Dai et al. (2019) one pair at a time, float64, causal."""
    q, k, r, u, v = (t.to(F64) for t in (q, k, r, u, v))
    length, keys = q.shape[-2], k.shape[-2]
    memory = keys - length
    out = torch.full((*q.shape[:-2], length, keys), -math.inf, dtype=F64)
    terms = {name: torch.zeros_like(out) for name in "abcd"}
    for i in range(length):
        for j in range(i + memory + 1):
            d = i + memory - j  # distance of key j from query i
            qi, kj, rd = q[..., i, :], k[..., j, :], r[..., d, :]
            a, b = (qi * kj).sum(-1), (qi * rd).sum(-1)
            c, e = (u[..., 0, :] * kj).sum(-1), (v[..., 0, :] * rd).sum(-1)
            for name, term in zip("abcd", (a, b, c, e), strict=True):
                terms[name][..., i, j] = term
            out[..., i, j] = (a + b + c + e) * scale
    return out, terms


@pytest.mark.parametrize(("length", "keys"), [(6, 6), (4, 9), (1, 3)])
def test_transformer_xl_equals_the_four_terms(length, keys) -> None:
    g = torch.Generator().manual_seed(3)
    heads, d = 3, 8
    q = torch.randn(2, heads, length, d, generator=g, dtype=F64)
    k = torch.randn(2, heads, keys, d, generator=g, dtype=F64)
    w_r = torch.randn(heads, d, d, generator=g, dtype=F64)  # W_{k,R} per head
    r = transformer_xl_encoding(keys, d, dtype=F64) @ w_r.transpose(-2, -1)  # (H,S,D)
    u = torch.randn(heads, 1, d, generator=g, dtype=F64)
    v = torch.randn(heads, 1, d, generator=g, dtype=F64)
    ref, terms = _xl_loop(q, k, r, u, v, 1 / math.sqrt(d))
    got = transformer_xl_scores(q, k, r, u, v)
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    finite = torch.isfinite(ref)
    torch.testing.assert_close(got[finite], ref[finite], rtol=1e-12, atol=1e-12)
    # each term alone: zero the others
    zero_u, zero_r = torch.zeros_like(u), torch.zeros_like(r)
    only_a = transformer_xl_scores(q, k, zero_r, zero_u, zero_u, scale=1.0)
    torch.testing.assert_close(only_a[finite], terms["a"][finite], rtol=1e-12, atol=0)
    only_c = transformer_xl_scores(torch.zeros_like(q), k, zero_r, u, zero_u, scale=1.0)
    torch.testing.assert_close(only_c[finite], terms["c"][finite], rtol=1e-12, atol=0)


def test_transformer_xl_encoding_is_the_authors_table_flipped() -> None:
    keys, d = 7, 6
    pos_seq = torch.arange(keys - 1, -1, -1.0, dtype=F64)  # the authors' order
    inv_freq = 1 / (10000 ** (torch.arange(0.0, d, 2.0, dtype=F64) / d))
    angles = torch.outer(pos_seq, inv_freq)
    theirs = torch.cat([angles.sin(), angles.cos()], dim=-1)
    ours = transformer_xl_encoding(keys, d, dtype=F64)
    torch.testing.assert_close(ours.flip(0), theirs, rtol=1e-13, atol=1e-15)


# ---- no position at all ----------------------------------------------------------------


def test_nope_reads_absolute_position() -> None:
    out, position = nope_position_readout(50)
    t = torch.arange(50, dtype=F64)
    torch.testing.assert_close(out, 1 / (t + 1), rtol=1e-14, atol=0)
    torch.testing.assert_close(position, t, rtol=0, atol=1e-10)
    out, position = nope_position_readout(0)
    assert out.shape == position.shape == (0,)


# ---- the self-attention layers ------------------------------------------------------


def _heads(module, x):
    """The module's own projections, split into heads: (B, H, L, D/H) each."""
    return (module._split(p(x)) for p in (module.q_proj, module.k_proj, module.v_proj))


def _merge(module, z):
    b, h, length, dh = z.shape
    return module.out_proj(z.transpose(1, 2).reshape(b, length, h * dh))


def _copy(source, target):
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(target, name).load_state_dict(getattr(source, name).state_dict())


def test_t5_layer_equals_the_formula() -> None:
    torch.manual_seed(7)
    layer = T5BiasSelfAttention(16, 4, num_buckets=8, max_distance=12).double()
    torch.nn.init.normal_(layer.relative_bias.relative_attention_bias.weight)
    x = torch.randn(2, 20, 16, dtype=F64)
    q, k, v = _heads(layer, x)
    bias = t5_relative_bias(
        layer.relative_bias.relative_attention_bias.weight,
        20,
        20,
        bidirectional=False,
        max_distance=12,
    )
    causal = torch.ones(20, 20, dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(-2, -1) / 2 + bias).masked_fill(causal, -math.inf)
    expected = _merge(layer, scores.softmax(-1) @ v)
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    # a zero table is plain causal attention
    torch.nn.init.zeros_(layer.relative_bias.relative_attention_bias.weight)
    plain = CausalSelfAttention(16, 4).double()
    _copy(layer, plain)
    torch.testing.assert_close(layer(x), plain(x), rtol=1e-12, atol=1e-12)


def test_shaw_layer_equals_the_loop() -> None:
    torch.manual_seed(8)
    layer = ShawSelfAttention(12, 3, max_relative_position=3).double()
    x = torch.randn(2, 9, 12, dtype=F64)
    q, k, v = _heads(layer, x)
    _, z = _shaw_loop(q, k, v, layer.rel_key, layer.rel_value, 0, True, 0.5)
    torch.testing.assert_close(layer(x), _merge(layer, z), rtol=1e-12, atol=1e-12)
    keys_only = ShawSelfAttention(12, 3, max_relative_position=3, values=False)
    assert keys_only.rel_value is None
    with torch.no_grad():
        layer.rel_key.zero_()
        layer.rel_value.zero_()
    plain = CausalSelfAttention(12, 3).double()
    _copy(layer, plain)
    torch.testing.assert_close(layer(x), plain(x), rtol=1e-12, atol=1e-12)


def test_transformer_xl_layer_equals_the_four_terms() -> None:
    torch.manual_seed(9)
    layer = TransformerXLSelfAttention(16, 2).double()
    torch.nn.init.normal_(layer.u)
    torch.nn.init.normal_(layer.v)
    x = torch.randn(2, 7, 16, dtype=F64)
    q, k, v = _heads(layer, x)
    r = layer.r_proj(transformer_xl_encoding(7, 16, dtype=F64)).view(7, 2, 8)
    scores, _ = _xl_loop(q, k, r.transpose(0, 1), layer.u, layer.v, 8**-0.5)
    expected = _merge(layer, scores.softmax(-1) @ v)
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        layer.r_proj.weight.zero_()
        layer.u.zero_()
        layer.v.zero_()
    plain = CausalSelfAttention(16, 2).double()
    _copy(layer, plain)
    torch.testing.assert_close(layer(x), plain(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "layer", [T5BiasSelfAttention, ShawSelfAttention, TransformerXLSelfAttention]
)
def test_layers_train_inside_the_tiny_transformer(layer) -> None:
    class Model(TinyTransformer):
        def _attention(self):
            return layer(self.config.dim, self.config.num_heads)

    torch.manual_seed(10)
    model = Model(ModelConfig(vocab_size=11, dim=16, num_heads=2, position="none"))
    assert sum(isinstance(m, layer) for m in model.modules()) == 2
    ids = torch.randint(0, 11, (3, 12))
    loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    loss.backward()
    own = [p for n, p in model.named_parameters() if "proj" not in n or "r_proj" in n]
    assert all(p.grad is not None for p in own)


# ---- bad input ---------------------------------------------------------------------------

Q = torch.randn(2, 3, 4, 8)
K = torch.randn(2, 3, 6, 8)
V = torch.randn(2, 3, 6, 5)
W_K = torch.randn(5, 8)  # K = 2
U = torch.zeros(8)
R = torch.randn(6, 8)

BAD_INPUTS = [
    (
        "nope_position_readout",
        lambda: nope_position_readout(-3),
        ValueError,
        r"^length must be an int >= 0, got -3",
    ),
    (
        "nope_position_readout",
        lambda: nope_position_readout(4, dtype=torch.long),
        TypeError,
        r"^dtype must be a floating torch.dtype, got torch.int64",
    ),
    (
        "T5BiasSelfAttention",
        lambda: T5BiasSelfAttention(16, 4, num_buckets=1),
        ValueError,
        r"^num_buckets must be an int >= 2",
    ),
    (
        "T5BiasSelfAttention.attend",
        lambda: T5BiasSelfAttention(8, 2).attend(Q, K, K, mask=torch.ones(4, 6)),
        ValueError,
        r"^mask must be None: T5BiasSelfAttention builds its own",
    ),
    (
        "ShawSelfAttention",
        lambda: ShawSelfAttention(16, 4, max_relative_position=-2),
        ValueError,
        r"^max_relative_position must be an int >= 0, got -2",
    ),
    (
        "ShawSelfAttention",
        lambda: ShawSelfAttention(16, 4, values=None),
        TypeError,
        r"^values must be a bool, got None",
    ),
    (
        "TransformerXLSelfAttention",
        lambda: TransformerXLSelfAttention(15, 3),
        ValueError,
        r"^dim must be an even int, got 15",
    ),
    (
        "TransformerXLSelfAttention.attend",
        lambda: TransformerXLSelfAttention(16, 2).attend(Q, K, K),
        ValueError,
        r"^is_causal must be True",
    ),
    (
        "relative_positions",
        lambda: relative_positions(-1, 3),
        ValueError,
        r"^query_length must be an int >= 0, got -1",
    ),
    (
        "relative_positions",
        lambda: relative_positions(2, 3, query_offset=1.5),
        TypeError,
        r"^query_offset must be an int, got 1.5",
    ),
    (
        "t5_relative_position_bucket",
        lambda: t5_relative_position_bucket(torch.tensor([1.0, -2.0])),
        TypeError,
        r"^relative_position must be an integer tensor, got a tensor of dtype "
        r"torch.float32",
    ),
    (
        "t5_relative_position_bucket",
        lambda: t5_relative_position_bucket(torch.tensor([1]), num_buckets=3),
        ValueError,
        r"^num_buckets must be an int >= 4 \(two directions",
    ),
    (
        "t5_relative_position_bucket",
        lambda: t5_relative_position_bucket(
            torch.tensor([1]), num_buckets=32, max_distance=8
        ),
        ValueError,
        r"^max_distance must be > 8 \(the exact buckets of a direction",
    ),
    (
        "t5_relative_position_bucket",
        lambda: t5_relative_position_bucket(torch.tensor([1]), bidirectional=1),
        TypeError,
        r"^bidirectional must be a bool, got 1",
    ),
    (
        "t5_relative_bias",
        lambda: t5_relative_bias(torch.randn(32), 3, 3),
        ValueError,
        r"^weight must have 2 dimensions \(num_buckets, H\), got shape \(32,\)",
    ),
    (
        "t5_relative_bias",
        lambda: t5_relative_bias(torch.randn(1, 4), 3, 3, bidirectional=False),
        ValueError,
        r"^weight must have a valid number of rows \(num_buckets\): num_buckets must "
        r"be an int >= 2",
    ),
    (
        "T5RelativeBias",
        lambda: T5RelativeBias(0),
        ValueError,
        r"^num_heads must be a positive int, got 0",
    ),
    (
        "T5RelativeBias",
        lambda: T5RelativeBias(4, dtype=torch.int64),
        TypeError,
        r"^dtype must be a floating torch.dtype, got torch.int64",
    ),
    (
        "T5RelativeBias.forward",
        lambda: T5RelativeBias(4)(3, -2),
        ValueError,
        r"^key_length must be an int >= 0, got -2",
    ),
    (
        "shaw_relative_index",
        lambda: shaw_relative_index(3, 3, -1),
        ValueError,
        r"^max_relative_position must be an int >= 0, got -1",
    ),
    (
        "shaw_scores",
        lambda: shaw_scores(Q, K, torch.randn(4, 8)),
        ValueError,
        r"^rel_key must have an odd number 2K \+ 1 of rows",
    ),
    (
        "shaw_scores",
        lambda: shaw_scores(Q, K, torch.randn(5, 7)),
        ValueError,
        r"^query and rel_key must have the same feature-width \(D\) size",
    ),
    (
        "shaw_scores",
        lambda: shaw_scores(Q, K, W_K.double()),
        TypeError,
        r"^rel_key must have query's dtype torch.float32",
    ),
    (
        "shaw_attention",
        lambda: shaw_attention(Q, K, V, W_K, torch.randn(5, 4)),
        ValueError,
        r"^rel_value must have shape \(2K \+ 1, Dv\) with rel_key's 2K \+ 1 rows "
        r"\(5, 5\), got shape \(5, 4\)",
    ),
    (
        "shaw_attention",
        lambda: shaw_attention(Q, K, V[..., :5, :], W_K),
        ValueError,
        r"^key and value must have the same length \(S\) size",
    ),
    (
        "shaw_attention",
        lambda: shaw_attention(Q, K, V, W_K, is_causal="yes"),
        TypeError,
        r"^is_causal must be a bool, got 'yes'",
    ),
    (
        "rel_shift",
        lambda: rel_shift(torch.randn(5, 3)),
        ValueError,
        r"^x must have L <= S",
    ),
    (
        "rel_shift",
        lambda: rel_shift(torch.randn(5)),
        ValueError,
        r"^x must have at least 2 dimensions \(\.\.\., L, S\), got shape \(5,\)",
    ),
    (
        "transformer_xl_encoding",
        lambda: transformer_xl_encoding(5, 7),
        ValueError,
        r"^dim must be an even int, got 7",
    ),
    (
        "transformer_xl_scores",
        lambda: transformer_xl_scores(K, Q, R, U, U),
        ValueError,
        r"^key must have at least as many positions as query",
    ),
    (
        "transformer_xl_scores",
        lambda: transformer_xl_scores(Q, K, R[:5], U, U),
        ValueError,
        r"^rel_key must have size 6 \(S, one row per distance",
    ),
    (
        "transformer_xl_scores",
        lambda: transformer_xl_scores(Q, K, R, torch.zeros(7), U),
        ValueError,
        r"^u must have size 8 \(D, query's width\)",
    ),
    (
        "transformer_xl_scores",
        lambda: transformer_xl_scores(Q, K, R, U, torch.zeros(5, 1, 8)),
        ValueError,
        r"^v must broadcast to query's shape \(2, 3, 4, 8\)",
    ),
    (
        "transformer_xl_scores",
        lambda: transformer_xl_scores(Q, K, R, U, U, scale=0.0),
        ValueError,
        r"^scale must be a real number > 0, got 0.0",
    ),
    (
        "PositionFamilyTransformer",
        lambda: PositionFamilyTransformer(_TINY, "rope"),
        ValueError,
        r"^attention must be one of",
    ),
    (
        "PositionFamilyTransformer",
        lambda: PositionFamilyTransformer(
            ModelConfig(vocab_size=8, dim=16, num_heads=2, position="rope"), "t5"
        ),
        ValueError,
        r"^config.position must be 'none'",
    ),
    (
        "position_family_model",
        lambda: position_family_model("xl", _TINY),
        ValueError,
        r"^scheme must be one of",
    ),
    (
        "position_family_model",
        lambda: position_family_model("rope", _TINY, fraction=0.5),
        ValueError,
        r"^options are for this module's attention layers only",
    ),
]


@pytest.mark.parametrize(
    ("name", "call", "error", "match"),
    BAD_INPUTS,
    ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD_INPUTS)],
)
def test_bad_input(name, call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_every_public_name_has_a_bad_input_case() -> None:
    from companion import relative

    assert set(relative.__all__) <= {row[0].split(".")[0] for row in BAD_INPUTS}


def test_empty_inputs_give_the_empty_answer() -> None:
    assert T5RelativeBias(2)(0, 5).shape == (2, 0, 5)
    assert relative_positions(0, 0).shape == (0, 0)
    assert transformer_xl_encoding(0, 4).shape == (0, 4)


@pytest.mark.parametrize("scheme", ["t5", "shaw", "transformer_xl", "p_rope"])
def test_position_family_model_builds_each_layer(scheme) -> None:
    torch.manual_seed(0)
    net = position_family_model(scheme, _TINY)
    assert isinstance(net, PositionFamilyTransformer)
    assert net.config.position == "none"
    kinds = {type(m).__name__ for m in net.modules()}
    expected = {
        "t5": "T5BiasSelfAttention",
        "shaw": "ShawSelfAttention",
        "transformer_xl": "TransformerXLSelfAttention",
        "p_rope": "PRoPESelfAttention",
    }[scheme]
    assert expected in kinds, kinds
    out = net(torch.randint(8, (2, 5)))
    assert out.shape == (2, 5, 8)
    assert position_family_model("alibi", _TINY).config.position == "alibi"


def test_the_comparison_moved_to_its_module_with_a_deprecated_alias() -> None:
    """relative.compare_position_schemes and PositionComparison still work for one
    release, warn, and are companion.position_comparison's own (the module that holds
    the trained comparison since experiments.py was split); importing companion.relative
    does not import companion.experiments (no cycle at import time)."""
    import subprocess
    import sys

    from companion import position_comparison, relative

    for name in ("compare_position_schemes", "PositionComparison"):
        new_home = rf"companion\.position_comparison\.{name}\b"
        with pytest.warns(DeprecationWarning, match=new_home):
            alias = getattr(relative, name)
        assert alias is getattr(position_comparison, name)
        assert name not in relative.__all__
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        relative.no_such_name  # noqa: B018
    code = (
        "import sys, companion.relative; print('companion.experiments' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_seed_bands_without_x_draws_a_moving_mean_at_its_last_step() -> None:
    """plotting.seed_bands (the chapter's loss figure): with x=None the smoothed values
    sit where they would with x = 1, 2, ... given (before the fix: shifted left by
    smooth - 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from companion import plotting

    runs = {"rope": torch.tensor([[3.0, 2.0, 1.0, 0.0], [5.0, 2.0, 3.0, 0.0]])}
    fig, (a, b) = plt.subplots(1, 2)
    plotting.seed_bands(a, None, runs, smooth=3)
    plotting.seed_bands(b, torch.arange(1, 5), runs, smooth=3)
    line_a, line_b = a.get_lines()[0], b.get_lines()[0]
    assert list(line_a.get_xdata()) == list(line_b.get_xdata()) == [3.0, 4.0]
    assert list(line_a.get_ydata()) == pytest.approx([8 / 3, 4 / 3])
    plt.close(fig)


# the RoPE variants that moved to companion.rope_variants (issue 33), written out here
# rather than read from the module, so a name dropped from the aliases fails this test
MOVED_TO_ROPE_VARIANTS = [
    "PRoPESelfAttention",
    "axial_rope_cos_sin",
    "axial_rope_frequencies",
    "critical_dimension",
    "grid_positions",
    "longrope_attention_factor",
    "longrope_frequencies",
    "multimodal_position_ids",
    "multimodal_rope_cos_sin",
    "p_rope_frequencies",
    "rope_base_lower_bound",
    "rope_decay_sum",
    "rope_pair_scores",
]


@pytest.mark.parametrize("name", MOVED_TO_ROPE_VARIANTS)
def test_the_rope_variants_moved_with_a_deprecated_alias(name) -> None:
    """relative.<name> and `from companion.relative import <name>` still answer for one
    release, warn naming the new home, and give rope_variants' own object."""
    from companion import relative, rope_variants

    new_home = rf"companion\.rope_variants\.{name}\b"
    with pytest.warns(DeprecationWarning, match=new_home):
        alias = getattr(relative, name)
    assert alias is getattr(rope_variants, name)
    with pytest.warns(DeprecationWarning, match=new_home):
        exec(f"from companion.relative import {name} as imported", namespace := {})
    assert namespace["imported"] is alias
    assert name not in relative.__all__ and name in rope_variants.__all__
