"""Tests for companion.modern: soft-capping, QK-norm bounds, sliding windows, attention
sinks and padding.

Oracles: ``torch.tanh`` written out, Hugging Face transformers' configurations and
modeling code built from small configs (no download), float64 loops from the formulas.
"""

from __future__ import annotations

import math
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import companion
from companion import experiments, modern, norm
from companion.attention import scaled_dot_product_attention
from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    RotarySelfAttention,
    TinyTransformer,
)
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

pytest.importorskip("transformers")

F64 = torch.float64


# ---- soft-capping --------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("cap", [1.0, 30.0, 50.0])
def test_softcap_matches_tanh(dtype: torch.dtype, cap: float) -> None:
    x = torch.linspace(-500, 500, 1001, dtype=F64).to(dtype)
    got = modern.softcap(x, cap)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got, cap * torch.tanh(x / cap))


def test_softcap_bounded_and_near_identity() -> None:
    x = torch.tensor([-math.inf, -1e6, -1.0, 0.0, 1e-3, 1e6, math.inf], dtype=F64)
    got = modern.softcap(x, 50.0)
    assert got.abs().max() <= 50.0
    assert got[0] == -50.0 and got[-1] == 50.0
    assert abs(got[4] - 1e-3) < 1e-12  # x - x^3 / (3 cap^2)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(-1e4, 1e4, allow_nan=False),
    st.floats(0.1, 100.0, allow_nan=False),
)
def test_softcap_odd_increasing_bounded(x: float, cap: float) -> None:
    t = torch.tensor([x, x + 1.0], dtype=F64)
    y = modern.softcap(t, cap)
    assert torch.allclose(modern.softcap(-t, cap), -y)
    assert y[1] >= y[0]
    assert y.abs().max() <= cap


# ---- softcapped attention, QK-norm and the tiny model's variants ------------------------


def test_softcapped_attention_matches_gemma2_eager() -> None:
    from transformers.models.gemma2 import modeling_gemma2 as g2

    gen = torch.Generator().manual_seed(0)
    # float32: Hugging Face's softmax runs in float32 whatever the input
    q, k, v = (torch.randn(2, 3, 7, 8, generator=gen) * 9 for _ in range(3))
    module = types.SimpleNamespace(head_dim=8, num_key_value_groups=1, training=False)
    causal = torch.full((7, 7), -math.inf).triu(1)
    want, _ = g2.eager_attention_forward(
        module, q, k, v, causal, scaling=8**-0.5, softcap=5.0
    )
    got = modern.softcapped_attention(q, k, v, cap=5.0, is_causal=True)
    torch.testing.assert_close(got, want.transpose(1, 2))


def test_softcap_layer_is_rope_then_softcapped_attention() -> None:
    # the layer's attend = RotarySelfAttention's RoPE step, then softcapped_attention
    torch.manual_seed(0)
    layer = modern.SoftcapSelfAttention(16, 2, cap=0.7).double()
    q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.float64) for _ in range(3))
    cos, sin = rope_cos_sin(torch.arange(5), layer.rope_frequencies, dtype=q.dtype)
    expected = modern.softcapped_attention(
        apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, cap=0.7, is_causal=True
    )
    torch.testing.assert_close(
        layer.attend(q, k, v, is_causal=True), expected, atol=1e-12, rtol=0
    )
    plain = modern.softcapped_attention(q, k, v, cap=0.7, is_causal=True)
    assert (layer.attend(q, k, v, is_causal=True) - plain).abs().max() > 1e-3
    with pytest.raises(ValueError, match=r"^mask must be None"):
        layer.attend(q, k, v, mask=torch.zeros(5, 5, dtype=torch.float64))


def test_softcapped_attention_large_cap_is_plain_attention() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 4, generator=gen, dtype=F64) for _ in range(3))
    torch.testing.assert_close(
        modern.softcapped_attention(q, k, v, cap=1e9, is_causal=True),
        scaled_dot_product_attention(q, k, v, is_causal=True),
    )


SMALL = ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=2)


def _layer_inputs_and_outputs(net, ids):
    """The attention layers of ``net`` and, per layer, its input and output on ``ids``."""
    layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
    seen = []
    hooks = [
        m.register_forward_hook(lambda m, a, out: seen.append((a[0], out)))
        for m in layers
    ]
    net(ids)
    for h in hooks:
        h.remove()
    return layers, seen


@pytest.mark.parametrize("kind", ["rope", "qk_norm", "softcap"])
def test_attention_maps_reproduce_each_layer(kind: str) -> None:
    companion.seed_everything(0)
    net = modern.ModernTinyTransformer(SMALL, attention=kind, cap=2.0).double()
    ids = torch.randint(16, (3, 9), generator=torch.Generator().manual_seed(2))
    layers, seen = _layer_inputs_and_outputs(net, ids)
    maps = modern.attention_maps(net, ids)  # (layers, B, H, L, L)
    assert maps.shape == (2, 3, 4, 9, 9)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 3, 4, 9, dtype=F64))
    assert (maps.triu(1) == 0).all()
    for m, (x, out), w in zip(layers, seen, maps, strict=True):
        heads = w @ m._split(m.v_proj(x))  # (B, H, L, D/H)
        merged = heads.transpose(1, 2).reshape(3, 9, 32)
        torch.testing.assert_close(m.out_proj(merged), out)


def test_attention_maps_apply_a_layer_s_own_window() -> None:
    """A sliding-window RoPE layer (chapter 10's hybrid, a ``score_bias``): its map is
    zero outside the window and still reproduces the layer's output; without the bias
    the map would spread over the whole prefix (the bug this pins)."""
    from companion.hybrid_positions import HybridPositionTransformer

    companion.seed_everything(0)
    config = ModelConfig(
        vocab_size=16, dim=32, num_heads=4, num_layers=2, position="none"
    )
    net = HybridPositionTransformer(config, ("rope-local", "nope-global"), window=3)
    net = net.double()
    ids = torch.randint(16, (2, 9), generator=torch.Generator().manual_seed(2))
    layers, seen = _layer_inputs_and_outputs(net, ids)
    maps = modern.attention_maps(net, ids)  # (2, B, H, 9, 9)
    i, j = torch.meshgrid(torch.arange(9), torch.arange(9), indexing="ij")
    outside = (j > i) | (i - j >= 3)
    assert (maps[0][..., outside] == 0).all() and (maps[0][..., ~outside] > 0).all()
    assert (maps[1][..., j <= i] > 0).all()  # the NoPE layer sees its whole prefix
    for m, (x, out), w in zip(layers, seen, maps, strict=True):
        heads = w @ m._split(m.v_proj(x))  # (B, H, L, D/H)
        torch.testing.assert_close(
            m.out_proj(heads.transpose(1, 2).reshape(2, 9, 32)), out
        )


def test_attention_maps_plain_causal_and_refuses_alibi() -> None:
    companion.seed_everything(0)
    net = TinyTransformer(
        ModelConfig(vocab_size=16, dim=16, num_heads=2, position="none")
    )
    maps = modern.attention_maps(net, torch.zeros(1, 4, dtype=torch.long))
    # identical tokens without positions: each query spreads evenly over its prefix
    want = torch.tensor(
        [[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [1 / 3] * 3 + [0], [0.25] * 4]
    )
    torch.testing.assert_close(maps[0, 0, 0], want)
    alibi = TinyTransformer(
        ModelConfig(vocab_size=16, dim=16, num_heads=2, position="alibi")
    )
    with pytest.raises(ValueError, match="ALiBiSelfAttention"):
        modern.attention_maps(alibi, torch.zeros(1, 4, dtype=torch.long))


def test_qk_norm_layer_normalizes_before_rope() -> None:
    companion.seed_everything(0)
    layer = modern.QKNormSelfAttention(16, 2).double()
    with torch.no_grad():
        layer.q_norm.weight.mul_(3.0)
    q, k, v = (torch.randn(1, 2, 5, 8, dtype=F64) * 40 for _ in range(3))
    rope = RotarySelfAttention(16, 2).double()
    qn = q / q.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * 3.0
    kn = k / k.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(
        layer.attend(q, k, v, is_causal=True), rope.attend(qn, kn, v, is_causal=True)
    )


@pytest.mark.parametrize("kind", ["qk_norm", "softcap"])
def test_modern_tiny_transformer_trains_batched(kind: str) -> None:
    nets = []
    for seed in (0, 1):
        companion.seed_everything(seed)
        nets.append(modern.ModernTinyTransformer(SMALL, attention=kind))
    runs = experiments.train_batched(
        nets, seeds=[0, 1], steps=3, batch_size=4, length=8, lag=2, lr=1e-2
    )
    assert all(len(r.losses) == 3 and math.isfinite(r.losses[-1]) for r in runs)


# ---- the QK-norm bound -----------------------------------------------------------------


@pytest.mark.parametrize("D", [2, 8, 64, 128])
def test_qk_norm_bound_is_attained_and_never_exceeded(D: int) -> None:
    gen = torch.Generator().manual_seed(D)
    g_q = 1 + torch.rand(D, generator=gen, dtype=F64)
    g_k = 1 + torch.rand(D, generator=gen, dtype=F64)
    g_k[:] = g_q  # equal gains: the bound is attained at the largest gain
    bound = modern.qk_norm_logit_bound(g_q, g_k)
    x = (
        torch.randn(4096, D, generator=gen, dtype=F64)
        * torch.rand(4096, 1, generator=gen) ** 4
    )
    q = norm.rms_norm(x, D, g_q, eps=1e-12)
    k = norm.rms_norm(x.roll(1, 0), D, g_k, eps=1e-12)
    assert ((q * k).sum(-1).abs() / math.sqrt(D)).max() <= bound + 1e-9
    i = int(g_q.argmax())
    e = torch.zeros(1, D, dtype=F64)
    e[0, i] = 1.0
    best = norm.rms_norm(e, D, g_q, eps=1e-12) * norm.rms_norm(e, D, g_k, eps=1e-12)
    assert best.sum().item() / math.sqrt(D) == pytest.approx(bound, rel=1e-9)
    assert modern.qk_norm_logit_bound(torch.ones(D), torch.ones(D)) == pytest.approx(
        math.sqrt(D)
    )


def test_qk_norm_bound_holds_after_rope() -> None:
    D = 8
    g = torch.tensor([1.0, 2.0, 0.5, 1.5, 1.0, 0.1, 3.0, 1.0], dtype=F64)
    bound = modern.qk_norm_logit_bound(g, g)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2000, D, generator=gen, dtype=F64)
    cos, sin = rope_cos_sin(torch.arange(2000), rope_frequencies(D), dtype=F64)
    q = apply_rope(norm.rms_norm(x, D, g), cos, sin)
    k = norm.rms_norm(x.flip(0), D, g)
    assert ((q * k).sum(-1).abs() / math.sqrt(D)).max() <= bound


# ---- sliding windows -------------------------------------------------------------------


def _reach(windows: list[int | None], length: int) -> int:
    """Brute force: boolean reachability through the layers' masks; the largest i - j
    with a path from token j to position i."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    total = torch.eye(length, dtype=torch.long)
    for w in windows:
        band = (j <= i) & ((j > i - w) if w is not None else True)
        total = ((band.long() @ total) > 0).long()
    return int(((i - j) * total).max())


@pytest.mark.parametrize(
    "windows", [[1], [2], [3, 3], [4, 2, 5], [3, None], [2, 2, 2, 2], [None]]
)
def test_receptive_field_matches_brute_force(windows: list[int | None]) -> None:
    got = modern.receptive_field(windows)
    length = 40
    reach = _reach(windows, length)
    if math.isinf(got):
        assert reach == length - 1
    else:
        assert reach == got


def test_kv_cache_bytes_equals_hf_dynamic_cache() -> None:
    """Hugging Face's cache for a local/global stack (DynamicSlidingWindowLayer keeps
    the last W - 1 tokens), filled one token at a time: its tensors' bytes."""
    from transformers import DynamicCache, Gemma2Config

    config = Gemma2Config(
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        hidden_size=16,
        sliding_window=3,
    )
    windows = [3 if t == "sliding_attention" else None for t in config.layer_types]
    assert windows == [3, None, 3, None]
    cache = DynamicCache(config=config)
    kv = torch.zeros(1, 2, 1, 8, dtype=torch.bfloat16)
    for length in range(1, 8):
        for layer in range(4):
            cache.update(kv, kv, layer)
        nbytes = sum(x.keys.nbytes + x.values.nbytes for x in cache.layers)
        got = modern.kv_cache_bytes(length, windows=windows, num_kv_heads=2, head_dim=8)
        assert got == nbytes
    assert modern.kv_cache_bytes(0, windows=windows, num_kv_heads=2, head_dim=8) == 0


# ---- padding ---------------------------------------------------------------------------


def test_padding_position_ids_match_hf_generate() -> None:
    from transformers.generation.utils import GenerationMixin

    mask = torch.tensor(
        [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [1, 1, 1, 0, 0]]
    )
    ids = torch.ones_like(mask)
    want = GenerationMixin._prepare_position_ids_for_generation(
        None, ids, {"attention_mask": mask, "input_ids": ids}
    )
    torch.testing.assert_close(modern.padding_position_ids(mask), want)
    torch.testing.assert_close(modern.padding_position_ids(mask.bool()), want)
    assert modern.padding_position_ids(mask)[0].tolist() == [0, 0, 0, 1, 2]


# ---- attention sinks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "sinks", "window"),
    [(0, 4, 8), (5, 4, 8), (12, 4, 8), (30, 4, 8), (30, 0, 3), (7, 2, 1)],
)
def test_sink_cache_keep(length: int, sinks: int, window: int) -> None:
    kept = modern.sink_cache_keep(length, sinks=sinks, window=window).tolist()
    want = [t for t in range(length) if t < sinks or t >= length - window]
    assert kept == want


@pytest.mark.parametrize("chunk", [1, 3])
def test_sink_cache_rolls_and_reindexes(chunk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 3, 20, 4, generator=gen)
    values = torch.randn(2, 3, 20, 4, generator=gen)
    cache = modern.SinkCache(sinks=2, window=5)
    for start in range(0, 20, chunk):
        k, v = cache.update(
            keys[:, :, start : start + chunk], values[:, :, start : start + chunk]
        )
        seen = min(20, start + chunk)
        keep = modern.sink_cache_keep(seen, sinks=2, window=5)
        torch.testing.assert_close(k, keys[:, :, keep])
        torch.testing.assert_close(v, values[:, :, keep])
        assert cache.positions().tolist() == list(range(len(keep)))
        assert cache.seen == seen


def test_sink_cache_chunk_returns_the_cache_after_eviction() -> None:
    # the documented caveat: a 20-token chunk is evicted before it is returned, so the
    # keys of tokens 2..13 (which the chunk's own queries 2..13 need) are not there
    cache = modern.SinkCache(sinks=2, window=6)
    tokens = torch.arange(20.0).reshape(1, 1, 20, 1)
    keys, _ = cache.update(tokens, tokens)
    assert keys.flatten().long().tolist() == [0, 1, *range(14, 20)]
    assert cache.positions().tolist() == list(range(8))
    assert "one token per call" in modern.SinkCache.update.__doc__


def _cache() -> modern.SinkCache:
    cache = modern.SinkCache(sinks=1, window=2)
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    return cache


ONES = torch.ones(4)
BAD_INPUTS = [
    ("softcap", lambda: modern.softcap([1.0], 50.0), TypeError, r"^x must be a torch"),
    (
        "softcap",
        lambda: modern.softcap(torch.ones(2, dtype=torch.long), 50.0),
        TypeError,
        r"^x must be a floating",
    ),
    ("softcap", lambda: modern.softcap(torch.ones(2), 0.0), ValueError, r"^cap must"),
    ("softcap", lambda: modern.softcap(torch.ones(2), "50"), TypeError, r"^cap must"),
    (
        "softcapped_attention",
        lambda: modern.softcapped_attention(
            torch.ones(2, 4), torch.ones(2, 3), torch.ones(2, 4), cap=5.0
        ),
        ValueError,
        r"^query and key|^key",
    ),
    (
        "softcapped_attention",
        lambda: modern.softcapped_attention(ONES[None], ONES[None], ONES[None], cap=-1),
        ValueError,
        r"^cap must",
    ),
    (
        "QKNormSelfAttention",
        lambda: modern.QKNormSelfAttention(12, 4),
        ValueError,
        r"dim / num_heads must be even",
    ),
    (
        "SoftcapSelfAttention",
        lambda: modern.SoftcapSelfAttention(16, 2, cap=0),
        ValueError,
        r"^cap must",
    ),
    (
        "ModernTinyTransformer",
        lambda: modern.ModernTinyTransformer(SMALL, attention="alibi"),
        ValueError,
        r"^attention must be one of",
    ),
    (
        "ModernTinyTransformer",
        lambda: modern.ModernTinyTransformer(
            ModelConfig(vocab_size=16, dim=32, position="none")
        ),
        ValueError,
        r"^config.position must be 'rope'",
    ),
    (
        "ModernTinyTransformer",
        lambda: modern.ModernTinyTransformer({"vocab_size": 16}),
        TypeError,
        r"^config must be a ModelConfig",
    ),
    (
        "attention_maps",
        lambda: modern.attention_maps(torch.nn.Linear(2, 2), torch.zeros(1, 2)),
        TypeError,
        r"^net must be",
    ),
    (
        "receptive_field",
        lambda: modern.receptive_field(4096),
        TypeError,
        r"^windows must be a sequence",
    ),
    (
        "receptive_field",
        lambda: modern.receptive_field([4, 0]),
        ValueError,
        r"^windows\[1\] must be",
    ),
    ("receptive_field", lambda: modern.receptive_field([]), ValueError, r"^windows"),
    (
        "kv_cache_bytes",
        lambda: modern.kv_cache_bytes(-1, windows=[4], num_kv_heads=1, head_dim=2),
        ValueError,
        r"^length must",
    ),
    (
        "kv_cache_bytes",
        lambda: modern.kv_cache_bytes(8, windows=[4], num_kv_heads=0, head_dim=2),
        ValueError,
        r"^num_kv_heads must",
    ),
    (
        "kv_cache_bytes",
        lambda: modern.kv_cache_bytes(
            8, windows=[4], num_kv_heads=1, head_dim=2, bytes_per_element=0.5
        ),
        TypeError,
        r"^bytes_per_element must",
    ),
    (
        "qk_norm_logit_bound",
        lambda: modern.qk_norm_logit_bound(ONES, torch.ones(3)),
        ValueError,
        r"k_gain",
    ),
    (
        "qk_norm_logit_bound",
        lambda: modern.qk_norm_logit_bound(torch.ones(2, 2), ONES),
        ValueError,
        r"^q_gain must have 1 dimensions",
    ),
    (
        "padding_position_ids",
        lambda: modern.padding_position_ids(torch.ones(2, 3)),
        TypeError,
        r"^attention_mask must be",
    ),
    (
        "padding_position_ids",
        lambda: modern.padding_position_ids(torch.tensor([[0, 2]])),
        ValueError,
        r"^attention_mask must hold only 0 and 1",
    ),
    (
        "padding_position_ids",
        lambda: modern.padding_position_ids(torch.ones(3, dtype=torch.long)),
        ValueError,
        r"^attention_mask must have 2 dimensions",
    ),
    (
        "sink_cache_keep",
        lambda: modern.sink_cache_keep(8, sinks=-1, window=2),
        ValueError,
        r"^sinks must",
    ),
    (
        "sink_cache_keep",
        lambda: modern.sink_cache_keep(8, sinks=1, window=0),
        ValueError,
        r"^window must",
    ),
    ("SinkCache", lambda: modern.SinkCache(sinks=1, window=0), ValueError, r"^window"),
    (
        "SinkCache.update",
        lambda: _cache().update(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3)),
        ValueError,
        r"^key must have 4 dimensions",
    ),
    (
        "SinkCache.update",
        lambda: _cache().update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4)),
        ValueError,
        r"^key and the cached keys|heads",
    ),
    (
        "SinkCache.update",
        lambda: modern.SinkCache(sinks=1, window=2).update(
            torch.zeros(1, 1, 1, 4), torch.zeros(1, 2, 1, 4)
        ),
        ValueError,
        r"^key and value must have the same heads size",
    ),
    (
        "SinkCache.update",
        lambda: _cache().update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8)),
        ValueError,
        r"^key and the cached keys must have the same D size",
    ),
]


def test_sink_cache_refused_update_leaves_the_cache_unchanged() -> None:
    cache = _cache()
    with pytest.raises(ValueError):
        cache.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8))
    assert cache.seen == 3 and cache.keys.shape == (1, 2, 3, 4)
