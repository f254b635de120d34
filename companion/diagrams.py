r"""Conceptual diagrams for the chapters, drawn from code.

Each function draws one mechanism the book explains (a pair turning in the plane, the
steps of attention, a cache that rolls) and returns the :class:`matplotlib.figure.Figure` it drew
on: the empty one it is given (the chapters pass ``fig=plt.figure()``, so that Jupyter
shows it as it shows every pyplot figure) or a new one, outside pyplot. No diagram
changes a global setting. Every number a diagram shows (an angle, a bucket, a
frequency ratio, a weight) is computed by the function of ``companion`` that the chapter
teaches, so the picture and the package cannot drift: the tests read the numbers back
from the drawn artists (each carries a ``gid`` such as ``"hand-2"`` or ``"weights-1-0"``)
and compare them with those functions. Every diagram is sized for a phone: its smallest
text reads at least ``plotting.MIN_TEXT_PX`` CSS pixels when the figure is
shown 358 px wide (:func:`companion.plotting.readable`).

The padded-batch diagram of chapter 6, which draws on an ``Axes`` like the plot helpers,
stays :func:`companion.plotting.padded_batch_diagram`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Arc, Circle, FancyArrowPatch, FancyBboxPatch, Rectangle
from torch import nn

from companion import _validate, attention, extension, mla, modern, norm, plotting
from companion.positional import sinusoidal_encoding, sinusoidal_frequencies
from companion.relative import t5_relative_position_bucket
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

__all__ = [
    "attention_pipeline",
    "attention_tiles",
    "frequency_rescaling",
    "kv_cache",
    "mla_paths",
    "model_stack",
    "norm_placement",
    "online_softmax",
    "rope_rotation",
    "sink_column",
    "sinusoid_clocks",
    "t5_bucket_map",
]

#: font size (pt) the diagrams are drawn with; readable() raises it where a phone needs
_FONT = 10.0
_QUERY = plotting.scheme_color("rope")  # queries and the rotated pair
_KEY = plotting.scheme_color("sinusoidal")  # keys
_CACHE = plotting.scheme_color("alibi")  # what a cache holds
_MASK = "0.8"
_MAX_CELLS = 16  # a row of cells wider than this no longer reads on a phone


# ---- shared drawing pieces -------------------------------------------------------------


def _target(fig: object) -> Figure | None:
    """Check ``fig``: ``None`` or an empty Figure to draw on."""
    if fig is None:
        return None
    _validate.instance("fig", fig, Figure, "a matplotlib Figure or None")
    if fig.axes or fig.texts or fig.patches or fig.lines:
        raise ValueError(
            "fig must be an empty Figure, got a Figure that holds a drawing"
        )
    return fig


def _figure(width: float, height: float, fig: Figure | None) -> Figure:
    """``fig`` (checked by :func:`_target`) sized ``width`` x ``height`` inches, or a new
    Figure of that size: pyplot is never touched here."""
    if fig is None:
        return Figure(figsize=(width, height))
    fig.set_size_inches(width, height)
    return fig


def _blank(ax: Axes) -> Axes:
    ax.set_axis_off()
    return ax


def _finish(fig: Figure) -> Figure:
    """Raise every text to the phone floor, with a margin: the saved SVG's crop can
    differ from matplotlib's tight box by a fraction of a point."""
    plotting.readable(fig, min_px=plotting.MIN_TEXT_PX + 0.25)
    return fig


def _box(
    ax: Axes,
    x: float,
    y: float,
    text: str,
    *,
    width: float,
    height: float = 0.8,
    color: str = "white",
    gid: str | None = None,
    edge: str = "0.25",
) -> None:
    """A rounded box centred on ``(x, y)`` with ``text`` in it."""
    ax.add_patch(
        FancyBboxPatch(
            (x - width / 2, y - height / 2),
            width,
            height,
            boxstyle="round,pad=0.02,rounding_size=0.12",
            facecolor=color,
            edgecolor=edge,
            linewidth=1.0,
        )
    )
    ax.text(x, y, text, ha="center", va="center", fontsize=_FONT, gid=gid)


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float]) -> None:
    ax.add_patch(
        FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=12, color="0.25", lw=1.1
        )
    )


def _cell(
    ax: Axes,
    x: float,
    y: float,
    text: str,
    *,
    color: str = "white",
    gid: str | None = None,
    size: float = 1.0,
    hatch: str | None = None,
    text_color: str = "black",
) -> None:
    """A square cell with lower-left corner ``(x, y)`` and ``text`` at its centre."""
    ax.add_patch(
        Rectangle(
            (x, y), size, size, facecolor=color, edgecolor="0.3", lw=0.8, hatch=hatch
        )
    )
    ax.text(
        x + size / 2,
        y + size / 2,
        text,
        ha="center",
        va="center",
        fontsize=_FONT,
        gid=gid,
        color=text_color,
    )


def _wrap(angle: float) -> float:
    """``angle`` wrapped to (-pi, pi]."""
    return -math.remainder(-angle, 2.0 * math.pi)


# ---- Chapter 1: the sinusoids as clock hands --------------------------------------------


def sinusoid_clocks(
    position: int = 5, *, dim: int = 8, base: float = 10000.0, fig: Figure | None = None
) -> Figure:
    r"""The sinusoidal encoding of one position as ``dim / 2`` clock hands.

    Pair :math:`i` of the encoding, :math:`(\sin p\,\omega_i, \cos p\,\omega_i)`, is a point
    on the unit circle at the angle :math:`p\,\omega_i`: a hand that turns at speed
    :math:`\omega_i = \text{base}^{-2i/\text{dim}}` as the position grows. Each clock shows
    the hand at ``position`` (read from :func:`companion.positional.sinusoidal_encoding`)
    and dots at the positions before it; the title gives :math:`\omega_i` from
    :func:`companion.positional.sinusoidal_frequencies`. Fast hands tell nearby positions
    apart; slow ones, far ones.

    Args:
        position: the position drawn, 0 to 10,000.
        dim: the encoding's width, even, 2 to 12 (one clock per pair).
        base: the base of the frequencies, > 1.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``hand-i`` (a line from the centre to the hand's tip),
        ``omega-i`` (the title's text).
    """
    fig = _target(fig)
    position = _validate.integer("position", position, minimum=0, maximum=10_000)
    dim = _validate.integer("dim", dim, minimum=2, maximum=12)
    if dim % 2:
        raise ValueError(f"dim must be an even int, got {dim}")
    base = _validate.real("base", base, exclusive_minimum=1.0)
    table = sinusoidal_encoding(position + 1, dim, base=base, dtype=torch.float64)
    omega = sinusoidal_frequencies(dim, base=base).double()
    pairs = dim // 2
    fig = _figure(1.45 * pairs + 0.4, 2.6, fig)
    axes = fig.subplots(1, pairs, squeeze=False)[0]
    for i, ax in enumerate(axes):
        ax.add_patch(Circle((0, 0), 1.0, fill=False, color="0.5", lw=1.0))
        sin, cos = table[:, 2 * i].numpy(), table[:, 2 * i + 1].numpy()
        ax.plot(cos[:-1], sin[:-1], "o", ms=3.5, color="0.55")
        ax.plot(
            [0.0, cos[-1]],
            [0.0, sin[-1]],
            color=_QUERY,
            lw=2.5,
            solid_capstyle="round",
            gid=f"hand-{i}",
        )
        ax.plot([1.0], [0.0], "k|", ms=8)  # where every hand starts, at p = 0
        ax.set_title(
            f"pair {i}\nω = {omega[i].item():.3g}", fontsize=_FONT, gid=f"omega-{i}"
        )
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
        ax.set_aspect("equal")
        _blank(ax)
    fig.suptitle(
        f"position {position}: hand i at angle {position}·ω_i",
        fontsize=_FONT,
        y=0.06,
        va="bottom",
    )
    fig.subplots_adjust(left=0.02, right=0.98, top=0.78, bottom=0.2, wspace=0.1)
    return _finish(fig)


# ---- Chapter 2: RoPE turns a pair by m theta ---------------------------------------------


def _rotated(vector: torch.Tensor, position: int, theta: torch.Tensor) -> np.ndarray:
    cos, sin = rope_cos_sin(torch.tensor([position]), theta, dtype=torch.float64)
    return apply_rope(vector[None], cos, sin)[0].numpy()  # (1, 2) -> (2,)


def rope_rotation(
    m: int = 2,
    n: int = 1,
    *,
    shift: int = 2,
    head_dim: int = 2,
    pair: int = 0,
    base: float = 10000.0,
    query: Sequence[float] = (1.0, 0.0),
    key: Sequence[float] = (0.7, 0.0),
    fig: Figure | None = None,
) -> Figure:
    r"""One RoPE pair of a query at position ``m`` and a key at position ``n``, turned by
    :math:`m\theta` and :math:`n\theta`, and the same two shifted by ``shift`` positions.

    :math:`\theta` is pair ``pair``'s frequency from
    :func:`companion.rope.rope_frequencies` and the rotations are
    :func:`companion.rope.apply_rope` on the two numbers of the pair. The arc between the
    rotated query and key is labelled with the angle measured between them: the angle
    they start at plus :math:`(m-n)\theta`, the same in both panels, which is why the
    score depends on :math:`m - n` only.

    Args:
        m: the query's position, 0 to 1,000.
        n: the key's position, 0 to 1,000.
        shift: positions added to both in the right panel, 0 to 1,000.
        head_dim: the head width whose frequencies are used, even, >= 2.
        pair: the pair drawn, ``0 <= pair < head_dim / 2``.
        base: RoPE's base, > 1.
        query: the query's pair at position 0, two real numbers, not both zero.
        key: the key's pair at position 0, two real numbers, not both zero.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure with two panels. Artists: ``query-k`` and ``key-k`` (lines from the
        centre to the rotated pair, panel ``k``), ``angle-k`` (the arc's label).
    """
    fig = _target(fig)
    m = _validate.integer("m", m, minimum=0, maximum=1000)
    n = _validate.integer("n", n, minimum=0, maximum=1000)
    shift = _validate.integer("shift", shift, minimum=0, maximum=1000)
    head_dim = _validate.positive_int("head_dim", head_dim, even=True)
    pair = _validate.integer("pair", pair, minimum=0)
    if pair >= head_dim // 2:
        raise ValueError(f"pair must be < head_dim / 2 = {head_dim // 2}, got {pair}")
    base = _validate.real("base", base, exclusive_minimum=1.0)
    pairs = {}
    for name, value in (("query", query), ("key", key)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise TypeError(
                f"{name} must be a sequence of two real numbers, got {value!r}"
            )
        if len(value) != 2:
            raise ValueError(f"{name} must hold two numbers, got {len(value)}")
        v = [_validate.real(f"{name}[{k}]", x) for k, x in enumerate(value)]
        if v[0] == 0.0 and v[1] == 0.0:
            raise ValueError(f"{name} must not be the zero pair, got {tuple(value)}")
        pairs[name] = torch.tensor(v, dtype=torch.float64)
    theta = rope_frequencies(head_dim, base=base)[pair : pair + 1].double()
    fig = _figure(6.0, 3.4, fig)
    axes = fig.subplots(1, 2)
    for k, (ax, (pm, pn)) in enumerate(
        zip(axes, ((m, n), (m + shift, n + shift)), strict=True)
    ):
        q = _rotated(pairs["query"], pm, theta)
        kk = _rotated(pairs["key"], pn, theta)
        radius = max(np.hypot(*q), np.hypot(*kk))
        ax.add_patch(Circle((0, 0), radius, fill=False, color="0.8", lw=0.8))
        for v, color, label, gid in (
            (pairs["query"].numpy(), _QUERY, None, None),
            (pairs["key"].numpy(), _KEY, None, None),
            (q, _QUERY, f"query at {pm}", f"query-{k}"),
            (kk, _KEY, f"key at {pn}", f"key-{k}"),
        ):
            style = {"lw": 2.5} if gid else {"lw": 1.2, "ls": ":", "alpha": 0.8}
            ax.plot([0, v[0]], [0, v[1]], color=color, gid=gid, **style)
            if label:
                ax.text(
                    1.12 * v[0], 1.12 * v[1], label, color=color, fontsize=_FONT,
                    ha="center", va="center",
                )  # fmt: skip
        a_q, a_k = math.atan2(q[1], q[0]), math.atan2(kk[1], kk[0])
        between = _wrap(a_q - a_k)
        r = 0.35 * radius
        lo, hi = sorted((math.degrees(a_k), math.degrees(a_k + between)))
        ax.add_patch(
            Arc((0, 0), 2 * r, 2 * r, theta1=lo, theta2=hi, color="0.2", lw=1.2)
        )
        mid = a_k + between / 2
        ax.text(
            -0.05 * radius, -1.45 * radius,
            f"angle from key to query:\n{between:+.2f} rad",
            ha="center", va="center", fontsize=_FONT, gid=f"angle-{k}",
        )  # fmt: skip
        ax.plot([1.6 * r * math.cos(mid)], [1.6 * r * math.sin(mid)], alpha=0)
        ax.set_title(f"m = {pm}, n = {pn}, m − n = {pm - pn}", fontsize=_FONT)
        ax.set_xlim(-1.35 * radius, 1.35 * radius)
        ax.set_ylim(-1.8 * radius, 1.35 * radius)
        ax.set_aspect("equal")
        _blank(ax)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.88, bottom=0.02, wspace=0.15)
    return _finish(fig)


# ---- Chapter 3: PI, NTK and YaRN per pair -------------------------------------------------


def frequency_rescaling(
    *,
    head_dim: int = 16,
    base: float = 10000.0,
    factor: float = 4.0,
    original_max_position_embeddings: int = 2048,
    fig: Figure | None = None,
) -> Figure:
    r"""How position interpolation, NTK-aware scaling and YaRN rescale each RoPE pair.

    One row per method, one cell per pair :math:`i`, holding the ratio
    :math:`\theta'_i / \theta_i` of the scaled frequency to the original, from
    :func:`companion.extension.linear_scaling_frequencies`,
    :func:`companion.extension.ntk_scaling_frequencies` and
    :func:`companion.extension.yarn_frequencies`; the top row gives each pair's original
    wavelength :math:`2\pi/\theta_i` in tokens. PI divides every pair by ``factor``; NTK
    leaves the fastest pair and divides the slowest by nearly ``factor``; YaRN leaves the
    pairs that turn many times within ``original_max_position_embeddings`` alone,
    interpolates those that turn less than once and ramps between.

    Args:
        head_dim: the head width, even, 4 to 24 (one cell per pair).
        base: RoPE's base, > 1.
        factor: the context-extension factor, > 1.
        original_max_position_embeddings: the training length, >= 1 (YaRN's ramp).
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``wavelength-i``, ``pi-i``, ``ntk-i``, ``yarn-i`` (the
        cells' texts).
    """
    fig = _target(fig)
    head_dim = _validate.integer("head_dim", head_dim, minimum=4, maximum=24)
    if head_dim % 2:
        raise ValueError(f"head_dim must be an even int, got {head_dim}")
    base = _validate.real("base", base, exclusive_minimum=1.0)
    factor = _validate.real("factor", factor, exclusive_minimum=1.0)
    length = _validate.integer("original_max_position_embeddings", original_max_position_embeddings, minimum=1)  # fmt: skip
    theta = rope_frequencies(head_dim, base=base).double()
    yarn, _ = extension.yarn_frequencies(
        head_dim, base=base, factor=factor, original_max_position_embeddings=length
    )
    rows = {
        "pi": ("PI", extension.linear_scaling_frequencies(head_dim, base=base, factor=factor)),
        "ntk": ("NTK-aware", extension.ntk_scaling_frequencies(head_dim, base=base, factor=factor)),
        "yarn": ("YaRN", yarn),
    }  # fmt: skip
    pairs = head_dim // 2
    fig = _figure(0.62 * pairs + 1.4, 2.9, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    cmap = colormaps["Blues"]
    for i in range(pairs):
        wavelength = 2 * math.pi / theta[i].item()
        _cell(ax, i, 3.2, f"{wavelength:.0f}" if wavelength >= 10 else f"{wavelength:.1f}", gid=f"wavelength-{i}", color="0.95")  # fmt: skip
        ax.text(i + 0.5, 4.4, str(i), ha="center", va="bottom", fontsize=_FONT)
        for r, (key, (_, freqs)) in enumerate(rows.items()):
            ratio = freqs[i].item() / theta[i].item()
            shade = math.log(ratio) / math.log(1 / factor)  # 0: unchanged, 1: / factor
            color = cmap(0.15 + 0.6 * shade)
            _cell(
                ax, i, 2 - r, f"{ratio:.2f}", gid=f"{key}-{i}", color=color,
                text_color="white" if shade > 0.7 else "black",
            )  # fmt: skip
    ax.text(-0.15, 4.4, "pair i", ha="right", va="bottom", fontsize=_FONT)
    ax.text(-0.15, 3.7, "wavelength", ha="right", va="center", fontsize=_FONT)
    for r, (_, (name, _)) in enumerate(rows.items()):
        ax.text(-0.15, 2.5 - r, name, ha="right", va="center", fontsize=_FONT)
    ax.text(
        pairs / 2, -0.3,
        f"θ'_i / θ_i for a factor of {factor:g}: 1 = unchanged, {1 / factor:.2f} = ÷ {factor:g}",
        ha="center", va="top", fontsize=_FONT,
    )  # fmt: skip
    ax.set_xlim(-2.2, pairs + 0.1)
    ax.set_ylim(-1.0, 5.0)
    return _finish(fig)


# ---- Chapter 4: T5's buckets ------------------------------------------------------------


def t5_bucket_map(
    *,
    num_buckets: int = 16,
    max_distance: int = 64,
    bidirectional: bool = False,
    fig: Figure | None = None,
) -> Figure:
    r"""Which distances to a key in the past share a T5 bucket.

    One cell per bucket of the past direction, labelled with the distances
    :math:`i - j` it holds, from :func:`companion.relative.t5_relative_position_bucket`
    on every distance up to ``2 * max_distance``: the first buckets hold one distance
    each (exact), the rest hold ranges that widen logarithmically up to
    ``max_distance``; the last holds every distance beyond.

    Args:
        num_buckets: buckets (of both directions when ``bidirectional``), 4 to 32.
        max_distance: where the last bucket starts, >= the exact buckets.
        bidirectional: the encoder's split of the buckets between past and future.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``bucket-b`` (the text of bucket ``b``'s distances).
    """
    fig = _target(fig)
    num_buckets = _validate.integer("num_buckets", num_buckets, minimum=4, maximum=32)
    bidirectional = _validate.flag("bidirectional", bidirectional)
    per_side = num_buckets // 2 if bidirectional else num_buckets
    exact = per_side // 2
    max_distance = _validate.integer("max_distance", max_distance, minimum=exact + 1)
    distance = torch.arange(0, 2 * max_distance + 1)
    bucket = t5_relative_position_bucket(
        -distance,
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    found = sorted(set(bucket.tolist()))
    fig = _figure(0.34 * len(found) + 0.9, 2.9, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    width, height = 1.0, 2.6
    for x, b in enumerate(found):
        held = distance[bucket == b]
        lo, hi = int(held.min()), int(held.max())
        if hi == int(distance[-1]):
            text = f"≥ {lo}"
        elif lo == hi:
            text = str(lo)
        else:
            text = f"{lo}–{hi}"
        color = _KEY if hi == lo and hi < exact else plotting.scheme_color("pi")
        ax.add_patch(Rectangle((x, 0), width, height, facecolor=color, alpha=0.35, edgecolor="0.3", lw=0.8))  # fmt: skip
        ax.text(x + 0.5, 0.15, text, rotation=90, ha="center", va="bottom", fontsize=_FONT, gid=f"bucket-{b}")  # fmt: skip
        ax.text(x + 0.5, -0.15, str(b), ha="center", va="top", fontsize=_FONT)
    n_exact = sum(1 for b in found if (bucket == b).sum() == 1 and b < found[0] + exact)
    ax.text(
        n_exact / 2, height + 0.15, "exact", ha="center", va="bottom", fontsize=_FONT
    )
    ax.text(
        (n_exact + len(found)) / 2, height + 0.15, f"logarithmic, to {max_distance}",
        ha="center", va="bottom", fontsize=_FONT,
    )  # fmt: skip
    ax.plot([n_exact, n_exact], [-0.1, height + 0.6], color="0.2", lw=1.2, ls="--")
    ax.text(-0.2, -0.15, "bucket", ha="right", va="top", fontsize=_FONT)
    ax.text(-0.2, 1.2, "distance\ni − j", ha="right", va="center", fontsize=_FONT)
    ax.set_xlim(-2.4, len(found) + 0.1)
    ax.set_ylim(-0.8, height + 0.7)
    return _finish(fig)


# ---- Chapter 5: the steps of attention, and the online softmax ------------------------------


def _matrix(ax: Axes, values: np.ndarray, name: str, title: str, *, masked=None, colors="Blues", hidden: str = "−∞") -> None:  # fmt: skip
    rows, cols = values.shape
    cmap = colormaps[colors]
    finite = values[np.isfinite(values)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    for i in range(rows):
        for j in range(cols):
            v = values[i, j]
            if masked is not None and not masked[i, j]:
                _cell(ax, j, rows - 1 - i, hidden, color=_MASK, gid=f"{name}-{i}-{j}")
                continue
            level = 0.0 if hi == lo else (v - lo) / (hi - lo)
            _cell(
                ax, j, rows - 1 - i, f"{v:.2f}", gid=f"{name}-{i}-{j}",
                color=cmap(0.05 + 0.55 * level), text_color="black",
            )  # fmt: skip
    ax.set_title(title, fontsize=_FONT)
    ax.set_xlim(-0.05, cols + 0.05)
    ax.set_ylim(-0.05, rows + 0.05)
    ax.set_aspect("equal")
    _blank(ax)


def attention_pipeline(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    fig: Figure | None = None,
) -> Figure:
    r"""Causal scaled dot-product attention of one short sequence, step by step.

    Four panels: the scores :math:`QK^\top/\sqrt{D}`; the scores with the causal mask
    (:func:`companion.attention.causal_mask`: a query sees itself and the keys before it,
    the rest is :math:`-\infty`); the weights,
    :func:`companion.attention.attention_weights` with ``is_causal=True``, each row
    summing to one; and the output, the weighted sum of the values,
    :func:`companion.attention.scaled_dot_product_attention` with ``is_causal=True``.

    Args:
        query: ``(L, D)``, real, 2 <= L <= 6.
        key: ``(L, D)``, as ``query``.
        value: ``(L, D_v)``, 1 <= D_v <= 6, as ``query``.

    Shape:
        query, key: ``(L, D)``; value: ``(L, D_v)``.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``scores-i-j``, ``masked-i-j``, ``weights-i-j``,
        ``output-i-j`` (the cells' texts).
    """
    fig = _target(fig)
    query = _validate.tensor("query", query, dtype="floating", ndim=2, nonempty=True)
    key = _validate.tensor_like("key", key, "query", query, dtype="floating", ndim=2)
    value = _validate.tensor_like("value", value, "query", query, dtype="floating", ndim=2)  # fmt: skip
    length, width = query.shape
    if not 2 <= length <= 6:
        raise ValueError(f"query must have 2 to 6 rows (L), got {length}")
    _validate.shape("key", key, (length, width), "as query: (L, D)")
    if value.shape[0] != length or not 1 <= value.shape[1] <= 6:
        raise ValueError(f"value must have shape ({length}, D_v) with 1 <= D_v <= 6, got {tuple(value.shape)}")  # fmt: skip
    scores = (query @ key.T) * attention.softmax_scale(query)  # (L, L)
    visible = attention.causal_mask(length, length)  # True: the key is seen
    weights = attention.attention_weights(query, key, is_causal=True)
    output = attention.scaled_dot_product_attention(query, key, value, is_causal=True)
    s = scores.detach().double().numpy()
    fig = _figure(6.2, 6.6, fig)
    axes = fig.subplots(2, 2).ravel()
    _matrix(axes[0], s, "scores", "1. scores q·k / √D")
    _matrix(axes[1], s, "masked", "2. causal mask: keys\nafter the query → −∞", masked=visible.numpy())  # fmt: skip
    _matrix(axes[2], weights.detach().double().numpy(), "weights", "3. softmax of each row:\nrows sum to 1", masked=visible.numpy(), hidden="0")  # fmt: skip
    _matrix(axes[3], output.detach().double().numpy(), "output", "4. output: weights × V", colors="Greens")  # fmt: skip
    for ax in axes[:3]:
        ax.text(-0.15, length - 0.5, "query 0", ha="right", va="center", fontsize=_FONT)
        ax.text(0.5, -0.15, "key 0", ha="center", va="top", fontsize=_FONT)
    fig.subplots_adjust(left=0.14, right=0.98, top=0.9, bottom=0.05, wspace=0.35, hspace=0.45)  # fmt: skip
    return _finish(fig)


def online_softmax(
    scores: torch.Tensor, *, block_size: int = 3, fig: Figure | None = None
) -> Figure:
    r"""The online softmax of one row of scores, streamed in blocks of keys.

    One row per block of ``block_size`` keys: the block's scores; the running maximum
    :math:`m` and running sum :math:`\ell = \sum_j e^{x_j - m}` over every key seen so far,
    with the factor :math:`e^{m_\text{old} - m}` that rescaled the old sum when the block
    raised the maximum; and, on the right, :math:`e^{x_j - m}/\ell` for the block's keys
    with the final :math:`m` and :math:`\ell`: the softmax, which the tests compare with
    :func:`torch.softmax`.

    Args:
        scores: ``(S,)``, real and finite, 2 <= S <= 12.
        block_size: keys per block, 1 <= block_size <= S.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``score-j``, ``max-b``, ``sum-b``, ``rescale-b`` (block
        ``b``), ``softmax-j``.
    """
    fig = _target(fig)
    scores = _validate.tensor("scores", scores, dtype="floating", ndim=1, nonempty=True)
    if not 2 <= scores.numel() <= 12:
        raise ValueError(f"scores must hold 2 to 12 entries, got {scores.numel()}")
    if not torch.isfinite(scores).all():
        raise ValueError("scores must be finite, got a tensor with inf or nan")
    size = scores.numel()
    block_size = _validate.integer("block_size", block_size, minimum=1, maximum=size)
    x = scores.detach().double()
    m, total = -math.inf, 0.0
    stats = []
    for start in range(0, size, block_size):
        block = x[start : start + block_size]
        m_new = max(m, block.max().item())
        factor = math.exp(m - m_new)  # 0 for the first block (m = -inf)
        total = total * factor + torch.exp(block - m_new).sum().item()
        stats.append((start, block.numel(), m_new, total, factor))
        m = m_new
    weights = torch.exp(x - m) / total
    # one row per block, so that the width does not grow with the row's length
    bs, row_h = block_size, 1.5
    blocks = len(stats)
    soft = bs + 3.6  # where the softmax cells start
    fig = _figure(0.45 * (soft + bs) + 0.5, 0.45 * row_h * blocks + 1.1, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    for b, (start, count, m_b, total_b, factor) in enumerate(stats):
        y = -b * row_h
        for k, j in enumerate(range(start, start + count)):
            _cell(ax, k, y, f"{x[j].item():.1f}", gid=f"score-{j}", color="0.95")
            shade = colormaps["Blues"](0.1 + 0.6 * weights[j].item())
            _cell(ax, soft + k, y, f"{weights[j].item():.2f}", gid=f"softmax-{j}", color=shade)  # fmt: skip
        ax.add_patch(Rectangle((-0.06, y - 0.06), count + 0.12, 1.12, fill=False, edgecolor=_QUERY, lw=1.6))  # fmt: skip
        ax.text(bs + 0.25, y + 0.75, f"m = {m_b:.1f}", ha="left", va="center", fontsize=_FONT, gid=f"max-{b}")  # fmt: skip
        ax.text(bs + 0.25, y + 0.25, f"ℓ = {total_b:.2f}", ha="left", va="center", fontsize=_FONT, gid=f"sum-{b}")  # fmt: skip
        if b:
            ax.text(bs + 0.25, y + 1.25, f"×{factor:.2g}", ha="left", va="center", fontsize=_FONT, gid=f"rescale-{b}", color=_QUERY)  # fmt: skip
    top = 1.5
    ax.text(bs / 2, top, f"scores, {bs} per block", ha="center", va="bottom", fontsize=_FONT)  # fmt: skip
    ax.text(bs + 0.25, top, "after it", ha="left", va="bottom", fontsize=_FONT)
    ax.text(soft + bs / 2, top, "softmax", ha="center", va="bottom", fontsize=_FONT)
    ax.text(
        (soft + bs) / 2, -(blocks - 1) * row_h - 0.3,
        "red ×: the old ℓ rescaled by e^(m_old − m)",
        ha="center", va="top", fontsize=_FONT, color=_QUERY,
    )  # fmt: skip
    ax.set_xlim(-0.2, soft + bs + 0.1)
    ax.set_ylim(-(blocks - 1) * row_h - 1.0, top + 0.6)
    return _finish(fig)


# ---- Chapter 6: where the norm sits ------------------------------------------------------


def norm_placement(
    *, norm_name: str = "LayerNorm", fig: Figure | None = None
) -> Figure:
    r"""The wiring of a Post-LN and a Pre-LN block, side by side.

    Post-LN (:class:`companion.norm.PostLNBlock`) computes
    :math:`\mathrm{norm}(x + \mathrm{sublayer}(x))`: the norm sits on the residual path,
    so every path from the input to the output passes through it. Pre-LN
    (:class:`companion.norm.PreLNBlock`) computes
    :math:`x + \mathrm{sublayer}(\mathrm{norm}(x))`: the residual path is the identity,
    and the stack needs one final norm. Each block has two sublayers, attention and the
    MLP, drawn bottom to top in the order the blocks call them.

    Args:
        norm_name: the norm's name on the boxes, ``"LayerNorm"`` or ``"RMSNorm"``.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``post-k`` and ``pre-k``, the boxes' texts from the bottom.
    """
    fig = _target(fig)
    norm_name = _validate.choice("norm_name", norm_name, ("LayerNorm", "RMSNorm"))
    fig = _figure(5.6, 6.4, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    steps = {
        "post": ["attention", "+", norm_name, "MLP", "+", norm_name],
        "pre": [norm_name, "attention", "+", norm_name, "MLP", "+"],
    }
    colours = {norm_name: plotting.scheme_color("layer"), "attention": "#dbe9f6", "MLP": "#fde6c8", "+": "white"}  # fmt: skip
    for col, (kind, names) in enumerate(steps.items()):
        x = 1.4 + 3.2 * col
        y = 0.6
        ax.text(x, y - 0.35, "x (input)", ha="center", va="top", fontsize=_FONT)
        last = y
        branch_start = y
        for k, name in enumerate(names):
            y = 1.2 + 0.95 * k
            _arrow(ax, (x, last + (0.3 if k else 0.0)), (x, y - 0.3))
            w = 0.55 if name == "+" else 1.9
            _box(ax, x, y, "+" if name == "+" else name, width=w, height=0.6, color=colours[name], gid=f"{kind}-{k}")  # fmt: skip
            if name == "+":  # the residual: from where the sublayer's branch began
                side = x - 1.25
                ax.plot([x, side, side, x - w / 2], [branch_start, branch_start, y, y], color="0.25", lw=1.1)  # fmt: skip
                branch_start = y + 0.3
            last = y
        _arrow(ax, (x, last + 0.3), (x, last + 0.75))
        ax.text(x, last + 0.8, "output", ha="center", va="bottom", fontsize=_FONT)
        ax.text(x, last + 1.35, "Post-LN" if kind == "post" else "Pre-LN", ha="center", va="bottom", fontsize=_FONT + 2, weight="bold",
                color=plotting.scheme_color(f"{kind}-LN"))  # fmt: skip
    ax.set_xlim(-0.1, 5.9)
    ax.set_ylim(-0.1, 8.5)
    ax.set_aspect("equal")
    return _finish(fig)


# ---- Chapter 7: the tiny model's stack ------------------------------------------------------


def _describe(module: nn.Module) -> str:
    """One box's text for a block's sublayer."""
    name = type(module).__name__
    if hasattr(module, "num_heads") and hasattr(module, "q_proj"):
        heads = module.num_heads
        dim = module.q_proj.in_features
        what = {"RotarySelfAttention": ", RoPE", "ALiBiSelfAttention": ", ALiBi"}.get(name, "")  # fmt: skip
        return f"causal attention\n{heads} heads of {dim // heads}{what}"
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if linears:
        widths = [linears[0].in_features] + [m.out_features for m in linears]
        return "MLP " + " → ".join(str(w) for w in widths)
    return name


def model_stack(model: nn.Module, *, fig: Figure | None = None) -> Figure:
    r"""The layers of a :class:`companion.model.TinyTransformer`, bottom to top.

    Read from the model itself: the token embedding (vocabulary × width), the position
    scheme (a table added to the embedding, or RoPE/ALiBi inside attention), each block
    with its norm placement, sublayer and norm, the final norm and the output head, and
    the parameter count of :func:`companion.model.parameter_count`.

    Args:
        model: a :class:`companion.model.TinyTransformer`.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``layer-k``, the boxes' texts from the bottom;
        ``parameters``, the count.
    """
    fig = _target(fig)
    from companion.model import TinyTransformer, parameter_count

    _validate.instance("model", model, TinyTransformer, "a companion.model.TinyTransformer")  # fmt: skip
    config = model.config
    vocab, dim = model.embed.num_embeddings, model.embed.embedding_dim
    layers: list[tuple[str, str]] = [(f"tokens (vocabulary {vocab})", "white")]
    table = {"sinusoidal": "+ sinusoidal table", "learned": "+ learned table"}.get(config.position)  # fmt: skip
    layers.append((f"embedding {vocab} × {dim}" + (f"\n{table}" if table else ""), "#eeeeee"))  # fmt: skip
    norm_of = {nn.LayerNorm: "LayerNorm"}
    for block in model.blocks:
        placement = "Pre-LN" if isinstance(block, norm.PreLNBlock) else "Post-LN"
        norm_name = norm_of.get(type(block.norm), type(block.norm).__name__)
        color = "#dbe9f6" if hasattr(block.sublayer, "q_proj") else "#fde6c8"
        layers.append((f"{placement}: {_describe(block.sublayer)}\n+ residual, {norm_name}", color))  # fmt: skip
    final = norm_of.get(type(model.final_norm), type(model.final_norm).__name__)
    layers.append((f"final {final}", plotting.scheme_color("layer")))
    layers.append((f"head {model.head.in_features} × {model.head.out_features} → logits", "#eeeeee"))  # fmt: skip
    height = 1.05
    fig = _figure(4.6, 0.62 * len(layers) * height + 1.0, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    for k, (text, color) in enumerate(layers):
        y = k * height
        _box(ax, 0, y, text, width=4.2, height=0.8, color=color, gid=f"layer-{k}")
        if k:
            _arrow(ax, (0, y - height + 0.4), (0, y - 0.4))
    ax.text(0, -0.75, f"{parameter_count(model):,} parameters, position: {config.position}",
            ha="center", va="top", fontsize=_FONT, gid="parameters")  # fmt: skip
    ax.set_xlim(-2.2, 2.2)
    ax.set_ylim(-1.3, (len(layers) - 1) * height + 0.5)
    return _finish(fig)


# ---- Chapters 8 and 9: the KV cache, its window and its sinks ------------------------------


def kv_cache(
    length: int = 9,
    *,
    prompt: int = 4,
    window: int | None = None,
    sinks: int = 0,
    fig: Figure | None = None,
) -> Figure:
    r"""The key/value cache while a decoder generates, one row per step.

    Row :math:`t` shows tokens :math:`0 \ldots t`: the new token, whose key and value
    are computed at this step (outlined), the tokens whose keys and values the cache
    holds for its query (shaded), and the tokens evicted (crossed). Without ``window``
    every token stays; with one, the tokens kept are
    :func:`companion.modern.sink_cache_keep`: the first ``sinks`` and the last
    ``window``, so the cache stops growing.

    Args:
        length: tokens at the last step, 2 to 16.
        prompt: tokens of the prompt, processed in one step, 1 to ``length``.
        window: the most recent tokens kept (the new one included), or ``None``.
        sinks: first tokens always kept; needs a ``window``.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``kept-t`` (the row's count), ``cell-t-j`` (the text of
        token ``j`` at step ``t``, ``"×"`` when evicted).
    """
    fig = _target(fig)
    length = _validate.integer("length", length, minimum=2, maximum=_MAX_CELLS)
    prompt = _validate.integer("prompt", prompt, minimum=1, maximum=length)
    window = _validate.optional(_validate.integer, "window", window, minimum=1)
    sinks = _validate.integer("sinks", sinks, minimum=0)
    if sinks and window is None:
        raise ValueError(f"sinks needs a window, got sinks={sinks} and window=None")
    steps = list(range(prompt - 1, length))  # the last token of each step
    fig = _figure(0.42 * length + 2.2, 0.45 * len(steps) + 1.3, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    for r, t in enumerate(steps):
        y = len(steps) - 1 - r
        if window is None:
            keep = set(range(t + 1))
        else:
            keep = set(
                modern.sink_cache_keep(t + 1, sinks=sinks, window=window).tolist()
            )
        for j in range(t + 1):
            new = j == t or (r == 0 and j < prompt)
            if j in keep:
                sink = j < sinks
                color = plotting.scheme_color("rope") if sink else _CACHE
                _cell(ax, j, y, str(j), color=color, gid=f"cell-{t}-{j}", size=0.9)
                ax.patches[-1].set_alpha(0.55)
            else:
                _cell(ax, j, y, "×", color="white", gid=f"cell-{t}-{j}", size=0.9, text_color="0.5")  # fmt: skip
            if new:
                ax.add_patch(Rectangle((j, y), 0.9, 0.9, fill=False, edgecolor="black", lw=2.0))  # fmt: skip
        ax.text(length + 0.2, y + 0.45, f"{len(keep)} cached", ha="left", va="center", fontsize=_FONT, gid=f"kept-{t}")  # fmt: skip
        ax.text(-0.2, y + 0.45, "prompt" if r == 0 else f"step {r}", ha="right", va="center", fontsize=_FONT)  # fmt: skip
    if window is None:
        what = "full cache: every token's key and value stay"
    elif sinks:
        what = f"{sinks} sinks + the last {window} tokens"
    else:
        what = f"rolling window: the last {window} tokens"
    ax.text(
        length / 2, len(steps) + 0.15, what, ha="center", va="bottom", fontsize=_FONT
    )
    ax.text(length / 2, -0.25, "token (outlined: computed at this step)", ha="center", va="top", fontsize=_FONT)  # fmt: skip
    ax.set_xlim(-1.6, length + 2.0)
    ax.set_ylim(-0.9, len(steps) + 0.7)
    return _finish(fig)


def sink_column(
    length: int = 6, *, sink_score: float = 3.0, fig: Figure | None = None
) -> Figure:
    r"""A sink column: causal attention weights where every query gives key 0 a large
    share.

    Every score is zero except each query's score with key 0, ``sink_score``; the weights
    are :func:`companion.attention.attention_weights` with ``is_causal=True``. Query
    :math:`i` then gives the first token :math:`e^{s}/(e^{s} + i)` of its weight,
    whatever the content: the column a trained model's sink makes.

    Args:
        length: tokens, 2 to 8.
        sink_score: the score of key 0 for every query, a finite real number.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``weights-i-j`` (the cells' texts).
    """
    fig = _target(fig)
    length = _validate.integer("length", length, minimum=2, maximum=8)
    sink_score = _validate.real("sink_score", sink_score)
    query = torch.ones(length, 1, dtype=torch.float64)
    key = torch.zeros(length, 1, dtype=torch.float64)
    key[0, 0] = sink_score  # q . k_0 / sqrt(1) = sink_score, every other score 0
    weights = attention.attention_weights(query, key, is_causal=True)
    visible = attention.causal_mask(length, length).numpy()
    fig = _figure(0.6 * length + 1.6, 0.6 * length + 1.3, fig)
    ax = fig.add_axes((0.2, 0.05, 0.78, 0.78))
    w = weights.numpy().copy()
    _matrix(ax, w, "weights", "", masked=visible, hidden="")
    ax.add_patch(Rectangle((0, 0), 1, length, fill=False, edgecolor=_QUERY, lw=2.5))
    ax.set_title("key 0 takes most of every row: a sink", fontsize=_FONT)
    ax.text(0.5, -0.15, "key 0", ha="center", va="top", fontsize=_FONT)
    ax.text(-0.15, length - 0.5, "query 0", ha="right", va="center", fontsize=_FONT)
    ax.text(-0.15, 0.5, f"query {length - 1}", ha="right", va="center", fontsize=_FONT)
    return _finish(fig)


# ---- Chapter 9: multi-head latent attention ---------------------------------------------------


def mla_paths(config: object, *, fig: Figure | None = None) -> Figure:
    r"""Multi-head latent attention's two paths from a token to its keys and values.

    The content path compresses the token's input (width ``hidden_size``) to a latent
    :math:`c_t` of width :math:`r` (``kv_lora_rank``), cached, from which every head's
    key part :math:`k^C` (``qk_nope_head_dim``) and value (``v_head_dim``) are read back.
    The decoupled path makes one key :math:`k^R` of width :math:`d_R`
    (``qk_rope_head_dim``), rotated by RoPE, shared by all heads and cached beside the
    latent. The foot gives the cache per token and layer, :math:`r + d_R` numbers, and
    :func:`companion.mla.cache_bytes_per_token` over all layers.

    Args:
        config: a DeepSeek-V3-style configuration with ``hidden_size``,
            ``num_attention_heads``, ``kv_lora_rank``, ``qk_rope_head_dim``,
            ``qk_nope_head_dim``, ``v_head_dim`` and ``num_hidden_layers``.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``input``, ``latent``, ``content-key``, ``value``,
        ``rope-key``, ``score``, ``cache`` (texts).
    """
    fig = _target(fig)
    fields = ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "num_hidden_layers")  # fmt: skip
    missing = [f for f in fields if not isinstance(getattr(config, f, None), int)]
    if missing:
        raise TypeError(f"config must be a DeepSeek-V3-style config with int fields {', '.join(missing)}, got {_validate.describe(config)}")  # fmt: skip
    c = {f: getattr(config, f) for f in fields}
    per_token = mla.cache_bytes_per_token(config, "mla")
    fig = _figure(6.4, 4.4, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    heads = c["num_attention_heads"]
    _box(ax, 0.0, 0.0, f"input x_t\nwidth {c['hidden_size']}", width=1.7, height=0.9, gid="input")  # fmt: skip
    _box(ax, 3.1, 1.4, f"latent c_t\nr = {c['kv_lora_rank']}", width=2.5, height=0.9, color=_CACHE, gid="latent")  # fmt: skip
    _box(ax, 3.1, -1.4, f"RoPE key k^R_t\nd_R = {c['qk_rope_head_dim']}", width=2.5, height=0.9, color=plotting.scheme_color("rope"), gid="rope-key")  # fmt: skip
    ax.patches[-1].set_alpha(0.6)
    ax.patches[-3].set_alpha(0.6)
    _box(ax, 6.9, 2.2, f"keys k^C: {heads}\nheads of {c['qk_nope_head_dim']}", width=2.5, height=0.9, gid="content-key")  # fmt: skip
    _box(ax, 6.9, 0.8, f"values: {heads}\nheads of {c['v_head_dim']}", width=2.5, height=0.9, gid="value")  # fmt: skip
    _box(ax, 6.9, -1.4, "shared by\nall heads", width=2.5, height=0.9, color="0.95")
    _arrow(ax, (0.85, 0.3), (1.8, 1.3))
    _arrow(ax, (0.85, -0.3), (1.8, -1.3))
    _arrow(ax, (4.4, 1.6), (5.6, 2.15))
    _arrow(ax, (4.4, 1.2), (5.6, 0.85))
    _arrow(ax, (4.4, -1.4), (5.6, -1.4))
    ax.text(1.1, 1.15, "W_DKV", ha="center", va="bottom", fontsize=_FONT, rotation=40)
    ax.text(1.1, -1.15, "W_KR", ha="center", va="top", fontsize=_FONT, rotation=-40)
    ax.text(5.0, 2.3, "W_UK", ha="center", va="bottom", fontsize=_FONT)
    ax.text(5.0, 0.75, "W_UV", ha="center", va="top", fontsize=_FONT)
    ax.add_patch(Rectangle((1.7, -2.1), 2.8, 4.2, fill=False, edgecolor=_CACHE, lw=1.8, ls="--"))  # fmt: skip
    ax.text(3.1, 2.2, "cached", ha="center", va="bottom", fontsize=_FONT, color="0.2")
    ax.text(
        3.7, -2.5, "score = q^C·k^C + q^R·k^R: only k^R carries the position",
        ha="center", va="top", fontsize=_FONT, gid="score",
    )  # fmt: skip
    ax.text(
        3.7, -3.2,
        f"cache per token and layer: {c['kv_lora_rank']} + {c['qk_rope_head_dim']} = "
        f"{c['kv_lora_rank'] + c['qk_rope_head_dim']} numbers;\n"
        f"{per_token:,} bytes per token over {c['num_hidden_layers']} layers (bfloat16)",
        ha="center", va="top", fontsize=_FONT, gid="cache",
    )  # fmt: skip
    ax.set_xlim(-1.0, 8.3)
    ax.set_ylim(-4.3, 2.9)
    return _finish(fig)


# ---- Chapter 10: FlashAttention's tiles -------------------------------------------------------


def attention_tiles(
    query_length: int = 8,
    key_length: int = 8,
    *,
    block_size: int = 2,
    is_causal: bool = True,
    fig: Figure | None = None,
) -> Figure:
    r"""The score matrix as FlashAttention walks it: tiles of ``block_size`` queries by
    ``block_size`` keys.

    Each tile is computed in on-chip memory, folded into its query block's running
    maximum and sum (the online softmax), and dropped; the :math:`L \times S` matrix is
    never written out. With a causal mask (:func:`companion.attention.causal_mask`) a
    tile above the diagonal is all masked and skipped, a tile on it is computed with the
    mask applied, and a tile below it is computed in full.

    Args:
        query_length: L, 1 to 16.
        key_length: S, 1 to 16.
        block_size: queries and keys per tile, 1 to 8.
        is_causal: mask keys after each query (``top_left`` alignment).
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``tile-a-b`` (the text of query block ``a``, key block
        ``b``: ``"full"``, ``"masked"`` or ``"skip"``), ``counts``.
    """
    fig = _target(fig)
    query_length = _validate.integer("query_length", query_length, minimum=1, maximum=_MAX_CELLS)  # fmt: skip
    key_length = _validate.integer("key_length", key_length, minimum=1, maximum=_MAX_CELLS)  # fmt: skip
    block_size = _validate.integer("block_size", block_size, minimum=1, maximum=8)
    is_causal = _validate.flag("is_causal", is_causal)
    visible = (
        attention.causal_mask(query_length, key_length)
        if is_causal
        else torch.ones(query_length, key_length, dtype=torch.bool)
    )
    rows = math.ceil(query_length / block_size)
    cols = math.ceil(key_length / block_size)
    fig = _figure(0.55 * key_length + 2.0, 0.55 * query_length + 1.6, fig)
    ax = _blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    counts = {"full": 0, "masked": 0, "skip": 0}
    colours = {"full": _KEY, "masked": plotting.scheme_color("pi"), "skip": "white"}
    for a in range(rows):
        for b in range(cols):
            tile = visible[a * block_size : (a + 1) * block_size, b * block_size : (b + 1) * block_size]  # fmt: skip
            kind = "full" if tile.all() else ("skip" if not tile.any() else "masked")
            counts[kind] += 1
            h, w = tile.shape
            y = query_length - a * block_size - h
            ax.add_patch(Rectangle((b * block_size, y), w, h, facecolor=colours[kind], alpha=0.45, edgecolor="0.2", lw=1.2))  # fmt: skip
            for i in range(h):  # the masked entries of a tile, hatched
                for j in range(w):
                    if not tile[i, j]:
                        ax.add_patch(Rectangle((b * block_size + j, y + h - 1 - i), 1, 1, fill=False, hatch="//", edgecolor="0.6", lw=0))  # fmt: skip
            ax.text(b * block_size + w / 2, y + h / 2, kind, ha="center", va="center", fontsize=_FONT, gid=f"tile-{a}-{b}")  # fmt: skip
    ax.text(key_length / 2, query_length + 0.2, f"keys → (tiles of {block_size} × {block_size})", ha="center", va="bottom", fontsize=_FONT)  # fmt: skip
    ax.text(-0.2, query_length / 2, "queries", ha="right", va="center", fontsize=_FONT, rotation=90)  # fmt: skip
    ax.text(
        key_length / 2, -0.3,
        f"{counts['full']} full, {counts['masked']} masked, {counts['skip']} skipped;\n"
        "each tile lives on the chip only",
        ha="center", va="top", fontsize=_FONT, gid="counts",
    )  # fmt: skip
    ax.set_xlim(-1.0, key_length + 0.2)
    ax.set_ylim(-1.4, query_length + 0.8)
    ax.set_aspect("equal")
    return _finish(fig)
