r"""The position family compared in training: chapter :ref:`ch-relative`'s trained runs.

:func:`compare_position_schemes` trains one tiny model per position scheme and seed (no
positions, ALiBi, RoPE, p-RoPE, T5's buckets, Shaw's and Transformer-XL's relative
terms: ``companion.relative.COMPARISON_SCHEMES``) on the lag task of
:func:`companion.model.lag_task` at the training length :math:`L_0`, then scores each
model at every position :math:`t` of one evaluation batch of :math:`N` sequences longer
than :math:`L_0` (:func:`companion.model.position_accuracy`), with lag :math:`k`,

.. math::
    \mathrm{acc}(t) = \frac{1}{N} \sum_{n=1}^{N}
    \mathbb{1}\big[\arg\max_v z_{n,t,v} = x_{n,t-k}\big], \qquad t \ge k .

:class:`PositionComparison` holds the curves and averages them over the trained band
:math:`k \le t < L_0` (:meth:`PositionComparison.inside`) and over the positions beyond
it, :math:`t \ge L_0` (:meth:`PositionComparison.beyond`): what a scheme does past the
length it saw.

Why RoPE fails past twice the training length is read in two halves. Without training,
:func:`pair_alias_offsets` gives, for every distance, how far its angle under one RoPE
pair lies from the answer's, modulo a turn: a key with a small offset is an *alias* of the
answer for that pair, and the chapter reads the keys it sees in order of that offset (no
fixed threshold). On the trained models, :func:`most_attended_key` finds the key a query
attends to most and splits its score and the answer's into each pair's cosine and sine
parts (:func:`companion.rope_variants.rope_pair_scores`).

Every model is built and trained by :mod:`companion.experiments`
(:func:`~companion.experiments.build`, :func:`~companion.experiments.train_batched`), so
the numeric variants of ``make claims`` act on it; ``tests/test_relative_claims.py``
calls :func:`compare_position_schemes` with the chapter's constants
(:data:`POSITION_FAMILY_STEPS`, :data:`POSITION_FAMILY_SEEDS`,
:data:`POSITION_FAMILY_T5_SEEDS`), so the claims it checks are the chapter's own.

Shape:
    - ``PositionComparison.losses[scheme]``: ``(seeds, steps)``
    - ``PositionComparison.accuracy[scheme]``: ``(seeds, eval_length)``, ``nan`` at
      ``t < lag``
    - :func:`pair_alias_offsets`: ``(length,)``, one offset per distance
    - ``AttendedKey.distance``, ``.weight``, ``.answer_weight``: ``(models,)``;
      ``.at_key``, ``.at_answer``: ``(models, 2, P)`` (cosine, sine; ``P = D/2`` pairs)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from companion import _validate, experiments
from companion.model import (
    CausalSelfAttention,
    ModelConfig,
    RotarySelfAttention,
    TinyTransformer,
    position_accuracy,
)
from companion.modern import attention_maps
from companion.relative import COMPARISON_SCHEMES, position_family_model
from companion.rope_variants import PRoPESelfAttention, rope_pair_scores

__all__ = [
    "POSITION_FAMILY_SEEDS",
    "POSITION_FAMILY_STEPS",
    "POSITION_FAMILY_T5_SEEDS",
    "AttendedKey",
    "PositionComparison",
    "compare_position_schemes",
    "most_attended_key",
    "pair_alias_offsets",
]


POSITION_FAMILY_STEPS: dict[str, int | tuple[int, ...]] = {
    "none": (500, 1000),  # the slow learners: a fixed budget, and half of it beside
    "alibi": (500, 1000),
    "rope": 400,  # the others reach a loss near zero within 400 steps
    "p_rope": 400,
    "t5": 400,
    "shaw": 400,
    "transformer_xl": 400,
}
"""Chapter 4's budgets per scheme, for :func:`compare_position_schemes`'s ``steps``."""

POSITION_FAMILY_SEEDS = 3
"""Chapter 4's seed count for every scheme, as in
:func:`~companion.experiments.seeds` ``(POSITION_FAMILY_SEEDS)``."""

POSITION_FAMILY_T5_SEEDS = 6
"""Chapter 4 trains T5 again over :func:`~companion.experiments.seeds`
``(POSITION_FAMILY_T5_SEEDS)``: its outcome beyond the training length is a frequency
over seeds."""


@dataclass(frozen=True)
class PositionComparison:
    """What :func:`compare_position_schemes` returns.

    Attributes:
        schemes: the schemes, in order.
        seeds: the seeds (one model per scheme and seed).
        training_length: ``L_0``, the length trained on.
        lag: the task's lag.
        losses: scheme -> training loss at each step, ``(seeds, steps)``.
        accuracy: scheme -> accuracy at each position of the evaluation length,
            ``(seeds, eval_length)`` (``nan`` at ``t < lag``).
        models: scheme -> the trained models, one per seed.
        shorter: ``(scheme, steps)`` -> the accuracy at each position, ``(seeds,
            eval_length)``, of the same seeds trained for a smaller budget (when
            ``steps`` gave the scheme several).
    """

    schemes: tuple[str, ...]
    seeds: tuple[int, ...]
    training_length: int
    lag: int
    losses: dict[str, torch.Tensor]
    accuracy: dict[str, torch.Tensor]
    models: dict[str, list[TinyTransformer]]
    shorter: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)

    def band(self, scheme: str, start: int, stop: int) -> torch.Tensor:
        """Each seed's mean accuracy over positions ``start <= t < stop``, ``(seeds,)``."""
        scheme = _validate.choice("scheme", scheme, self.schemes)
        return self.accuracy[scheme][:, start:stop].mean(dim=1)

    def inside(self, scheme: str) -> torch.Tensor:
        """Accuracy on the trained positions ``lag <= t < L_0``, per seed."""
        return self.band(scheme, self.lag, self.training_length)

    def beyond(self, scheme: str) -> torch.Tensor:
        """Accuracy on the positions beyond the training length only, ``t >= L_0``,
        per seed."""
        eval_length = next(iter(self.accuracy.values())).shape[-1]
        return self.band(scheme, self.training_length, eval_length)

    def final_loss(self, scheme: str, window: int = 50) -> torch.Tensor:
        """Each seed's mean training loss over the last ``window`` steps."""
        scheme = _validate.choice("scheme", scheme, self.schemes)
        window = _validate.positive_int("window", window)
        return self.losses[scheme][:, -window:].mean(dim=1)

    def table(self) -> str:
        """A Markdown table: per scheme, the accuracy inside and beyond ``L_0`` as
        mean ± standard deviation over the seeds (lowest–highest), and the final loss."""

        def cell(v: torch.Tensor) -> str:
            sd = v.std(correction=1).item() if v.numel() > 1 else 0.0
            return f"{v.mean():.3f} ± {sd:.3f} ({v.min():.2f}–{v.max():.2f})"

        eval_length = next(iter(self.accuracy.values())).shape[-1]
        rows = [
            f"| scheme | inside: t = {self.lag}–{self.training_length - 1} | beyond "
            f"only: t = {self.training_length}–{eval_length - 1} | final loss |",
            "|---|---|---|---|",
        ]
        for s in self.schemes:
            rows.append(
                f"| {s} | {cell(self.inside(s))} | {cell(self.beyond(s))} | "
                f"{self.final_loss(s).mean():.3f} |"
            )
        return "\n".join(rows)


def compare_position_schemes(
    schemes: Sequence[str] | None = None,
    *,
    seeds: Sequence[int] | None = None,
    steps: int | dict[str, int | tuple[int, ...]] = 400,
    config: ModelConfig | None = None,
    training_length: int = 16,
    eval_length: int = 64,
    lag: int = 2,
    batch_size: int = 32,
    lr: float = 1e-2,
    warmup_steps: int = 50,
    num_sequences: int = 256,
    progress: bool = False,
    builders: Mapping[str, Callable[[ModelConfig], TinyTransformer]] | None = None,
) -> PositionComparison:
    """Train every scheme on the lag task with every seed and measure the accuracy at
    each position up to ``eval_length`` (the trained comparison of chapter 4).

    The test bench is :mod:`companion.model`'s: a :class:`~companion.model.TinyTransformer`
    (default: vocabulary 16, width 32, 4 heads, 2 layers) with the position scheme of
    :func:`companion.relative.position_family_model`, built by
    :func:`~companion.experiments.build` (so ``COMPANION_INIT_JITTER`` acts on it),
    trained by :func:`~companion.experiments.train_batched` (all seeds and budgets of a
    scheme as one batched model, AdamW, linear warm-up then a cosine decay) on
    :func:`companion.model.lag_task` at ``training_length``, then scored by
    :func:`companion.model.position_accuracy` on one evaluation batch of
    ``eval_length`` positions. Seed ``s`` builds its model from seed ``s`` and draws its
    batches from seed ``s``. Every argument is checked before the first model is built.

    Args:
        schemes: names from ``companion.relative.COMPARISON_SCHEMES`` (or
            ``"sinusoidal"``, ``"learned"``), without repeats; ``None``: all of
            ``COMPARISON_SCHEMES``.
        seeds: at least one seed, without repeats; ``None``:
            :func:`~companion.experiments.seeds` ``(3)``.
        steps: optimization steps per model: one number, or one per scheme (a dict
            from every scheme to its steps: the slow learners can get more). A tuple
            of budgets for a scheme trains its seeds at each, in one batched run;
            the largest gives the results, the others go to
            :attr:`PositionComparison.shorter`.
        config: the model sizes (``position`` is set per scheme); ``None`` for the
            default above, with ``max_len = eval_length`` (the rows of a learned table).
        training_length: ``L_0``.
        eval_length: the evaluation length, more than ``L_0``.
        lag: the task's lag, less than ``L_0``.
        batch_size: sequences per step.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps.
        num_sequences: evaluation sequences.
        progress: print the mean loss while training.
        builders: schemes of the caller's own: name -> a function from the config to
            a fresh model (chapter 10's hybrid,
            :func:`companion.hybrid_positions.compare_hybrid_positions`); a name here
            may appear in ``schemes`` and must not be a built-in scheme's.

    Returns:
        A :class:`PositionComparison`.
    """
    if schemes is None:
        schemes = COMPARISON_SCHEMES
    if isinstance(schemes, str) or not isinstance(schemes, Sequence) or not schemes:
        raise _validate.fail(
            TypeError, "schemes", "a non-empty sequence of names", schemes
        )  # before builders is read: the names are checked below, against it too
    options = (*COMPARISON_SCHEMES, "sinusoidal", "learned")
    if builders is None:
        builders = {}
    _validate.instance("builders", builders, Mapping, "a dict of name -> function")
    for name, make in builders.items():
        if not isinstance(name, str) or name in options:
            raise ValueError(
                f"builders must name schemes of its own (not {options}), got {name!r}"
            )
        _validate.callable_(f"builders[{name!r}]", make)
    options = (*options, *builders)
    schemes = _validate.choices("schemes", schemes, options)
    seed_list = (
        experiments.seeds(3)
        if seeds is None
        else experiments.distinct_seeds("seeds", seeds)
    )
    training_length = _validate.positive_int("training_length", training_length)
    eval_length = _validate.positive_int("eval_length", eval_length)
    if config is None:  # max_len sizes a learned table only (the capstone's bench: 64)
        config = ModelConfig(
            vocab_size=16, dim=32, num_heads=4, num_layers=2, max_len=eval_length
        )
    _validate.instance("config", config, ModelConfig, "a ModelConfig")
    if eval_length <= training_length:
        raise ValueError(
            f"eval_length must be more than training_length={training_length}, got "
            f"{eval_length}"
        )
    if isinstance(steps, dict):
        missing = [s for s in schemes if s not in steps]
        if missing:
            raise ValueError(
                f"steps must give every scheme its steps, missing {missing}"
            )
        budget = {}
        for s in schemes:
            given = steps[s] if isinstance(steps[s], tuple) else (steps[s],)
            if not given:
                raise ValueError(f"steps[{s!r}] must hold at least one budget, got ()")
            counts = [_validate.positive_int(f"steps[{s!r}]", n) for n in given]
            if len(set(counts)) != len(counts):
                raise ValueError(f"steps[{s!r}] must not repeat a budget, got {given}")
            budget[s] = tuple(sorted(counts))
    else:
        budget = dict.fromkeys(schemes, (_validate.positive_int("steps", steps),))
    lr = _validate.positive_real("lr", lr)
    warmup_steps = _validate.nonnegative_int("warmup_steps", warmup_steps)
    num_sequences = _validate.positive_int("num_sequences", num_sequences)
    progress = _validate.flag("progress", progress)
    batch_size = _validate.positive_int("batch_size", batch_size)
    lag = _validate.positive_int("lag", lag)
    if lag >= training_length:
        raise ValueError(
            f"lag must be less than training_length={training_length}, got {lag}"
        )
    config = replace(config, max_len=max(config.max_len, eval_length))

    losses: dict[str, torch.Tensor] = {}
    accuracy: dict[str, torch.Tensor] = {}
    models: dict[str, list[TinyTransformer]] = {}
    shorter: dict[tuple[str, int], torch.Tensor] = {}
    for scheme in schemes:
        jobs = [(n, seed) for n in budget[scheme] for seed in seed_list]
        make = builders.get(scheme, lambda c, s=scheme: position_family_model(s, c))
        nets = [experiments.build(lambda m=make: m(config), seed) for _, seed in jobs]
        if progress:
            print(f"{scheme}: seeds {seed_list}, {budget[scheme]} steps")
        runs = experiments.train_batched(
            nets,
            seeds=[seed for _, seed in jobs],
            steps=[n for n, _ in jobs],
            batch_size=batch_size,
            length=training_length,
            lag=lag,
            lr=lr,
            warmup_steps=warmup_steps,
            schedule="cosine",
            progress=progress,
        )
        acc = [
            position_accuracy(
                net, length=eval_length, lag=lag, num_sequences=num_sequences
            )
            for net in nets
        ]
        last = len(jobs) - len(seed_list)  # the largest budget: the last seeds' jobs
        losses[scheme] = torch.tensor(
            [r.losses for r in runs[last:]], dtype=torch.float64
        )
        accuracy[scheme] = torch.stack(acc[last:])
        models[scheme] = nets[last:]
        for k, n in enumerate(budget[scheme][:-1]):
            shorter[scheme, n] = torch.stack(
                acc[k * len(seed_list) : (k + 1) * len(seed_list)]
            )
    return PositionComparison(
        schemes, seed_list, training_length, lag, losses, accuracy, models, shorter
    )


# ---- Why RoPE fails past twice the length: aliases under the fastest pair ------------

_ROPE_LAYERS = (RotarySelfAttention, PRoPESelfAttention)


def pair_alias_offsets(theta: float, *, lag: int, length: int) -> torch.Tensor:
    r"""How far each distance's angle under one RoPE pair lies from the answer's, modulo a
    turn: the training-free half of chapter :ref:`ch-relative`'s reading of RoPE's
    failure past twice the training length.

    A pair turning by :math:`\theta` per position gives a key :math:`d` places back the
    angle :math:`d\theta`, and the answer of the lag task (``lag`` places back)
    :math:`k\theta`. The pair cannot tell the two apart where their difference is a whole
    number of turns; the offset returned is that difference wrapped into
    :math:`[-\pi, \pi)`,

    .. math::
        \delta(d) = \big((d - k)\theta + \pi\big) \bmod 2\pi - \pi,

    so :math:`|\delta(d)|` small means the key is an alias of the answer for this pair.
    For the book's bench (head width 8, base :math:`10^4`) the fastest pair has
    :math:`\theta_0 = 1`: a key 46 back differs from the answer by 44 rad, seven turns
    and about 0.018 rad. Computed in float64.

    Args:
        theta: the pair's angle per position, in radians (finite, positive).
        lag: the answer's distance :math:`k`, an int >= 0.
        length: how many distances, :math:`d = 0, \dots, \text{length} - 1`.

    Returns:
        ``(length,)`` float64, entry :math:`d` the offset :math:`\delta(d)`.
    """
    theta = _validate.real("theta", theta, exclusive_minimum=0.0)
    lag = _validate.nonnegative_int("lag", lag)
    length = _validate.positive_int("length", length)
    d = torch.arange(length, dtype=torch.float64)
    return torch.remainder((d - lag) * theta + math.pi, 2 * math.pi) - math.pi


@dataclass(frozen=True)
class AttendedKey:
    """What :func:`most_attended_key` returns: one entry per model.

    Attributes:
        query: the query position :math:`t`.
        lag: the answer's distance :math:`k` (the answer is the key at :math:`t - k`).
        distance: ``(models,)`` int64, the distance :math:`t - j` of the key :math:`j`
            with the largest weight, mean over the probe's sequences and the heads.
        weight: ``(models,)`` float64, that key's mean weight.
        answer_weight: ``(models,)`` float64, the answer's mean weight.
        at_key: ``(models, 2, P)`` float64, each RoPE pair's cosine (index 0) and sine
            (index 1) part of the score of that key
            (:func:`companion.rope_variants.rope_pair_scores`), mean over the sequences
            and the heads.
        at_answer: ``(models, 2, P)`` float64, the same for the answer.
    """

    query: int
    lag: int
    distance: torch.Tensor
    weight: torch.Tensor
    answer_weight: torch.Tensor
    at_key: torch.Tensor
    at_answer: torch.Tensor

    @property
    def gap(self) -> torch.Tensor:
        """``at_key - at_answer``, ``(models, 2, P)``: what each part of each pair gives
        the most attended key more than the answer."""
        return self.at_key - self.at_answer


def most_attended_key(
    models: Sequence[TinyTransformer],
    probe: torch.Tensor,
    *,
    query: int,
    lag: int,
    layer: int = -1,
) -> AttendedKey:
    r"""The key one query of each RoPE model attends to most, and each RoPE pair's share of
    its score next to the answer's: the trained half of chapter :ref:`ch-relative`'s
    reading of RoPE's failure past twice the training length.

    For each model, the attention weights of ``layer``
    (:func:`companion.modern.attention_maps`) at query ``query`` are averaged over the
    probe's sequences and the heads; the key with the largest mean weight is the most
    attended one. Its score and the answer's (the key ``lag`` places back) are split into
    each pair's cosine and sine parts by :func:`companion.rope_variants.rope_pair_scores`,
    averaged the same way, so the chapter can read which pair gives the winning key more
    than the answer and which gives it about as much (an alias under that pair, see
    :func:`pair_alias_offsets`).

    Args:
        models: one or more :class:`~companion.model.TinyTransformer` with RoPE layers
            (e.g. ``PositionComparison.models["rope"]``).
        probe: token ids, ``(B, L)``, with ``L > query``.
        query: the query position :math:`t`, at least ``lag``.
        lag: the answer's distance :math:`k`, an int >= 1.
        layer: which attention layer, as a Python index (``-1``: the last).

    Returns:
        An :class:`AttendedKey`.
    """
    models = _validate.sequence("models", models, what="RoPE models")
    if not models:
        raise ValueError("models must hold at least one model, got 0")
    depth = set()
    for i, net in enumerate(models):
        _validate.module(f"models[{i}]", net, TinyTransformer)
        layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]
        kinds = sorted({type(m).__name__ for m in layers})
        if not layers or any(type(m) not in _ROPE_LAYERS for m in layers):
            raise ValueError(
                f"models[{i}] must use RoPE or p-RoPE attention in every layer, got "
                f"{kinds}"
            )
        depth.add(len(layers))
    probe = _validate.tensor(
        "probe", probe, dtype="integer", ndim=2, nonempty=True, meaning="(B, L)"
    )
    lag = _validate.positive_int("lag", lag)
    query = _validate.integer("query", query, minimum=lag, maximum=probe.shape[-1] - 1)
    layer = _validate.integer(
        "layer", layer, minimum=-min(depth), maximum=min(depth) - 1
    )
    distance, weight, answer_weight, at_key, at_answer = [], [], [], [], []
    answer = query - lag
    for net in models:
        parts = rope_pair_scores(net, probe, layer=layer)  # (2, P, B, H, L, S)
        with torch.no_grad():
            maps = attention_maps(net, probe)[layer]  # (B, H, L, S)
        row = maps[..., query, : query + 1].double().mean(dim=(0, 1))  # (t + 1,)
        key = int(row.argmax())
        split = parts[..., query, :].mean(dim=(2, 3))  # (2, P, S)
        distance.append(query - key)
        weight.append(row[key])
        answer_weight.append(row[answer])
        at_key.append(split[..., key])
        at_answer.append(split[..., answer])
    return AttendedKey(
        query,
        lag,
        torch.tensor(distance, dtype=torch.int64),
        torch.stack(weight),
        torch.stack(answer_weight),
        torch.stack(at_key),
        torch.stack(at_answer),
    )
