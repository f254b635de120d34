r"""The drawing core of :mod:`companion.diagrams`: the figure a diagram draws on, boxes,
arrows, cells, a matrix of cells, the font size and the diagrams' role colours.

Private: the diagrams' modules (:mod:`companion.diagrams` and the private
``_position_diagrams``) draw with it; :mod:`companion.diagrams` is where they are
documented and tested.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from companion import _validate, plotting
from companion._colors import ROLE_COLORS

__all__: list[str] = []  # private: nothing here is part of the documented API

#: font size (pt) the diagrams are drawn with; readable() raises it where a phone needs
FONT = 10.0
#: the diagrams' roles have their own colours, none a scheme's (companion._colors)
ROLE = ROLE_COLORS
QUERY = ROLE_COLORS["query"]  # queries
KEY = ROLE_COLORS["key"]  # keys
CACHE = ROLE_COLORS["cached"]  # what a cache holds
MASK = "0.8"
MAX_CELLS = 16  # a row of cells wider than this no longer reads on a phone


# ---- shared drawing pieces -------------------------------------------------------------


def target(fig: object) -> Figure | None:
    """Check ``fig``: ``None`` or an empty Figure to draw on."""
    if fig is None:
        return None
    _validate.instance("fig", fig, Figure, "a matplotlib Figure or None")
    if fig.axes or fig.texts or fig.patches or fig.lines:
        raise ValueError(
            "fig must be an empty Figure, got a Figure that holds a drawing"
        )
    return fig


def figure(width: float, height: float, fig: Figure | None) -> Figure:
    """``fig`` (checked by :func:`target`) sized ``width`` x ``height`` inches, or a new
    Figure of that size: pyplot is never touched here."""
    if fig is None:
        return Figure(figsize=(width, height))
    fig.set_size_inches(width, height)
    return fig


def blank(ax: Axes) -> Axes:
    ax.set_axis_off()
    return ax


def finish(fig: Figure) -> Figure:
    """Raise every text to the phone floor, with a margin: the saved SVG's crop can
    differ from matplotlib's tight box by a fraction of a point."""
    plotting.readable(fig, min_px=plotting.MIN_TEXT_PX + 0.25)
    return fig


def box(
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
    ax.text(x, y, text, ha="center", va="center", fontsize=FONT, gid=gid)


def arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float]) -> None:
    ax.add_patch(
        FancyArrowPatch(
            start, end, arrowstyle="-|>", mutation_scale=12, color="0.25", lw=1.1
        )
    )


def cell(
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
        fontsize=FONT,
        gid=gid,
        color=text_color,
    )


def wrap(angle: float) -> float:
    """``angle`` wrapped to (-pi, pi]."""
    return -math.remainder(-angle, 2.0 * math.pi)


def matrix(ax: Axes, values: np.ndarray, name: str, title: str, *, masked=None, colors="Blues", hidden: str = "−∞", digits: int = 2) -> None:  # fmt: skip
    rows, cols = values.shape
    cmap = colormaps[colors]
    finite = values[np.isfinite(values)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    for i in range(rows):
        for j in range(cols):
            v = values[i, j]
            if masked is not None and not masked[i, j]:
                cell(ax, j, rows - 1 - i, hidden, color=MASK, gid=f"{name}-{i}-{j}")
                continue
            level = 0.0 if hi == lo else (v - lo) / (hi - lo)
            cell(
                ax, j, rows - 1 - i, f"{v:.{digits}f}", gid=f"{name}-{i}-{j}",
                color=cmap(0.05 + 0.55 * level), text_color="black",
            )  # fmt: skip
    ax.set_title(title, fontsize=FONT)
    ax.set_xlim(-0.05, cols + 0.05)
    ax.set_ylim(-0.05, rows + 0.05)
    ax.set_aspect("equal")
    blank(ax)
