r"""RoPE in local layers, no positions in global ones: the hybrids of chapter
:ref:`ch-attention-2026`, trained on the book's train-short-test-long task.

Cohere's Command A (``Cohere2``), Llama 4 (iRoPE) and SmolLM3 mix two kinds of attention
layer. A *local RoPE* layer rotates queries and keys (:func:`companion.rope.apply_rope`)
and lets query :math:`i` see only the keys :math:`i - W < j \le i` of a sliding window
(:func:`companion.masks.sliding_window_causal`); a *global NoPE* layer has no position
step at all and sees every key :math:`j \le i`. Command A repeats three sliding-window
RoPE layers and one global NoPE layer; Llama 4 three chunked RoPE layers (chunks of 8192
tokens, :func:`companion.masks.chunked_causal`, not a sliding window) and one global
NoPE layer with a length-dependent temperature on its queries
(:func:`companion.llama4.attention_temperature`); SmolLM3 drops RoPE in every fourth
layer and keeps the others global. Here a hybrid is *data*: a pattern, one entry per
layer, bottom to top, from :data:`LAYER_KINDS`, and a window ``W``.

:class:`LocalRotarySelfAttention` is :class:`companion.model.RotarySelfAttention` with
one override, the hook :meth:`~companion.attention.MultiHeadAttention.score_bias`
(:func:`sliding_window_bias`); a NoPE layer is :class:`companion.model.CausalSelfAttention`
as it is. :class:`HybridPositionTransformer` is a
:class:`companion.model.TinyTransformer` whose attention layers follow the pattern.

:func:`compare_hybrid_positions` trains the hybrid beside all-RoPE (``"rope"``) and
all-NoPE (``"none"``) through chapter :ref:`ch-relative`'s comparison,
:func:`companion.position_comparison.compare_position_schemes` (one scheme added by its
``builders``), so every model is built and trained by :mod:`companion.experiments` and
the variants of ``make claims`` act on it; ``tests/test_hybrid_claims.py`` calls it
with the chapter's constants (:data:`HYBRID_STEPS`, :data:`HYBRID_SEEDS`, :data:`HYBRID_WINDOW`).

Shape:
    - :func:`sliding_window_bias`: ``(L, S)``
    - :class:`LocalRotarySelfAttention`, :class:`HybridPositionTransformer`: as
      :class:`companion.model.RotarySelfAttention` and
      :class:`companion.model.TinyTransformer`
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from companion import _validate
from companion.masks import sliding_window_causal
from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    RotarySelfAttention,
    TinyTransformer,
)
from companion.position_comparison import PositionComparison, compare_position_schemes

__all__ = [
    "HYBRID_PATTERN",
    "HYBRID_SCHEMES",
    "HYBRID_SEEDS",
    "HYBRID_STEPS",
    "HYBRID_WINDOW",
    "LAYER_KINDS",
    "HybridPositionTransformer",
    "LocalRotarySelfAttention",
    "compare_hybrid_positions",
    "sliding_window_bias",
]

LAYER_KINDS = ("rope-local", "rope-global", "nope-global")
"""The kinds a layer of a hybrid pattern may be, in order RoPE in a sliding window,
RoPE over every key, or no positions over every key."""

HYBRID_PATTERN = ("rope-local", "nope-global")
"""The hybrid of chapter 10 on the book's two-layer bench, a local RoPE layer and then a
global NoPE layer (Command A and Llama 4 repeat three local RoPE layers and one global NoPE
layer; the bench has room for one of each)."""

HYBRID_WINDOW = 8
"""Chapter 10's window ``W`` of the local layer: half the training length, so every
offset it can see is trained."""

HYBRID_SCHEMES = ("hybrid", "rope", "none")
"""The schemes :func:`compare_hybrid_positions` trains: the hybrid, all-RoPE, all-NoPE."""

HYBRID_STEPS: dict[str, int | tuple[int, ...]] = {
    "hybrid": 400,
    "rope": 400,
    "none": 400,
}
"""The budget of chapter 10's hybrids, the same for the three (all-RoPE's is
chapter 4's, in its trained comparison of the position family; all-NoPE, still learning
at 400 steps, gets 1,000 there)."""

HYBRID_SEEDS = 3
"""Chapter 10's seed count, as in :func:`~companion.experiments.seeds` ``(HYBRID_SEEDS)``."""


def sliding_window_bias(
    window: int,
    query_length: int,
    key_length: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""The additive mask of causal attention in a sliding window: 0 where query
    :math:`i` may see key :math:`j`, :math:`i - W < j \le i`, and :math:`-\infty`
    elsewhere.

    The ``L`` queries sit at the last ``L`` of the ``S`` key positions (after a cache of
    ``S - L``), as in :class:`companion.model.RotarySelfAttention`. The predicate is
    :func:`companion.masks.sliding_window_causal`, Hugging Face's convention
    (``sliding_window=W``: the query's own key and the ``W - 1`` before it).

    Args:
        window: :math:`W`, a positive int.
        query_length: ``L``, a positive int.
        key_length: ``S``, an int >= ``L``.
        dtype: a floating dtype.
        device: where to build it.

    Returns:
        ``(L, S)``, 0 or ``-inf``.
    """
    window = _validate.positive_int("window", window)
    query_length = _validate.positive_int("query_length", query_length)
    key_length = _validate.integer("key_length", key_length, minimum=query_length)
    dtype = _validate.dtype("dtype", dtype)
    device = _validate.device("device", device)
    S, L = key_length, query_length
    i = torch.arange(S - L, S, device=device)[:, None]  # (L, 1) query positions
    j = torch.arange(S, device=device)[None, :]  # (1, S) key positions
    allowed = sliding_window_causal(window)(None, None, i, j)  # (L, S), i - W < j <= i
    bias = torch.zeros(L, S, dtype=dtype, device=device)
    return bias.masked_fill(~allowed, -math.inf)  # (L, S)


class LocalRotarySelfAttention(RotarySelfAttention):
    r"""Causal RoPE self-attention in a sliding window of ``window`` keys.

    :class:`companion.model.RotarySelfAttention` with one override, the hook
    :meth:`~companion.attention.MultiHeadAttention.score_bias`:
    :func:`sliding_window_bias` (its causal mask included) is added to the scores, so
    query :math:`i` sees the keys :math:`i - W < j \le i` only. The window is causal by
    construction: the layer builds its own mask (``accepts_mask = False``).

    Args:
        dim: model width ``D``.
        num_heads: heads ``H``; ``dim / num_heads`` must be even.
        window: ``W``, a positive int.
        base: the RoPE base.

    Shape:
        - input: ``(B, L, D)``
        - output: ``(B, L, D)``
    """

    accepts_mask = False

    def __init__(
        self, dim: int, num_heads: int, *, window: int, base: float = 10000.0
    ) -> None:
        window = _validate.positive_int("window", window)
        super().__init__(dim, num_heads, base=base)
        self.window = window

    def score_bias(
        self, query: torch.Tensor, key: torch.Tensor, *, is_causal: bool
    ) -> torch.Tensor:
        """The sliding window's bias for ``L`` queries and ``S`` keys, ``(L, S)``."""
        return sliding_window_bias(
            self.window,
            query.shape[-2],
            key.shape[-2],
            dtype=query.dtype,
            device=query.device,
        )  # (L, S), -inf outside i - W < j <= i

    def extra_repr(self) -> str:  # part of train_batched's key: windows must differ
        return f"window={self.window}"


class HybridPositionTransformer(TinyTransformer):
    """A :class:`companion.model.TinyTransformer` whose attention layers follow a
    pattern: layer ``l`` is ``pattern[l]``, one of :data:`LAYER_KINDS`.

    ``"rope-local"`` is :class:`LocalRotarySelfAttention` (window ``window``, base
    ``config.rope_base``), ``"rope-global"`` :class:`companion.model.RotarySelfAttention`
    and ``"nope-global"`` :class:`companion.model.CausalSelfAttention` (no position
    step). Only ``_attention`` is overridden; the model trains with
    :func:`companion.experiments.train_batched` like the base class. A pattern of
    ``"rope-global"`` only is the all-RoPE ``TinyTransformer``, weight for weight from
    the same seed; of ``"nope-global"`` only, the one without positions.

    Args:
        config: the sizes; ``config.position`` must be ``"none"`` (the pattern is the
            position scheme).
        pattern: one kind per layer, ``config.num_layers`` of them, bottom to top.
        window: ``W`` of the local layers, a positive int.

    Shape:
        - input: token ids ``(B, L)``
        - output: logits ``(B, L, vocab_size)``
    """

    def __init__(
        self,
        config: ModelConfig,
        pattern: Sequence[str] = HYBRID_PATTERN,
        *,
        window: int = HYBRID_WINDOW,
    ) -> None:
        _validate.instance("config", config, ModelConfig, "a ModelConfig")
        if config.position != "none":
            raise ValueError(
                "config.position must be 'none' (the pattern is the position scheme), "
                f"got {config.position!r}"
            )
        pattern = _validate.sequence(
            "pattern", pattern, length=config.num_layers, what="layer kinds"
        )
        pattern = tuple(
            _validate.choice(f"pattern[{i}]", k, LAYER_KINDS)
            for i, k in enumerate(pattern)
        )
        window = _validate.positive_int("window", window)
        nn_setattr = object.__setattr__  # plain values, before nn.Module.__init__
        nn_setattr(self, "pattern", pattern)
        nn_setattr(self, "window", window)
        # TinyTransformer builds its layers bottom to top, one _attention() call each
        nn_setattr(self, "_kinds", iter(pattern))
        super().__init__(config)

    def _attention(self) -> CausalSelfAttention:
        c, kind = self.config, next(self._kinds)
        if kind == "rope-local":
            return LocalRotarySelfAttention(
                c.dim, c.num_heads, window=self.window, base=c.rope_base
            )
        if kind == "rope-global":
            return RotarySelfAttention(c.dim, c.num_heads, base=c.rope_base)
        return CausalSelfAttention(c.dim, c.num_heads)


def compare_hybrid_positions(
    *,
    seeds: Sequence[int] | None = None,
    steps: int | dict[str, int | tuple[int, ...]] = HYBRID_STEPS,
    pattern: Sequence[str] = HYBRID_PATTERN,
    window: int = HYBRID_WINDOW,
    config: ModelConfig | None = None,
    **options: object,
) -> PositionComparison:
    """Train the hybrid, all-RoPE and all-NoPE on the lag task at ``L_0`` and score
    every position up to the evaluation length (chapter 10's trained comparison).

    One call to :func:`companion.position_comparison.compare_position_schemes` with the
    schemes :data:`HYBRID_SCHEMES`, ``"hybrid"`` built as a
    :class:`HybridPositionTransformer` of ``pattern`` and ``window`` on the same sizes
    as the others; ``"rope"`` and ``"none"`` are the position family's models. Read the result
    with :meth:`~companion.position_comparison.PositionComparison.inside` and
    :meth:`~companion.position_comparison.PositionComparison.beyond` (the positions past
    ``L_0`` only).

    Args:
        seeds: as :func:`~companion.position_comparison.compare_position_schemes`
            (``None``: :func:`~companion.experiments.seeds` ``(HYBRID_SEEDS)``).
        steps: one number, or one per scheme of :data:`HYBRID_SCHEMES`.
        pattern: the hybrid's layer kinds, one per layer.
        window: ``W`` of its local layers.
        config: the sizes, as :func:`~companion.position_comparison.compare_position_schemes`.
        **options: the other keyword arguments of
            :func:`~companion.position_comparison.compare_position_schemes`
            (``training_length``, ``eval_length``, ``lag``, ...).

    Returns:
        A :class:`~companion.position_comparison.PositionComparison` over
        :data:`HYBRID_SCHEMES`.
    """
    from companion import experiments

    window = _validate.positive_int("window", window)
    pattern = _validate.sequence("pattern", pattern, what="layer kinds")
    for i, k in enumerate(pattern):
        _validate.choice(f"pattern[{i}]", k, LAYER_KINDS)
    if config is not None:
        _validate.instance("config", config, ModelConfig, "a ModelConfig")
        if len(pattern) != config.num_layers:
            raise ValueError(
                f"pattern must hold config.num_layers={config.num_layers} layer kinds, "
                f"got {len(pattern)}"
            )
    elif len(pattern) != 2:
        raise ValueError(
            f"pattern must hold 2 layer kinds (the default bench), got {len(pattern)}"
        )

    def hybrid(c: ModelConfig) -> HybridPositionTransformer:
        c = dataclasses.replace(c, position="none")
        return HybridPositionTransformer(c, pattern, window=window)

    return compare_position_schemes(
        HYBRID_SCHEMES,
        seeds=experiments.seeds(HYBRID_SEEDS) if seeds is None else seeds,
        steps=steps,
        config=config,
        builders={"hybrid": hybrid},
        **options,  # type: ignore[arg-type]
    )
