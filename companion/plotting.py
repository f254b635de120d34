r"""Plot helpers for the chapters.

Each helper takes a matplotlib :class:`~matplotlib.axes.Axes`, draws on it, labels it and
returns it. None of them changes global settings (no ``plt.style.use``, no ``rcParams``), so a
learner's own plots are left alone. Tensors are moved to the CPU and converted to NumPy here,
at the plotting boundary.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.axes import Axes

def to_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A float64 NumPy copy of ``x`` (detached, on the CPU), for plotting."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    if isinstance(x, np.ndarray):
        return x.astype(np.float64, copy=True)
    raise TypeError(f"x must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def heatmap(
    ax: Axes,
    matrix: torch.Tensor | np.ndarray,
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    cmap: str = "RdBu_r",
    symmetric: bool = True,
    colorbar: bool = True,
    xticklabels: list[str] | None = None,
    yticklabels: list[str] | None = None,
) -> Axes:
    """Draw a 2-D matrix as an image, rows top to bottom.

    Args:
        ax: the axes to draw on.
        matrix: a 2-D tensor or array.
        title: axes title.
        xlabel: x-axis label (columns).
        ylabel: y-axis label (rows).
        cmap: a matplotlib colormap name.
        symmetric: centre the colour scale on zero (for signed data).
        colorbar: add a colour bar next to the axes.
        xticklabels: names for the columns (e.g. tokens).
        yticklabels: names for the rows.

    Returns:
        ``ax``.
    """
    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    m = to_numpy(matrix)
    if m.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {m.shape}")
    if symmetric:
        vmax = float(np.abs(m).max()) or 1.0
        vmin = -vmax
    else:
        vmin, vmax = float(m.min()), float(m.max())
    image = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    if xticklabels is not None:
        ax.set_xticks(range(len(xticklabels)), labels=xticklabels)
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)), labels=yticklabels)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return ax
