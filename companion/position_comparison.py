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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from companion import _validate, experiments
from companion.model import ModelConfig, TinyTransformer, position_accuracy
from companion.relative import COMPARISON_SCHEMES, position_family_model

__all__ = [
    "POSITION_FAMILY_SEEDS",
    "POSITION_FAMILY_STEPS",
    "POSITION_FAMILY_T5_SEEDS",
    "PositionComparison",
    "compare_position_schemes",
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
            default above.
        training_length: ``L_0``.
        eval_length: the evaluation length, more than ``L_0``.
        lag: the task's lag, less than ``L_0``.
        batch_size: sequences per step.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps.
        num_sequences: evaluation sequences.
        progress: print the mean loss while training.

    Returns:
        A :class:`PositionComparison`.
    """
    if schemes is None:
        schemes = COMPARISON_SCHEMES
    if isinstance(schemes, str) or not isinstance(schemes, Sequence) or not schemes:
        raise _validate.fail(
            TypeError, "schemes", "a non-empty sequence of names", schemes
        )
    options = (*COMPARISON_SCHEMES, "sinusoidal", "learned")
    schemes = tuple(
        _validate.choice(f"schemes[{i}]", s, options) for i, s in enumerate(schemes)
    )
    if len(set(schemes)) != len(schemes):
        raise ValueError(f"schemes must not repeat a name, got {schemes}")
    seed_list = (
        experiments.seeds(3)
        if seeds is None
        else experiments.distinct_seeds("seeds", seeds)
    )
    if config is None:
        config = ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=2)
    _validate.instance("config", config, ModelConfig, "a ModelConfig")
    training_length = _validate.positive_int("training_length", training_length)
    eval_length = _validate.positive_int("eval_length", eval_length)
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
        nets = [
            experiments.build(lambda s=scheme: position_family_model(s, config), seed)
            for _, seed in jobs
        ]
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
