r"""Diagrams drawn with patches rather than data: the padded batch of chapter 6 (normalization).

Private: :mod:`companion.plotting` re-exports
:func:`~companion.plotting.padded_batch_diagram` and is where it is documented and
tested.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from companion import _validate
from companion._colors import SCHEME_COLORS

__all__: list[str] = []  # private: nothing here is part of the documented API


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
    """Draw a padded batch of sentences and the entries one normalization statistic
    pools.

    Each sentence is a block of ``dim`` feature rows by ``L`` position columns (``L``
    the longest sentence); padding cells are hatched grey. ``mode="batch"`` shades
    feature row ``feature`` in every sentence and at every position, padding included:
    the entries that BatchNorm averages over for that feature (``(B, D, L)`` layout, as
    :class:`torch.nn.BatchNorm1d`). ``mode="layer"`` shades the column of one token
    ``token = (sentence, position)``: the entries LayerNorm averages over.

    Args:
        ax: the axes to draw on.
        sentences: the tokens of each sentence.
        dim: number of feature rows to draw, 1 to 64.
        mode: ``"batch"`` or ``"layer"``.
        feature: the feature row shaded in ``"batch"`` mode.
        token: the ``(sentence, position)`` column shaded in ``"layer"`` mode.
        pad: the label of padding positions.

    Returns:
        ``ax``.
    """
    _validate.instance("ax", ax, Axes, "a matplotlib Axes")
    mode = _validate.choice("mode", mode, ("batch", "layer"))
    _validate.instance("sentences", sentences, (list, tuple), "a list of token lists")
    if not sentences or any(
        not isinstance(s, (list, tuple)) or len(s) == 0 for s in sentences
    ):
        raise ValueError("sentences must be a non-empty list of non-empty token lists")
    dim = _validate.integer("dim", dim, minimum=1, maximum=64)  # rows of a drawing
    feature = _validate.integer("feature", feature, minimum=0)
    if not feature < dim:
        raise ValueError(f"feature must be in [0, {dim}), got {feature}")
    _validate.instance("pad", pad, str, "a str")
    b_tok, l_tok = (
        _validate.int_sequence("token", token, minimum=0) + (0, 0)[len(token) :]
    )
    if len(token) != 2 or not (
        0 <= b_tok < len(sentences) and 0 <= l_tok < len(sentences[b_tok])
    ):
        raise ValueError(f"token must index a real token, got {token}")
    length = max(len(s) for s in sentences)
    shade = SCHEME_COLORS["batch"] if mode == "batch" else SCHEME_COLORS["layer"]
    gap = 2.6  # vertical space between sentences: the token labels and the name above
    cw = 2.0  # cell width: room for a token label
    for b, sent in enumerate(sentences):
        top = -b * (dim + gap)
        for pos in range(length):
            real = pos < len(sent)
            label = str(sent[pos]) if real else pad
            ax.text(
                cw * (pos + 0.5), top + 0.3, label, ha="center", va="bottom", fontsize=9
            )
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
        name = f"sentence {b + 1}"  # above its block: a label on the left costs width
        ax.text(0.0, top + 1.45, name, ha="left", va="bottom", fontsize=9)
    ax.set_xlim(-0.1, cw * length + 0.1)
    ax.set_ylim(-(len(sentences) - 1) * (dim + gap) - dim - 0.3, 2.6)
    ax.set_aspect("equal")
    ax.set_xticks(
        [cw * (i + 0.5) for i in range(length)], labels=[str(i) for i in range(length)]
    )
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    what = (
        "BatchNorm: one mean/var per feature\n"
        f"(feature {feature}: every sentence, every position)"
        if mode == "batch"
        else "LayerNorm: one mean/var per token\n"
        f"(sentence {b_tok + 1}, position {l_tok}: its features)"
    )
    ax.set(title=what, xlabel="position")
    return ax
