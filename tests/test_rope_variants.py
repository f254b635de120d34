"""Tests for companion.rope_variants: the RoPE base bound, p-RoPE, LongRoPE, M-RoPE and
axial 2-D RoPE.

Oracles: Hugging Face transformers' ``ROPE_INIT_FUNCTIONS["longrope"]`` and
``Phi3RotaryEmbedding``, Qwen2-VL's ``get_rope_index``, ``Qwen2VLRotaryEmbedding`` and
``apply_rotary_pos_emb``, all built from small configs in code (no download); float64
loops written from the papers' formulas (Men et al. 2024, axial RoPE in the complex
plane, each RoPE pair's score); companion.model's RoPE layer for p-RoPE at p = 1.
"""

from __future__ import annotations

import itertools
import math
import types
import warnings

import pytest
import torch

from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    RotarySelfAttention,
)
from companion.relative import position_family_model
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies
from companion.rope_variants import (
    PRoPESelfAttention,
    axial_rope_cos_sin,
    axial_rope_frequencies,
    critical_dimension,
    grid_positions,
    longrope_attention_factor,
    longrope_frequencies,
    multimodal_position_ids,
    multimodal_rope_cos_sin,
    p_rope_frequencies,
    rope_base_lower_bound,
    rope_decay_sum,
    rope_pair_scores,
)

_TINY = ModelConfig(vocab_size=8, dim=16, num_heads=2, num_layers=1)
_IDS = torch.randint(8, (2, 5), generator=torch.Generator().manual_seed(0))

transformers = pytest.importorskip("transformers")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore")
    from transformers import Phi3Config, Qwen2VLConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.phi3.modeling_phi3 import (
        Phi3RotaryEmbedding,
    )
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl
    from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()  # Phi-3's config warns about its own field names

F64 = torch.float64


# ---- LongRoPE -----------------------------------------------------------------------


def _phi3(d: int, n0: int, n_max: int, params: dict, partial: float = 1.0):
    g = torch.Generator().manual_seed(4)
    pairs = int(d * partial) // 2
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": (1 + torch.rand(pairs, generator=g)).tolist(),
        "long_factor": (1 + 30 * torch.rand(pairs, generator=g)).sort()[0].tolist(),
        **params,
    }
    if partial != 1.0:
        rope["partial_rotary_factor"] = partial
    config = Phi3Config(
        hidden_size=2 * d,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=n_max,
        original_max_position_embeddings=n0,
        rope_parameters=rope,
    )
    return config, rope


@pytest.mark.parametrize(
    ("d", "n0", "n_max", "params", "partial"),
    [
        (32, 64, 2048, {}, 1.0),  # factor from the lengths (Phi-3), 32x
        (16, 4096, 131072, {}, 1.0),  # Phi-3-mini-128k's lengths
        (32, 100, 400, {"factor": 3.0}, 1.0),
        (32, 100, 400, {"attention_factor": 1.5}, 1.0),
        (64, 512, 512, {}, 1.0),  # factor 1: attention factor 1
        (32, 256, 1024, {}, 0.5),  # partial rotary: D counts the rotated part
    ],
)
def test_longrope_equals_hf(d, n0, n_max, params, partial) -> None:
    config, rope = _phi3(d, n0, n_max, params, partial)
    rotated = int(d * partial)
    factor = rope.get("factor", n_max / n0)
    for seq_len in (None, 1, n0 - 1, n0, n0 + 1, 4 * n0):
        theirs, their_factor = ROPE_INIT_FUNCTIONS["longrope"](
            config, "cpu", seq_len=seq_len
        )
        ours, our_factor = longrope_frequencies(
            rotated,
            base=10000.0,
            short_factor=rope["short_factor"],
            long_factor=rope["long_factor"],
            factor=factor,
            original_max_position_embeddings=n0,
            seq_len=seq_len,
            attention_factor=params.get("attention_factor"),
        )
        torch.testing.assert_close(ours, theirs.to(F64), rtol=2e-6, atol=0.0)
        assert our_factor == pytest.approx(their_factor, rel=1e-15)
        long = seq_len is not None and seq_len > n0
        expected = rope["long_factor"] if long else rope["short_factor"]
        base_freq = rope_frequencies(rotated)
        torch.testing.assert_close(
            ours, base_freq / torch.tensor(expected, dtype=F64), rtol=1e-14, atol=0
        )


def test_longrope_switch_equals_hf_rotary_embedding() -> None:
    # HF picks the set from max(position_ids) + 1 > L0: position L0 - 1 is short, L0 long
    d, n0 = 32, 64
    config, rope = _phi3(d, n0, 2048, {})
    emb = Phi3RotaryEmbedding(config)
    x = torch.zeros(1, 1, 2 * d)
    for last in (n0 - 1, n0, 3 * n0):
        positions = torch.arange(last + 1)[None]
        cos, sin = emb(x, positions)
        inv_freq, factor = longrope_frequencies(
            d,
            short_factor=rope["short_factor"],
            long_factor=rope["long_factor"],
            factor=2048 / n0,
            original_max_position_embeddings=n0,
            seq_len=last + 1,
        )
        our_cos, our_sin = rope_cos_sin(positions[0], inv_freq)
        assert (our_cos * factor - cos[0, :, : d // 2]).abs().max() < 2e-5
        assert (our_sin * factor - sin[0, :, d // 2 :]).abs().max() < 2e-5


def test_longrope_attention_factor_values() -> None:
    assert longrope_attention_factor(32.0, 4096) == pytest.approx(
        math.sqrt(1 + math.log(32) / math.log(4096))
    )
    assert longrope_attention_factor(1.0, 4096) == 1.0
    assert longrope_attention_factor(0.5, 4096) == 1.0


# ---- Qwen2-VL M-RoPE ------------------------------------------------------------------


def _qwen2_vl_config(d: int, section: list[int], merge: int = 2):
    return Qwen2VLConfig(
        text_config={
            "hidden_size": 2 * d,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": section,
            },
        },
        vision_config={"spatial_merge_size": merge},
    )


def _hf_rope_index(segments, merge: int = 2, video_from: int = 10**9):
    """Qwen2VLModel.get_rope_index on a namespace standing in for the model (it reads
    only config.vision_config.spatial_merge_size); grids from index ``video_from`` on
    are videos."""
    model = types.SimpleNamespace(config=_qwen2_vl_config(8, [2, 1, 1], merge))
    model.get_vision_position_ids = types.MethodType(
        qwen2_vl.Qwen2VLModel.get_vision_position_ids, model
    )
    types_, images, videos = [], [], []
    for n, item in enumerate(segments):
        if isinstance(item, tuple):
            t, h, w = item
            kind = 2 if n >= video_from else 1
            types_ += [kind] * (t * (h // merge) * (w // merge))
            (videos if kind == 2 else images).append(item)
        else:
            types_ += [0] * item
    ids = torch.zeros(1, len(types_), dtype=torch.long)
    position_ids, _ = qwen2_vl.Qwen2VLModel.get_rope_index(
        model,
        ids,
        torch.tensor([types_]),
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return position_ids[:, 0]


@pytest.mark.parametrize(
    ("segments", "merge", "video_from"),
    [
        ([3, (1, 4, 6), 2], 2, 10**9),
        ([(1, 2, 2)], 2, 10**9),
        ([5], 2, 10**9),
        ([2, (2, 4, 4), 1, (1, 6, 2), 3], 2, 1),  # a 2-frame video, then an image
        ([1, (3, 2, 4), 4], 1, 1),
    ],
)
def test_multimodal_position_ids_equal_hf(segments, merge, video_from) -> None:
    ours = multimodal_position_ids(segments, spatial_merge_size=merge)
    theirs = _hf_rope_index(segments, merge, video_from)
    assert torch.equal(ours, theirs)


def test_multimodal_position_ids_example() -> None:
    ours = multimodal_position_ids([3, (1, 4, 6), 2])
    assert ours.tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
    ]


@pytest.mark.parametrize(("d", "section"), [(32, [4, 6, 6]), (16, [2, 3, 3])])
def test_multimodal_rope_equals_hf(d, section) -> None:
    config = _qwen2_vl_config(d, section)
    emb = qwen2_vl.Qwen2VLRotaryEmbedding(config.text_config)
    segments = [3, (1, 4, 6), 2, (2, 2, 8), 4]
    position_ids = torch.stack([multimodal_position_ids(segments)] * 2, dim=1)
    position_ids[:, 1] += 5  # a second sequence, shifted: (3, B, L)
    length = position_ids.shape[-1]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, length, d, generator=g)
    cos, sin = emb(q, position_ids)  # (B, L, D)
    our_cos, our_sin = multimodal_rope_cos_sin(
        position_ids, rope_frequencies(d), section
    )
    assert our_cos.shape == (2, length, d // 2)
    for ours, theirs in ((our_cos, cos), (our_sin, sin)):
        assert (ours - theirs[..., : d // 2]).abs().max() < 2e-6
        assert (ours - theirs[..., d // 2 :]).abs().max() < 2e-6
    rotated, _ = qwen2_vl.apply_rotary_pos_emb(q, q, cos, sin)
    ours = apply_rope(q, our_cos, our_sin)
    assert (ours - rotated).abs().max() < 2e-5
    # a text-only sequence is ordinary RoPE
    text = multimodal_position_ids([9])
    c1, s1 = multimodal_rope_cos_sin(text, rope_frequencies(d), section)
    c2, s2 = rope_cos_sin(torch.arange(9), rope_frequencies(d))
    assert torch.equal(c1, c2) and torch.equal(s1, s2)


# ---- axial 2-D RoPE ---------------------------------------------------------------------


def _axial_score(q, k, dx, dy, theta):
    """Re sum_i q_i conj(k_i) e^{i (dx, dy) theta} in the complex view, float64:
    pairs (i, i + D/2) of the half layout, x on the first D/4 pairs, y on the rest."""
    d = q.shape[-1]
    qc = torch.complex(q[: d // 2], q[d // 2 :])
    kc = torch.complex(k[: d // 2], k[d // 2 :])
    quarter = d // 4
    angle = torch.cat([dx * theta, dy * theta])  # (D/2,)
    assert angle.shape[0] == 2 * quarter
    return (qc * kc.conj() * torch.polar(torch.ones_like(angle), angle)).real.sum()


def test_axial_rope_depends_on_dx_dy_only() -> None:
    d, h, w = 16, 3, 4
    g = torch.Generator().manual_seed(6)
    q, k = (
        torch.randn(d, generator=g, dtype=F64),
        torch.randn(d, generator=g, dtype=F64),
    )
    theta = axial_rope_frequencies(d, base=100.0)
    xy = grid_positions(h, w)
    cos, sin = axial_rope_cos_sin(xy, theta, dtype=F64)
    rq = apply_rope(q.expand(h * w, d), cos, sin)  # the query at every patch
    rk = apply_rope(k.expand(h * w, d), cos, sin)
    scores = rq @ rk.T  # (N, N)
    for a, b in itertools.product(range(h * w), repeat=2):
        dx, dy = (xy[a] - xy[b]).tolist()
        expected = _axial_score(q, k, dx, dy, theta)
        assert abs(scores[a, b] - expected) < 1e-12
    # a shift of the whole grid by (dx, dy) = (7, -3) changes no score
    cos2, sin2 = axial_rope_cos_sin(xy + torch.tensor([7, -3]), theta, dtype=F64)
    rq2 = apply_rope(q.expand(h * w, d), cos2, sin2)
    rk2 = apply_rope(k.expand(h * w, d), cos2, sin2)
    assert (rq2 @ rk2.T - scores).abs().max() < 1e-12
    # ... while 1-D RoPE over the raster order does not depend on (dx, dy) alone:
    # (0,0)->(3,0) and (3,0)->(0,1) are both raster offset 3
    c1, s1 = rope_cos_sin(torch.arange(h * w), rope_frequencies(d))
    r1q = apply_rope(q.expand(h * w, d).float(), c1, s1)
    r1k = apply_rope(k.expand(h * w, d).float(), c1, s1)
    raster = r1q @ r1k.T
    assert abs(raster[3, 0] - raster[4, 1]) < 1e-5  # same raster offset: same score
    assert abs(scores[3, 0] - scores[4, 1]) > 1e-3  # axial tells (3, 0) from (-3, 1)


def test_grid_positions_are_rope_vit_raster_order() -> None:
    t = torch.arange(12)
    assert torch.equal(grid_positions(3, 4), torch.stack([t % 4, t // 4], dim=-1))
    assert grid_positions(0, 5).shape == (0, 2)
    theta = axial_rope_frequencies(8)
    assert torch.equal(theta, rope_frequencies(4, base=100.0))
    # RoPE-ViT's compute_axial_cis: 1 / theta ** (arange(0, dim, 4)[: dim // 4] / dim)
    d = 32
    theirs = 1.0 / (100.0 ** (torch.arange(0, d, 4)[: d // 4].to(F64) / d))
    torch.testing.assert_close(axial_rope_frequencies(d), theirs, rtol=1e-15, atol=0)


# ---- the base bound (Men et al., 2024) ------------------------------------------------


def test_rope_decay_sum_is_the_sum_of_cosines() -> None:
    m = torch.tensor([0, 1, 5, 1000, 123456])
    theta = rope_frequencies(128, base=500000.0)
    direct = torch.cos(m[:, None].to(F64) * theta).sum(-1)
    ours = rope_decay_sum(m, 128, base=500000.0)
    torch.testing.assert_close(ours, direct, rtol=1e-13, atol=1e-10)
    assert float(rope_decay_sum(torch.tensor(0), 16)) == 8.0


def _admissible(b: float, length: int, d: int) -> bool:
    m = torch.arange(length + 1, dtype=F64)
    return bool(
        (torch.cos(m[:, None] * rope_frequencies(d, base=b)).sum(-1) >= 0).all()
    )


@pytest.mark.parametrize(("length", "d"), [(100, 64), (300, 32)])
def test_rope_base_lower_bound_against_a_dense_scan(length, d) -> None:
    bound = rope_base_lower_bound(length, d, rtol=1e-6)
    assert _admissible(bound, length, d)
    assert not _admissible(bound * (1 - 2e-6), length, d)
    # a dense scan finds nothing admissible below it
    scan = torch.logspace(math.log10(2.0), math.log10(bound), 800, dtype=F64)[:-1]
    assert not any(_admissible(float(b), length, d) for b in scan)


def test_admissible_bases_are_not_an_interval() -> None:
    # D = 128, L = 1024: the island at the bound (4.29e3, the paper's 4.3e3), a gap,
    # a second island near 5.6e3, a gap, then admissible again from about 6.0e3
    bases = (4293.0, 4294.0, 5000.0, 5620.0, 5800.0, 6100.0)
    verdicts = [_admissible(b, 1024, 128) for b in bases]
    assert verdicts == [False, True, False, True, False, True]


@pytest.mark.parametrize(
    ("d", "base", "length"),
    [
        (128, 1e4, 4096),
        (128, 5e5, 8192),
        (128, 1e6, 32768),
        (64, 1e4, 2048),
        (96, 7e3, 100),
    ],
)
def test_critical_dimension_is_the_papers_formula(d, base, length) -> None:
    x = (d / 2) * math.log(length / (2 * math.pi)) / math.log(base)
    assert x != int(x)
    assert critical_dimension(d, base, length) == 2 * math.ceil(x)
    # and the count it stands for: pairs whose wavelength fits in the training length
    wavelengths = 2 * math.pi * base ** (2 * torch.arange(d // 2, dtype=F64) / d)
    assert critical_dimension(d, base, length) == 2 * int((wavelengths <= length).sum())


def test_critical_dimension_of_llama_2_is_92() -> None:
    assert critical_dimension(128, 10000.0, 4096) == 92
    assert critical_dimension(128, 10000.0, 6) == 0  # no pair turns within 6 tokens
    assert critical_dimension(128, 10000.0, 10**9) == 128


# ---- p-RoPE and the comparison's models ---------------------------------------------


def test_p_rope_keeps_the_fastest_pairs() -> None:
    theta = rope_frequencies(128, base=5e5)
    for p, kept in ((1.0, 64), (0.75, 48), (0.25, 16), (0.0, 0)):
        out = p_rope_frequencies(128, p, base=5e5)
        assert torch.equal(out[:kept], theta[:kept])
        assert (out[kept:] == 0).all()


def _hf_proportional(head_dim: int, p: float, base: float, factor: float = 1.0):
    """Hugging Face's ``proportional`` RoPE (Gemma 4): its inverse frequencies."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters={
            "rope_type": "proportional",
            "rope_theta": base,
            "partial_rotary_factor": p,
            "factor": factor,
        },
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["proportional"](cfg)
    assert attention_factor == 1.0
    return inv_freq


def test_p_rope_pair_count_is_hugging_faces_proportional_rope() -> None:
    """The count of turning pairs is HF's floor int(p * D // 2) on a grid of (D, p),
    the issue's D = 24, p = 0.3 (3 pairs; rounding gave 4) and D = 64, p = 0.3 (9, not
    10) among them; the frequencies equal HF's to float32 rounding."""
    differs = 0
    for d, p in itertools.product(
        (2, 4, 6, 8, 10, 12, 24, 30, 64, 100, 128, 256, 512),
        (0.0, 0.05, 0.1, 0.125, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.6, 0.7, 0.75, 0.9, 1.0),
    ):
        hf = _hf_proportional(d, p, 1e4)
        ours = p_rope_frequencies(d, p, base=1e4)
        assert ours.shape == hf.shape == (d // 2,)
        assert int((ours > 0).sum()) == int((hf > 0).sum()), (d, p)
        torch.testing.assert_close(ours.float(), hf, rtol=1e-6, atol=0.0)
        differs += int((ours > 0).sum()) != round(p * d / 2)
    assert differs >= 10  # the grid holds counts where floor and round differ
    assert int((p_rope_frequencies(24, 0.3) > 0).sum()) == 3
    assert int((p_rope_frequencies(64, 0.3) > 0).sum()) == 9
    assert int((_hf_proportional(24, 0.3, 1e4) > 0).sum()) == 3


def test_p_rope_attention_is_rope_with_frozen_slow_pairs() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    full = PRoPESelfAttention(16, 2, fraction=1.0).double()
    none = PRoPESelfAttention(16, 2, fraction=0.0).double()
    plain = CausalSelfAttention(16, 2).double()
    none.load_state_dict(full.state_dict())
    plain.load_state_dict(full.state_dict())
    rotary = RotarySelfAttention(16, 2).double()
    rotary.load_state_dict(full.state_dict())
    assert torch.allclose(full(x), rotary(x), atol=1e-12)  # p = 1: RoPE
    assert torch.allclose(none(x), plain(x), atol=1e-12)  # p = 0: no position
    half = PRoPESelfAttention(16, 2, fraction=0.5)
    assert half.rope_frequencies.tolist()[2:] == [0.0, 0.0]


def _double(t):
    return None if t is None else t.double()


@pytest.mark.parametrize("scheme", ["rope", "p_rope"])
def test_rope_pair_scores_add_up_to_the_layers_scores(scheme) -> None:
    """Oracle: summed over both parts and every pair, the split is the layer's score
    (companion.modern.attention_maps, computed from the rotated q and k) on and below
    the diagonal; each part from the formula a cos(d theta) - b sin(d theta), written
    out for one query, key and pair in float64."""
    from companion.modern import attention_maps

    config = ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=2, max_len=40)
    torch.manual_seed(3)
    net = position_family_model(scheme, config)
    ids = torch.randint(16, (3, 40), generator=torch.Generator().manual_seed(4))
    parts = rope_pair_scores(net, ids)  # (2, P, B, H, L, L)
    assert parts.shape == (2, 4, 3, 4, 40, 40) and parts.dtype == F64
    for layer in (0, -1):
        split = rope_pair_scores(net, ids, layer=layer).sum(dim=(0, 1))
        whole = attention_maps(net, ids, scores=True)[layer].double()
        below = torch.ones(40, 40, dtype=torch.bool).tril()
        torch.testing.assert_close(
            split[..., below], whole[..., below], atol=2e-6, rtol=0
        )
    # one entry by hand: last layer, sequence 1, head 2, query 30, key 5, pair 1
    last = [m for m in net.modules() if isinstance(m, RotarySelfAttention)][-1]
    inputs = []
    hook = last.register_forward_pre_hook(lambda _, args: inputs.append(args[0]))
    with torch.no_grad():
        net(ids)
    hook.remove()
    x = inputs[0].double()
    with torch.no_grad():
        q = torch.nn.functional.linear(
            x, last.q_proj.weight.double(), _double(last.q_proj.bias)
        )
        k = torch.nn.functional.linear(
            x, last.k_proj.weight.double(), _double(last.k_proj.bias)
        )
    head, dh = 2, 8
    qh, kh = q[1, 30, head * dh : (head + 1) * dh], k[1, 5, head * dh : (head + 1) * dh]
    a = qh[1] * kh[1] + qh[5] * kh[5]  # Re(z_q conj z_k), pair 1 = entries (1, 5)
    b = qh[5] * kh[1] - qh[1] * kh[5]  # Im(z_q conj z_k)
    angle = 25 * float(last.rope_frequencies[1])  # d = 30 - 5
    cos_part = (a * math.cos(angle) / math.sqrt(dh)).item()
    sin_part = (-b * math.sin(angle) / math.sqrt(dh)).item()
    assert parts[0, 1, 1, head, 30, 5].item() == pytest.approx(cos_part, abs=1e-6)
    assert parts[1, 1, 1, head, 30, 5].item() == pytest.approx(sin_part, abs=1e-6)
    assert abs(sin_part) > 1e-3 and abs(cos_part) > 1e-3  # both parts tested
    if scheme == "p_rope":  # the stopped pairs have no sine part
        assert parts[1, 2:].abs().max() == 0


# ---- bad input ---------------------------------------------------------------------------

SHORT = [1.0] * 8  # for head_dim 16
LONGROPE = dict(
    short_factor=SHORT,
    long_factor=SHORT,
    factor=4.0,
    original_max_position_embeddings=64,
)

BAD_INPUTS = [
    (
        "critical_dimension",
        lambda: critical_dimension(128, 10000.0, 0),
        ValueError,
        r"^training_length must be a positive int, got 0",
    ),
    (
        "critical_dimension",
        lambda: critical_dimension(128, 0.5, 4096),
        ValueError,
        r"^base must be a real number > 1, got 0.5",
    ),
    (
        "longrope_attention_factor",
        lambda: longrope_attention_factor(32.0, 1),
        ValueError,
        r"^original_max_position_embeddings must be an int >= 2, got 1",
    ),
    (
        "longrope_attention_factor",
        lambda: longrope_attention_factor(-1.0, 4096),
        ValueError,
        r"^factor must be a real number > 0, got -1.0",
    ),
    (
        "longrope_frequencies",
        lambda: longrope_frequencies(16, **{**LONGROPE, "short_factor": [1.0] * 7}),
        ValueError,
        r"^short_factor must hold 8 positive reals \(D/2\), got 7",
    ),
    (
        "longrope_frequencies",
        lambda: longrope_frequencies(
            16, **{**LONGROPE, "long_factor": [1.0] * 7 + [0.0]}
        ),
        ValueError,
        r"^long_factor\[7\] must be a real number > 0, got 0.0",
    ),
    (
        "longrope_frequencies",
        lambda: longrope_frequencies(
            16, **{**LONGROPE, "long_factor": torch.ones(8, dtype=torch.long)}
        ),
        TypeError,
        r"^long_factor must be a floating-point tensor",
    ),
    (
        "longrope_frequencies",
        lambda: longrope_frequencies(16, **LONGROPE, seq_len=-1),
        ValueError,
        r"^seq_len must be an int >= 0, got -1",
    ),
    (
        "longrope_frequencies",
        lambda: longrope_frequencies(15, **LONGROPE),
        ValueError,
        r"^head_dim must be an even int, got 15",
    ),
    (
        "multimodal_position_ids",
        lambda: multimodal_position_ids([3, (1, 3, 4)]),
        ValueError,
        r"^segments\[1\] must have h and w divisible by spatial_merge_size=2",
    ),
    (
        "multimodal_position_ids",
        lambda: multimodal_position_ids([3, (1, 2, 2), (1, 2, 2)]),
        ValueError,
        r"^segments must separate two grids by text",
    ),
    (
        "multimodal_position_ids",
        lambda: multimodal_position_ids([3, (1, 2)]),
        ValueError,
        r"^segments\[1\] must hold 3 ints \(t, h, w\), got 2",
    ),
    (
        "multimodal_position_ids",
        lambda: multimodal_position_ids("abc"),
        TypeError,
        r"^segments must be a tuple or list of text lengths and \(t, h, w\) grids",
    ),
    (
        "multimodal_position_ids",
        lambda: multimodal_position_ids([0]),
        ValueError,
        r"^segments\[0\] must be a positive int, got 0",
    ),
    (
        "multimodal_rope_cos_sin",
        lambda: multimodal_rope_cos_sin(
            torch.zeros(3, 4, dtype=torch.long), torch.ones(8), [2, 3, 4]
        ),
        ValueError,
        r"^mrope_section must sum to D/2 = 8",
    ),
    (
        "multimodal_rope_cos_sin",
        lambda: multimodal_rope_cos_sin(
            torch.zeros(3, 4, dtype=torch.long), torch.ones(8), [4, 4]
        ),
        ValueError,
        r"^mrope_section must hold 3 ints, one per axis, got 2",
    ),
    (
        "multimodal_rope_cos_sin",
        lambda: multimodal_rope_cos_sin(torch.zeros(3, 4), torch.ones(8, 1), [2, 3, 3]),
        ValueError,
        r"^frequencies must have 1 dimensions \(D/2,\)",
    ),
    (
        "axial_rope_frequencies",
        lambda: axial_rope_frequencies(18),
        ValueError,
        r"^head_dim must be a multiple of 4 \(two axes of pairs\), got 18",
    ),
    (
        "axial_rope_frequencies",
        lambda: axial_rope_frequencies(16, base=1.0),
        ValueError,
        r"^base must be a real number > 1, got 1.0",
    ),
    (
        "grid_positions",
        lambda: grid_positions(3, -4),
        ValueError,
        r"^width must be an int >= 0, got -4",
    ),
    (
        "axial_rope_cos_sin",
        lambda: axial_rope_cos_sin(torch.zeros(5, 3), torch.ones(4)),
        ValueError,
        r"^positions must have size 2 \(\(x, y\)\) in dimension -1",
    ),
    (
        "axial_rope_cos_sin",
        lambda: axial_rope_cos_sin(torch.zeros(5, 2), torch.ones(4), dtype=torch.int32),
        TypeError,
        r"^dtype must be a floating torch.dtype, got torch.int32",
    ),
    (
        "rope_decay_sum",
        lambda: rope_decay_sum([1, 2], 128),
        TypeError,
        r"^offsets must be a torch.Tensor, got a list",
    ),
    (
        "rope_decay_sum",
        lambda: rope_decay_sum(torch.arange(3), 127),
        ValueError,
        r"^head_dim must be an even int, got 127",
    ),
    (
        "rope_base_lower_bound",
        lambda: rope_base_lower_bound(0),
        ValueError,
        r"^context_length must be a positive int, got 0",
    ),
    (
        "rope_base_lower_bound",
        lambda: rope_base_lower_bound(100, 64, low=1e6),
        ValueError,
        r"^low must be a base that is not admissible yet",
    ),
    (
        "rope_base_lower_bound",
        lambda: rope_base_lower_bound(100, 64, high=10.0),
        ValueError,
        r"^high must be large enough to hold an admissible base",
    ),
    (
        "rope_base_lower_bound",
        lambda: rope_base_lower_bound(100, 64, rtol=0.0),
        ValueError,
        r"^rtol must be a real number > 0, got 0.0",
    ),
    (
        "p_rope_frequencies",
        lambda: p_rope_frequencies(8, 1.5),
        ValueError,
        r"^fraction must be a real number <= 1",
    ),
    (
        "p_rope_frequencies",
        lambda: p_rope_frequencies(7, 0.5),
        ValueError,
        r"^head_dim must be",
    ),
    (
        "PRoPESelfAttention",
        lambda: PRoPESelfAttention(16, 4, fraction=-0.1),
        ValueError,
        r"^fraction must be a real number >= 0",
    ),
    (
        "rope_pair_scores",
        lambda: rope_pair_scores(position_family_model("t5", _TINY), _IDS),
        ValueError,
        r"^net must use RoPE or p-RoPE attention in every layer, got "
        r"\['T5BiasSelfAttention'\]",
    ),
    (
        "rope_pair_scores",
        lambda: rope_pair_scores(position_family_model("rope", _TINY), _IDS, layer=1),
        ValueError,
        r"^layer must be",
    ),
    (
        "rope_pair_scores",
        lambda: rope_pair_scores(position_family_model("rope", _TINY), _IDS.float()),
        TypeError,
        r"^input_ids must",
    ),
    (
        "rope_pair_scores",
        lambda: rope_pair_scores(torch.nn.Linear(2, 2), _IDS),
        TypeError,
        r"^net must be",
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
    from companion import rope_variants

    assert set(rope_variants.__all__) <= {row[0].split(".")[0] for row in BAD_INPUTS}


def test_empty_inputs_give_the_empty_answer() -> None:
    cos, _ = axial_rope_cos_sin(grid_positions(0, 3), axial_rope_frequencies(8))
    assert cos.shape == (0, 4)
