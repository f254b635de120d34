r"""A learned sink against a sink token, trained: chapter :ref:`ch-attention-2026`'s
comparison of what each buys.

StreamingLLM (Xiao et al., 2024) found that language models park the attention of
queries with nothing to read on the first token, and that evicting that token from a
sliding-window cache breaks them; it keeps the first tokens in the cache, and proposes
training with a dedicated *sink token* at slot 0. GPT-OSS gives every head a *learned
sink* instead: one more logit in each row's softmax, a column that takes mass and gives
no value (:func:`companion.masks.attention_with_sinks`). This module trains the three
side by side on a task where some queries have nothing to read, and asks what each
model does with those queries and what evicting the oldest keys costs it.

The task (:func:`trigger_lag_targets`) is the book's lag task with a twist: at a
*trigger* token (ids below ``triggers``) the answer is the token ``lag`` places back, as
in the lag task; at any other token it is the next id, ``(x_t + 1) mod V``, which the
token itself gives: a head that reads the token ``lag`` back has nothing to do there.
(Guo et al., 2024, "Active-dormant attention heads", train on a task of this kind, their
bigram-backcopy task, and find the heads go dormant on a sink.)

The three models (:data:`SINK_KINDS`), built as :class:`SinkTransformer`, differ in one
step each:

* ``"none"``: the chapter's tiny RoPE model, :class:`companion.model.TinyTransformer`;
* ``"token"``: a learned vector (``SinkTransformer.sink_token``) is put in front of
  every sequence at slot 0, StreamingLLM's pre-training sink token; its output is dropped;
* ``"learned"``: every attention layer is :class:`LearnedSinkSelfAttention`, one learned
  sink logit per head, as GPT-OSS.

:func:`sink_runs` trains them with :mod:`companion.experiments` (so the variants of
``make claims`` act on them) and :func:`measure_sinks` reads the sink's share of the
queries that have nothing to read and the loss with the oldest keys evicted
(:func:`windowed`: StreamingLLM's "window attention", nothing kept, or its rolling cache
with slot 0 kept, ``keep_first``; the mask is :func:`streaming_bias`, the layer
:class:`StreamingRotarySelfAttention`). ``tests/test_sink_claims.py`` asserts the
chapter's bounds with its constants.

Shape:
    - :func:`trigger_lag_targets`: ``(B, L)`` -> ``(B, L)``
    - :func:`streaming_bias`: ``(L, S)``
    - :class:`StreamingRotarySelfAttention`, :class:`LearnedSinkSelfAttention`,
      :class:`SinkTransformer`: as
      :class:`companion.model.RotarySelfAttention` and
      :class:`companion.model.TinyTransformer`
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from companion import _validate, experiments
from companion.experiments import SeedRuns
from companion.hybrid_positions import sliding_window_bias
from companion.masks import attention_with_sinks
from companion.model import (
    IGNORE_INDEX,
    ModelConfig,
    RotarySelfAttention,
    TinyTransformer,
)

__all__ = [
    "SINK_KINDS",
    "SINK_LR",
    "SINK_SEEDS",
    "SINK_SIZES",
    "SINK_STEPS",
    "SINK_TASK",
    "SINK_TRIGGERS",
    "SINK_WINDOW",
    "LearnedSinkSelfAttention",
    "SinkMeasures",
    "SinkTransformer",
    "StreamingRotarySelfAttention",
    "measure_sinks",
    "sink_probe",
    "sink_runs",
    "streaming_bias",
    "trigger_lag_targets",
    "windowed",
]

SINK_KINDS = ("none", "token", "learned")
"""The models of the comparison, in order no sink, a sink token at slot 0 and a learned
sink logit per head."""

SINK_SIZES = ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=2)
"""The tiny RoPE model of the 2024-2025 attention layer's stability runs (width 32, four
heads of width 8, two layers)."""

SINK_TASK: dict[str, int] = {"batch_size": 32, "length": 16, "lag": 2}
"""32 sequences of 16 tokens a step; a trigger's answer is the token two back."""

SINK_TRIGGERS = 4
"""Token ids below it are triggers (a quarter of the 16); the others answer ``x_t + 1``."""

SINK_STEPS = 120
"""Optimization steps of every run (AdamW, cosine after a 10-step warm-up)."""

SINK_LR = 0.02
"""The peak learning rate of every run."""

SINK_SEEDS = 3
"""The seed count, as in :func:`~companion.experiments.seeds` ``(SINK_SEEDS)``."""

SINK_WINDOW = 3
"""The evaluation window ``W``, with which query ``t`` keeps only the keys ``t - 2 .. t``,
the fewest that still hold a trigger's answer (``lag = 2``); the first slot is evicted."""

_WARMUP = 10


def trigger_lag_targets(
    tokens: torch.Tensor,
    *,
    lag: int = SINK_TASK["lag"],
    triggers: int = SINK_TRIGGERS,
    vocab_size: int = SINK_SIZES.vocab_size,
) -> torch.Tensor:
    r"""The targets of the trigger-lag task on a batch of token ids.

    Equivalent to the following, for every sequence::

        target[t] = tokens[t - lag]            if tokens[t] < triggers  (a trigger)
                    (tokens[t] + 1) % vocab_size  otherwise
        target[t] = -100                       for t < lag (not scored)

    Args:
        tokens: token ids in ``[0, vocab_size)`` (e.g. :func:`companion.model.lag_task`'s).
        lag: how far back a trigger's answer is, positive.
        triggers: ids below it are triggers, ``1 <= triggers < vocab_size``.
        vocab_size: the number of token ids.

    Shape:
        - tokens: ``(..., L)`` integer, ``L > lag``
        - output: ``(..., L)`` int64, ``-100`` at ``t < lag``
    """
    lag = _validate.positive_int("lag", lag)
    vocab_size = _validate.integer("vocab_size", vocab_size, minimum=2)
    triggers = _validate.integer("triggers", triggers, minimum=1)
    if triggers >= vocab_size:
        raise ValueError(
            f"triggers must be less than vocab_size={vocab_size} (some tokens must not "
            f"trigger), got {triggers}"
        )
    tokens = _validate.tensor("tokens", tokens, dtype="integer", min_ndim=1)
    if tokens.shape[-1] <= lag:
        raise ValueError(
            f"tokens must have more than lag={lag} positions, got shape "
            f"{tuple(tokens.shape)}"
        )
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(
            f"tokens must be ids in [0, {vocab_size - 1}] (vocab_size={vocab_size}), got "
            f"ids from {tokens.min().item()} to {tokens.max().item()}"
        )
    tokens = tokens.long()
    out = torch.full_like(tokens, IGNORE_INDEX)
    now, back = tokens[..., lag:], tokens[..., :-lag]
    out[..., lag:] = torch.where(now < triggers, back, (now + 1) % vocab_size)
    return out


def streaming_bias(
    window: int,
    query_length: int,
    key_length: int,
    *,
    keep_first: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    r"""The additive mask of a rolling cache: query :math:`i` sees the keys
    :math:`i - W < j \le i` of its window and, with ``keep_first``, key 0 as well
    (StreamingLLM's attention sink kept in the cache); 0 where it may see, :math:`-\infty`
    elsewhere.

    Equivalent to :func:`companion.hybrid_positions.sliding_window_bias` with column 0
    opened when ``keep_first`` (key 0 is never after a query, so the mask stays causal).

    Args:
        window: :math:`W`, a positive int.
        query_length: ``L``, a positive int (the queries are the last ``L`` of the keys).
        key_length: ``S``, an int >= ``L``.
        keep_first: keep key 0 in every query's view.
        dtype: a floating dtype.
        device: where to build it.

    Returns:
        ``(L, S)``, 0 or ``-inf``.
    """
    keep_first = _validate.flag("keep_first", keep_first)
    bias = sliding_window_bias(
        window, query_length, key_length, dtype=dtype, device=device
    )  # (L, S); checks the sizes, the dtype and the device
    if keep_first:
        bias[:, 0] = 0.0  # the first key, seen by every query
    return bias


class StreamingRotarySelfAttention(RotarySelfAttention):
    r"""Causal RoPE self-attention over a rolling cache: the last ``window`` keys and,
    with ``keep_first``, the first key too.

    :class:`companion.model.RotarySelfAttention` with one override, the hook
    :meth:`~companion.attention.MultiHeadAttention.score_bias`: :func:`streaming_bias`.
    ``window=None`` keeps every earlier key (the plain causal mask, as a bias). The
    positions are the tokens' own (the cache is not re-indexed, as StreamingLLM's is):
    on sequences no longer than the training length no position is new.

    Args:
        dim: model width.
        num_heads: heads ``H``; ``dim / num_heads`` must be even.
        base: the RoPE base.
        window: ``W`` (a positive int) or ``None`` for every earlier key.
        keep_first: keep key 0 in the view of every query (with a window).

    Shape:
        - input: ``(B, L, dim)``
        - output: ``(B, L, dim)``
    """

    accepts_mask = False

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        base: float = 10000.0,
        window: int | None = None,
        keep_first: bool = False,
    ) -> None:
        window = _validate.optional(_validate.positive_int, "window", window)
        keep_first = _validate.flag("keep_first", keep_first)
        super().__init__(dim, num_heads, base=base)
        self.window = window
        self.keep_first = keep_first

    def score_bias(
        self, query: torch.Tensor, key: torch.Tensor, *, is_causal: bool
    ) -> torch.Tensor:
        """:func:`streaming_bias` for ``L`` queries and ``S`` keys, ``(L, S)``."""
        L, S = query.shape[-2], key.shape[-2]
        window = S if self.window is None else self.window  # S keys: plain causal
        return streaming_bias(
            window, L, S, keep_first=self.keep_first, dtype=query.dtype,
            device=query.device,
        )  # fmt: skip

    def extra_repr(self) -> str:  # part of train_batched's key
        return f"window={self.window}, keep_first={self.keep_first}"


class LearnedSinkSelfAttention(StreamingRotarySelfAttention):
    r"""Causal RoPE self-attention with a learned sink logit per head, as GPT-OSS.

    :class:`StreamingRotarySelfAttention` with one override, the hook
    :meth:`~companion.attention.MultiHeadAttention.attention`, which becomes
    :func:`companion.masks.attention_with_sinks` with this layer's ``sinks`` (one logit
    per head, initialized to zero): each row's weights sum to one minus the sink's share.
    The window and ``keep_first`` are :class:`StreamingRotarySelfAttention`'s.

    Args:
        dim, num_heads, base, window, keep_first: as
            :class:`StreamingRotarySelfAttention`.

    Shape:
        - input: ``(B, L, dim)``
        - output: ``(B, L, dim)``
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        base: float = 10000.0,
        window: int | None = None,
        keep_first: bool = False,
    ) -> None:
        super().__init__(
            dim, num_heads, base=base, window=window, keep_first=keep_first
        )
        self.sinks = nn.Parameter(torch.zeros(self.num_heads))

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """:func:`companion.masks.attention_with_sinks` with this layer's ``sinks``."""
        return attention_with_sinks(q, k, v, self.sinks, mask=mask)

    def extra_repr(self) -> str:  # part of train_batched's key
        return f"sinks={self.num_heads}, {super().extra_repr()}"


class SinkTransformer(TinyTransformer):
    """The tiny RoPE model with no sink, a sink token or a learned sink per head.

    ``sink="none"`` is :class:`companion.model.TinyTransformer` as it is, weight for
    weight from the same seed. ``sink="token"`` adds one learned vector,
    ``sink_token`` ``(dim,)``, drawn like an embedding row, put in front of every
    sequence at slot 0 (position 0; the tokens move to positions ``1 .. L``); its output
    is dropped, so the logits are the tokens'. ``sink="learned"`` builds every attention
    layer as :class:`LearnedSinkSelfAttention`. With ``window`` every layer is a rolling
    cache (:class:`StreamingRotarySelfAttention`'s mask): the last ``W`` slots (the sink
    token's slot counts as one and is evicted like the rest) and, with ``keep_first``,
    slot 0 as well (the sink token, or the first token where there is none);
    :func:`windowed` builds that copy of a trained model.

    Args:
        config: the sizes; ``config.position`` must be ``"rope"``.
        sink: one of :data:`SINK_KINDS`.
        window: ``W`` (a positive int) or ``None``.
        keep_first: keep slot 0 in every query's view (only with a window).

    Shape:
        - input: token ids ``(B, L)``
        - output: logits ``(B, L, vocab_size)``
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        sink: str = "learned",
        window: int | None = None,
        keep_first: bool = False,
    ) -> None:
        _validate.instance("config", config, ModelConfig, "a ModelConfig")
        if config.position != "rope":
            raise ValueError(f"config.position must be 'rope', got {config.position!r}")
        sink = _validate.choice("sink", sink, SINK_KINDS)
        window = _validate.optional(_validate.positive_int, "window", window)
        keep_first = _validate.flag("keep_first", keep_first)
        if keep_first and window is None:
            raise ValueError(
                "keep_first needs a window (without one every slot is kept), got "
                "window=None"
            )
        nn_setattr = object.__setattr__  # plain values, before nn.Module.__init__
        nn_setattr(self, "sink", sink)
        nn_setattr(self, "window", window)
        nn_setattr(self, "keep_first", keep_first)
        super().__init__(config)
        if sink == "token":
            self.sink_token = nn.Parameter(torch.randn(config.dim))

    def _attention(self) -> RotarySelfAttention:
        c = self.config
        view = {"window": self.window, "keep_first": self.keep_first}
        if self.sink == "learned":
            return LearnedSinkSelfAttention(
                c.dim, c.num_heads, base=c.rope_base, **view
            )
        if self.window is not None:
            return StreamingRotarySelfAttention(
                c.dim, c.num_heads, base=c.rope_base, **view
            )
        return RotarySelfAttention(c.dim, c.num_heads, base=c.rope_base)

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.sink != "token":
            return super()._logits(input_ids)
        x = self.embed(input_ids)  # (B, L, D)
        slot = self.sink_token.expand(*x.shape[:-2], 1, x.shape[-1])  # (B, 1, D)
        x = torch.cat([slot, x], dim=-2)  # (B, 1 + L, D): the sink token at slot 0
        x = self.final_norm(self.blocks(x))
        return self.head(x)[..., 1:, :]  # (B, L, V): the sink token's output dropped

    def extra_repr(self) -> str:  # part of train_batched's key
        return f"sink={self.sink!r}, window={self.window}, keep_first={self.keep_first}"


def windowed(
    net: SinkTransformer, window: int, *, keep_first: bool = False
) -> SinkTransformer:
    """A copy of ``net`` (same weights) whose layers keep only the last ``window`` slots:
    StreamingLLM's window attention, the oldest keys evicted and nothing kept; with
    ``keep_first``, slot 0 is kept as well (StreamingLLM's cache with one sink: the sink
    token, or the first token where there is none).

    Args:
        net: a :class:`SinkTransformer`.
        window: ``W``, a positive int.
        keep_first: keep slot 0.

    Returns:
        A new :class:`SinkTransformer` on ``net``'s device, in eval mode.
    """
    _validate.module("net", net, SinkTransformer)
    window = _validate.positive_int("window", window)
    keep_first = _validate.flag("keep_first", keep_first)
    with torch.random.fork_rng(devices=[]):  # building draws weights: leave no trace
        copy = SinkTransformer(
            net.config, sink=net.sink, window=window, keep_first=keep_first
        )
    copy = copy.to(net.embed.weight)  # net's device and dtype, before its weights
    copy.load_state_dict(net.state_dict())
    return copy.eval()


def sink_runs(
    seeds: Sequence[int] | None = None,
    *,
    steps: int = SINK_STEPS,
    lr: float = SINK_LR,
    kinds: Sequence[str] = SINK_KINDS,
    device: torch.device | str | None = None,
) -> dict[str, SeedRuns]:
    """Train one :class:`SinkTransformer` per kind and seed on the trigger-lag task.

    Equivalent to the following, for each kind::

        experiments.run_seeds(lambda: SinkTransformer(SINK_SIZES, sink=kind), seeds,
                              device=device, steps=steps, lr=lr, warmup_steps=10,
                              schedule="cosine", targets=trigger_lag_targets,
                              **SINK_TASK)

    The same seed gives every kind the same batches.

    Args:
        seeds: the seeds (``None``: :func:`~companion.experiments.seeds` ``(SINK_SEEDS)``).
        steps: optimization steps, more than the 10 of the warm-up.
        lr: the peak learning rate, positive.
        kinds: the kinds to train, distinct names from :data:`SINK_KINDS`.
        device: where to train.

    Returns:
        kind -> :class:`~companion.experiments.SeedRuns`.
    """
    seed_list = experiments.seeds(SINK_SEEDS) if seeds is None else seeds
    seed_list = experiments.distinct_seeds("seeds", seed_list)
    steps = _validate.integer("steps", steps, minimum=_WARMUP + 1)
    lr = _validate.positive_real("lr", lr)
    kinds = _validate.choices("kinds", kinds, SINK_KINDS)
    return {
        kind: experiments.run_seeds(
            lambda kind=kind: SinkTransformer(SINK_SIZES, sink=kind),
            seed_list,
            device=device,
            steps=steps,
            lr=lr,
            warmup_steps=_WARMUP,
            schedule="cosine",
            targets=trigger_lag_targets,
            **SINK_TASK,
        )
        for kind in kinds
    }


def sink_probe(num_sequences: int = 256) -> torch.Tensor:
    """Token ids to measure on, the same in every variant of ``make claims``: uniform ids
    of :data:`SINK_SIZES` at the training length, from a generator of their own.

    Shape:
        output: ``(num_sequences, SINK_TASK["length"])`` int64
    """
    num_sequences = _validate.positive_int("num_sequences", num_sequences)
    generator = torch.Generator().manual_seed(20261128)
    shape = (num_sequences, SINK_TASK["length"])
    return torch.randint(SINK_SIZES.vocab_size, shape, generator=generator)


@dataclass
class SinkMeasures:
    """What :func:`measure_sinks` reads from one kind's trained models, one entry per seed.

    Attributes:
        lowest: the lowest mean training loss over 20 consecutive steps, ``(seeds,)``.
        loss: the probe's mean loss at the queries ``t >= W``, every key kept,
            ``(seeds,)``.
        window_loss: the same with only the last ``W`` slots kept (:func:`windowed`),
            ``(seeds,)``.
        accuracy: the probe's accuracy at the queries ``t >= W``, every key kept,
            ``(seeds,)``.
        window_accuracy: the same with only the last ``W`` slots kept, ``(seeds,)``.
        kept_loss: the loss with the last ``W`` slots and slot 0 kept
            (:func:`windowed` with ``keep_first``), ``(seeds,)``.
        kept_accuracy: the accuracy with the last ``W`` slots and slot 0, ``(seeds,)``.
        resting: the weight each head puts on its sink (the learned sink's column, the
            sink token, or for ``"none"`` the first token) from queries at ``t >= start``
            (4 by default) whose token is not a trigger, nothing to read,
            ``(seeds, layers, H)``.
        reading: the same from the trigger queries, ``(seeds, layers, H)``.
    """

    lowest: torch.Tensor
    loss: torch.Tensor
    window_loss: torch.Tensor
    accuracy: torch.Tensor
    window_accuracy: torch.Tensor
    kept_loss: torch.Tensor
    kept_accuracy: torch.Tensor
    resting: torch.Tensor
    reading: torch.Tensor

    def __post_init__(self) -> None:
        _validate.per_seed(self, "lowest", max_ndim=3)


def _sink_share(net: SinkTransformer, ids: torch.Tensor) -> torch.Tensor:
    """Each layer's and head's weight on the sink, per query: ``(layers, B, H, L)``."""
    from companion.modern import attention_maps

    # (layers, B, H, S, S): S = L + 1 with a sink token at slot 0, else S = L; a learned
    # sink's column is dropped
    weights = attention_maps(net, ids)
    if net.sink == "learned":
        return 1 - weights.sum(-1)  # what a row does not give the keys, its sink gets
    share = weights[..., 0]  # key 0: the sink token, or the first token
    return share[..., 1:] if net.sink == "token" else share  # the tokens' queries


@torch.no_grad()
def measure_sinks(
    runs: SeedRuns,
    probe: torch.Tensor | None = None,
    *,
    window: int = SINK_WINDOW,
    start: int = 4,
) -> SinkMeasures:
    """Read one kind's trained models: losses with every key, with the last ``window``
    slots, and with those and slot 0, and the sink's share of the queries with and
    without a trigger.

    Args:
        runs: one kind's :class:`~companion.experiments.SeedRuns` from :func:`sink_runs`.
        probe: token ids (``None``: :func:`sink_probe`).
        window: ``W`` of the evaluation, at least ``lag + 1`` (a trigger's answer kept).
        start: the first query whose sink share is counted.

    Returns:
        A :class:`SinkMeasures`.
    """
    _validate.instance("runs", runs, SeedRuns, "a SeedRuns")
    for i, net in enumerate(runs.models):
        _validate.module(f"runs.models[{i}]", net, SinkTransformer)
        if net.config != runs.models[0].config:
            raise ValueError(
                f"runs.models must share one config, got runs.models[{i}].config="
                f"{net.config} and runs.models[0].config={runs.models[0].config}"
            )
        if net.window is not None:
            raise ValueError(
                f"runs.models[{i}] must see every key (window=None; measure_sinks "
                f"builds the windowed copies), got window={net.window}"
            )
    for i, curve in enumerate(runs.losses):
        if not curve:
            raise ValueError(f"runs.losses[{i}] must hold the run's losses, got none")
    vocab_size = runs.models[0].config.vocab_size
    probe = sink_probe() if probe is None else probe
    _validate.tensor("probe", probe, dtype="integer", ndim=2, meaning="(B, L)")
    lag = SINK_TASK["lag"]
    window = _validate.integer("window", window, minimum=lag + 1)
    start = _validate.nonnegative_int("start", start)
    length = probe.shape[1]
    if probe.shape[0] == 0 or max(window, start) >= length:
        raise ValueError(
            f"probe must hold sequences longer than window ({window}) and start "
            f"({start}), got shape {tuple(probe.shape)}"
        )
    if probe.min() < 0 or probe.max() >= vocab_size:
        raise ValueError(
            f"probe must be token ids in [0, {vocab_size - 1}] (the models' vocab_size), "
            f"got ids from {probe.min().item()} to {probe.max().item()}"
        )
    counted = probe[:, start:] < SINK_TRIGGERS
    if counted.all() or not counted.any():
        raise ValueError(
            f"probe must hold triggers (ids below {SINK_TRIGGERS}) and other tokens at "
            f"the queries t >= start={start}, got only one kind"
        )
    targets = trigger_lag_targets(probe, vocab_size=vocab_size)
    trigger = probe < SINK_TRIGGERS
    rows: dict[str, list] = {k: [] for k in SinkMeasures.__dataclass_fields__}
    for net, curve in zip(runs.models, runs.losses, strict=True):
        device = net.embed.weight.device
        ids, tgt = probe.to(device), targets[:, window:].to(device)
        views = (
            ("", net),
            ("window_", windowed(net, window)),
            ("kept_", windowed(net, window, keep_first=True)),
        )
        for prefix, model in views:
            logits = model(ids)[:, window:]  # (B, L - W, V): windows past slot 0
            loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten())
            rows[prefix + "loss"].append(loss.item())
            rows[prefix + "accuracy"].append(
                (logits.argmax(-1) == tgt).double().mean().item()
            )
        share = _sink_share(net, ids)[..., start:].cpu().double()  # (layers, B, H, L')
        for name, where in (("resting", ~trigger), ("reading", trigger)):
            w = where[:, None, start:].double()  # (B, 1, L')
            rows[name].append((share * w).sum((1, 3)) / w.sum((0, 2)))  # (layers, H)
        window_20 = min(20, len(curve))
        curve_64 = torch.tensor(curve, dtype=torch.float64)
        rows["lowest"].append(curve_64.unfold(0, window_20, 1).mean(-1).min().item())
    return SinkMeasures(
        **{
            k: torch.stack(v) if isinstance(v[0], torch.Tensor) else torch.tensor(v)
            for k, v in rows.items()
        }
    )
