r"""The diagrams of the position chapters (1-4): the sinusoids as clock hands, a RoPE pair
turned by :math:`m\theta`, PI/NTK/YaRN per pair, T5's buckets.

Private: :mod:`companion.diagrams` re-exports them and is where they are documented and
tested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Arc, Circle, Rectangle

from companion import _drawing as draw
from companion import _validate, extension, plotting
from companion.positional import sinusoidal_encoding, sinusoidal_frequencies
from companion.relative import t5_relative_position_bucket
from companion.rope import apply_rope, rope_cos_sin, rope_frequencies

__all__ = ["frequency_rescaling", "rope_rotation", "sinusoid_clocks", "t5_bucket_map"]

# ---- The sinusoidal encoding: the sinusoids as clock hands ---------------------------


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
    fig = draw.target(fig)
    position = _validate.integer("position", position, minimum=0, maximum=10_000)
    dim = _validate.integer("dim", dim, minimum=2, maximum=12)
    if dim % 2:
        raise ValueError(f"dim must be an even int, got {dim}")
    base = _validate.real("base", base, exclusive_minimum=1.0)
    table = sinusoidal_encoding(position + 1, dim, base=base, dtype=torch.float64)
    omega = sinusoidal_frequencies(dim, base=base).double()
    pairs = dim // 2
    fig = draw.figure(1.45 * pairs + 0.4, 2.6, fig)
    axes = fig.subplots(1, pairs, squeeze=False)[0]
    for i, ax in enumerate(axes):
        ax.add_patch(Circle((0, 0), 1.0, fill=False, color="0.5", lw=1.0))
        sin, cos = table[:, 2 * i].numpy(), table[:, 2 * i + 1].numpy()
        ax.plot(cos[:-1], sin[:-1], "o", ms=3.5, color="0.55")
        ax.plot(
            [0.0, cos[-1]],
            [0.0, sin[-1]],
            color=plotting.scheme_color("sinusoidal"),  # the scheme's own colour
            lw=2.5,
            solid_capstyle="round",
            gid=f"hand-{i}",
        )
        ax.plot([1.0], [0.0], "k|", ms=8)  # where every hand starts, at p = 0
        ax.set_title(
            f"pair {i}\nω = {omega[i].item():.3g}", fontsize=draw.FONT, gid=f"omega-{i}"
        )
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
        ax.set_aspect("equal")
        draw.blank(ax)
    fig.suptitle(
        f"position {position}: each hand at angle {position} × its ω",
        fontsize=draw.FONT,
        y=0.06,
        va="bottom",
    )
    fig.subplots_adjust(left=0.02, right=0.98, top=0.78, bottom=0.2, wspace=0.1)
    return draw.finish(fig)


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
    fig = draw.target(fig)
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
    fig = draw.figure(6.0, 3.4, fig)
    axes = fig.subplots(1, 2)
    for k, (ax, (pm, pn)) in enumerate(
        zip(axes, ((m, n), (m + shift, n + shift)), strict=True)
    ):
        q = _rotated(pairs["query"], pm, theta)
        kk = _rotated(pairs["key"], pn, theta)
        radius = max(np.hypot(*q), np.hypot(*kk))
        ax.add_patch(Circle((0, 0), radius, fill=False, color="0.8", lw=0.8))
        for v, color, label, gid in (
            (pairs["query"].numpy(), draw.QUERY, None, None),
            (pairs["key"].numpy(), draw.KEY, None, None),
            (q, draw.QUERY, f"query at {pm}", f"query-{k}"),
            (kk, draw.KEY, f"key at {pn}", f"key-{k}"),
        ):
            style = {"lw": 2.5} if gid else {"lw": 1.2, "ls": ":", "alpha": 0.8}
            ax.plot([0, v[0]], [0, v[1]], color=color, gid=gid, **style)
            if label:  # outside the circle, along the vector: never over a line
                u = v / np.hypot(*v)
                ax.text(
                    1.12 * radius * u[0], 1.12 * radius * u[1], label, color=color,
                    fontsize=draw.FONT, ha="left" if u[0] > 0.3 else ("right" if u[0] < -0.3 else "center"),
                    va="bottom" if u[1] > 0.3 else ("top" if u[1] < -0.3 else "center"),
                    gid=f"{gid}-label",
                )  # fmt: skip
        a_q, a_k = math.atan2(q[1], q[0]), math.atan2(kk[1], kk[0])
        between = draw.wrap(a_q - a_k)
        r = 0.35 * radius
        lo, hi = sorted((math.degrees(a_k), math.degrees(a_k + between)))
        ax.add_patch(
            Arc((0, 0), 2 * r, 2 * r, theta1=lo, theta2=hi, color="0.2", lw=1.2)
        )
        mid = a_k + between / 2
        ax.text(
            -0.05 * radius, -1.45 * radius,
            f"angle from key to query:\n{between:+.2f} rad",
            ha="center", va="center", fontsize=draw.FONT, gid=f"angle-{k}",
        )  # fmt: skip
        ax.plot([1.6 * r * math.cos(mid)], [1.6 * r * math.sin(mid)], alpha=0)
        ax.set_title(f"m = {pm}, n = {pn}, m − n = {pm - pn}", fontsize=draw.FONT)
        ax.set_xlim(-1.35 * radius, 1.35 * radius)
        ax.set_ylim(-1.8 * radius, 1.35 * radius)
        ax.set_aspect("equal")
        draw.blank(ax)
    fig.subplots_adjust(left=0.02, right=0.98, top=0.88, bottom=0.02, wspace=0.15)
    return draw.finish(fig)


# ---- Chapter 3: PI, NTK and YaRN per pair -------------------------------------------------


def frequency_rescaling(
    *,
    head_dim: int = 16,
    base: float = 10000.0,
    factor: float = 4.0,
    original_max_position_embeddings: int = 2048,
    every: int = 1,
    fig: Figure | None = None,
) -> Figure:
    r"""How position interpolation, NTK-aware scaling and YaRN rescale each RoPE pair.

    One row per method, one cell per pair :math:`i` drawn (every ``every``-th pair of the
    head: the ratios are those of the ``head_dim``-wide head itself), holding the ratio
    :math:`\theta'_i / \theta_i` of the scaled frequency to the original, from
    :func:`companion.extension.linear_scaling_frequencies`,
    :func:`companion.extension.ntk_scaling_frequencies` and
    :func:`companion.extension.yarn_frequencies`; the top row gives each pair's original
    wavelength :math:`2\pi/\theta_i` in tokens. PI divides every pair by ``factor``; NTK
    leaves the fastest pair and divides the slowest by nearly ``factor``; YaRN leaves the
    pairs that turn many times within ``original_max_position_embeddings`` alone,
    interpolates those that turn less than once and ramps between.

    Args:
        head_dim: the head width, even, 4 to 512.
        every: draw pairs 0, ``every``, 2 ``every``, ...: 1 to 64, at most 12 pairs drawn.
        base: RoPE's base, > 1.
        factor: the context-extension factor, > 1.
        original_max_position_embeddings: the training length, >= 1 (YaRN's ramp).
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``wavelength-i``, ``pi-i``, ``ntk-i``, ``yarn-i`` (the
        cells' texts).
    """
    fig = draw.target(fig)
    head_dim = _validate.integer("head_dim", head_dim, minimum=4, maximum=512)
    every = _validate.integer("every", every, minimum=1, maximum=64)
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
    drawn = list(range(0, head_dim // 2, every))
    if len(drawn) > 12:
        raise ValueError(f"head_dim / 2 / every must be at most 12 pairs drawn, got {len(drawn)} (head_dim={head_dim}, every={every})")  # fmt: skip
    pairs = len(drawn)
    fig = draw.figure(0.62 * pairs + 1.4, 3.1, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    cmap = colormaps["Blues"]
    for x, i in enumerate(drawn):
        wavelength = 2 * math.pi / theta[i].item()
        draw.cell(ax, x, 3.2, f"{wavelength:.0f}" if wavelength >= 10 else f"{wavelength:.1f}", gid=f"wavelength-{i}", color="0.95")  # fmt: skip
        ax.text(x + 0.5, 4.4, str(i), ha="center", va="bottom", fontsize=draw.FONT)
        for r, (key, (_, freqs)) in enumerate(rows.items()):
            ratio = freqs[i].item() / theta[i].item()
            shade = math.log(ratio) / math.log(1 / factor)  # 0: unchanged, 1: / factor
            color = cmap(0.15 + 0.6 * shade)
            draw.cell(
                ax, x, 2 - r, f"{ratio:.2f}", gid=f"{key}-{i}", color=color,
                text_color="white" if shade > 0.7 else "black",
            )  # fmt: skip
    ax.text(-0.15, 4.4, "pair i", ha="right", va="bottom", fontsize=draw.FONT)
    ax.text(-0.15, 3.7, "wavelength", ha="right", va="center", fontsize=draw.FONT)
    for r, (_, (name, _)) in enumerate(rows.items()):
        ax.text(-0.15, 2.5 - r, name, ha="right", va="center", fontsize=draw.FONT)
    ax.text(
        pairs / 2, -0.3,
        f"new θ / old θ, head of {head_dim}, factor {factor:g}:\n1 = unchanged, {1 / factor:.2f} = ÷ {factor:g}",
        ha="center", va="top", fontsize=draw.FONT,
    )  # fmt: skip
    ax.set_xlim(-2.2, pairs + 0.1)
    ax.set_ylim(-1.4, 5.0)
    return draw.finish(fig)


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
    each (exact), the rest hold ranges that widen logarithmically; the last holds every
    distance from its start on, which comes before ``max_distance`` (50 for 16 buckets
    and 64, 113 for T5's decoder, 32 and 128) and is printed over the cells.

    Args:
        num_buckets: buckets (of both directions when ``bidirectional``), 4 to 32.
        max_distance: where T5's logarithmic scale reaches the last bucket, > the
            exact buckets (the last bucket starts before it).
        bidirectional: the encoder's split of the buckets between past and future.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``bucket-b`` (the text of bucket ``b``'s distances).
    """
    fig = draw.target(fig)
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
    fig = draw.figure(0.34 * len(found) + 0.9, 2.9, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
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
        color = draw.ROLE["exact"] if hi == lo and hi < exact else draw.ROLE["range"]
        ax.add_patch(Rectangle((x, 0), width, height, facecolor=color, alpha=0.35, edgecolor="0.3", lw=0.8))  # fmt: skip
        ax.text(x + 0.5, 0.15, text, rotation=90, ha="center", va="bottom", fontsize=draw.FONT, gid=f"bucket-{b}")  # fmt: skip
        ax.text(x + 0.5, -0.15, str(b), ha="center", va="top", fontsize=draw.FONT)
    last_start = int(distance[bucket == found[-1]].min())
    n_exact = sum(1 for b in found if (bucket == b).sum() == 1 and b < found[0] + exact)
    ax.text(
        n_exact / 2,
        height + 0.15,
        "exact",
        ha="center",
        va="bottom",
        fontsize=draw.FONT,
    )
    ax.text(
        (n_exact + len(found)) / 2, height + 0.15, f"logarithmic; the last from {last_start}",
        ha="center", va="bottom", fontsize=draw.FONT,
    )  # fmt: skip
    ax.plot([n_exact, n_exact], [-0.1, height + 0.6], color="0.2", lw=1.2, ls="--")
    ax.text(-0.2, -0.15, "bucket", ha="right", va="top", fontsize=draw.FONT)
    ax.text(-0.2, 1.2, "distance\ni − j", ha="right", va="center", fontsize=draw.FONT)
    ax.set_xlim(-2.4, len(found) + 0.1)
    ax.set_ylim(-0.8, height + 0.7)
    return draw.finish(fig)
