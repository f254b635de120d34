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


def _check_ax(ax: object) -> None:
    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes, got {type(ax).__name__}")


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
    _check_ax(ax)
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


# ---- Sinusoidal positional encoding (book/01_sinusoidal_encoding) ----


def encoding_columns(
    ax: Axes,
    encoding: torch.Tensor | np.ndarray,
    columns: list[int] | tuple[int, ...],
    *,
    title: str = "",
) -> Axes:
    """Plot selected columns of a position table ``(L, D)`` as curves over the position.

    Args:
        ax: the axes to draw on.
        encoding: a 2-D table, rows are positions.
        columns: the column indices to draw, one curve each (labelled ``dim j``).
        title: axes title.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    table = to_numpy(encoding)
    if table.ndim != 2:
        raise ValueError(f"encoding must be 2-D (L, D), got shape {table.shape}")
    for j in columns:
        if not 0 <= j < table.shape[1]:
            raise ValueError(f"columns must lie in [0, {table.shape[1]}), got {j}")
        ax.plot(np.arange(table.shape[0]), table[:, j], label=f"dim {j}")
    ax.set(title=title, xlabel="position", ylabel="value")
    ax.legend(loc="upper right", fontsize="small")
    return ax


def curves(
    ax: Axes,
    x: torch.Tensor | np.ndarray,
    series: dict[str, torch.Tensor | np.ndarray],
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    logy: bool = False,
    marker: str = "",
) -> Axes:
    """Plot one or more labelled curves ``y(x)`` on shared axes.

    Args:
        ax: the axes to draw on.
        x: the abscissae, 1-D.
        series: label -> ordinates, each 1-D with the length of ``x``.
        title: axes title.
        xlabel: x-axis label.
        ylabel: y-axis label.
        logy: use a logarithmic y axis.
        marker: a matplotlib marker for every curve (e.g. ``"."``).

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    xs = to_numpy(x)
    for label, y in series.items():
        ys = to_numpy(y)
        if ys.shape != xs.shape:
            raise ValueError(f"series {label!r} has shape {ys.shape}, x has shape {xs.shape}")
        ax.plot(xs, ys, marker=marker, label=label)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if len(series) > 1:
        ax.legend(fontsize="small")
    return ax


# ---- Normalization (book/05_normalization) ----


def padded_batch_diagram(
    ax: Axes,
    sentences: list[list[str]],
    *,
    dim: int = 4,
    mode: str = "batch",
    feature: int = 0,
    token: tuple[int, int] = (0, 0),
    pad: str = "PAD",
) -> Axes:
    """Draw a padded batch of sentences and the entries one normalization statistic pools.

    Each sentence is a block of ``dim`` feature rows by ``L`` position columns (``L`` the
    longest sentence); padding cells are hatched grey. ``mode="batch"`` shades feature row
    ``feature`` in every sentence and at every position, padding included: the entries that
    BatchNorm averages over for that feature (``(B, D, L)`` layout, as
    :class:`torch.nn.BatchNorm1d`). ``mode="layer"`` shades the column of one token
    ``token = (sentence, position)``: the entries LayerNorm averages over.

    Args:
        ax: the axes to draw on.
        sentences: the tokens of each sentence.
        dim: number of feature rows to draw.
        mode: ``"batch"`` or ``"layer"``.
        feature: the feature row shaded in ``"batch"`` mode.
        token: the ``(sentence, position)`` column shaded in ``"layer"`` mode.
        pad: the label of padding positions.

    Returns:
        ``ax``.
    """
    from matplotlib.patches import Rectangle

    _check_ax(ax)
    if mode not in ("batch", "layer"):
        raise ValueError(f"mode must be 'batch' or 'layer', got {mode!r}")
    if not sentences or any(len(s) == 0 for s in sentences):
        raise ValueError("sentences must be a non-empty list of non-empty token lists")
    if not 0 <= feature < dim:
        raise ValueError(f"feature must be in [0, {dim}), got {feature}")
    length = max(len(s) for s in sentences)
    b_tok, l_tok = token
    if not (0 <= b_tok < len(sentences) and 0 <= l_tok < len(sentences[b_tok])):
        raise ValueError(f"token must index a real token, got {token}")
    shade = "tab:orange" if mode == "batch" else "tab:blue"
    gap = 1.6  # vertical space between sentences, room for the token labels
    cw = 2.0  # cell width: room for a token label
    for b, sent in enumerate(sentences):
        top = -b * (dim + gap)
        for pos in range(length):
            real = pos < len(sent)
            label = sent[pos] if real else pad
            ax.text(cw * (pos + 0.5), top + 0.3, label, ha="center", va="bottom", fontsize=9)
            for j in range(dim):
                chosen = (mode == "batch" and j == feature) or (
                    mode == "layer" and (b, pos) == (b_tok, l_tok)
                )
                face = shade if chosen else ("white" if real else "0.85")
                ax.add_patch(
                    Rectangle(
                        (cw * pos, top - j - 1),
                        cw,
                        1,
                        facecolor=face,
                        edgecolor="0.3",
                        hatch="//" if not real else None,
                        alpha=0.85 if chosen else 1.0,
                    )
                )
        ax.text(-0.15, top - dim / 2, f"sentence {b + 1}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-4.5, cw * length + 0.1)
    ax.set_ylim(-(len(sentences) - 1) * (dim + gap) - dim - 0.3, 1.2)
    ax.set_aspect("equal")
    ax.set_xticks([cw * (i + 0.5) for i in range(length)], labels=[str(i) for i in range(length)])
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    what = (
        f"BatchNorm: one mean/var per feature\n(feature {feature}: every sentence, every position)"
        if mode == "batch"
        else f"LayerNorm: one mean/var per token\n(sentence {b_tok + 1}, position {l_tok}: its features)"
    )
    ax.set(title=what, xlabel="position (each block: feature rows x position columns)")
    return ax


def layer_profile(
    ax: Axes,
    series: dict[str, list[float] | torch.Tensor | np.ndarray],
    *,
    xlabel: str = "layer",
    ylabel: str = "",
    title: str = "",
    logy: bool = True,
) -> Axes:
    """Plot one quantity per layer (activation scale, gradient norm) for several models.

    Args:
        ax: the axes to draw on.
        series: a name -> values-per-layer mapping; each becomes a line with markers.
        xlabel: x-axis label.
        ylabel: y-axis label.
        title: axes title.
        logy: logarithmic y axis.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    if not series:
        raise ValueError("series must name at least one line")
    for name, values in series.items():
        v = to_numpy(values) if isinstance(values, torch.Tensor) else np.asarray(values, float)
        ax.plot(np.arange(1, len(v) + 1), v, marker="o", markersize=3, label=name)
    if logy:
        ax.set_yscale("log")
    ax.legend()
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return ax


# ---- Beyond the training length: ALiBi and RoPE context extension (book/03_context_extension) ----


def wavelength_curves(
    ax: Axes,
    wavelengths: torch.Tensor | np.ndarray,
    series: dict[str, torch.Tensor | np.ndarray],
    *,
    markers: dict[str, float] | None = None,
    title: str = "",
    ylabel: str = "",
    logy: bool = False,
) -> Axes:
    """Plot per-pair quantities of RoPE against the pair's wavelength (log x axis).

    Args:
        ax: the axes to draw on.
        wavelengths: the wavelength of each pair in tokens, 1-D (the x axis, logarithmic).
        series: label -> one value per pair, each with the length of ``wavelengths``.
        markers: label -> a length in tokens, drawn as a dashed vertical line (e.g. the
            training length).
        title: axes title.
        ylabel: y-axis label.
        logy: use a logarithmic y axis.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    xs = to_numpy(wavelengths)
    for label, y in series.items():
        ys = to_numpy(y)
        if ys.shape != xs.shape:
            raise ValueError(f"series {label!r} has shape {ys.shape}, x has shape {xs.shape}")
        ax.plot(xs, ys, marker=".", markersize=4, label=label)
    for k, (label, length) in enumerate((markers or {}).items()):
        ax.axvline(float(length), color=f"C{7 + k % 3}", linestyle="--", linewidth=1, label=label)
    ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel="wavelength of the pair (tokens, log scale)", ylabel=ylabel)
    ax.legend(fontsize="small")
    return ax


def masked_heatmap(
    ax: Axes,
    matrix: torch.Tensor | np.ndarray,
    *,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    cmap: str = "viridis",
    colorbar: bool = True,
) -> Axes:
    """Draw a 2-D matrix whose ``-inf``/``nan`` entries (masked positions) show in light grey.

    Args:
        ax: the axes to draw on.
        matrix: a 2-D tensor or array, e.g. an attention bias with a causal mask.
        title: axes title.
        xlabel: x-axis label (columns).
        ylabel: y-axis label (rows).
        cmap: a matplotlib colormap name for the finite entries.
        colorbar: add a colour bar next to the axes.

    Returns:
        ``ax``.
    """
    import matplotlib as mpl

    _check_ax(ax)
    m = to_numpy(matrix)
    if m.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {m.shape}")
    masked = np.ma.masked_invalid(m)
    colours = mpl.colormaps[cmap].with_extremes(bad="0.85")  # a copy: the registry is untouched
    image = ax.imshow(masked, cmap=colours, aspect="auto", interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return ax


# ---- Rotary position embedding (book/02_rope) ----


def error_vs_position(
    ax: Axes,
    positions: torch.Tensor | np.ndarray,
    errors: dict[str, torch.Tensor | np.ndarray],
    *,
    levels: dict[str, float] | None = None,
    title: str = "",
    ylabel: str = "max |error|",
) -> Axes:
    """Plot errors against position on log-log axes, with dashed horizontal reference levels.

    Args:
        ax: the axes to draw on.
        positions: the positions (abscissae), 1-D and positive.
        errors: label -> errors, each 1-D with the length of ``positions``, positive.
        levels: label -> a constant drawn as a dashed line (e.g. a dtype's rounding).
        title: axes title.
        ylabel: y-axis label.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    xs = to_numpy(positions)
    if xs.ndim != 1 or (xs <= 0).any():
        raise ValueError(f"positions must be 1-D and positive, got shape {xs.shape}")
    for label, err in errors.items():
        ys = to_numpy(err)
        if ys.shape != xs.shape:
            raise ValueError(f"errors {label!r} has shape {ys.shape}, positions has {xs.shape}")
        ax.plot(xs, np.maximum(ys, 1e-300), marker=".", label=label)
    for label, value in (levels or {}).items():
        ax.axhline(value, linestyle="--", linewidth=0.8, color="gray")
        ax.annotate(
            label,
            (xs[0], value),
            textcoords="offset points",
            xytext=(2, 3),
            fontsize="small",
            color="gray",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(title=title, xlabel="position m", ylabel=ylabel)
    ax.legend(fontsize="small")
    return ax


# ---- Attention, from alignment scores to FlashAttention's trick (book/04_attention) ----


def loglog_curves(
    ax: Axes,
    x: torch.Tensor | np.ndarray,
    series: dict[str, torch.Tensor | np.ndarray],
    *,
    reference_power: float | None = None,
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
) -> Axes:
    """Plot labelled curves on log-log axes, optionally with a dashed ``x**power`` guide.

    A cost that grows like ``L**2`` is a straight line of slope 2 on these axes; the guide
    (anchored at the first curve's last point) shows that slope.

    Args:
        ax: the axes to draw on.
        x: the abscissae, 1-D and positive.
        series: label -> ordinates, each 1-D, positive, with the length of ``x``.
        reference_power: draw a dashed guide ``∝ x**reference_power``; ``None`` for none.
        title: axes title.
        xlabel: x-axis label.
        ylabel: y-axis label.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    xs = to_numpy(x)
    if not series:
        raise ValueError("series must hold at least one curve")
    for label, y in series.items():
        ys = to_numpy(y)
        if ys.shape != xs.shape:
            raise ValueError(f"series {label!r} has shape {ys.shape}, x has shape {xs.shape}")
        ax.plot(xs, ys, marker="o", label=label)
    if reference_power is not None:
        anchor = to_numpy(next(iter(series.values())))[-1]
        guide = anchor * (xs / xs[-1]) ** reference_power
        ax.plot(xs, guide, linestyle="--", color="0.5", label=f"∝ x^{reference_power:g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.legend(fontsize="small")
    return ax


# ---- A tiny Transformer (book/06_tiny_transformer) ----


def training_curves(
    ax: Axes,
    runs: dict[str, list[list[float]]],
    *,
    smooth: int = 10,
    title: str = "",
) -> Axes:
    """Loss curves, one line per label: the mean over runs, with a min..max band.

    Args:
        ax: the axes to draw on.
        runs: label -> list of per-run loss sequences (all of one length).
        smooth: width of the moving average applied to each run (1 for none).
        title: axes title.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    if not runs:
        raise ValueError("runs must hold at least one label")
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be a positive int, got {smooth!r}")
    kernel = np.ones(smooth) / smooth
    for label, losses in runs.items():
        curves_ = np.array(
            [np.convolve(np.asarray(run, float), kernel, mode="valid") for run in losses]
        )
        steps = np.arange(curves_.shape[1]) + smooth
        ax.plot(steps, curves_.mean(axis=0), label=label)
        ax.fill_between(steps, curves_.min(axis=0), curves_.max(axis=0), alpha=0.2)
    ax.set(xlabel="training step", ylabel="cross-entropy loss", title=title)
    ax.legend(fontsize="small")
    return ax


def accuracy_by_length(
    ax: Axes,
    results: dict[str, torch.Tensor],
    lengths: tuple[int, ...],
    *,
    train_length: int,
) -> Axes:
    """Accuracy against evaluation length, one line per scheme, error bars over seeds.

    Args:
        ax: the axes to draw on.
        results: scheme -> accuracies of shape ``(seeds, len(lengths))``.
        lengths: the evaluation lengths.
        train_length: drawn as a dashed vertical line.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    for label, acc in results.items():
        a = to_numpy(acc)
        if a.ndim != 2 or a.shape[1] != len(lengths):
            raise ValueError(
                f"results[{label!r}] must have shape (seeds, {len(lengths)}), got {a.shape}"
            )
        ax.errorbar(lengths, a.mean(axis=0), yerr=a.std(axis=0), marker="o", capsize=3, label=label)
    ax.axvline(train_length, color="grey", linestyle="--", label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(lengths), labels=[str(n) for n in lengths])
    ax.set(
        xlabel="evaluation length", ylabel="accuracy", ylim=(0, 1.05), title="accuracy vs length"
    )
    ax.legend(fontsize="small")
    return ax


# ---- Performance and precision (book/07_performance) ----


def ratio_bars(
    ax: Axes,
    ratios: dict[str, float],
    *,
    reference: str = "",
    title: str = "",
    xlabel: str = "time / reference",
) -> Axes:
    """Horizontal bars of ratios to a reference, with a dashed line at 1.

    Args:
        ax: the axes to draw on.
        ratios: label -> ratio (positive), one bar each, top to bottom in this order.
        reference: the reference's name, written next to the line at 1.
        title: axes title.
        xlabel: x-axis label.

    Returns:
        ``ax``.
    """
    _check_ax(ax)
    if not ratios:
        raise ValueError("ratios must hold at least one bar")
    labels = list(ratios)
    values = np.array([float(ratios[k]) for k in labels])
    if not np.isfinite(values).all() or (values <= 0).any():
        raise ValueError(f"ratios must be finite and positive, got {values.tolist()}")
    ys = np.arange(len(labels))[::-1]
    ax.barh(ys, values, color="C0")
    for y, value in zip(ys, values, strict=True):
        ax.annotate(
            f"{value:.2f}",
            (value, y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize="small",
        )
    ax.axvline(1.0, linestyle="--", color="gray", linewidth=0.8)
    if reference:
        ax.annotate(
            reference,
            (1.0, ys[0] + 0.45),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize="small",
            color="gray",
        )
    ax.set_yticks(ys, labels=labels)
    ax.set_xlim(0, values.max() * 1.2)
    ax.set(title=title, xlabel=xlabel)
    return ax
