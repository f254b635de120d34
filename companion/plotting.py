r"""Plot helpers for the chapters.

Each helper takes a matplotlib :class:`~matplotlib.axes.Axes` ``ax``, draws on it,
labels it (``title``, ``xlabel``, ``ylabel`` where it takes them) and returns it. None
of them changes global settings (no ``plt.style.use``, no ``rcParams``), so a learner's
own plots are left alone. Tensors are moved to the CPU and converted to NumPy here, at
the plotting boundary.

Most helpers draw *named series against x* (one labelled line per entry of a dict); they
are thin callers of :func:`named_series`, which also gives every line its colour, and
their docstrings list only what they add to it. The same scheme keeps the same colour in
every chapter: a series whose label names an entry of :data:`SCHEME_COLORS` (``"rope"``,
``"ALiBi"``, ``"pre-LN"``, ``"YaRN"``, ``"torch"``...) is drawn in that colour; other
series take the first colours of matplotlib's ``tab10`` cycle that the figure's schemes
leave free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

from companion import _colors, _validate
from companion._colors import TAB10 as _TAB10
from companion._colors import scheme_color
from companion._colors import scheme_key as _scheme_key
from companion._diagrams import padded_batch_diagram

__all__ = [
    "SCHEME_COLORS",
    "accuracy_by_length",
    "curves",
    "encoding_columns",
    "error_vs_position",
    "heatmap",
    "layer_profile",
    "loglog_curves",
    "masked_heatmap",
    "named_series",
    "padded_batch_diagram",
    "ratio_bars",
    "readable",
    "scheme_color",
    "seed_bands",
    "shown_width",
    "to_numpy",
    "training_curves",
    "wavelength_curves",
]

# ---- Colours: one per scheme, the same in every chapter ------------------------------

#: One colour per position scheme, context-extension method, normalization,
#: implementation and dtype the chapters compare. Read-only. Groups that appear together
#: in a figure have distinct colours; tab10 hues for schemes, PyTorch/Hugging Face/Meta
#: brand hues for implementations. :func:`scheme_color` reads it under other spellings.
SCHEME_COLORS: Mapping[str, str] = _colors.SCHEME_COLORS


# ---- Converting and checking at the plotting boundary --------------------------------


def to_numpy(x: torch.Tensor | np.ndarray, *, name: str = "x") -> np.ndarray:
    """A float64 NumPy copy of ``x`` (detached, on the CPU), for plotting.

    Args:
        x: a real (floating, integer or bool) tensor or array.
        name: the argument's name in an error message.

    Returns:
        A new float64 array.
    """
    if isinstance(x, torch.Tensor):
        _validate.tensor(name, x, dtype=("floating", "integer", "bool"))
        return x.detach().to("cpu", torch.float64).numpy()
    _validate.instance(name, x, np.ndarray, "a torch.Tensor or numpy.ndarray")
    if not (
        np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
    ) and (x.dtype != np.bool_):
        raise TypeError(
            f"{name} must be a real-valued array, got an array of dtype {x.dtype}"
        )
    return x.astype(np.float64, copy=True)


def _values(name: str, values: object, ndim: int = 1) -> np.ndarray:
    """A float64 array of ``ndim`` dimensions from a tensor, an array or (1-D) a list
    of numbers."""
    if ndim == 1 and isinstance(values, (list, tuple)):
        try:
            values = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(
                f"{name} must be a 1-D tensor, array or list of numbers, got {values!r}"
            ) from None
    out = to_numpy(values, name=name)  # type: ignore[arg-type]
    if out.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {out.shape}")
    return out


def _labelled(name: str, value: object, expected: str, empty: str = "") -> Mapping:
    """A dict keyed by label; not an empty one when ``empty`` says what it must hold."""
    _validate.instance(name, value, Mapping, expected)
    if empty and not value:
        raise ValueError(f"{name} must {empty}, got an empty dict")
    return value


def _series(name: str, series: object) -> dict[str, np.ndarray]:
    data = _labelled(
        name, series, "a dict of label -> values", "name at least one series"
    )
    out = {}
    for label, values in data.items():
        _validate.instance(f"{name} label", label, str, "a str")
        out[label] = _values(f"{name}[{label!r}]", values)
    return out


def _log_if(logy: object) -> str:
    """The ``yscale`` of a helper's ``logy`` flag."""
    return "log" if _validate.flag("logy", logy) else "linear"


# ---- Named series against x: the one line-drawing loop -------------------------------

_SCALES = ("linear", "log", "log2")


def named_series(
    ax: Axes,
    x: torch.Tensor | np.ndarray | Sequence[float] | None,
    series: Mapping[str, torch.Tensor | np.ndarray | Sequence[float]],
    *,
    colors: Mapping[str, str] | None = None,
    marker: str = "",
    markersize: float | None = None,
    xscale: str = "linear",
    yscale: str = "linear",
    floor: float | None = None,
    spread: Mapping[str, tuple[object, object]] | None = None,
    yerr: Mapping[str, object] | None = None,
    legend: str = "auto",
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    names: tuple[str, str] = ("x", "series"),
) -> Axes:
    """Draw each named series as a labelled line against ``x``: the shared loop.

    Colours: ``colors[label]`` when given (a matplotlib colour or a scheme name), else
    the scheme's colour when the label names one (:func:`scheme_color`), else the next
    ``tab10`` colour that no scheme in this call uses.

    Args:
        ax: the axes to draw on.
        x: the abscissae, 1-D; ``None`` draws each series against ``1, 2, ..., n``
            (layer or block numbers).
        series: label -> ordinates, each 1-D with the length of ``x``.
        colors: label -> colour, overriding the automatic choice for those labels.
        marker: a matplotlib marker for every line (e.g. ``"o"``, ``"."``).
        markersize: the marker size in points (``None``: matplotlib's).
        xscale: ``"linear"``, ``"log"`` (base 10) or ``"log2"``.
        yscale: ``"linear"``, ``"log"`` or ``"log2"``.
        floor: draw values below it at it (e.g. ``1e-300`` so exact zeros show on log
            axes).
        spread: label -> ``(low, high)`` arrays, drawn as a shaded band in the line's
            colour.
        yerr: label -> error-bar half-widths, drawn as error bars in the line's colour.
        legend: ``"auto"`` (a legend when there are two or more series), ``"best"``,
            ``"outside"`` (right of the axes, never over the data) or ``"none"``.
        title: axes title.
        xlabel: x-axis label.
        ylabel: y-axis label.
        names: the names of ``x`` and ``series`` in error messages (a helper that calls
            this one with its own arguments, e.g. ``("positions", "errors")``, passes
            them).

    Returns:
        ``ax``.
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    xn, sn = names
    xs = None if x is None else _values(xn, x)
    data = _series(sn, series)
    for scale_name, scale in (("xscale", xscale), ("yscale", yscale)):
        _validate.choice(scale_name, scale, _SCALES)
    _validate.choice("legend", legend, ("auto", "best", "outside", "none"))
    _validate.instance("marker", marker, str, "a str")
    markersize = _validate.optional(_validate.positive_real, "markersize", markersize)
    floor = _validate.optional(_validate.real, "floor", floor)
    extras = {}
    for extra_name, extra in (("colors", colors), ("spread", spread), ("yerr", yerr)):
        if extra is None:
            continue
        _labelled(extra_name, extra, "a dict keyed by series label")
        unknown = sorted(set(extra) - set(data))
        if unknown:
            raise ValueError(
                f"{extra_name} must be keyed by labels of series {sorted(data)}, "
                f"got {unknown}"
            )
        extras[extra_name] = extra
    lines_x = {}
    for label, ys in data.items():
        lx = np.arange(1.0, len(ys) + 1) if xs is None else xs
        if ys.shape != lx.shape:
            raise ValueError(
                f"{sn} {label!r} has shape {ys.shape}, {xn} has shape {lx.shape}"
            )
        lines_x[label] = lx
    bands = {}
    for label, pair in extras.get("spread", {}).items():
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(
                f"spread[{label!r}] must be a (low, high) pair, got {pair!r}"
            )
        low, high = (_values(f"spread[{label!r}]", v) for v in pair)
        if low.shape != data[label].shape or high.shape != data[label].shape:
            raise ValueError(
                f"spread[{label!r}] must hold two arrays of shape {data[label].shape}, "
                f"got {low.shape} and {high.shape}"
            )
        bands[label] = (low, high)
    errs = {}
    for label, err in extras.get("yerr", {}).items():
        e = _values(f"yerr[{label!r}]", err)
        if e.shape != data[label].shape:
            raise ValueError(
                f"yerr[{label!r}] must have shape {data[label].shape}, got {e.shape}"
            )
        errs[label] = e

    chosen = dict(extras.get("colors", {}))
    for label in data:
        if label not in chosen and _scheme_key(label) is not None:
            chosen[label] = SCHEME_COLORS[_scheme_key(label)]
    chosen = {
        k: scheme_color(v) if isinstance(v, str) and _scheme_key(v) else v
        for k, v in chosen.items()
    }
    taken = {c for c in chosen.values() if isinstance(c, str)}
    free = iter([c for c in _TAB10 if c not in taken] + list(_TAB10))
    for label, ys in data.items():
        color = chosen[label] if label in chosen else next(free)
        if floor is not None:
            ys = np.maximum(ys, floor)
        style = {"marker": marker, "color": color, "label": label}
        if markersize is not None:
            style["markersize"] = markersize
        if label in errs:
            ax.errorbar(lines_x[label], ys, yerr=errs[label], capsize=3, **style)
        else:
            ax.plot(lines_x[label], ys, **style)
        if label in bands:
            ax.fill_between(
                lines_x[label], *bands[label], color=color, alpha=0.2, linewidth=0
            )
    for setter, scale in ((ax.set_xscale, xscale), (ax.set_yscale, yscale)):
        if scale == "log2":
            setter("log", base=2)
        elif scale == "log":
            setter("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if legend == "outside":
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    elif legend == "best" or (legend == "auto" and len(data) > 1):
        ax.legend(loc="best", fontsize="small")
    return ax


# ---- Matrices as images --------------------------------------------------------------


def _image(
    ax: Axes, matrix: object, cmap: object, colorbar: object
) -> tuple[np.ndarray, bool]:
    """The checks :func:`heatmap` and :func:`masked_heatmap` share: the matrix, 2-D."""
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    m = _values("matrix", matrix, ndim=2)
    _validate.instance("cmap", cmap, str, "a matplotlib colormap name")
    if cmap not in colormaps:
        raise ValueError(
            f"cmap must be a matplotlib colormap name such as 'viridis', got {cmap!r}"
        )
    return m, _validate.flag("colorbar", colorbar)


def _show(ax: Axes, image: object, colorbar: bool, **labels: str) -> Axes:
    if colorbar:
        ax.figure.colorbar(image, ax=ax)
    ax.set(**labels)
    return ax


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
    m, colorbar = _image(ax, matrix, cmap, colorbar)
    symmetric = _validate.flag("symmetric", symmetric)
    for name, labels, size in (
        ("xticklabels", xticklabels, m.shape[1]),
        ("yticklabels", yticklabels, m.shape[0]),
    ):
        if (
            labels is not None
            and len(_validate.instance(name, labels, Sequence, "a list of str")) != size
        ):
            raise ValueError(f"{name} must hold {size} labels, got {len(labels)}")
    if symmetric:
        vmax = float(np.abs(m).max()) if m.size else 1.0
        vmax = vmax or 1.0
        vmin = -vmax
    else:
        vmin, vmax = (float(m.min()), float(m.max())) if m.size else (0.0, 1.0)
    image = ax.imshow(
        m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest"
    )
    if xticklabels is not None:
        ax.set_xticks(range(len(xticklabels)), labels=xticklabels)
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)), labels=yticklabels)
    return _show(ax, image, colorbar, title=title, xlabel=xlabel, ylabel=ylabel)


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
    """Draw a 2-D matrix whose ``-inf``/``nan`` entries (masked positions) show in light
    grey; otherwise as :func:`heatmap` (whose arguments these are).

    Args:
        matrix: a 2-D tensor or array, e.g. an attention bias with a causal mask.
        cmap: a matplotlib colormap name for the finite entries.
    """
    m, colorbar = _image(ax, matrix, cmap, colorbar)
    masked = np.ma.masked_invalid(m)
    colours = colormaps[cmap].with_extremes(
        bad="0.85"
    )  # a copy: the registry is untouched
    image = ax.imshow(masked, cmap=colours, aspect="auto", interpolation="nearest")
    return _show(ax, image, colorbar, title=title, xlabel=xlabel, ylabel=ylabel)


# ---- Sinusoidal positional encoding (book/01_sinusoidal_encoding) --------------------


def encoding_columns(
    ax: Axes,
    encoding: torch.Tensor | np.ndarray,
    columns: list[int] | tuple[int, ...],
    *,
    title: str = "",
) -> Axes:
    """Plot selected columns of a position table ``(L, D)`` as curves over the position.

    The legend sits to the right of the axes, off the waves.

    Args:
        encoding: a 2-D table, rows are positions.
        columns: the column indices to draw, one curve each (labelled ``dim j``).
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    table = to_numpy(encoding, name="encoding")
    if table.ndim != 2:
        raise ValueError(f"encoding must be 2-D (L, D), got shape {table.shape}")
    cols = _validate.int_sequence("columns", columns)
    for j in cols:
        if not 0 <= j < table.shape[1]:
            raise ValueError(f"columns must lie in [0, {table.shape[1]}), got {j}")
    return named_series(
        ax,
        np.arange(table.shape[0]),
        {f"dim {j}": table[:, j] for j in cols},
        legend="outside",
        title=title,
        xlabel="position",
        ylabel="value",
    )


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
    """Plot one or more labelled curves ``y(x)`` on shared axes: :func:`named_series`
    with a linear x axis and a legend for two or more curves.

    Args:
        logy: use a logarithmic y axis.
    """
    return named_series(
        ax,
        x,
        series,
        marker=marker,
        yscale=_log_if(logy),
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
    )


# ---- Normalization (book/06_normalization) -------------------------------------------
# padded_batch_diagram (a diagram of patches, not of data) lives in _diagrams.py


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
        series: a name -> values-per-layer mapping; each becomes a line with markers
            against the layer number 1, 2, ..., n (models of different depths may share
            the axes).
        logy: logarithmic y axis.
    """
    return named_series(
        ax,
        None,
        series,
        marker="o",
        markersize=3,
        yscale=_log_if(logy),
        legend="best",
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
    )


# ---- Beyond the training length (book/03_context_extension) --------------------------


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
        wavelengths: the wavelength of each pair in tokens, 1-D (the x axis,
            logarithmic).
        series: label -> one value per pair, each with the length of ``wavelengths``.
        markers: label -> a length in tokens, drawn as a grey dashed vertical line (e.g.
            the training length).
        logy: use a logarithmic y axis.
    """
    named_series(
        ax,
        wavelengths,
        series,
        marker=".",
        markersize=4,
        xscale="log",
        yscale=_log_if(logy),
        legend="none",
        title=title,
        xlabel="wavelength of the pair (tokens, log scale)",
        ylabel=ylabel,
        names=("wavelengths", "series"),
    )
    if markers is not None:
        _labelled("markers", markers, "a dict of label -> length")
        for k, (label, length) in enumerate(markers.items()):
            value = _validate.real(f"markers[{label!r}]", length)
            style = ("--", ":", "-.")[k % 3]
            ax.axvline(value, color="0.35", linestyle=style, linewidth=1, label=label)
    ax.legend(fontsize="small")
    return ax


# ---- Rotary position embedding (book/02_rope) ----------------------------------------


def error_vs_position(
    ax: Axes,
    positions: torch.Tensor | np.ndarray,
    errors: dict[str, torch.Tensor | np.ndarray],
    *,
    levels: dict[str, float] | None = None,
    title: str = "",
    ylabel: str = "max |error|",
) -> Axes:
    """Plot errors against position on log-log axes, with dashed horizontal reference
    levels.

    Args:
        positions: the positions (abscissae), 1-D and positive.
        errors: label -> errors, each 1-D with the length of ``positions``; exact zeros
            are drawn at 1e-300.
        levels: label -> a constant drawn as a dashed line (e.g. a dtype's rounding).
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    xs = _values("positions", positions)
    if (xs <= 0).any():
        raise ValueError(
            f"positions must be 1-D and positive, got {xs.tolist()[:4]}..."
        )
    if levels is not None:
        _labelled("levels", levels, "a dict of label -> value")
        levels = {
            k: _validate.positive_real(f"levels[{k!r}]", v) for k, v in levels.items()
        }
    named_series(
        ax,
        xs,
        errors,
        marker=".",
        xscale="log2",
        yscale="log",
        floor=1e-300,
        legend="none",
        title=title,
        xlabel="position m",
        ylabel=ylabel,
        names=("positions", "errors"),
    )
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
    ax.legend(fontsize="small")
    return ax


# ---- Attention, from alignment scores to FlashAttention's trick (book/05_attention) --


def loglog_curves(
    ax: Axes,
    x: torch.Tensor | np.ndarray,
    series: dict[str, torch.Tensor | np.ndarray],
    *,
    reference_power: float | None = None,
    variable: str = "x",
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
) -> Axes:
    """Plot labelled curves on log-log axes, optionally with a dashed ``x**power``
    guide.

    A cost that grows like ``L**2`` is a straight line of slope 2 on these axes; the
    guide (anchored at the first curve's last point) shows that slope.

    Args:
        x: the abscissae, 1-D and positive.
        series: label -> ordinates, each 1-D, positive, with the length of ``x``.
        reference_power: draw a dashed guide ``∝ x**reference_power``; ``None`` for
            none.
        variable: the abscissa's symbol in the guide's legend entry (``"L"`` gives
            ``∝ L²`` for power 2, ``∝ L`` for power 1).
    """
    power = _validate.optional(_validate.real, "reference_power", reference_power)
    _validate.instance("variable", variable, str, "a symbol such as 'L'")
    named_series(
        ax,
        x,
        series,
        marker="o",
        xscale="log2",
        yscale="log",
        legend="none",
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
    )
    if power is not None:
        xs = _values("x", x)
        anchor = _values("series", next(iter(series.values())))[-1]
        guide = anchor * (xs / xs[-1]) ** power
        exponent = "" if power == 1 else f"^{{{power:g}}}"
        label = f"∝ ${variable}{exponent}$"
        ax.plot(xs, guide, linestyle="--", color="0.5", label=label)
    ax.legend(fontsize="small")
    return ax


# ---- A tiny Transformer (book/07_tiny_transformer) -----------------------------------


def training_curves(
    ax: Axes,
    runs: dict[str, list[list[float]]],
    *,
    smooth: int = 10,
    title: str = "",
) -> Axes:
    """Loss curves, one line per label: the mean over runs, with a min..max band.

    :func:`seed_bands` with the axes of a loss curve, for runs of one length.

    Args:
        runs: label -> list of per-run loss sequences (all of one length, at least
            ``smooth`` steps).
        smooth: width of the moving average applied to each run (1 for none).
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    _labelled(
        "runs", runs, "a dict of label -> list of runs", "hold at least one label"
    )
    smooth = _validate.positive_int("smooth", smooth)
    arrays = {}
    for label, losses in runs.items():
        _validate.instance(f"runs[{label!r}]", losses, (list, tuple), "a list of runs")
        per_run = [
            _values(f"runs[{label!r}][{i}]", run) for i, run in enumerate(losses)
        ]
        if (
            not per_run
            or len({len(r) for r in per_run}) != 1
            or len(per_run[0]) < smooth
        ):
            raise ValueError(
                f"runs[{label!r}] must hold runs of one length >= smooth = {smooth}, "
                f"got lengths {[len(r) for r in per_run]}"
            )
        arrays[label] = np.array(per_run)  # (runs, n)
    lengths = {a.shape[1] for a in arrays.values()}
    if len(lengths) != 1:
        raise ValueError(
            f"runs must all have one length, got {sorted(lengths)} steps "
            "(seed_bands draws runs of different lengths)"
        )
    return seed_bands(
        ax,
        np.arange(1, lengths.pop() + 1),
        arrays,
        smooth=smooth,
        legend="best",
        title=title,
        xlabel="training step",
        ylabel="cross-entropy loss",
    )


def accuracy_by_length(
    ax: Axes,
    results: dict[str, torch.Tensor],
    lengths: tuple[int, ...],
    *,
    train_length: int,
) -> Axes:
    """Accuracy against evaluation length, one line per scheme, error bars over seeds.

    Args:
        results: scheme -> accuracies of shape ``(seeds, len(lengths))``.
        lengths: the evaluation lengths.
        train_length: drawn as a dashed vertical line.
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    lengths = _validate.int_sequence("lengths", lengths, minimum=1)
    train_length = _validate.positive_int("train_length", train_length)
    _labelled(
        "results", results, "a dict of scheme -> accuracies", "hold at least one scheme"
    )
    accuracies = {}
    for label, acc in results.items():
        a = to_numpy(acc, name=f"results[{label!r}]")
        if a.ndim != 2 or a.shape[1] != len(lengths):
            raise ValueError(
                f"results[{label!r}] must have shape (seeds, {len(lengths)}), "
                f"got {a.shape}"
            )
        accuracies[label] = a
    named_series(
        ax,
        np.asarray(lengths, dtype=np.float64),
        {label: a.mean(axis=0) for label, a in accuracies.items()},
        yerr={label: a.std(axis=0) for label, a in accuracies.items()},
        marker="o",
        xscale="log2",
        legend="none",
        title="accuracy vs length",
        xlabel="evaluation length",
        ylabel="accuracy",
    )
    ax.axvline(train_length, color="grey", linestyle="--", label="training length")
    ax.set_xticks(list(lengths), labels=[str(n) for n in lengths])
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize="small")
    return ax


# ---- Performance and precision (book/10_performance) ---------------------------------


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
        ratios: label -> ratio (positive), one bar each, top to bottom in this order.
        reference: the reference's name, written next to the line at 1.
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    _labelled("ratios", ratios, "a dict of label -> ratio", "hold at least one bar")
    labels = list(ratios)
    values = np.array(
        [
            _validate.real(f"ratios[{k!r}]", ratios[k], exclusive_minimum=0.0)
            for k in labels
        ]
    )
    _validate.instance("reference", reference, str, "a str")
    ys = np.arange(len(labels))[::-1]
    colours = [
        SCHEME_COLORS[_scheme_key(k)] if _scheme_key(k) else "#1f77b4" for k in labels
    ]
    ax.barh(ys, values, color=colours)
    text = {"textcoords": "offset points", "xytext": (3, 0), "fontsize": "small"}
    for y, value in zip(ys, values, strict=True):
        ax.annotate(f"{value:.2f}", (value, y), va="center", **text)
    ax.axvline(1.0, linestyle="--", color="gray", linewidth=0.8)
    if reference:
        ax.annotate(reference, (1.0, ys[0] + 0.45), color="gray", **text)
        # headroom for the label over the top bar, inside the frame once readable()
        # has enlarged it (the default margin leaves it crossing the top spine)
        ax.set_ylim(ys[-1] - 0.7, ys[0] + 1.1)
    ax.set_yticks(ys, labels=labels)
    ax.set_xlim(0, values.max() * 1.2)
    ax.set(title=title, xlabel=xlabel)
    return ax


# ---- Readable on a phone -------------------------------------------------------------

#: Width in CSS pixels at which the book's column shows a figure on a 390 px phone screen.
PHONE_COLUMN_PX = 358.0
#: The smallest text, in CSS pixels, a figure may show at that width.
MIN_TEXT_PX = 10.0


def shown_width(fig: Figure) -> float:
    """The width in inches of ``fig`` as Jupyter's inline backend saves it: the tight
    bounding box of what is drawn (``bbox_inches="tight"``) plus ``savefig.pad_inches``
    on each side. Wider than ``fig.get_figwidth()`` when labels reach past the edge,
    narrower when the figure has empty margins."""
    _validate.instance("fig", fig, Figure, "a matplotlib Figure")
    fig.draw_without_rendering()
    bbox = fig.get_tightbbox()  # the renderer savefig would use
    return float(bbox.width) + 2.0 * _pad_inches()


def _pad_inches() -> float:
    pad = matplotlib.rcParams["savefig.pad_inches"]
    return 0.0 if pad == "layout" else float(pad)


def readable(
    fig: Figure, *, min_px: float = MIN_TEXT_PX, column_px: float = PHONE_COLUMN_PX
) -> Figure:
    r"""Enlarge every text of ``fig`` that would read smaller than ``min_px`` on a phone.

    The book's figures are SVG, saved as Jupyter's inline backend saves them: cropped to
    the drawing's tight bounding box plus ``savefig.pad_inches`` on each side, ``w``
    inches wide (``w * 72`` pt), and scaled to the column, ``column_px`` CSS pixels wide
    on a phone. A text of ``f`` pt then shows at
    :math:`f \cdot \text{column\_px} / (72 w)` CSS px, so every text (tick labels, axis
    labels, titles, legends, annotations) is raised to at least
    :math:`\text{min\_px} \cdot 72 w / \text{column\_px}` pt; larger texts are left as
    they are. A 7-inch figure needs 14.1 pt, a 5-inch one 10.1 pt: narrow figures keep
    their proportions best. ``w`` is the larger of the crop and the whole figure plus its
    padding, so that a ``tight_layout`` after this call (which spreads the axes to the
    edges) keeps the floor; a text that grows past the edge widens the crop, so ``w`` is
    measured again until the sizes hold. Call it once the figure is drawn. Only ``fig`` changes; no global setting does.

    Args:
        fig: the figure, fully drawn.
        min_px: the smallest text, in CSS pixels at ``column_px``.
        column_px: the width the figure is shown at, in CSS pixels.

    Returns:
        ``fig``.
    """
    _validate.instance("fig", fig, Figure, "a matplotlib Figure")
    min_px = _validate.positive_real("min_px", min_px)
    column_px = _validate.positive_real("column_px", column_px)
    # texts that grow can widen the crop (a label past the edge), which shrinks them
    # again on the phone: measure, raise, and measure again until nothing changes
    for _ in range(5):
        # at least the whole figure's width: a tight_layout after this call spreads the
        # axes to the figure's edges, and the crop with them
        width = max(shown_width(fig), fig.get_figwidth() + 2.0 * _pad_inches())
        floor = min_px * 72.0 * width / column_px  # shown_width draws: ticks exist
        changed = False
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                # through the axis, so that ticks made at a later draw keep the size
                for which in ("major", "minor"):
                    sizes = [t.get_fontsize() for t in axis.get_ticklabels(which=which)]
                    if sizes and min(sizes) < floor - 1e-9:
                        axis.set_tick_params(which=which, labelsize=floor)
                        changed = True
        for text in fig.findobj(Text):
            if text.get_text() and text.get_fontsize() < floor - 1e-9:
                text.set_fontsize(floor)
                changed = True
        if not changed:
            break
    return fig


# ---- The rest of the position family (book/04_relative_positions) --------------------


def seed_bands(
    ax: Axes,
    x: torch.Tensor | np.ndarray | None,
    runs: Mapping[str, torch.Tensor | np.ndarray],
    *,
    smooth: int = 1,
    yscale: str = "linear",
    legend: str = "auto",
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
) -> Axes:
    """One line per label, the mean over seeds, with a lowest-to-highest seed band.

    Runs of different lengths are allowed: shorter ones end early (loss curves of
    schemes trained for different numbers of steps).

    Args:
        x: abscissae of the longest run (``None``: ``1, 2, ...``); a moving mean is
            drawn at the abscissa of the last value of its window.
        runs: label -> ``(seeds, n)`` values; ``n`` may differ between labels.
        smooth: width of a moving average over each seed's values (1 for none).
        yscale: ``"linear"``, ``"log"`` or ``"log2"``.
        legend: as :func:`named_series`.
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    _labelled("runs", runs, "a dict of label -> (seeds, n) values", "hold a label")
    smooth = _validate.positive_int("smooth", smooth)
    arrays = {
        label: _values(f"runs[{label!r}]", r, ndim=2) for label, r in runs.items()
    }
    for label, a in arrays.items():
        if a.shape[1] < smooth:
            raise ValueError(
                f"runs[{label!r}] must have at least smooth = {smooth} values per "
                f"seed, got {a.shape[1]}"
            )
    kernel = np.ones(smooth) / smooth
    longest = max(a.shape[1] for a in arrays.values())
    length = longest - smooth + 1
    mean, spread = {}, {}
    for label, a in arrays.items():
        s = np.array([np.convolve(r, kernel, mode="valid") for r in a])
        padded = np.full((s.shape[0], length), np.nan)
        padded[:, : s.shape[1]] = s
        mean[label] = padded.mean(axis=0)
        spread[label] = (padded.min(axis=0), padded.max(axis=0))
    # a moving mean is drawn at the last step of its window, with or without x
    xs = np.arange(1.0, longest + 1) if x is None else _values("x", x)
    xs = xs[smooth - 1 :]
    return named_series(
        ax,
        xs,
        mean,
        spread=spread,
        yscale=yscale,
        legend=legend,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        names=("x", "runs"),
    )
