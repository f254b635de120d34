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

The padded-batch diagram of the normalization chapter, which draws on an ``Axes`` like the plot helpers,
stays :func:`companion.plotting.padded_batch_diagram`.
"""

from __future__ import annotations

import math

import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from torch import nn

from companion import _drawing as draw
from companion import (
    _validate,
    attention,
    masks,
    mla,
    modern,
    norm,
    plotting,
    qwen3_next,
)
from companion._position_diagrams import (
    frequency_rescaling,
    rope_rotation,
    sinusoid_clocks,
    t5_bucket_map,
)
from companion.model import TinyTransformer, parameter_count

__all__ = [
    "attention_pipeline",
    "attention_tiles",
    "frequency_rescaling",
    "hybrid_stack",
    "kv_cache",
    "learned_sink",
    "mla_paths",
    "model_stack",
    "norm_placement",
    "online_softmax",
    "rope_rotation",
    "sink_column",
    "sinusoid_clocks",
    "t5_bucket_map",
]


# ---- Chapter 5: the steps of attention, and the online softmax ------------------------------


def attention_pipeline(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    fig: Figure | None = None,
) -> Figure:
    r"""Causal scaled dot-product attention of one short sequence, step by step.

    On top, the inputs :math:`Q`, :math:`K` and :math:`V` (one row per token); below,
    four panels: the scores :math:`QK^\top/\sqrt{D}`; the scores with the causal mask
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
        ``fig``, or a new figure. Artists: ``query-i-j``, ``key-i-j``, ``value-i-j`` (the
        inputs), ``scores-i-j``, ``masked-i-j``, ``weights-i-j``,
        ``output-i-j`` (the cells' texts).
    """
    fig = draw.target(fig)
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
    fig = draw.figure(6.2, 9.4, fig)
    grid = fig.add_gridspec(3, 6, height_ratios=(0.8, 1.0, 1.0))
    inputs = [fig.add_subplot(grid[0, 2 * k : 2 * k + 2]) for k in range(3)]
    for ax, (name, what, tensor) in zip(inputs, (("query", "Q: queries", query), ("key", "K: keys", key), ("value", "V: values", value)), strict=True):  # fmt: skip
        draw.matrix(
            ax, tensor.detach().double().numpy(), name, what, colors="Greys", digits=1
        )
    axes = [fig.add_subplot(grid[1 + r, 3 * c : 3 * c + 3]) for r in (0, 1) for c in (0, 1)]  # fmt: skip
    draw.matrix(axes[0], s, "scores", "1. scores q·k / √D")
    draw.matrix(axes[1], s, "masked", "2. causal mask: keys\nafter the query → −∞", masked=visible.numpy())  # fmt: skip
    draw.matrix(axes[2], weights.detach().double().numpy(), "weights", "3. softmax of each row:\nrows sum to 1", masked=visible.numpy(), hidden="0")  # fmt: skip
    draw.matrix(axes[3], output.detach().double().numpy(), "output", "4. output: weights × V", colors="Greens")  # fmt: skip
    for k, ax in enumerate(axes[:3]):
        if k != 1:  # left panels only: on the right it ran into the left one's cells
            ax.text(-0.15, length - 0.5, "query 0", ha="right", va="center", fontsize=draw.FONT)  # fmt: skip
        ax.text(0.5, -0.15, "key 0", ha="center", va="top", fontsize=draw.FONT)
    fig.subplots_adjust(left=0.14, right=0.98, top=0.94, bottom=0.04, wspace=0.9, hspace=0.5)  # fmt: skip
    return draw.finish(fig)


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
    fig = draw.target(fig)
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
    fig = draw.figure(0.45 * (soft + bs) + 0.5, 0.45 * row_h * blocks + 1.1, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    for b, (start, count, m_b, total_b, factor) in enumerate(stats):
        y = -b * row_h
        for k, j in enumerate(range(start, start + count)):
            draw.cell(ax, k, y, f"{x[j].item():.1f}", gid=f"score-{j}", color="0.95")
            shade = colormaps["Blues"](0.1 + 0.6 * weights[j].item())
            draw.cell(ax, soft + k, y, f"{weights[j].item():.2f}", gid=f"softmax-{j}", color=shade)  # fmt: skip
        ax.add_patch(Rectangle((-0.06, y - 0.06), count + 0.12, 1.12, fill=False, edgecolor=draw.QUERY, lw=1.6))  # fmt: skip
        ax.text(bs + 0.25, y + 0.75, f"m = {m_b:.1f}", ha="left", va="center", fontsize=draw.FONT, gid=f"max-{b}")  # fmt: skip
        ax.text(bs + 0.25, y + 0.25, f"ℓ = {total_b:.2f}", ha="left", va="center", fontsize=draw.FONT, gid=f"sum-{b}")  # fmt: skip
        if b:
            ax.text(bs + 0.25, y + 1.25, f"×{factor:.2g}", ha="left", va="center", fontsize=draw.FONT, gid=f"rescale-{b}", color=draw.QUERY)  # fmt: skip
    top = 1.5
    ax.text(bs / 2, top, f"scores, {bs} per block", ha="center", va="bottom", fontsize=draw.FONT)  # fmt: skip
    ax.text(bs + 0.25, top, "after it", ha="left", va="bottom", fontsize=draw.FONT)
    ax.text(soft + bs / 2, top, "softmax", ha="center", va="bottom", fontsize=draw.FONT)
    ax.text(
        (soft + bs) / 2, -(blocks - 1) * row_h - 0.3,
        "× (coloured): the old ℓ rescaled by exp(old m − new m)",
        ha="center", va="top", fontsize=draw.FONT, color=draw.QUERY,
    )  # fmt: skip
    ax.set_xlim(-0.2, soft + bs + 0.1)
    ax.set_ylim(-(blocks - 1) * row_h - 1.0, top + 0.6)
    return draw.finish(fig)


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
        ``fig``, or a new figure. Artists: ``post-k`` and ``pre-k``, the boxes' texts from the
        bottom; ``post-skip-s`` and ``pre-skip-s``, the residual lines (their first point is
        where the branch starts: the top of the box whose output the sublayer reads).
    """
    fig = draw.target(fig)
    norm_name = _validate.choice("norm_name", norm_name, ("LayerNorm", "RMSNorm"))
    fig = draw.figure(5.6, 6.4, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    steps = {
        "post": ["attention", "+", norm_name, "MLP", "+", norm_name],
        "pre": [norm_name, "attention", "+", norm_name, "MLP", "+"],
    }
    colours = {norm_name: plotting.scheme_color("layer" if norm_name == "LayerNorm" else "rms"), "attention": "#dbe9f6", "MLP": "#fde6c8", "+": "white"}  # fmt: skip
    for col, (kind, names) in enumerate(steps.items()):
        x = 1.4 + 3.2 * col
        y = 0.6
        ax.text(x, y - 0.35, "x (input)", ha="center", va="top", fontsize=draw.FONT)
        last = y
        branch_start = y
        # a sublayer's branch starts at the output of the step before it: Pre-LN's "+"
        # (the residual stream), Post-LN's norm (the norm sits on the residual path)
        ends_a_step = "+" if kind == "pre" else norm_name
        skips = 0
        for k, name in enumerate(names):
            y = 1.2 + 0.95 * k
            draw.arrow(ax, (x, last + (0.3 if k else 0.0)), (x, y - 0.3))
            w = 0.55 if name == "+" else 1.9
            draw.box(ax, x, y, "+" if name == "+" else name, width=w, height=0.6, color=colours[name], gid=f"{kind}-{k}")  # fmt: skip
            if name == "+":  # the residual: from where the sublayer's branch began
                side = x - 1.25
                ax.plot([x, side, side, x - w / 2], [branch_start, branch_start, y, y], color="0.25", lw=1.1, gid=f"{kind}-skip-{skips}")  # fmt: skip
                skips += 1
            if name == ends_a_step:
                branch_start = y + 0.3  # the top of this box
            last = y
        draw.arrow(ax, (x, last + 0.3), (x, last + 0.75))
        ax.text(x, last + 0.8, "output", ha="center", va="bottom", fontsize=draw.FONT)
        ax.text(x, last + 1.35, "Post-LN" if kind == "post" else "Pre-LN", ha="center", va="bottom", fontsize=draw.FONT + 2, weight="bold",
                color=plotting.scheme_color(f"{kind}-LN"))  # fmt: skip
    ax.set_xlim(-0.1, 5.9)
    ax.set_ylim(-0.1, 8.5)
    ax.set_aspect("equal")
    return draw.finish(fig)


# ---- Chapter 7: the tiny model's stack ------------------------------------------------------


def _describe(module: nn.Module) -> tuple[str, str]:
    """One box's text for a block's sublayer."""
    name = type(module).__name__
    if hasattr(module, "num_heads") and hasattr(module, "q_proj"):
        heads = module.num_heads
        dim = module.q_proj.in_features
        what = {"RotarySelfAttention": ", RoPE", "ALiBiSelfAttention": ", ALiBi"}.get(name, "")  # fmt: skip
        return "causal attention", f"{heads} heads of {dim // heads}{what}"
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if linears:
        widths = [linears[0].in_features] + [m.out_features for m in linears]
        return "MLP", "widths " + ", ".join(str(w) for w in widths)
    return name, ""


def _block_text(placement: str, module: nn.Module, norm_name: str) -> str:
    """A block's box, read top to bottom in the order the block computes."""
    what, detail = _describe(module)
    detail = f" ({detail})" if detail else ""
    if placement == "Pre-LN":
        return f"Pre-LN: {norm_name} → {what}\n{detail.strip()} → + residual"
    return f"Post-LN: {what}{detail}\n→ + residual → {norm_name}"


def model_stack(model: nn.Module, *, fig: Figure | None = None) -> Figure:
    r"""The layers of a :class:`companion.model.TinyTransformer`, bottom to top.

    Read from the model itself: the token embedding (vocabulary × width), the position
    scheme (a table added to the embedding, or RoPE/ALiBi inside attention), each block
    with its norm placement, sublayer and norm in the order the block computes them, the
    final norm (a Pre-LN model's; a Post-LN model has none) and the output head, and
    the parameter count of :func:`companion.model.parameter_count`.

    Args:
        model: a :class:`companion.model.TinyTransformer`.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``layer-k``, the boxes' texts from the bottom;
        ``parameters``, the count.
    """
    fig = draw.target(fig)
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
        layers.append((_block_text(placement, block.sublayer, norm_name), color))
    if not isinstance(model.final_norm, nn.Identity):  # Post-LN has no final norm
        final = norm_of.get(type(model.final_norm), type(model.final_norm).__name__)
        layers.append((f"final {final}", plotting.scheme_color("layer" if final == "LayerNorm" else "rms")))  # fmt: skip
    layers.append((f"head {model.head.in_features} × {model.head.out_features} → logits", "#eeeeee"))  # fmt: skip
    height = 1.05
    fig = draw.figure(4.6, 0.62 * len(layers) * height + 1.0, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    for k, (text, color) in enumerate(layers):
        y = k * height
        draw.box(ax, 0, y, text, width=4.2, height=0.8, color=color, gid=f"layer-{k}")
        if k:
            draw.arrow(ax, (0, y - height + 0.4), (0, y - 0.4))
    ax.text(0, -0.75, f"{parameter_count(model):,} parameters, position: {config.position}",
            ha="center", va="top", fontsize=draw.FONT, gid="parameters")  # fmt: skip
    ax.set_xlim(-2.2, 2.2)
    ax.set_ylim(-1.3, (len(layers) - 1) * height + 0.5)
    return draw.finish(fig)


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
    every token stays; with one, the tokens read are
    :func:`companion.modern.sink_cache_keep`: the first ``sinks`` and the last
    ``window``, so the cache stops growing. A rolling window without sinks keeps only
    the last :math:`W - 1` between steps, since the next query brings its own key
    (:func:`companion.modern.kv_cache_bytes`, Hugging Face's sliding-window cache): its
    rows say how many the cache keeps after the step (it reads the shaded ones). A sink
    cache (StreamingLLM's) keeps what it reads.

    Args:
        length: tokens at the last step, 2 to 16.
        prompt: tokens of the prompt, processed in one step, 1 to ``length``.
        window: the most recent tokens kept (the new one included), or ``None``.
        sinks: first tokens always kept; needs a ``window``.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``kept-t`` (the row's count: ``"n cached"``, or
        ``"keeps k"`` for a rolling window, which reads the shaded cells), ``cell-t-j`` (the text of
        token ``j`` at step ``t``, ``"×"`` when evicted).
    """
    fig = draw.target(fig)
    length = _validate.integer("length", length, minimum=2, maximum=draw.MAX_CELLS)
    prompt = _validate.integer("prompt", prompt, minimum=1, maximum=length)
    window = _validate.optional(_validate.integer, "window", window, minimum=1)
    sinks = _validate.integer("sinks", sinks, minimum=0)
    if sinks and window is None:
        raise ValueError(f"sinks needs a window, got sinks={sinks} and window=None")
    steps = list(range(prompt - 1, length))  # the last token of each step
    wide = 0.0  # "keeps k" fits where "n cached" does
    fig = draw.figure(0.42 * length + 2.2 + 0.42 * wide, 0.45 * len(steps) + 1.3, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
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
                color = draw.ROLE["sink"] if sink else draw.CACHE
                draw.cell(ax, j, y, str(j), color=color, gid=f"cell-{t}-{j}", size=0.9)
                ax.patches[-1].set_alpha(0.55)
            else:
                draw.cell(ax, j, y, "×", color="white", gid=f"cell-{t}-{j}", size=0.9, text_color="0.5")  # fmt: skip
            if new:
                ax.add_patch(Rectangle((j, y), 0.9, 0.9, fill=False, edgecolor="black", lw=2.0))  # fmt: skip
        if window is not None and not sinks:  # the next query brings its own key
            count = f"keeps {min(t + 1, window - 1)}"
        else:
            count = f"{len(keep)} cached"
        ax.text(length + 0.2, y + 0.45, count, ha="left", va="center", fontsize=draw.FONT, gid=f"kept-{t}")  # fmt: skip
        ax.text(-0.2, y + 0.45, "prompt" if r == 0 else f"step {r}", ha="right", va="center", fontsize=draw.FONT)  # fmt: skip
    if window is None:
        what = "full cache: every token's key and value stay"
    elif sinks:
        what = f"{sinks} sinks + the last {window} tokens"
    else:
        what = f"window of {window}: a step reads the shaded {window},\nthe cache keeps {window - 1} for the next"
    ax.text(
        length / 2,
        len(steps) + 0.15,
        what,
        ha="center",
        va="bottom",
        fontsize=draw.FONT,
    )
    ax.text(length / 2, -0.25, "token (outlined: computed at this step)", ha="center", va="top", fontsize=draw.FONT)  # fmt: skip
    ax.set_xlim(-1.6, length + 2.0 + wide)
    ax.set_ylim(-0.9, len(steps) + (1.3 if window is not None and not sinks else 0.7))
    return draw.finish(fig)


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
    fig = draw.target(fig)
    length = _validate.integer("length", length, minimum=2, maximum=8)
    sink_score = _validate.real("sink_score", sink_score)
    query = torch.ones(length, 1, dtype=torch.float64)
    key = torch.zeros(length, 1, dtype=torch.float64)
    key[0, 0] = sink_score  # q . k_0 / sqrt(1) = sink_score, every other score 0
    weights = attention.attention_weights(query, key, is_causal=True)
    visible = attention.causal_mask(length, length).numpy()
    fig = draw.figure(0.6 * length + 1.6, 0.6 * length + 1.3, fig)
    ax = fig.add_axes((0.2, 0.05, 0.78, 0.78))
    w = weights.numpy().copy()
    draw.matrix(ax, w, "weights", "", masked=visible, hidden="")
    ax.add_patch(Rectangle((0, 0), 1, length, fill=False, edgecolor=draw.ROLE["sink"], lw=2.5))  # fmt: skip
    ax.set_title("key 0 takes most of every row: a sink", fontsize=draw.FONT)
    ax.text(0.5, -0.15, "key 0", ha="center", va="top", fontsize=draw.FONT)
    ax.text(-0.15, length - 0.5, "query 0", ha="right", va="center", fontsize=draw.FONT)
    ax.text(
        -0.15, 0.5, f"query {length - 1}", ha="right", va="center", fontsize=draw.FONT
    )
    return draw.finish(fig)


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
    fig = draw.target(fig)
    fields = ("hidden_size", "num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "num_hidden_layers")  # fmt: skip
    missing = [f for f in fields if not isinstance(getattr(config, f, None), int)]
    if missing:
        raise TypeError(f"config must be a DeepSeek-V3-style config with int fields {', '.join(missing)}, got {_validate.describe(config)}")  # fmt: skip
    c = {f: getattr(config, f) for f in fields}
    per_token = mla.cache_bytes_per_token(config, "mla")
    fig = draw.figure(6.4, 4.4, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    heads = c["num_attention_heads"]
    draw.box(ax, 0.0, 0.0, f"input x\nwidth {c['hidden_size']}", width=1.7, height=0.9, gid="input")  # fmt: skip
    draw.box(ax, 3.1, 1.4, f"latent c\nwidth {c['kv_lora_rank']}", width=2.5, height=0.9, color=draw.CACHE, gid="latent")  # fmt: skip
    draw.box(ax, 3.1, -1.4, f"RoPE key\nwidth {c['qk_rope_head_dim']}", width=2.5, height=0.9, color=plotting.scheme_color("rope"), gid="rope-key")  # fmt: skip
    ax.patches[-1].set_alpha(0.6)
    ax.patches[-3].set_alpha(0.6)
    draw.box(ax, 6.9, 2.2, f"keys: {heads}\nheads of {c['qk_nope_head_dim']}", width=2.5, height=0.9, gid="content-key")  # fmt: skip
    draw.box(ax, 6.9, 0.8, f"values: {heads}\nheads of {c['v_head_dim']}", width=2.5, height=0.9, gid="value")  # fmt: skip
    draw.box(ax, 6.9, -1.4, "shared by\nall heads", width=2.5, height=0.9, color="0.95")
    draw.arrow(ax, (0.85, 0.3), (1.8, 1.3))
    draw.arrow(ax, (0.85, -0.3), (1.8, -1.3))
    draw.arrow(ax, (4.4, 1.6), (5.6, 2.15))
    draw.arrow(ax, (4.4, 1.2), (5.6, 0.85))
    draw.arrow(ax, (4.4, -1.4), (5.6, -1.4))
    # the projections' names beside their arrows, never on them
    ax.text(0.9, 1.05, "down", ha="right", va="bottom", fontsize=draw.FONT)
    ax.text(0.9, -1.05, "project,\nrotate", ha="right", va="top", fontsize=draw.FONT)
    ax.text(5.0, 2.35, "up", ha="right", va="bottom", fontsize=draw.FONT)
    ax.text(5.0, 0.6, "up", ha="center", va="top", fontsize=draw.FONT)
    ax.add_patch(Rectangle((1.7, -2.1), 2.8, 4.2, fill=False, edgecolor="0.35", lw=1.8, ls="--"))  # fmt: skip
    ax.text(
        3.1, 2.2, "cached", ha="center", va="bottom", fontsize=draw.FONT, color="0.2"
    )
    ax.text(
        3.7, -2.5, "score = content part + RoPE part:\nonly the RoPE key carries the position",
        ha="center", va="top", fontsize=draw.FONT, gid="score",
    )  # fmt: skip
    ax.text(
        3.7, -3.35,
        f"cache per token and layer: {c['kv_lora_rank']} + {c['qk_rope_head_dim']} = "
        f"{c['kv_lora_rank'] + c['qk_rope_head_dim']} numbers;\n"
        f"{per_token:,} bytes per token over {c['num_hidden_layers']} layers (bfloat16)",
        ha="center", va="top", fontsize=draw.FONT, gid="cache",
    )  # fmt: skip
    ax.set_xlim(-1.0, 8.3)
    ax.set_ylim(-4.6, 2.9)
    return draw.finish(fig)


# ---- The performance appendix: FlashAttention's tiles ------------------------------------


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
    mask applied, and a tile below it is computed in full: the split of the loop that
    FlashAttention-2 and Triton's tutorial make. The book's kernel
    (:func:`companion.kernels.flash_attention`) skips the same tiles but applies the mask
    to every tile it visits.

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
    fig = draw.target(fig)
    query_length = _validate.integer("query_length", query_length, minimum=1, maximum=draw.MAX_CELLS)  # fmt: skip
    key_length = _validate.integer("key_length", key_length, minimum=1, maximum=draw.MAX_CELLS)  # fmt: skip
    block_size = _validate.integer("block_size", block_size, minimum=1, maximum=8)
    is_causal = _validate.flag("is_causal", is_causal)
    visible = (
        attention.causal_mask(query_length, key_length)
        if is_causal
        else torch.ones(query_length, key_length, dtype=torch.bool)
    )
    rows = math.ceil(query_length / block_size)
    cols = math.ceil(key_length / block_size)
    fig = draw.figure(0.55 * key_length + 2.0, 0.55 * query_length + 1.6, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    counts = {"full": 0, "masked": 0, "skip": 0}
    colours = {
        "full": draw.ROLE["full"],
        "masked": draw.ROLE["masked"],
        "skip": "white",
    }
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
            ax.text(b * block_size + w / 2, y + h / 2, kind, ha="center", va="center", fontsize=draw.FONT, gid=f"tile-{a}-{b}")  # fmt: skip
    ax.text(key_length / 2, query_length + 0.2, f"keys → (tiles of {block_size} × {block_size})", ha="center", va="bottom", fontsize=draw.FONT)  # fmt: skip
    ax.text(-0.2, query_length / 2, "queries", ha="right", va="center", fontsize=draw.FONT, rotation=90)  # fmt: skip
    ax.text(
        key_length / 2, -0.3,
        f"{counts['full']} full, {counts['masked']} masked, {counts['skip']} skipped;\n"
        "each tile lives on the chip only",
        ha="center", va="top", fontsize=draw.FONT, gid="counts",
    )  # fmt: skip
    ax.set_xlim(-1.0, key_length + 0.2)
    ax.set_ylim(-1.4, query_length + 0.8)
    ax.set_aspect("equal")
    return draw.finish(fig)


# ---- Chapter 11: Qwen3-Next's hybrid stack and its state cache ---------------------------


def _mib(n: float) -> str:
    """Bytes in the unit that reads best: KiB below one MiB, MiB below one GiB."""
    if n < 2**20:
        return f"{n / 2**10:,.1f} KiB"
    if n < 2**30:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**30:,.2f} GiB"


def hybrid_stack(
    config: object, *, layers: int = 8, length: int = 32768, fig: Figure | None = None
) -> Figure:
    r"""The first layers of a Qwen3-Next-style hybrid, bottom to top, and what each caches.

    Read from ``config`` (a Hugging Face ``Qwen3NextConfig`` or anything
    :func:`companion.qwen3_next.state_cache_bytes` accepts): each of the first
    ``layers`` layers is a box, a Gated DeltaNet (``"linear_attention"``) with the bytes
    of its state, the same at any length, or a gated full attention with the bytes of
    its keys and values after ``length`` tokens. Every number is
    :func:`~companion.qwen3_next.state_cache_bytes`'s (bfloat16 model, the state in
    float32) divided among the layers of its kind; the foot gives the whole model's
    cache at ``length`` tokens against a model whose every layer were full attention.

    Args:
        config: a Qwen3-Next configuration (``layer_types`` and the ``linear_*`` sizes).
        layers: how many layers to draw from the bottom, 1 to 12.
        length: the tokens of the sequence, ``>= 1``.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``layer-k`` (the box of layer ``k``, from the
        bottom), ``total`` (the foot).
    """
    fig = draw.target(fig)
    layers = _validate.integer("layers", layers, minimum=1, maximum=12)
    length = _validate.integer("length", length, minimum=1)
    sizes = qwen3_next.state_cache_bytes(config)  # checks config
    types = list(config.layer_types)
    if layers > len(types):
        raise ValueError(
            f"layers must be at most the config's {len(types)} layers, got {layers}"
        )
    n_linear = types.count("linear_attention")
    n_full = len(types) - n_linear
    state = sizes.state_per_sequence / max(n_linear, 1)  # one linear layer's state
    kv = sizes.kv_per_token / max(n_full, 1) * length  # one full layer's keys, values
    height = 0.95
    fig = draw.figure(5.0, 0.55 * layers * height + 2.2, fig)
    ax = draw.blank(fig.add_axes((0.0, 0.0, 1.0, 1.0)))
    for k in range(layers):
        y = k * height
        if types[k] == "linear_attention":
            text = f"{k}: Gated DeltaNet, state {_mib(state)}"
            color = draw.CACHE
        else:
            text = f"{k}: gated attention, KV {_mib(kv)}"
            color = draw.ROLE["masked"]
        draw.box(ax, 0, y, text, width=4.6, height=0.72, color=color, gid=f"layer-{k}")
        if k:
            draw.arrow(ax, (0, y - height + 0.36), (0, y - 0.36))
    total = sizes.state_per_sequence + length * sizes.kv_per_token
    full = length * sizes.all_full_kv_per_token
    ax.text(
        0, (layers - 1) * height + 0.6,
        f"the first {layers} of {len(types)} layers ({n_linear} linear, {n_full} full)"
        f"\nand what each caches at {length:,} tokens",
        ha="center", va="bottom", fontsize=draw.FONT,
    )  # fmt: skip
    ax.text(
        0, -0.6,
        f"whole model: {_mib(total)}\n(every layer full attention: {_mib(full)})",
        ha="center", va="top", fontsize=draw.FONT, gid="total",
    )  # fmt: skip
    ax.set_xlim(-2.5, 2.5)
    ax.set_ylim(-1.9, (layers - 1) * height + 1.2)
    return draw.finish(fig)


# ---- Chapter 10: GPT-OSS's learned sink ------------------------------------------------------


def learned_sink(
    length: int = 5,
    *,
    sink: float = 0.0,
    padding: int = 1,
    fig: Figure | None = None,
) -> Figure:
    r"""GPT-OSS's learned sink: every row's softmax gets one more column, the head's
    logit :math:`\sigma_h`, which takes weight and gives no value.

    ``length`` tokens attend causally to each other with equal scores (0); the first
    ``padding`` of them are left padding, which no query sees. The weights are
    :func:`companion.masks.attention_with_sinks` read with the identity as values, so
    the key columns are exactly the weights the output mixes; the last column is
    :math:`p_{\mathrm{sink}}`, one less the row's sum. A query that sees :math:`n`
    keys gives each :math:`1/(n + e^{\sigma})` and the sink
    :math:`e^{\sigma}/(n + e^{\sigma})`; a padding query sees no key and gives the
    sink everything (its output is zero, not NaN).

    Args:
        length: queries and keys, 2 to 8, the padding included.
        sink: :math:`\sigma_h`, a finite real number.
        padding: left-padding tokens, 0 to ``length - 1``.
        fig: an empty figure to draw on, such as ``plt.figure()`` (Jupyter then shows
            it as it shows every pyplot figure); ``None``: a new Figure, outside pyplot.

    Returns:
        ``fig``, or a new figure. Artists: ``weights-i-j`` (the cells' texts; column
        ``j = length`` is the sink's, an empty text where the key is masked).
    """
    fig = draw.target(fig)
    length = _validate.integer("length", length, minimum=2, maximum=8)
    sink = _validate.real("sink", sink)
    padding = _validate.integer("padding", padding, minimum=0, maximum=length - 1)
    keep = torch.arange(length) >= padding  # (S,): left padding first
    allowed = masks.materialize_mask(
        masks.and_masks(masks.causal, masks.padding(keep[None])), 1, length, length
    )  # (1, 1, L, S)
    zeros = torch.zeros(1, 1, length, 1, dtype=torch.float64)
    identity = torch.eye(length, dtype=torch.float64)[None, None]  # values: one-hot
    sigma = torch.tensor([sink], dtype=torch.float64)
    weights = masks.attention_with_sinks(zeros, zeros, identity, sigma, allowed)[0, 0]
    p_sink = 1.0 - weights.sum(-1, keepdim=True)  # (L, 1): the dropped column
    values = torch.cat([weights, p_sink], dim=-1).numpy()  # (L, S + 1)
    visible = torch.cat([allowed[0, 0], torch.ones(length, 1, dtype=torch.bool)], -1)
    fig = draw.figure(0.6 * (length + 1) + 1.9, 0.6 * length + 1.5, fig)
    ax = fig.add_axes((0.2, 0.1, 0.75, 0.72))
    draw.matrix(ax, values, "weights", "", masked=visible.numpy(), hidden="")
    ax.add_patch(Rectangle((length, 0), 1, length, fill=False, edgecolor=draw.ROLE["sink"], lw=2.5))  # fmt: skip
    ax.set_title(
        f"one more column, the sink (logit {sink:g}):\nit takes weight, gives no value",
        fontsize=draw.FONT,
    )
    ax.text(length / 2, -0.15, "keys", ha="center", va="top", fontsize=draw.FONT)
    ax.text(length + 0.5, -0.15, "sink", ha="center", va="top", fontsize=draw.FONT)
    for i in range(length):
        label = "pad" if i < padding else f"query {i}"
        ax.text(-0.15, length - 0.5 - i, label, ha="right", va="center", fontsize=draw.FONT)  # fmt: skip
    return draw.finish(fig)
