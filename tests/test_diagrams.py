"""Tests of companion.diagrams: every diagram returns a Figure, the numbers it shows equal
independent computations of what the chapter teaches (NumPy loops from the formulas,
Hugging Face's T5 buckets, torch.softmax), its text reads on a phone, and bad input
raises a TypeError/ValueError naming the argument (``BAD_INPUTS``, read by the
package-wide contract test as well). The static test at the end checks that every chapter from
the sinusoidal encoding to the performance appendix shows at least one of these diagrams
as a captioned figure."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from test_plotting import svg_width_inches
from torch import nn

from companion import _colors, diagrams, extension, model, modern, norm
from companion.relative import t5_relative_position_bucket
from companion.rope import rope_frequencies

ROOT = Path(__file__).resolve().parents[1]
PHONE_FLOOR_PX = 10.0  # the book's promise (issue 37, D7), as in test_plotting


def _text(fig: Figure, gid: str) -> str:
    found = [t for t in fig.findobj(matplotlib.text.Text) if t.get_gid() == gid]
    assert len(found) == 1, f"{len(found)} texts with gid {gid!r}"
    return found[0].get_text()


def _tip(fig: Figure, gid: str) -> np.ndarray:
    found = [ln for ln in fig.findobj(matplotlib.lines.Line2D) if ln.get_gid() == gid]
    assert len(found) == 1, f"{len(found)} lines with gid {gid!r}"
    return np.array([found[0].get_xdata()[-1], found[0].get_ydata()[-1]], dtype=float)


def _position(fig: Figure, gid: str) -> tuple[float, float]:
    found = [t for t in fig.findobj(matplotlib.text.Text) if t.get_gid() == gid]
    assert len(found) == 1, f"{len(found)} texts with gid {gid!r}"
    return found[0].get_position()


def _number(text: str) -> float:
    return float(re.search(r"[-+−]?\d+(\.\d+)?", text).group(0).replace("−", "-"))


def _qkv(length: int = 4, width: int = 3, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(length, width, generator=gen) for _ in range(3))


def _tiny() -> nn.Module:
    config = model.ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=2)
    return model.TinyTransformer(config)


class _V3:
    """The fields of transformers' default DeepseekV3Config (DeepSeek-V3's)."""

    hidden_size, num_attention_heads, num_hidden_layers = 7168, 128, 61
    kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim = 512, 64, 128, 128


class _Hybrid:
    """The fields of Qwen3-Next-80B-A3B's config.json (transformers' Qwen3NextConfig
    defaults): 48 layers, every fourth full attention."""

    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * 12
    linear_num_key_heads, linear_num_value_heads = 16, 32
    linear_key_head_dim = linear_value_head_dim = 128
    linear_conv_kernel_dim, num_key_value_heads, head_dim = 4, 2, 256


ROW = torch.tensor([1.2, -0.5, 3.1, 0.4, 5.0, 2.2, -1.0, 4.1, 0.3], dtype=torch.float64)

DIAGRAMS = {
    "sinusoid_clocks": lambda: diagrams.sinusoid_clocks(),
    "rope_rotation": lambda: diagrams.rope_rotation(),
    "frequency_rescaling": lambda: diagrams.frequency_rescaling(),
    "t5_bucket_map": lambda: diagrams.t5_bucket_map(),
    "attention_pipeline": lambda: diagrams.attention_pipeline(*_qkv()),
    "online_softmax": lambda: diagrams.online_softmax(ROW),
    "norm_placement": lambda: diagrams.norm_placement(),
    "model_stack": lambda: diagrams.model_stack(_tiny()),
    "kv_cache": lambda: diagrams.kv_cache(),
    "kv_cache window": lambda: diagrams.kv_cache(12, window=4),
    "kv_cache sinks": lambda: diagrams.kv_cache(12, sinks=2, window=4),
    "sink_column": lambda: diagrams.sink_column(),
    "learned_sink": lambda: diagrams.learned_sink(),
    "mla_paths": lambda: diagrams.mla_paths(_V3()),
    "attention_tiles": lambda: diagrams.attention_tiles(),
    "hybrid_stack": lambda: diagrams.hybrid_stack(_Hybrid()),
}


def test_every_public_diagram_is_exercised() -> None:
    drawn = {name.split()[0] for name in DIAGRAMS}
    assert drawn == set(diagrams.__all__)


@pytest.mark.parametrize("name", list(DIAGRAMS), ids=str)
def test_diagram_is_a_figure_whose_text_reads_on_a_phone(name: str) -> None:
    fig = DIAGRAMS[name]()
    assert isinstance(fig, Figure)
    width = svg_width_inches(fig)  # the saved SVG, as the book shows it
    texts = [t for t in fig.findobj(matplotlib.text.Text) if t.get_text()]
    assert texts, "a diagram without text explains nothing"
    smallest = min(t.get_fontsize() for t in texts) * 358.0 / (72.0 * width)
    assert smallest >= PHONE_FLOOR_PX - 0.05, f"{smallest:.2f} CSS px at 358 px"
    assert width < 8.5, f"{width:.2f} in: too wide to keep its text on a phone"
    assert not any("$" in t.get_text() for t in texts)  # no shrunken sub/superscripts


# ---- the numbers each diagram shows -------------------------------------------------------


@pytest.mark.parametrize(("position", "dim", "base"), [(5, 8, 1e4), (11, 6, 100.0)])
def test_clock_hands_are_the_encoding_pairs(position, dim, base) -> None:
    fig = diagrams.sinusoid_clocks(position, dim=dim, base=base)
    for i in range(dim // 2):
        omega = base ** (-2 * i / dim)  # the formula, in float64
        angle = position * omega
        np.testing.assert_allclose(
            _tip(fig, f"hand-{i}"), [math.cos(angle), math.sin(angle)], atol=1e-6
        )
        assert _text(fig, f"omega-{i}").endswith(f"ω = {omega:.3g}")


@pytest.mark.parametrize(
    ("m", "n", "shift", "head_dim", "pair", "query", "key"),
    [
        (2, 1, 2, 2, 0, (1.0, 0.0), (0.7, 0.0)),
        (7, 3, 5, 8, 1, (0.3, 0.9), (-0.5, 0.4)),
    ],
)
def test_rope_pairs_turn_by_position_times_theta(
    m, n, shift, head_dim, pair, query, key
):
    fig = diagrams.rope_rotation(
        m, n, shift=shift, head_dim=head_dim, pair=pair, query=query, key=key
    )
    theta = 10000.0 ** (-2 * pair / head_dim)

    def turn(v, p):
        c, s = math.cos(p * theta), math.sin(p * theta)
        return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1]])

    start = math.atan2(query[1], query[0]) - math.atan2(key[1], key[0])
    expected = math.remainder(start + (m - n) * theta, 2 * math.pi)
    for k, (pm, pn) in enumerate(((m, n), (m + shift, n + shift))):
        np.testing.assert_allclose(_tip(fig, f"query-{k}"), turn(query, pm), atol=1e-9)
        np.testing.assert_allclose(_tip(fig, f"key-{k}"), turn(key, pn), atol=1e-9)
        shown = _number(_text(fig, f"angle-{k}").split("\n")[1])
        assert shown == pytest.approx(expected, abs=0.006)  # two decimals


def test_rescaling_cells_are_each_methods_ratio() -> None:
    d, base, s, length = 16, 10000.0, 4.0, 2048
    fig = diagrams.frequency_rescaling(
        head_dim=d, base=base, factor=s, original_max_position_embeddings=length
    )
    yarn, _ = extension.yarn_frequencies(
        d, base=base, factor=s, original_max_position_embeddings=length
    )
    theta = base ** (-np.arange(0, d, 2) / d)
    for i in range(d // 2):
        assert _text(fig, f"pi-{i}") == f"{1 / s:.2f}"
        # NTK-aware: base * s^(d / (d - 2)), so pair i is divided by s^(2i / (d - 2))
        assert _text(fig, f"ntk-{i}") == f"{s ** (-2 * i / (d - 2)):.2f}"
        assert _text(fig, f"yarn-{i}") == f"{yarn[i].item() / theta[i]:.2f}"
        wavelength = 2 * math.pi / theta[i]
        assert _number(_text(fig, f"wavelength-{i}")) == pytest.approx(
            wavelength, rel=0.03, abs=0.06
        )
    # YaRN's ramp: pairs that turn > 32 times in the training length are left alone,
    # those that turn < once are interpolated fully
    turns = length / (2 * math.pi / theta)
    for i in range(d // 2):
        if turns[i] > 32:
            assert _text(fig, f"yarn-{i}") == "1.00"
        if turns[i] < 1:
            assert _text(fig, f"yarn-{i}") == f"{1 / s:.2f}"


@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "bidirectional"),
    [(16, 64, False), (32, 128, True), (32, 128, False), (8, 20, False)],
)
def test_bucket_cells_hold_the_distances_of_t5s_buckets(
    num_buckets, max_distance, bidirectional
) -> None:
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    fig = diagrams.t5_bucket_map(
        num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional
    )
    distance = torch.arange(0, 2 * max_distance + 1)
    theirs = t5.T5Attention._relative_position_bucket(
        -distance,
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    for b in sorted(set(theirs.tolist())):
        held = distance[theirs == b].tolist()
        text = _text(fig, f"bucket-{b}")
        if held[-1] == 2 * max_distance:
            assert text == f"≥ {held[0]}"
        elif len(held) == 1:
            assert text == str(held[0])
        else:
            assert text == f"{held[0]}–{held[-1]}"
        assert held == list(range(held[0], held[-1] + 1))  # a bucket is a range


def test_attention_pipeline_cells_are_causal_softmax_attention() -> None:
    q, k, v = _qkv(4, 3, seed=2)
    fig = diagrams.attention_pipeline(q, k, v)
    qd, kd, vd = (t.double().numpy() for t in (q, k, v))
    scores = qd @ kd.T / math.sqrt(3)
    weights = np.zeros_like(scores)
    for i in range(4):  # a loop from the formula: keys 0..i, softmax of the row
        e = np.exp(scores[i, : i + 1] - scores[i, : i + 1].max())
        weights[i, : i + 1] = e / e.sum()
    output = weights @ vd
    for i in range(4):
        for j in range(4):
            assert _text(fig, f"scores-{i}-{j}") == f"{scores[i, j]:.2f}"
            masked = _text(fig, f"masked-{i}-{j}")
            assert masked == ("−∞" if j > i else f"{scores[i, j]:.2f}")
            assert _number(_text(fig, f"weights-{i}-{j}")) == pytest.approx(
                weights[i, j], abs=0.0051
            )
        for j in range(3):
            assert _number(_text(fig, f"output-{i}-{j}")) == pytest.approx(
                output[i, j], abs=0.0051
            )


@pytest.mark.parametrize("block_size", [1, 3, 4, 9])
def test_online_softmax_running_max_and_sum_are_the_prefixes(block_size: int) -> None:
    fig = diagrams.online_softmax(ROW, block_size=block_size)
    x = ROW.numpy()
    for b, end in enumerate(range(block_size, x.size + block_size, block_size)):
        prefix = x[: min(end, x.size)]
        m = prefix.max()
        assert _number(_text(fig, f"max-{b}")) == pytest.approx(m, abs=0.051)
        total = np.exp(prefix - m).sum()
        assert _text(fig, f"sum-{b}") == f"ℓ = {total:.2f}"
        if b:
            m_old = x[: end - block_size].max()
            assert _text(fig, f"rescale-{b}") == f"×{math.exp(m_old - m):.2g}"
    softmax = torch.softmax(ROW, 0)
    for j in range(x.size):
        assert _text(fig, f"softmax-{j}") == f"{softmax[j].item():.2f}"
        assert _text(fig, f"score-{j}") == f"{x[j]:.1f}"


def _call_order(block_type: type) -> list[str]:
    """The order in which a block calls its norm and its sublayer, by forward hooks."""
    calls: list[str] = []
    sub, nrm = nn.Linear(4, 4), nn.LayerNorm(4)
    sub.register_forward_hook(lambda *_: calls.append("sublayer"))
    nrm.register_forward_hook(lambda *_: calls.append("norm"))
    block_type(4, sub, nrm)(torch.randn(2, 4))
    return calls


@pytest.mark.parametrize("norm_name", ["LayerNorm", "RMSNorm"])
def test_norm_placement_draws_the_blocks_call_order(norm_name: str) -> None:
    fig = diagrams.norm_placement(norm_name=norm_name)
    for kind, block in (("post", norm.PostLNBlock), ("pre", norm.PreLNBlock)):
        boxes = [_text(fig, f"{kind}-{k}") for k in range(6)]
        drawn = ["norm" if b == norm_name else "sublayer" for b in boxes if b != "+"]
        assert drawn == 2 * _call_order(block)  # two sublayers: attention, then MLP
        assert [b for b in boxes if b not in ("+", norm_name)] == ["attention", "MLP"]
        # B1: each skip line starts at the top of the box whose output the sublayer's
        # branch reads: the block's input for the first; for the second, the output of
        # the first step, which forward hooks name (Post-LN: the norm, Pre-LN: the "+")
        first_step_ends_with = "norm" if _call_order(block)[-1] == "norm" else "+"
        for s, box in ((0, None), (1, 2)):
            lines = [ln for ln in fig.findobj(matplotlib.lines.Line2D) if ln.get_gid() == f"{kind}-skip-{s}"]  # fmt: skip
            assert len(lines) == 1
            start = lines[0].get_ydata()[0]
            if box is None:
                assert start < min(_position(fig, f"{kind}-{k}")[1] for k in range(6))
            else:
                named = "norm" if boxes[box] == norm_name else boxes[box]
                assert named == first_step_ends_with
                assert start == pytest.approx(_position(fig, f"{kind}-{box}")[1] + 0.3)
        # the residual sum comes right after each sublayer
        assert [
            boxes[k + 1] for k, b in enumerate(boxes) if b in ("attention", "MLP")
        ] == [
            "+",
            "+",
        ]


@pytest.mark.parametrize(
    ("position", "placement"),
    [("rope", "pre"), ("sinusoidal", "post"), ("alibi", "pre")],
)
def test_model_stack_lists_the_models_layers(position: str, placement: str) -> None:
    config = model.ModelConfig(
        vocab_size=16, dim=32, num_heads=4, num_layers=2, position=position,
        placement=placement,
    )  # fmt: skip
    tiny = model.TinyTransformer(config)
    fig = diagrams.model_stack(tiny)
    n = len(tiny.blocks)
    # B18: a Post-LN model has no final norm (nn.Identity), so no box for it
    boxes = n + (4 if placement == "pre" else 3)
    texts = [_text(fig, f"layer-{k}") for k in range(boxes)]
    assert not [s for s in fig.findobj(matplotlib.text.Text) if s.get_gid() == f"layer-{boxes}"]  # fmt: skip
    assert not any("Identity" in s for s in texts)
    assert ("final LayerNorm" in texts) == (placement == "pre")
    assert texts[0] == "tokens (vocabulary 16)"
    assert texts[1].startswith("embedding 16 × 32")
    assert ("sinusoidal table" in texts[1]) == (position == "sinusoidal")
    name = "Pre-LN" if placement == "pre" else "Post-LN"
    for k, block in enumerate(tiny.blocks):
        assert texts[2 + k].startswith(f"{name}: ")
        is_attention = "attention" in type(block.sublayer).__name__.lower()
        assert ("4 heads of 8" in texts[2 + k]) == is_attention
        assert ("MLP (widths 32, 128, 32)" in texts[2 + k].replace("\n", " ")) == (not is_attention)  # fmt: skip
        # B2: read top to bottom, the box follows the block's computation
        norm_at, sum_at = (
            texts[2 + k].index("LayerNorm"),
            texts[2 + k].index("+ residual"),
        )
        assert (norm_at < sum_at) == (placement == "pre")
        assert ("RoPE" in texts[2 + k]) == (is_attention and position == "rope")
    assert texts[-1] == "head 32 × 16 → logits"
    count = sum(p.numel() for p in tiny.parameters())
    assert _text(fig, "parameters").startswith(f"{count:,} parameters")


@pytest.mark.parametrize(
    ("length", "prompt", "window", "sinks"),
    [(9, 4, None, 0), (12, 4, 4, 0), (12, 4, 4, 2), (7, 1, 3, 1)],
)
def test_kv_cache_rows_keep_the_sinks_and_the_window(length, prompt, window, sinks):
    fig = diagrams.kv_cache(length, prompt=prompt, window=window, sinks=sinks)
    for t in range(prompt - 1, length):
        if window is None:
            kept = set(range(t + 1))
        else:  # StreamingLLM: the first `sinks` and the last `window` tokens
            kept = {j for j in range(t + 1) if j < sinks or j > t - window}
        if window is not None and not sinks:
            # B4: between steps a rolling layer keeps W - 1 (the next query brings its
            # own key): the chapter's measured kv_cache_bytes, one byte per token
            keeps = (
                modern.kv_cache_bytes(
                    t + 1,
                    windows=[window],
                    num_kv_heads=1,
                    head_dim=1,
                    bytes_per_element=1,
                )
                // 2
            )
            assert _text(fig, f"kept-{t}") == f"keeps {keeps}"
            shaded = sum(_text(fig, f"cell-{t}-{j}") != "×" for j in range(t + 1))
            assert shaded == len(kept)  # read at this step
        else:
            assert _text(fig, f"kept-{t}") == f"{len(kept)} cached"
        for j in range(t + 1):
            assert _text(fig, f"cell-{t}-{j}") == (str(j) if j in kept else "×")


@pytest.mark.parametrize(("length", "score"), [(6, 3.0), (4, 0.0), (8, -1.0)])
def test_sink_column_weights_are_the_causal_softmax(length: int, score: float) -> None:
    fig = diagrams.sink_column(length, sink_score=score)
    for i in range(length):
        denominator = math.exp(score) + i  # key 0 at the sink score, i keys at 0
        for j in range(length):
            text = _text(fig, f"weights-{i}-{j}")
            if j > i:
                assert text == ""
            else:
                expected = (math.exp(score) if j == 0 else 1.0) / denominator
                assert text == f"{expected:.2f}"


@pytest.mark.parametrize(
    ("length", "sink", "padding"), [(5, 0.0, 1), (4, 1.5, 0), (8, -2.0, 3)]
)
def test_learned_sink_weights_take_the_sink_column(length, sink, padding) -> None:
    """Query i (after the padding) sees n = i - padding + 1 keys of score 0: each gets
    1 / (n + e^sink), the sink column e^sink / (n + e^sink); a padding query gives the
    sink all its weight; masked keys show no number."""
    fig = diagrams.learned_sink(length, sink=sink, padding=padding)
    for i in range(length):
        n = i - padding + 1
        for j in range(length + 1):
            text = _text(fig, f"weights-{i}-{j}")
            if j == length:
                share = 1.0 if n <= 0 else math.exp(sink) / (n + math.exp(sink))
                assert text == f"{share:.2f}"
            elif j < padding or j > i:
                assert text == ""
            else:
                assert text == f"{1.0 / (n + math.exp(sink)):.2f}"
    labels = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    assert labels.count("pad") == padding and "sink" in labels
    assert [f"query {i}" in labels for i in range(length)] == [
        i >= padding for i in range(length)
    ]


def test_mla_paths_label_the_widths_and_the_cache() -> None:
    fig = diagrams.mla_paths(_V3())
    assert _text(fig, "latent").endswith("width 512")
    assert _text(fig, "rope-key").endswith("width 64")
    assert _text(fig, "content-key") == "keys: 128\nheads of 128"
    # B14: words and Unicode, no raw TeX (no mathtext: its sub/superscripts shrink)
    raw = [s.get_text() for s in fig.findobj(matplotlib.text.Text) if re.search(r"[_^]", s.get_text())]  # fmt: skip
    assert not raw, raw
    assert _text(fig, "value") == "values: 128\nheads of 128"
    cache = _text(fig, "cache")
    assert "512 + 64 = 576 numbers" in cache
    assert f"{61 * 576 * 2:,} bytes per token over 61 layers" in cache  # bfloat16


def test_mla_paths_read_a_hugging_face_config() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.DeepseekV3Config(
        kv_lora_rank=8, qk_rope_head_dim=4, num_hidden_layers=2
    )
    cache = _text(diagrams.mla_paths(config), "cache")
    assert "8 + 4 = 12 numbers" in cache and f"{2 * 12 * 2:,} bytes" in cache


@pytest.mark.parametrize(
    ("length", "keys", "block", "causal"),
    [(8, 8, 2, True), (7, 7, 3, True), (6, 8, 4, False), (5, 5, 1, True)],
)
def test_tiles_are_full_masked_or_skipped_as_the_causal_mask_says(
    length, keys, block, causal
) -> None:
    fig = diagrams.attention_tiles(length, keys, block_size=block, is_causal=causal)
    counts = {"full": 0, "masked": 0, "skip": 0}
    for a in range(math.ceil(length / block)):
        for b in range(math.ceil(keys / block)):
            q_lo, q_hi = a * block, min(length, (a + 1) * block) - 1
            k_lo, k_hi = b * block, min(keys, (b + 1) * block) - 1
            if not causal or k_hi <= q_lo:  # every key at or before every query
                kind = "full"
            elif k_lo > q_hi:  # every key after every query
                kind = "skip"
            else:
                kind = "masked"
            counts[kind] += 1
            assert _text(fig, f"tile-{a}-{b}") == kind
    first = _text(fig, "counts").split(";")[0]
    assert first == f"{counts['full']} full, {counts['masked']} masked, {counts['skip']} skipped"  # fmt: skip


@pytest.mark.parametrize("name", sorted(diagrams.__all__))
def test_diagram_draws_on_the_empty_figure_it_is_given(name: str) -> None:
    """The chapters pass plt.figure(); here a Figure outside pyplot stands for it."""
    target = Figure()
    args = {
        "attention_pipeline": _qkv(),
        "online_softmax": (ROW,),
        "model_stack": (_tiny(),),
        "mla_paths": (_V3(),),
        "hybrid_stack": (_Hybrid(),),
    }.get(name, ())
    fig = getattr(diagrams, name)(*args, fig=target)
    assert fig is target and fig.axes
    assert fig.get_figwidth() == pytest.approx(DIAGRAMS[name]().get_figwidth())


def test_diagrams_touch_no_global_setting() -> None:
    before = dict(matplotlib.rcParams)
    for draw in DIAGRAMS.values():
        draw()
    assert dict(matplotlib.rcParams) == before


def test_hybrid_stack_draws_each_layers_cache_from_the_formula() -> None:
    """Each layer's box: its kind from layer_types and its bytes, computed here by hand
    (state H_v d_k d_v in float32 plus (K - 1)(2 H_k d_k + H_v d_v) in bfloat16; keys
    and values 2 H_kv D in bfloat16 per token), and the foot's totals."""
    c, length = _Hybrid(), 4096
    fig = diagrams.hybrid_stack(c, layers=8, length=length)
    state = 32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * 2  # one linear layer
    kv = 2 * 2 * 256 * 2 * length  # one full layer
    for k in range(8):
        text = _text(fig, f"layer-{k}")
        if k % 4 == 3:
            assert text == f"{k}: gated attention, KV {kv / 2**20:,.1f} MiB"
        else:
            assert text == f"{k}: Gated DeltaNet, state {state / 2**20:,.1f} MiB"
    total = 36 * state + 12 * kv
    full = 48 * kv
    assert _text(fig, "total") == (
        f"whole model: {total / 2**20:,.1f} MiB\n"
        f"(every layer full attention: {full / 2**20:,.1f} MiB)"
    )
    assert len([t for t in fig.findobj(matplotlib.text.Text) if (t.get_gid() or "").startswith("layer-")]) == 8  # fmt: skip


# ---- bad input ------------------------------------------------------------------------------

Q, K, V = _qkv()

# (public name, thunk, exception, regex the message must match)
BAD_INPUTS: list[tuple[str, object, type[Exception], str]] = [
    (
        "frequency_rescaling",
        lambda: diagrams.frequency_rescaling(head_dim=128, every=4),
        ValueError,
        r"^head_dim / 2 / every must be at most 12 pairs drawn, got 16 \(head_dim=128, every=4\)$",
    ),
    (
        "frequency_rescaling",
        lambda: diagrams.frequency_rescaling(every=0),
        ValueError,
        r"^every must be",
    ),
    (
        "sinusoid_clocks",
        lambda: diagrams.sinusoid_clocks(fig=Figure().subplots()),
        TypeError,
        r"^fig must be a matplotlib Figure or None, got a Axes$",
    ),
    (
        "norm_placement",
        lambda: diagrams.norm_placement(fig=diagrams.norm_placement()),
        ValueError,
        r"^fig must be an empty Figure, got a Figure that holds a drawing$",
    ),
    (
        "sinusoid_clocks",
        lambda: diagrams.sinusoid_clocks(-1),
        ValueError,
        r"^position must be an int >= 0, got -1$",
    ),
    (
        "sinusoid_clocks",
        lambda: diagrams.sinusoid_clocks(dim=7),
        ValueError,
        r"^dim must be an even int, got 7$",
    ),
    (
        "sinusoid_clocks",
        lambda: diagrams.sinusoid_clocks(dim=40),
        ValueError,
        r"^dim must be an int <= 12, got 40$",
    ),
    (
        "sinusoid_clocks",
        lambda: diagrams.sinusoid_clocks(base=1.0),
        ValueError,
        r"^base must be a real number > 1, got 1.0$",
    ),
    (
        "sinusoid_clocks",
        lambda: diagrams.sinusoid_clocks(2.5),
        TypeError,
        r"^position must be an int",
    ),
    (
        "rope_rotation",
        lambda: diagrams.rope_rotation(pair=1),
        ValueError,
        r"^pair must be < head_dim / 2 = 1, got 1$",
    ),
    (
        "rope_rotation",
        lambda: diagrams.rope_rotation(head_dim=3),
        ValueError,
        r"^head_dim must be an even int, got 3$",
    ),
    (
        "rope_rotation",
        lambda: diagrams.rope_rotation(query=(0.0, 0.0)),
        ValueError,
        r"^query must not be the zero pair",
    ),
    (
        "rope_rotation",
        lambda: diagrams.rope_rotation(key=(1.0, 2.0, 3.0)),
        ValueError,
        r"^key must hold two numbers, got 3$",
    ),
    (
        "rope_rotation",
        lambda: diagrams.rope_rotation(key="ab"),
        TypeError,
        r"^key must be a sequence of two real numbers",
    ),
    (
        "rope_rotation",
        lambda: diagrams.rope_rotation(shift=-1),
        ValueError,
        r"^shift must be an int >= 0, got -1$",
    ),
    (
        "frequency_rescaling",
        lambda: diagrams.frequency_rescaling(factor=1.0),
        ValueError,
        r"^factor must be a real number > 1, got 1.0$",
    ),
    (
        "frequency_rescaling",
        lambda: diagrams.frequency_rescaling(head_dim=9),
        ValueError,
        r"^head_dim must be an even int, got 9$",
    ),
    (
        "frequency_rescaling",
        lambda: diagrams.frequency_rescaling(original_max_position_embeddings=0),
        ValueError,
        r"^original_max_position_embeddings must be a positive int, got 0$",
    ),
    (
        "t5_bucket_map",
        lambda: diagrams.t5_bucket_map(num_buckets=2),
        ValueError,
        r"^num_buckets must be an int >= 4, got 2$",
    ),
    (
        "t5_bucket_map",
        lambda: diagrams.t5_bucket_map(max_distance=8),
        ValueError,
        r"^max_distance must be an int >= 9, got 8$",
    ),
    (
        "t5_bucket_map",
        lambda: diagrams.t5_bucket_map(bidirectional=1),
        TypeError,
        r"^bidirectional must be a bool, got 1$",
    ),
    (
        "attention_pipeline",
        lambda: diagrams.attention_pipeline(Q.tolist(), K, V),
        TypeError,
        r"^query must be a torch.Tensor, got a list$",
    ),
    (
        "attention_pipeline",
        lambda: diagrams.attention_pipeline(Q, K[:3], V),
        ValueError,
        r"^key must have shape",
    ),
    (
        "attention_pipeline",
        lambda: diagrams.attention_pipeline(Q, K, V.double()),
        TypeError,
        r"^value must",
    ),
    (
        "attention_pipeline",
        lambda: diagrams.attention_pipeline(
            torch.randn(9, 2), torch.randn(9, 2), torch.randn(9, 2)
        ),
        ValueError,
        r"^query must have 2 to 6 rows \(L\), got 9$",
    ),
    (
        "attention_pipeline",
        lambda: diagrams.attention_pipeline(Q, K, torch.randn(4, 7)),
        ValueError,
        r"^value must have shape \(4, D_v\) with 1 <= D_v <= 6, got \(4, 7\)$",
    ),
    (
        "online_softmax",
        lambda: diagrams.online_softmax(torch.tensor([1.0, math.inf])),
        ValueError,
        r"^scores must be finite",
    ),
    (
        "online_softmax",
        lambda: diagrams.online_softmax(torch.zeros(13)),
        ValueError,
        r"^scores must hold 2 to 12 entries, got 13$",
    ),
    (
        "online_softmax",
        lambda: diagrams.online_softmax(ROW, block_size=10),
        ValueError,
        r"^block_size must be an int <= 9, got 10$",
    ),
    (
        "online_softmax",
        lambda: diagrams.online_softmax(torch.zeros(2, 2)),
        ValueError,
        r"^scores must",
    ),
    (
        "norm_placement",
        lambda: diagrams.norm_placement(norm_name="BatchNorm"),
        ValueError,
        r"^norm_name must be one of",
    ),
    (
        "model_stack",
        lambda: diagrams.model_stack(nn.Linear(2, 2)),
        TypeError,
        r"^model must be a companion.model.TinyTransformer, got a Linear$",
    ),
    (
        "kv_cache",
        lambda: diagrams.kv_cache(sinks=2),
        ValueError,
        r"^sinks needs a window, got sinks=2 and window=None$",
    ),
    (
        "kv_cache",
        lambda: diagrams.kv_cache(8, prompt=9),
        ValueError,
        r"^prompt must be an int <= 8, got 9$",
    ),
    (
        "kv_cache",
        lambda: diagrams.kv_cache(40),
        ValueError,
        r"^length must be an int <= 16, got 40$",
    ),
    (
        "kv_cache",
        lambda: diagrams.kv_cache(window=0),
        ValueError,
        r"^window must be a positive int, got 0$",
    ),
    (
        "sink_column",
        lambda: diagrams.sink_column(1),
        ValueError,
        r"^length must be an int >= 2, got 1$",
    ),
    (
        "sink_column",
        lambda: diagrams.sink_column(sink_score=math.nan),
        ValueError,
        r"^sink_score must be a finite real number",
    ),
    (
        "mla_paths",
        lambda: diagrams.mla_paths(object()),
        TypeError,
        r"^config must be a DeepSeek-V3-style config with int fields hidden_size",
    ),
    (
        "attention_tiles",
        lambda: diagrams.attention_tiles(block_size=0),
        ValueError,
        r"^block_size must be a positive int, got 0$",
    ),
    (
        "attention_tiles",
        lambda: diagrams.attention_tiles(17),
        ValueError,
        r"^query_length must be an int <= 16, got 17$",
    ),
    (
        "attention_tiles",
        lambda: diagrams.attention_tiles(is_causal="yes"),
        TypeError,
        r"^is_causal must be a bool",
    ),
    (
        "learned_sink",
        lambda: diagrams.learned_sink(9),
        ValueError,
        r"^length must be an int <= 8, got 9$",
    ),
    (
        "learned_sink",
        lambda: diagrams.learned_sink(5, padding=5),
        ValueError,
        r"^padding must be an int <= 4, got 5$",
    ),
    (
        "hybrid_stack",
        lambda: diagrams.hybrid_stack(_Hybrid(), layers=13),
        ValueError,
        r"^layers must be an int <= 12, got 13$",
    ),
    (
        "hybrid_stack",
        lambda: diagrams.hybrid_stack(object()),
        TypeError,
        r"^config must be a Qwen3NextConfig",
    ),
]


@pytest.mark.parametrize(
    ("name", "thunk", "exc", "match"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_raises_a_named_error(name, thunk, exc, match) -> None:
    with pytest.raises(exc, match=match):
        thunk()


# ---- every chapter shows a diagram -------------------------------------------------------------


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


CHAPTERS = sorted(
    p for p in (ROOT / "book").glob("[0-9][0-9]_*.ipynb") if 1 <= int(p.name[:2]) <= 12
)


def test_chapters_one_to_twelve_are_all_found() -> None:
    assert [int(p.name[:2]) for p in CHAPTERS] == list(range(1, 13))


@pytest.mark.parametrize("nb_path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_shows_a_captioned_diagram(nb_path: Path) -> None:
    """A code cell that draws with companion.diagrams, as a {figure} with a caption and
    alt text, its code folded (hide-input) as the other figures' cells are."""
    found = []
    for cell in _cells(nb_path):
        code = "".join(cell["source"])
        if cell["cell_type"] != "code" or not re.search(r"\bdiagrams\.\w+\(", code):
            continue
        meta = cell.get("metadata", {})
        figure = meta.get("mystnb", {}).get("figure", {})
        alt = meta.get("mystnb", {}).get("image", {}).get("alt", "")
        assert figure.get("caption") and figure.get("name"), f"cell {cell['id']}"
        assert len(alt) > 40, f"cell {cell['id']}: alt text describes the diagram"
        assert "hide-input" in meta.get("tags", []), f"cell {cell['id']}"
        found.append(cell["id"])
    assert found, f"{nb_path.name} shows no diagram of companion.diagrams"


# ---- review R3 (FD): findings each with the test that would have caught it -------------


def test_the_diagrams_roles_have_colours_of_their_own() -> None:
    """R3a-16/B20: no role colour is a scheme's, and the role diagrams draw none."""
    schemes = set(_colors.SCHEME_COLORS.values())
    assert not schemes & set(_colors.ROLE_COLORS.values())
    for fig in (
        diagrams.t5_bucket_map(),
        diagrams.kv_cache(12, prompt=4, sinks=2, window=6),
        diagrams.attention_tiles(),
        diagrams.online_softmax(ROW),
        diagrams.sink_column(),
        diagrams.learned_sink(),
    ):
        used = {
            matplotlib.colors.to_hex(c)
            for a in fig.findobj(matplotlib.patches.Patch)
            for c, shown in ((a.get_facecolor(), a.get_fill()), (a.get_edgecolor(), a.get_linewidth() > 0))
            if shown
        } | {matplotlib.colors.to_hex(s.get_color()) for s in fig.findobj(matplotlib.text.Text)}  # fmt: skip
        assert not used & schemes, used & schemes
    hands = [ln for ln in diagrams.sinusoid_clocks().findobj(matplotlib.lines.Line2D) if (ln.get_gid() or "").startswith("hand-")]  # fmt: skip
    assert {matplotlib.colors.to_hex(h.get_color()) for h in hands} == {_colors.SCHEME_COLORS["sinusoidal"]}  # fmt: skip


def test_frequency_rescaling_draws_the_wide_heads_own_pairs() -> None:
    """B13: every eighth pair of a 128-wide head, with that head's ratios (not those of
    a 16-wide head, which differ by up to 0.16)."""
    fig = diagrams.frequency_rescaling(head_dim=128, every=8, factor=4.0)
    theta = rope_frequencies(128).double()
    ntk = extension.ntk_scaling_frequencies(128, factor=4.0).double() / theta
    yarn = extension.yarn_frequencies(128, factor=4.0, original_max_position_embeddings=2048)[0].double() / theta  # fmt: skip
    for i in range(0, 64, 8):
        assert _text(fig, f"ntk-{i}") == f"{ntk[i].item():.2f}"
        assert _text(fig, f"yarn-{i}") == f"{yarn[i].item():.2f}"
    assert (
        _text(fig, "yarn-40") != f"{0.44:.2f}"
    )  # the 16-wide head's value at 1987 tokens
    with pytest.raises(ValueError, match="every"):
        diagrams.frequency_rescaling(head_dim=128, every=2)


def test_t5_header_gives_where_the_last_bucket_starts() -> None:
    """R3a-22: the last bucket starts before max_distance (50 for 16 buckets and 64)."""
    for buckets, far in ((16, 64), (32, 128)):
        d = torch.arange(0, 2 * far + 1)
        b = t5_relative_position_bucket(-d, bidirectional=False, num_buckets=buckets, max_distance=far)  # fmt: skip
        start = int(d[b == b.max()].min())
        assert start < far
        fig = diagrams.t5_bucket_map(num_buckets=buckets, max_distance=far)
        texts = [s.get_text() for s in fig.findobj(matplotlib.text.Text)]
        assert f"logarithmic; the last from {start}" in texts
        assert not any(f"to {far}" in s for s in texts)


def test_rope_rotation_labels_sit_outside_the_circle() -> None:
    """R3a-10: a label at 1.12 of a short vector lay on the longer one's circle."""
    fig = diagrams.rope_rotation(2, 1, shift=2)
    for k in range(2):
        radius = max(np.hypot(*_tip(fig, f"query-{k}")), np.hypot(*_tip(fig, f"key-{k}")))  # fmt: skip
        for who in ("query", "key"):
            assert np.hypot(*_position(fig, f"{who}-{k}-label")) > radius


def test_online_softmax_of_a_rising_row_draws_rescalings_below_one() -> None:
    """R3a-7/B3: a row whose maximum rises draws factors < 1 (the attention chapter asserts
    its own)."""
    rising = torch.tensor([1.0, 0.5, 2.0, 3.5, 1.2, 0.3, 4.8, 2.2, 1.0, 5.6, -0.7])
    fig = diagrams.online_softmax(rising, block_size=3)
    factors = [_number(_text(fig, f"rescale-{b}")) for b in range(1, 4)]
    assert sum(f < 1 for f in factors) >= 2
    assert not any("_" in s.get_text() for s in fig.findobj(matplotlib.text.Text))


def test_attention_pipeline_shows_its_inputs() -> None:
    """R3a-8: Q, K and V are drawn, so panel 4 (weights × V) can be followed."""
    q, k, v = _qkv()
    fig = diagrams.attention_pipeline(q, k, v)
    for name, tensor in (("query", q), ("key", k), ("value", v)):
        for i in range(tensor.shape[0]):
            for j in range(tensor.shape[1]):
                assert _text(fig, f"{name}-{i}-{j}") == f"{tensor[i, j].item():.1f}"
    labels = [s for s in fig.findobj(matplotlib.text.Text) if s.get_text() == "query 0"]
    assert len(labels) == 2  # the left panels only: none against a neighbour's cells
