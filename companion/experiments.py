r"""The book's training: one home for its loops, seeds, perturbations and result tables.

Chapters 4, 7 and 9 train small models (the lag task of :func:`companion.model.lag_task`)
and report what the runs show. Trained outcomes are chaotic at the level of floating-point
rounding: the same seed on another processor, with another thread count or another ATen
kernel can end elsewhere. So the book states a trained result only as what holds across
seeds *and* across numeric variants that stand for other processors, and every model a
chapter trains is built here, where those variants act:

* :func:`build` seeds the global generators and builds one model, then multiplies each
  initial weight by ``1 + eps * u`` (``u`` uniform in ``[-1, 1]`` from a generator of its
  own, so the data and the seeds stay put) when the environment variable
  ``COMPANION_INIT_JITTER=<eps>`` is set (:func:`init_jitter`, :func:`jitter_`);
* :func:`seeds` gives a chapter its seeds: ``0 .. n - 1``, shifted by
  ``COMPANION_SEED_OFFSET`` when that is set (the harness's "other seeds" variant);
* :func:`train` is the plain loop, one model at a time; :func:`train_batched` trains
  several models of one configuration as one batched model (the same updates, computed
  together), each at its own number of steps and warm-up if asked;
* :func:`run_seeds` builds and trains one configuration over several seeds and returns a
  :class:`SeedRuns`, whose :meth:`SeedRuns.summary` gives the mean and spread the chapters
  print.

``make claims`` (``scripts/claims.py``) reruns every trained claim (``tests/test_*claims*.py``,
marker ``trained``) with the jitter at ``+1e-7`` and ``-1e-7``, on one thread, with
``ATEN_CPU_CAPABILITY=default`` and with other seeds, and prints which claims held in
every variant. The book keeps only those.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn import functional as F

from companion import _validate
from companion.environment import seed_everything
from companion.model import (
    ModelConfig,
    TinyTransformer,
    check_lag_task,
    lag_task,
    model_config,
    position_accuracy,
)

__all__ = [
    "JITTER_ENV",
    "POSITION_FAMILY_STEPS",
    "SEED_OFFSET_ENV",
    "PositionComparison",
    "SeedRuns",
    "TrainingRun",
    "build",
    "compare_position_schemes",
    "init_jitter",
    "jitter_",
    "run_seeds",
    "seed_offset",
    "seeds",
    "summary_table",
    "train",
    "train_batched",
]

JITTER_ENV = "COMPANION_INIT_JITTER"
"""The environment variable that, set to ``eps``, makes :func:`build` jitter weights."""

SEED_OFFSET_ENV = "COMPANION_SEED_OFFSET"
"""The environment variable that shifts every seed :func:`seeds` hands out."""

_JITTER_STREAM = (
    0x5EED_0F_F5E7  # the jitter's generator: seed + this, apart from the data's
)


# ---- Variants: the jitter and the seeds --------------------------------------------------


def init_jitter() -> float:
    """The relative jitter of initial weights asked for by ``COMPANION_INIT_JITTER``.

    Returns:
        ``eps`` as a float, ``0.0`` when the variable is unset or empty.

    Raises:
        ValueError: the variable is set to something that is not a finite number with
            ``|eps| < 1``.
    """
    text = os.environ.get(JITTER_ENV, "").strip()
    if not text:
        return 0.0
    try:
        eps = float(text)
    except ValueError:
        raise ValueError(
            f"{JITTER_ENV} must be a number such as 1e-7, got {text!r}"
        ) from None
    if not math.isfinite(eps) or abs(eps) >= 1:
        raise ValueError(
            f"{JITTER_ENV} must be a finite number with |eps| < 1, got {text!r}"
        )
    return eps


def seed_offset() -> int:
    """The shift ``COMPANION_SEED_OFFSET`` asks for (``0`` when unset)."""
    text = os.environ.get(SEED_OFFSET_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(
            f"{SEED_OFFSET_ENV} must be a non-negative integer, got {text!r}"
        )
    return int(text)


def seeds(n: int) -> tuple[int, ...]:
    """The ``n`` seeds of an experiment: ``(0, 1, ..., n - 1)``, each shifted by
    ``COMPANION_SEED_OFFSET`` when that is set.

    Args:
        n: how many seeds, positive.

    Returns:
        A tuple of ``n`` distinct non-negative ints.
    """
    n = _validate.positive_int("n", n)
    offset = seed_offset()
    return tuple(range(offset, offset + n))


@torch.no_grad()
def jitter_(model: nn.Module, eps: float, *, seed: int) -> nn.Module:
    r"""Multiply every parameter of ``model`` in place by ``1 + eps * u``.

    .. math:: w \leftarrow w \, (1 + \epsilon u), \qquad u \sim U[-1, 1]

    ``u`` is drawn for each entry from a :class:`torch.Generator` of its own, seeded from
    ``seed``, on the CPU: the global generators (which the data and later draws use) are
    left as they were, and the same ``(seed, eps)`` gives the same weights everywhere.
    ``eps = 0`` leaves the model bit for bit as it was.

    Args:
        model: the module whose parameters to perturb.
        eps: the relative size of the perturbation, ``|eps| < 1``.
        seed: a non-negative int: the model's seed.

    Returns:
        ``model`` itself.
    """
    _validate.module("model", model)
    eps = _validate.real("eps", eps, minimum=-1.0, maximum=1.0)
    if abs(eps) == 1.0:
        raise ValueError(f"eps must satisfy |eps| < 1, got {eps}")
    seed = _validate.integer("seed", seed, minimum=0, maximum=2**62)
    if eps == 0.0:
        return model
    generator = torch.Generator().manual_seed(seed + _JITTER_STREAM)
    for p in model.parameters():
        u = torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1
        # in float64, then rounded once: a float32 factor 1 + 1e-7 u would itself round
        # to 1 or 1 +- one float32 step (1.2e-7) and leave most weights unchanged
        scaled = p.detach().cpu().double() * (1 + eps * u)
        p.copy_(scaled.to(device=p.device, dtype=p.dtype))
    return model


def build(
    factory: Callable[[], nn.Module],
    seed: int,
    *,
    device: torch.device | str | None = None,
) -> nn.Module:
    """Build one model of an experiment: seed, construct, jitter, move.

    Equivalent to the following::

        companion.seed_everything(seed)  # the same initial weights for the same seed
        model = factory()
        jitter_(model, init_jitter(), seed=seed)  # a no-op unless COMPANION_INIT_JITTER
        model.to(device)

    Args:
        factory: a function of no arguments that returns a fresh module (e.g.
            ``lambda: TinyTransformer(config)``).
        seed: the model's seed, a non-negative int.
        device: where to put the model (``None``: where the factory made it).

    Returns:
        The module the factory made, jittered and moved.
    """
    if isinstance(factory, nn.Module):  # a module is callable, but runs forward()
        raise _validate.fail(
            TypeError,
            "factory",
            "a function that returns a fresh model (e.g. lambda: TinyTransformer(config))",
            factory,
        )
    _validate.callable_("factory", factory)
    seed = _validate.integer("seed", seed, minimum=0, maximum=2**32 - 1)
    device = _validate.device("device", device)
    eps = init_jitter()
    seed_everything(seed)
    model = factory()
    if not isinstance(model, nn.Module):
        raise _validate.fail(
            TypeError, "factory()", "an nn.Module (a fresh model)", model
        )
    jitter_(model, eps, seed=seed)
    return model if device is None else model.to(device)


# ---- Training loops ----------------------------------------------------------------------


@dataclass
class TrainingRun:
    """What :func:`train` returns: the loss at every step and the learning rate used."""

    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("losses", "learning_rates"):
            value = getattr(self, name)
            if not isinstance(value, list):
                raise _validate.fail(TypeError, name, "a list of floats", value)
        if len(self.learning_rates) != len(self.losses):
            raise ValueError(
                f"learning_rates must hold one rate per loss ({len(self.losses)}), got "
                f"{len(self.learning_rates)}"
            )


def _schedule(
    steps: object, lr: object, warmup_steps: object, seed: object
) -> tuple[int, float, int]:
    steps = _validate.positive_int("steps", steps)
    lr = _validate.positive_real("lr", lr)
    warmup_steps = _validate.nonnegative_int("warmup_steps", warmup_steps)
    _validate.integer("seed", seed, minimum=0)
    return steps, lr, warmup_steps


SCHEDULES = ("constant", "cosine")


def _rate(lr: float, warmup_steps: int, step: int, steps: int, schedule: str) -> float:
    """Linear warm-up over ``warmup_steps``, then constant or a cosine decay to zero."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)  # 0 .. 1
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(
    model: nn.Module,
    *,
    steps: int,
    batch_size: int,
    length: int,
    lag: int,
    lr: float = 3e-3,
    warmup_steps: int = 0,
    schedule: str = "constant",
    seed: int = 0,
) -> TrainingRun:
    """Train ``model`` on :func:`companion.model.lag_task` with AdamW and a cross-entropy loss.

    The learning rate rises linearly over ``warmup_steps`` (none by default) and then
    stays constant (``schedule="constant"``, so a comparison with and without warm-up
    changes one thing only) or falls to zero along half a cosine (``"cosine"``).
    Batches come from a generator seeded with ``seed``; seed the model's initialization
    yourself (:func:`companion.environment.seed_everything`) before building it.

    Args:
        model: a :class:`~companion.model.TinyTransformer` (any module with its ``.config`` that maps
            ``(B, L)`` ids to logits).
        steps: optimization steps.
        batch_size: sequences per step.
        length: training length ``L_train``.
        lag: the task's lag.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps (0 for none).
        schedule: ``"constant"`` or ``"cosine"`` after the warm-up.
        seed: seed of the batch generator, a non-negative int.

    Returns:
        A :class:`TrainingRun` with one loss per step.
    """
    config = model_config("model", model)
    steps, lr, warmup_steps = _schedule(steps, lr, warmup_steps, seed)
    schedule = _validate.choice("schedule", schedule, SCHEDULES)
    check_lag_task(batch_size, length, lag, config.vocab_size)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    run = TrainingRun()
    model.train()
    for step in range(steps):
        rate = _rate(lr, warmup_steps, step, steps, schedule)
        for group in optimizer.param_groups:
            group["lr"] = rate
        tokens, targets = lag_task(
            batch_size,
            length,
            lag=lag,
            vocab_size=config.vocab_size,
            generator=generator,
            device=device,
        )
        logits = model(tokens)  # (B, L, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # skips -100
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        run.losses.append(loss.item())
        run.learning_rates.append(rate)
    model.eval()
    return run


class _Logits(nn.Module):
    """Wraps a :class:`TinyTransformer` to call it without the value checks (vmap)."""

    def __init__(self, net: TinyTransformer) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net._logits(input_ids)


def train_batched(
    models: Sequence[TinyTransformer],
    *,
    seeds: Sequence[int],
    steps: int | Sequence[int],
    batch_size: int,
    length: int,
    lag: int,
    lr: float = 3e-3,
    warmup_steps: int | Sequence[int] = 0,
    schedule: str = "constant",
    targets: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
) -> list[TrainingRun]:
    """Train several models of one configuration at once, as one batched model.

    Equivalent to the following, computed together::

        [train(m, steps=n, warmup_steps=w, ..., seed=s)
         for m, s, n, w in zip(models, seeds, steps, warmup_steps)]

    The models' parameters are stacked along a new leading axis
    (:func:`torch.func.stack_module_state`), one forward pass is
    :func:`torch.vmap` of :func:`torch.func.functional_call` over that axis and over the
    models' own batches, and one AdamW update (``weight_decay=0``, as :func:`train`)
    steps all stacked tensors, each model at its own learning rate. AdamW acts element
    by element, so each model gets exactly its own update; the batched matrix products
    may round differently from one-at-a-time ones (last-bit differences). The trained
    weights are copied back into ``models``.

    ``steps`` and ``warmup_steps`` may differ between the models: a model with fewer
    steps follows its own schedule, compressed into its steps as :func:`train` would,
    and then leaves the batch (its parameters set aside, no longer computed; its run
    records its own steps). So one call trains, for example, the same seeds at two
    budgets.

    Args:
        models: :class:`~companion.model.TinyTransformer` s with equal configs, on one device, each built
            from its own seed.
        seeds: one batch-generator seed per model, as :func:`train`'s ``seed``.
        steps: optimization steps, one number for every model or one per model.
        batch_size: sequences per step and model.
        length: training length ``L_train``.
        lag: the task's lag.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps (0 for none), one number or one per model.
        schedule: ``"constant"`` or ``"cosine"`` after the warm-up, as :func:`train`.
        targets: another task on the same tokens: a function from a ``(B, L)`` batch of
            token ids to its ``(B, L)`` integer targets (``-100`` where nothing is
            scored), used instead of the lag task's targets. ``None``: the lag task.
        progress: print the mean loss ten times during training (for interactive use).

    Returns:
        One :class:`TrainingRun` per model, in order.
    """
    if isinstance(models, nn.Module) or not isinstance(models, Sequence) or not models:
        raise _validate.fail(
            TypeError, "models", "a non-empty sequence of TinyTransformers", models
        )
    for i, m in enumerate(models):
        _validate.module(f"models[{i}]", m, TinyTransformer)
        if m.config != models[0].config:
            raise ValueError(
                f"models must share one config, got models[{i}].config={m.config} and "
                f"models[0].config={models[0].config}"
            )
        _validate.same_device(
            f"models[{i}]'s parameters",
            m.embed.weight,
            "models[0]'s parameters",
            models[0].embed.weight,
        )
    if len({id(m) for m in models}) != len(models):
        raise ValueError("models must be distinct modules, got the same module twice")
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise _validate.fail(TypeError, "seeds", "a sequence of ints", seeds)
    if len(seeds) != len(models):
        raise ValueError(
            f"seeds must hold one seed per model ({len(models)}), "
            f"got {len(seeds)} seeds"
        )
    seeds = [
        _validate.integer(f"seeds[{i}]", s, minimum=0) for i, s in enumerate(seeds)
    ]
    step_counts = _per_model("steps", steps, len(models), _validate.positive_int)
    warmups = _per_model(
        "warmup_steps", warmup_steps, len(models), _validate.nonnegative_int
    )
    lr = _validate.positive_real("lr", lr)
    schedule = _validate.choice("schedule", schedule, SCHEDULES)
    config = models[0].config
    check_lag_task(batch_size, length, lag, config.vocab_size)
    if targets is not None:
        _validate.callable_("targets", targets)
    progress = _validate.flag("progress", progress)

    device = models[0].embed.weight.device
    base = _Logits(models[0])
    wrapped = [_Logits(m) for m in models]
    params, buffers = torch.func.stack_module_state(wrapped)  # name -> (M, ...)
    buffers = {name: b[0] for name, b in buffers.items()}  # equal in every model

    def loss_of(p: dict, tokens: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = torch.func.functional_call(base, (p, buffers), (tokens,))  # (B, L, V)
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())  # skips -100

    batched_loss = torch.vmap(loss_of)  # over the models' axis of p, tokens, targets
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    moments = {
        name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in params.items()
    }
    runs = [TrainingRun() for _ in models]
    active = list(range(len(models)))  # the models still training, in stacked order
    trained: dict[int, dict[str, torch.Tensor]] = {}  # model -> its final parameters
    total = max(step_counts)
    every = max(1, total // 10)
    for step in range(total):
        if any(step_counts[i] == step for i in active):  # some models are done:
            keep = [k for k, i in enumerate(active) if step_counts[i] > step]
            for k, i in enumerate(active):  # set them aside, stop computing them
                if step_counts[i] == step:
                    trained[i] = {n: p[k].detach().clone() for n, p in params.items()}
            params = {n: p.detach()[keep].requires_grad_() for n, p in params.items()}
            moments = {n: (m[keep], v[keep]) for n, (m, v) in moments.items()}
            active = [active[k] for k in keep]
        rates = [_rate(lr, warmups[i], step, step_counts[i], schedule) for i in active]
        batches = [
            lag_task(
                batch_size,
                length,
                lag=lag,
                vocab_size=config.vocab_size,
                generator=generators[i],
            )
            for i in active
        ]
        tokens = torch.stack([t for t, _ in batches]).to(device)  # (M, B, L)
        if targets is None:
            target = torch.stack([y for _, y in batches]).to(device)  # (M, B, L)
        else:
            target = torch.stack([_task_targets(targets, t) for t in tokens])
        losses = batched_loss(params, tokens, target)  # (M,)
        # no shared parameter: each model gets its own gradient
        grads = torch.autograd.grad(losses.sum(), list(params.values()))
        _adamw_step(params, grads, moments, rates, step + 1)
        for i, value, rate in zip(active, losses.tolist(), rates, strict=True):
            runs[i].losses.append(value)
            runs[i].learning_rates.append(rate)
        if progress and ((step + 1) % every == 0 or step + 1 == total):
            print(f"step {step + 1:>5}/{total}: mean loss {losses.mean().item():.4f}")
    for k, i in enumerate(active):
        trained[i] = {n: p[k].detach() for n, p in params.items()}
    with torch.no_grad():
        for i, m in enumerate(wrapped):
            for name, p in m.named_parameters():
                p.copy_(trained[i][name])
    for m in models:
        m.eval()
    return runs


def _per_model(
    name: str, value: object, count: int, check: Callable[[str, object], int]
) -> list[int]:
    """One checked value per model: ``value`` itself, or its items (one per model)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if len(value) != count:
            raise ValueError(
                f"{name} must be one number or one per model ({count}), "
                f"got {len(value)} values"
            )
        return [check(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [check(name, value)] * count


def _task_targets(
    targets: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor
) -> torch.Tensor:
    """``targets(tokens)``, checked to be integer targets of the tokens' shape."""
    out = _validate.tensor("targets(tokens)", targets(tokens), dtype="integer")
    _validate.shape("targets(tokens)", out, tokens.shape, "of the tokens")
    return out.long()


_BETAS, _EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults


@torch.no_grad()
def _adamw_step(
    params: dict[str, torch.Tensor],
    grads: Sequence[torch.Tensor],
    moments: dict[str, tuple[torch.Tensor, torch.Tensor]],
    rates: list[float],
    step: int,
) -> None:
    """One AdamW step (``weight_decay=0``) on stacked parameters, model ``i`` at
    ``rates[i]``: torch.optim.AdamW's arithmetic, with a learning rate per model."""
    beta1, beta2 = _BETAS
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    first = next(iter(params.values()))
    step_size = torch.tensor(
        [r / bias_correction1 for r in rates], dtype=first.dtype, device=first.device
    )  # (M,)
    for (name, p), g in zip(params.items(), grads, strict=True):
        exp_avg, exp_avg_sq = moments[name]
        exp_avg.lerp_(g, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(_EPS)
        size = step_size.view(-1, *([1] * (p.ndim - 1)))  # (M, 1, ...)
        p.sub_(size * exp_avg / denom)


# ---- Runs over seeds, and their table ----------------------------------------------------


@dataclass
class SeedRuns:
    """One configuration trained over several seeds: what :func:`run_seeds` returns.

    Attributes:
        seeds: the seeds, in order.
        losses: one loss curve per seed (a list of floats per step).
        models: the trained models, one per seed.
    """

    seeds: tuple[int, ...]
    losses: list[list[float]]
    models: list[nn.Module]

    def __post_init__(self) -> None:
        if not (len(self.seeds) == len(self.losses) == len(self.models)):
            raise ValueError(
                "seeds, losses and models must have one entry per seed, got "
                f"{len(self.seeds)}, {len(self.losses)} and {len(self.models)}"
            )

    def final(self, last: int = 10) -> torch.Tensor:
        """Each seed's mean loss over its last ``last`` steps, float64 ``(seeds,)``."""
        last = _validate.positive_int("last", last)
        return torch.tensor(
            [sum(c[-last:]) / len(c[-last:]) for c in self.losses], dtype=torch.float64
        )

    def summary(self, last: int = 10) -> tuple[float, float]:
        """``(mean, spread)`` of :meth:`final` over the seeds: the spread is
        ``max - min``."""
        values = self.final(last)
        return values.mean().item(), (values.max() - values.min()).item()


def run_seeds(
    factory: Callable[[], TinyTransformer],
    seed_list: Sequence[int],
    *,
    device: torch.device | str | None = None,
    **train_kwargs: object,
) -> SeedRuns:
    """Build one model per seed with :func:`build` and train them together.

    Equivalent to the following::

        models = [build(factory, s, device=device) for s in seed_list]
        runs = train_batched(models, seeds=seed_list, **train_kwargs)
        SeedRuns(tuple(seed_list), [r.losses for r in runs], models)

    Args:
        factory: a function of no arguments that returns a fresh
            :class:`~companion.model.TinyTransformer` (or subclass).
        seed_list: the seeds (e.g. :func:`seeds`), each the model's seed and its data's.
        device: where to train.
        **train_kwargs: the rest of :func:`train_batched`'s arguments (``steps``,
            ``batch_size``, ``length``, ``lag``, ``lr``, ...).

    Returns:
        A :class:`SeedRuns`.
    """
    _validate.callable_("factory", factory)
    if isinstance(seed_list, (str, bytes)) or not isinstance(seed_list, Sequence):
        raise _validate.fail(TypeError, "seed_list", "a sequence of ints", seed_list)
    if not seed_list:
        raise ValueError("seed_list must hold at least one seed, got none")
    checked = tuple(
        _validate.integer(f"seed_list[{i}]", s, minimum=0)
        for i, s in enumerate(seed_list)
    )
    if "seeds" in train_kwargs:
        raise TypeError("run_seeds takes the seeds as seed_list, not seeds=")
    models = [build(factory, s, device=device) for s in checked]
    runs = train_batched(models, seeds=checked, **train_kwargs)  # type: ignore[arg-type]
    return SeedRuns(checked, [r.losses for r in runs], models)


def summary_table(runs: dict[str, SeedRuns], *, last: int = 10) -> str:
    """A Markdown table of several configurations: per-seed final loss, mean, spread.

    Args:
        runs: label -> :class:`SeedRuns`.
        last: steps averaged into each final loss.

    Returns:
        The table, one row per label, losses to 3 decimals.
    """
    if not isinstance(runs, dict) or not runs:
        raise _validate.fail(TypeError, "runs", "a non-empty dict of SeedRuns", runs)
    for label, r in runs.items():
        _validate.instance(f"runs[{label!r}]", r, SeedRuns, "a SeedRuns")
    rows = [
        "| run | final loss per seed | mean | spread (max - min) |",
        "|---|---|---|---|",
    ]
    for label, r in runs.items():
        mean, spread = r.summary(last)
        per_seed = ", ".join(f"{v:.3f}" for v in r.final(last).tolist())
        rows.append(f"| {label} | {per_seed} | {mean:.3f} | {spread:.3f} |")
    return "\n".join(rows)


# ---- The position family's comparison (chapter 4) ----------------------------------------

# after the seeds() above: compare_position_schemes takes a parameter of that name
_experiment_seeds = seeds

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
"""Chapter 4's seed count for every scheme, as in :func:`seeds` ``(POSITION_FAMILY_SEEDS)``."""

POSITION_FAMILY_T5_SEEDS = 6
"""Chapter 4 trains T5 again over :func:`seeds` ``(POSITION_FAMILY_T5_SEEDS)``: its
outcome beyond the training length is a frequency over seeds."""

__all__ += ["POSITION_FAMILY_SEEDS", "POSITION_FAMILY_T5_SEEDS"]


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


def _distinct_seeds(seed_list: object) -> tuple[int, ...]:
    if (
        isinstance(seed_list, (str, bytes))
        or not isinstance(seed_list, Sequence)
        or not seed_list
    ):
        raise _validate.fail(
            TypeError, "seeds", "a non-empty sequence of ints", seed_list
        )
    checked = tuple(
        _validate.integer(f"seeds[{i}]", s, minimum=0, maximum=2**32 - 1)
        for i, s in enumerate(seed_list)
    )
    if len(set(checked)) != len(checked):
        raise ValueError(f"seeds must not repeat, got {checked}")
    return checked


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
    :func:`companion.relative.position_family_model`, built by :func:`build` (so
    ``COMPANION_INIT_JITTER`` acts on it), trained by :func:`train_batched` (all seeds
    and budgets of a scheme as one batched model, AdamW, linear warm-up then a cosine
    decay) on :func:`companion.model.lag_task` at ``training_length``, then scored by
    :func:`companion.model.position_accuracy` on one evaluation batch of ``eval_length``
    positions. Seed ``s`` builds its model from seed ``s`` and draws its batches from
    seed ``s``. Every argument is checked before the first model is built.

    Args:
        schemes: names from ``companion.relative.COMPARISON_SCHEMES`` (or
            ``"sinusoidal"``, ``"learned"``), without repeats; ``None``: all of
            ``COMPARISON_SCHEMES``.
        seeds: at least one seed, without repeats; ``None``: :func:`seeds` ``(3)``.
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
    from companion.relative import COMPARISON_SCHEMES, position_family_model

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
    seed_list = _experiment_seeds(3) if seeds is None else _distinct_seeds(seeds)
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
            build(lambda s=scheme: position_family_model(s, config), seed)
            for _, seed in jobs
        ]
        if progress:
            print(f"{scheme}: seeds {seed_list}, {budget[scheme]} steps")
        runs = train_batched(
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


# ---- The modern layer's experiments (chapter 9) -------------------------------------------
#
# Chapter 9 trains the tiny RoPE model of chapter 7 with plain attention, QK-norm and
# soft-capping, at a learning rate where the plain model fails, and reads the trained
# models' attention (the stability runs and the sink measurement). The chapter and
# tests/test_modern_claims.py call these functions, so the claims the harness checks are
# the chapter's own.

__all__ += [
    "MODERN_SIZES",
    "MODERN_TASK",
    "STABILITY_CAP",
    "STABILITY_RUNS",
    "STABILITY_STEPS",
    "StabilityMeasures",
    "first_attention_step",
    "first_token_mass",
    "lag_weight",
    "measure_stability",
    "modern_probe",
    "stability_runs",
    "uniform_first_token_share",
]

MODERN_SIZES = ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=2)
"""Chapter 9's tiny model — width 32, four heads of width 8, two layers, RoPE."""

MODERN_TASK: dict[str, int] = {"batch_size": 32, "length": 16, "lag": 2}
"""Chapter 9's lag task — 32 sequences of 16 tokens a step, output the token two back."""

STABILITY_RUNS: dict[str, tuple[str, float]] = {
    "plain, lr 0.03": ("rope", 0.03),
    "plain, lr 0.3": ("rope", 0.3),
    "QK-norm, lr 0.3": ("qk_norm", 0.3),
    "soft-cap 5, lr 0.3": ("softcap", 0.3),
}
"""Chapter 9's stability runs — label -> (attention of
:class:`~companion.modern.ModernTinyTransformer`, AdamW learning rate)."""

STABILITY_STEPS = 200
"""Chapter 9's stability runs — optimization steps of every run."""

STABILITY_CAP = 5.0
"""Chapter 9's stability runs — the soft-cap of the ``"softcap"`` runs (Gemma 2's is 50;
this one the tiny model's logits reach)."""


def stability_runs(
    seed_list: Sequence[int],
    *,
    steps: int = STABILITY_STEPS,
    cap: float = STABILITY_CAP,
    labels: Sequence[str] | None = None,
) -> dict[str, SeedRuns]:
    """Chapter 9's stability runs: each of :data:`STABILITY_RUNS` over ``seed_list``.

    Equivalent to the following, for each label::

        run_seeds(lambda: ModernTinyTransformer(MODERN_SIZES, attention=kind, cap=cap),
                  seed_list, steps=steps, lr=lr, **MODERN_TASK)

    AdamW without weight decay at a constant learning rate, no warm-up (:func:`train`).

    Args:
        seed_list: the seeds (e.g. ``seeds(6)``).
        steps: optimization steps of every run.
        cap: the soft-cap of the ``"softcap"`` runs.
        labels: which of :data:`STABILITY_RUNS` to run (``None``: all, in order).

    Returns:
        label -> :class:`SeedRuns`.
    """
    from companion.modern import ModernTinyTransformer  # modern imports model, as here

    steps = _validate.positive_int("steps", steps)
    cap = _validate.positive_real("cap", cap)
    if labels is None:
        labels = tuple(STABILITY_RUNS)
    if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
        raise _validate.fail(TypeError, "labels", "a sequence of run labels", labels)
    chosen = [_validate.choice("labels", label, STABILITY_RUNS) for label in labels]
    runs = {}
    for label in chosen:
        kind, lr = STABILITY_RUNS[label]
        runs[label] = run_seeds(
            lambda kind=kind: ModernTinyTransformer(
                MODERN_SIZES, attention=kind, cap=cap
            ),
            seed_list,
            steps=steps,
            lr=lr,
            **MODERN_TASK,
        )
    return runs


def modern_probe(num_sequences: int = 64) -> torch.Tensor:
    """The batch on which chapter 9 reads trained models' attention: ``num_sequences`` of
    :data:`MODERN_TASK`'s length from :func:`~companion.model.lag_task`, generator seed
    1234 (no training seed), the same under every variant.

    Shape:
        output: ``(num_sequences, 16)`` token ids.
    """
    num_sequences = _validate.positive_int("num_sequences", num_sequences)
    generator = torch.Generator().manual_seed(1234)
    return lag_task(
        num_sequences,
        MODERN_TASK["length"],
        lag=MODERN_TASK["lag"],
        vocab_size=MODERN_SIZES.vocab_size,
        generator=generator,
    )[0]


@dataclass
class StabilityMeasures:
    """What :func:`measure_stability` reads from one configuration's trained models,
    one entry per seed (``(seeds,)``) or per seed and layer (``(seeds, layers)``).

    Attributes:
        final: mean training loss over the last 20 steps, ``(seeds,)``.
        lowest: the lowest mean training loss over 20 consecutive steps, ``(seeds,)``
            (a run that trained and then spiked near its end keeps it low).
        accuracy: :func:`~companion.model.accuracy` on the lag task, ``(seeds,)``.
        largest_logit: the largest ``|score|`` the attention sees (scaled by
            ``1/sqrt(D)``, after the cap where there is one) on the probe, ``(seeds,)``.
        raw_logit: the same before the cap (the soft-capped model's weights run without
            it); equal to ``largest_logit`` where there is no cap, ``(seeds,)``.
        one_hot: the fraction of the probe's attention rows (every layer, head and
            sequence, queries ``t >= 1``; query 0 sees one key) whose largest weight
            passes 0.99, ``(seeds,)``.
        spike: the largest training loss of a step after the first step whose loss is
            below 0.01 (a trained run's spikes), ``(seeds,)``; NaN where no step gets
            below 0.01.
        saturated: the fraction of the causal scores within 1% of the cap, ``(seeds,)``;
            NaN without a cap.
        zero_slope: the fraction of the causal scores where the cap's slope
            ``1 - tanh^2(s / cap)`` is exactly zero in the model's dtype (``tanh``
            rounded to ``+-1``: no gradient passes), ``(seeds,)``; NaN without a cap.
        bound: :func:`~companion.modern.qk_norm_logit_bound` of each layer's trained
            gains, ``(seeds, layers)``; NaN without QK-norm.
        layer_logit: the largest ``|score|`` of each layer, ``(seeds, layers)``.
        gain: the largest ``|gain|`` of each layer's query and key norms,
            ``(seeds, layers)``; NaN without QK-norm.
    """

    final: torch.Tensor
    lowest: torch.Tensor
    accuracy: torch.Tensor
    largest_logit: torch.Tensor
    raw_logit: torch.Tensor
    one_hot: torch.Tensor
    spike: torch.Tensor
    saturated: torch.Tensor
    zero_slope: torch.Tensor
    bound: torch.Tensor
    layer_logit: torch.Tensor
    gain: torch.Tensor

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            _validate.tensor(name, getattr(self, name), min_ndim=1, max_ndim=2)
        seeds = self.final.shape[0]
        for name in self.__dataclass_fields__:
            _validate.size(name, getattr(self, name), 0, seeds, "one per seed")


@torch.no_grad()
def measure_stability(
    runs: SeedRuns, probe: torch.Tensor | None = None
) -> StabilityMeasures:
    """Read the final and lowest loss, the spikes, accuracy, logits, one-hot rows,
    QK-norm bounds and saturation of the trained models of one of
    :func:`stability_runs`' configurations.

    Args:
        runs: one configuration's :class:`SeedRuns`.
        probe: token ids to read the attention on (``None``: :func:`modern_probe`).

    Returns:
        A :class:`StabilityMeasures`.
    """
    from companion.model import accuracy
    from companion.modern import (
        ModernTinyTransformer,
        QKNormSelfAttention,
        SoftcapSelfAttention,
        attention_maps,
        qk_norm_logit_bound,
    )

    _validate.instance("runs", runs, SeedRuns, "a SeedRuns")
    probe = modern_probe() if probe is None else probe
    _validate.tensor("probe", probe, dtype="integer", ndim=2, meaning="(B, L)")
    nan = float("nan")
    rows: dict[str, list] = {k: [] for k in StabilityMeasures.__dataclass_fields__}
    for net, curve in zip(runs.models, runs.losses, strict=True):
        _validate.module("runs.models[i]", net, ModernTinyTransformer)
        device = next(net.parameters()).device
        ids = probe.to(device)
        scores = attention_maps(net, ids, scores=True)  # (layers, B, H, L, L)
        finite = [s[s.isfinite()].abs() for s in scores]  # per layer
        top_weight = scores[..., 1:, :].softmax(-1).amax(-1)  # (layers, B, H, L - 1)
        rows["one_hot"].append(top_weight.gt(0.99).double().mean().item())
        low = [i for i, loss in enumerate(curve) if loss < 0.01]
        rows["spike"].append(max(curve[low[0] :]) if low else nan)
        layers = [m for m in net.modules() if isinstance(m, SoftcapSelfAttention)]
        if layers:  # the same weights without the cap
            plain = ModernTinyTransformer(net.config, attention="rope").to(device)
            plain.load_state_dict(net.state_dict())
            raw = attention_maps(plain, ids, scores=True)
            raw_top = raw[raw.isfinite()].abs().max().item()
            cap = layers[0].cap
            saturated = torch.cat(finite).gt(0.99 * cap).double().mean().item()
            tanh = torch.tanh(raw[raw.isfinite()] / cap)  # as softcap computes it
            zero_slope = (1 - tanh * tanh).eq(0).double().mean().item()
        else:
            raw_top = torch.cat(finite).max().item()
            saturated = zero_slope = nan
        qk = [m for m in net.modules() if isinstance(m, QKNormSelfAttention)]
        rows["bound"].append(
            [qk_norm_logit_bound(m.q_norm.weight, m.k_norm.weight) for m in qk]
            or [nan] * len(finite)
        )
        rows["gain"].append(
            [
                torch.cat([m.q_norm.weight, m.k_norm.weight]).abs().max().item()
                for m in qk
            ]
            or [nan] * len(finite)
        )
        rows["final"].append(sum(curve[-20:]) / len(curve[-20:]))
        window = min(20, len(curve))
        rows["lowest"].append(
            torch.tensor(curve, dtype=torch.float64)
            .unfold(0, window, 1)
            .mean(-1)
            .min()
            .item()
        )
        rows["accuracy"].append(
            accuracy(net, length=MODERN_TASK["length"], lag=MODERN_TASK["lag"])
        )
        rows["largest_logit"].append(torch.cat(finite).max().item())
        rows["raw_logit"].append(raw_top)
        rows["saturated"].append(saturated)
        rows["zero_slope"].append(zero_slope)
        rows["layer_logit"].append([f.max().item() for f in finite])
    return StabilityMeasures(
        **{k: torch.tensor(v, dtype=torch.float64) for k, v in rows.items()}
    )


@torch.no_grad()
def _checked_models_and_probe(models: object, probe: object) -> torch.Tensor:
    """Checks a sequence of trained models and a probe (``None``: :func:`modern_probe`)."""
    if isinstance(models, nn.Module) or not isinstance(models, Sequence) or not models:
        raise _validate.fail(
            TypeError, "models", "a non-empty sequence of trained models", models
        )
    probe = modern_probe() if probe is None else probe
    _validate.tensor("probe", probe, dtype="integer", ndim=2, meaning="(B, L)")
    return probe


def _attention_maps_of(
    models: Sequence[nn.Module], probe: torch.Tensor
) -> Iterator[torch.Tensor]:
    """Each model's attention maps on ``probe``, (layers, B, H, L, L), checking it first."""
    from companion.modern import attention_maps

    for i, net in enumerate(models):
        _validate.module(f"models[{i}]", net, TinyTransformer)
        yield attention_maps(net, probe)


def lag_weight(
    models: Sequence[nn.Module],
    probe: torch.Tensor | None = None,
    *,
    lag: int = MODERN_TASK["lag"],
) -> torch.Tensor:
    """The attention weight trained tiny models put on the key ``lag`` places back (the
    lag task's answer): for each model, layer and head, averaged over the probe's
    sequences and its queries ``t >= lag``.

    Args:
        models: trained :class:`~companion.model.TinyTransformer` s.
        probe: token ids (``None``: :func:`modern_probe`).
        lag: how far back the key sits.

    Returns:
        float64 ``(models, layers, heads)``.
    """
    probe = _checked_models_and_probe(models, probe)
    lag = _validate.positive_int("lag", lag)
    if lag >= probe.shape[1]:
        raise ValueError(
            f"lag must be less than the probe's length ({probe.shape[1]}), got {lag}"
        )
    out = []
    for maps in _attention_maps_of(models, probe):  # (layers, B, H, L, L)
        back = maps[..., lag:, :].diagonal(offset=0, dim1=-2, dim2=-1)  # (.., L - lag)
        out.append(back.mean(dim=(1, 3)).double())  # (layers, H)
    return torch.stack(out)


def first_attention_step(
    seed_list: Sequence[int],
    *,
    lr: float = STABILITY_RUNS["plain, lr 0.3"][1],
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """AdamW's first step on ``W_Q`` and ``W_K`` of every layer of chapter 9's plain
    model, measured: the stability runs' first step (:func:`train_batched`, one step of
    :data:`MODERN_TASK` from the seed), taken on a model built as they build it.

    Args:
        seed_list: the seeds.
        lr: AdamW's learning rate (the failing plain run's, 0.3).
        device: where to compute.

    Returns:
        ``"initial"``: the weights before the step and ``"step"``: ``|after - before|``,
        each float64 ``(seeds, layers, 2, dim, dim)`` (index 0 of the third axis is
        ``W_Q``, 1 is ``W_K``).
    """
    from companion.model import CausalSelfAttention
    from companion.modern import ModernTinyTransformer

    seed_list = _capstone_seeds("seed_list", seed_list)
    lr = _validate.positive_real("lr", lr)
    initial, step = [], []
    for seed in seed_list:
        net = build(
            lambda: ModernTinyTransformer(MODERN_SIZES, attention="rope"),
            seed,
            device=device,
        )
        layers = [m for m in net.modules() if isinstance(m, CausalSelfAttention)]

        def weights(layers: list = layers) -> torch.Tensor:
            pairs = [torch.stack([m.q_proj.weight, m.k_proj.weight]) for m in layers]
            return torch.stack(pairs).detach().double()  # (layers, 2, dim, dim)

        before = weights()
        train_batched([net], seeds=[seed], steps=1, lr=lr, **MODERN_TASK)
        initial.append(before)
        step.append((weights() - before).abs())
    return {"initial": torch.stack(initial), "step": torch.stack(step)}


def uniform_first_token_share(length: int = 16, *, start: int = 4) -> float:
    r"""The weight an even spread puts on the first token, averaged over queries
    ``t = start .. length - 1``: the mean of :math:`1/(t + 1)`."""
    length = _validate.positive_int("length", length)
    start = _validate.nonnegative_int("start", start)
    if start >= length:
        raise ValueError(f"start must be less than length ({length}), got {start}")
    return (1 / (torch.arange(start, length, dtype=torch.float64) + 1)).mean().item()


@torch.no_grad()
def first_token_mass(
    models: Sequence[nn.Module], probe: torch.Tensor | None = None, *, start: int = 4
) -> torch.Tensor:
    """The attention weight trained tiny models put on the first token (a sink's
    signature): for each model, layer and head, averaged over the probe's sequences and
    its queries at ``t >= start``.

    Args:
        models: trained :class:`~companion.model.TinyTransformer` s (e.g. a
            :class:`SeedRuns`' ``models``).
        probe: token ids (``None``: :func:`modern_probe`).
        start: the first query counted (the first queries have few keys to choose from).

    Returns:
        float64 ``(models, layers, heads)``; compare with
        :func:`uniform_first_token_share`.
    """
    probe = _checked_models_and_probe(models, probe)
    start = _validate.nonnegative_int("start", start)
    if start >= probe.shape[1]:
        raise ValueError(
            f"start must be less than the probe's length ({probe.shape[1]}), got {start}"
        )
    mass = []
    for maps in _attention_maps_of(models, probe):  # (layers, B, H, L, L)
        mass.append(maps[..., start:, 0].mean(dim=(1, 3)).double())  # (layers, H)
    return torch.stack(mass)


# ---- The capstone's experiments (chapter 7) ----------------------------------------------

__all__ += [
    "CAPSTONE_EVAL_LENGTH",
    "CAPSTONE_SIZES",
    "CAPSTONE_TASK",
    "WARMUP_CONFIGS",
    "absolute_position_runs",
    "band_accuracy",
    "capstone_model",
    "first_adamw_step",
    "first_relapse",
    "first_step_below",
    "position_accuracies",
    "train_capstone_scheme",
    "warmup_runs",
]

CAPSTONE_SIZES: dict[str, int] = {
    "vocab_size": 16,
    "dim": 32,
    "num_heads": 4,
    "num_layers": 2,
    "max_len": 64,
}
"""The capstone's model — width 32, four heads of width 8, two layers, 16 tokens, and a
learned table (where one is asked for) of 64 rows, four times the training length."""

CAPSTONE_TASK: dict[str, int] = {"batch_size": 32, "length": 16, "lag": 2}
"""The capstone's training batches — 32 sequences of length ``L_0 = 16``, lag 2."""

CAPSTONE_EVAL_LENGTH = 64
"""The capstone evaluates every model once, on 256 sequences of four times ``L_0``."""

WARMUP_CONFIGS: dict[str, tuple[str, int]] = {
    "pre-LN": ("pre", 0),
    "post-LN": ("post", 0),
    "post-LN + warm-up": ("post", 30),
}
"""The capstone's warm-up experiment — label -> (placement, warm-up steps)."""

CAPSTONE_SEEDS = 3
"""The capstone's scheme comparison trains :func:`seeds` ``(CAPSTONE_SEEDS)``."""

CAPSTONE_BUDGETS: tuple[int, ...] = (500, 1000)
"""The capstone's budgets in steps; the results use the larger, the smaller shows what
the budget changes (:func:`train_capstone_scheme`'s ``budgets``)."""

CAPSTONE_LR = 1e-2
"""The capstone's peak learning rate (:func:`train_capstone_scheme`'s ``lr``)."""

CAPSTONE_WARMUP_STEPS = 50
"""The capstone's linear warm-up (:func:`train_capstone_scheme`'s ``warmup_steps``)."""

WARMUP_RUN_SEEDS = 6
"""The Post-LN/Pre-LN experiment's seed count, as in :func:`seeds` ``(WARMUP_RUN_SEEDS)``."""

WARMUP_RUN_STEPS = 150
"""The Post-LN/Pre-LN experiment's steps (:func:`warmup_runs`'s ``steps``)."""

WARMUP_RUN_LR = 3e-2
"""The Post-LN/Pre-LN experiment's constant rate (:func:`warmup_runs`'s ``lr``)."""

ABSOLUTE_STEPS: dict[str, int] = {"learned": 100, "rope": 600}
"""The third exercise's steps per scheme (:func:`absolute_position_runs`'s ``steps``)."""

__all__ += [
    "ABSOLUTE_STEPS",
    "CAPSTONE_BUDGETS",
    "CAPSTONE_LR",
    "CAPSTONE_SEEDS",
    "CAPSTONE_WARMUP_STEPS",
    "WARMUP_RUN_LR",
    "WARMUP_RUN_SEEDS",
    "WARMUP_RUN_STEPS",
]


def capstone_model(position: str, **overrides: object) -> Callable[[], TinyTransformer]:
    """The factory of the capstone's model with one position scheme: give it to
    :func:`build` or :func:`run_seeds`.

    Args:
        position: ``"none"``, ``"sinusoidal"``, ``"learned"``, ``"rope"`` or ``"alibi"``.
        **overrides: other :class:`~companion.model.ModelConfig` fields (``num_layers``,
            ``placement``, ``rope_base``, ...), in place of :data:`CAPSTONE_SIZES`.

    Returns:
        A function of no arguments that builds a fresh
        :class:`~companion.model.TinyTransformer`.
    """
    from companion.model import ModelConfig

    config = ModelConfig(**{**CAPSTONE_SIZES, "position": position, **overrides})  # type: ignore[arg-type]
    return lambda: TinyTransformer(config)


def train_capstone_scheme(
    scheme: str,
    seed_list: Sequence[int],
    *,
    budgets: Sequence[int] = CAPSTONE_BUDGETS,
    lr: float = CAPSTONE_LR,
    warmup_steps: int = CAPSTONE_WARMUP_STEPS,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> dict[int, SeedRuns]:
    """The capstone's scheme comparison for one scheme: every seed at every budget.

    Each ``(budget, seed)`` model is built with :func:`build` (so the seed sets both the
    initial weights and the batches) and all of them train together in one
    :func:`train_batched` call on the lag task (:data:`CAPSTONE_TASK`): AdamW, a linear
    warm-up to ``lr`` over ``warmup_steps``, then half a cosine to zero at each run's own
    last step.

    Args:
        scheme: the position scheme (see :func:`capstone_model`).
        seed_list: the seeds (e.g. ``seeds(3)``).
        budgets: the numbers of steps, each run once per seed.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps.
        device: where to train.
        progress: print the mean loss during training.

    Returns:
        budget -> :class:`SeedRuns` (the seeds in ``seed_list``'s order).
    """
    factory = capstone_model(scheme)
    seed_list = _capstone_seeds("seed_list", seed_list)
    budgets = tuple(
        _validate.positive_int(f"budgets[{i}]", b) for i, b in enumerate(budgets)
    )
    if not budgets or len(set(budgets)) != len(budgets):
        raise ValueError(f"budgets must be distinct step counts, got {budgets}")
    jobs = [(steps, seed) for steps in budgets for seed in seed_list]
    models = [build(factory, seed, device=device) for _, seed in jobs]
    runs = train_batched(
        models,
        seeds=[seed for _, seed in jobs],
        steps=[steps for steps, _ in jobs],  # each run its own budget and schedule
        lr=lr,
        warmup_steps=warmup_steps,
        schedule="cosine",
        progress=progress,
        **CAPSTONE_TASK,
    )
    out = {}
    for steps in budgets:
        done = [k for k, (n, _) in enumerate(jobs) if n == steps]  # in seed order
        out[steps] = SeedRuns(
            seed_list, [runs[k].losses for k in done], [models[k] for k in done]
        )
    return out


def position_accuracies(
    runs: SeedRuns, *, length: int = CAPSTONE_EVAL_LENGTH, lag: int = 2
) -> torch.Tensor:
    """Each trained model's accuracy at each position of one evaluation batch.

    :func:`companion.model.position_accuracy` for each model of ``runs``, on the same 256
    sequences of length ``length`` (its default seed): one evaluation at the longest
    length serves every shorter band, since a causal model's output at ``t`` depends
    only on positions ``0..t``.

    Args:
        runs: trained models (a :class:`SeedRuns`).
        length: the evaluation length.
        lag: the task's lag.

    Returns:
        float64 ``(seeds, length)``, ``nan`` at ``t < lag``.
    """
    from companion.model import position_accuracy

    _validate.instance("runs", runs, SeedRuns, "a SeedRuns")
    return torch.stack(
        [position_accuracy(m, length=length, lag=lag) for m in runs.models]
    )


def band_accuracy(
    per_position: torch.Tensor, bands: dict[str, tuple[int, int]]
) -> torch.Tensor:
    """Mean accuracy over bands of positions: ``(seeds, L) -> (seeds, bands)``.

    Args:
        per_position: accuracies per seed and position (:func:`position_accuracies`).
        bands: label -> ``(start, stop)``, the positions ``start <= t < stop``.

    Returns:
        ``(seeds, len(bands))``, the bands in ``bands``' order.
    """
    per_position = _validate.tensor(
        "per_position", per_position, dtype="floating", ndim=2, meaning="(seeds, L)"
    )
    if not isinstance(bands, dict) or not bands:
        raise _validate.fail(
            TypeError, "bands", "a non-empty dict label -> (start, stop)", bands
        )
    L = per_position.shape[1]
    for label, band in bands.items():
        if (
            not isinstance(band, tuple)
            or len(band) != 2
            or not all(isinstance(v, int) for v in band)
            or not 0 <= band[0] < band[1] <= L
        ):
            raise ValueError(
                f"bands[{label!r}] must be (start, stop) with 0 <= start < stop <= {L}, "
                f"got {band!r}"
            )
    return torch.stack(
        [per_position[:, a:b].mean(dim=1) for a, b in bands.values()], dim=1
    )


def first_step_below(
    losses: Sequence[float], threshold: float, *, window: int = 20
) -> int | None:
    """The first step at which the mean loss over the last ``window`` steps is below
    ``threshold`` (the step that ends the window), ``None`` if it never is.

    Args:
        losses: one loss per step.
        threshold: the loss to get below.
        window: the moving average's width.
    """
    window = _validate.positive_int("window", window)
    threshold = _validate.real("threshold", threshold)
    curve = [float(v) for v in losses]
    for end in range(window, len(curve) + 1):
        if sum(curve[end - window : end]) / window < threshold:
            return end
    return None


def first_relapse(
    losses: Sequence[float], *, low: float = 0.1, high: float = 1.0
) -> int | None:
    """The first step at which a run that had got below ``low`` is back above ``high``
    (it lost what it had learned), ``None`` if that never happens.

    Args:
        losses: one loss per step.
        low: the loss that counts as trained.
        high: the loss that counts as lost again.
    """
    low = _validate.real("low", low)
    high = _validate.real("high", high)
    if not low < high:
        raise ValueError(f"low must be below high, got low={low}, high={high}")
    reached = False
    for step, value in enumerate(float(v) for v in losses):
        if reached and value > high:
            return step
        reached = reached or value < low
    return None


def warmup_runs(
    seed_list: Sequence[int],
    *,
    steps: int = WARMUP_RUN_STEPS,
    lr: float = WARMUP_RUN_LR,
    num_layers: int = 4,
    configs: dict[str, tuple[str, int]] | None = None,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> dict[str, SeedRuns]:
    """The capstone's Post-LN/Pre-LN experiment: RoPE, ``num_layers`` layers, a constant
    learning rate ``lr`` after an optional linear warm-up, every seed of every
    configuration of :data:`WARMUP_CONFIGS` (one :func:`train_batched` call per
    placement).

    Args:
        seed_list: the seeds (e.g. ``seeds(6)``).
        steps: training steps of every run.
        lr: the learning rate, reached after the warm-up and then kept.
        num_layers: the model's depth.
        configs: label -> (placement, warm-up steps); :data:`WARMUP_CONFIGS` by default.
        device: where to train.
        progress: print the mean loss during training.

    Returns:
        label -> :class:`SeedRuns`, in ``configs``' order.
    """
    seed_list = _capstone_seeds("seed_list", seed_list)
    configs = WARMUP_CONFIGS if configs is None else configs
    if not isinstance(configs, dict) or not configs:
        raise _validate.fail(
            TypeError,
            "configs",
            "a non-empty dict label -> (placement, warm-up)",
            configs,
        )
    for label, (placement, warm) in configs.items():
        _validate.choice(f"configs[{label!r}] placement", placement, ("pre", "post"))
        _validate.nonnegative_int(f"configs[{label!r}] warm-up", warm)
    out: dict[str, SeedRuns] = {}
    for placement in dict.fromkeys(p for p, _ in configs.values()):  # one batch each
        factory = capstone_model("rope", num_layers=num_layers, placement=placement)
        labels = [label for label, (p, _) in configs.items() if p == placement]
        jobs = [(label, seed) for label in labels for seed in seed_list]
        models = [build(factory, seed, device=device) for _, seed in jobs]
        runs = train_batched(
            models,
            seeds=[seed for _, seed in jobs],
            steps=steps,
            lr=lr,
            warmup_steps=[configs[label][1] for label, _ in jobs],
            progress=progress,
            **CAPSTONE_TASK,
        )
        for label in labels:
            done = [k for k, (name, _) in enumerate(jobs) if name == label]
            out[label] = SeedRuns(
                seed_list, [runs[k].losses for k in done], [models[k] for k in done]
            )
    return {label: out[label] for label in configs}


def first_adamw_step(
    seed_list: Sequence[int],
    *,
    lr: float = 3e-2,
    num_layers: int = 4,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """One AdamW step of the warm-up experiment's models, measured: the premises of
    Xiong et al. and Liu et al. at this depth.

    For each placement and seed: build the model (:func:`build`), take one batch of the
    lag task (from the seed), and record the norm of the gradient of the top MLP's output
    matrix, the norm of AdamW's first update of it, and how far the step moves the
    logits, ``|z_after - z_before| / |z_before|``.

    Args:
        seed_list: the seeds.
        lr: AdamW's learning rate.
        num_layers: the model's depth.
        device: where to compute.

    Returns:
        placement (``"post"``, ``"pre"``) -> float64 ``(seeds, 3)``: gradient norm,
        update norm, relative logit change.
    """
    seed_list = _capstone_seeds("seed_list", seed_list)
    lr = _validate.positive_real("lr", lr)
    out = {}
    for placement in ("post", "pre"):
        factory = capstone_model("rope", num_layers=num_layers, placement=placement)
        rows = []
        for seed in seed_list:
            net = build(factory, seed, device=device)
            dev = next(net.parameters()).device
            generator = torch.Generator().manual_seed(seed)
            x, y = lag_task(
                CAPSTONE_TASK["batch_size"],
                CAPSTONE_TASK["length"],
                lag=CAPSTONE_TASK["lag"],
                vocab_size=net.config.vocab_size,
                generator=generator,
                device=dev,
            )
            top = net.blocks[-1].sublayer[2].weight  # the last MLP's output matrix
            top_before = top.detach().clone()
            with torch.no_grad():
                logits_before = net(x)
            F.cross_entropy(net(x).flatten(0, 1), y.flatten()).backward()
            grad = top.grad.norm().item()
            torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0).step()
            with torch.no_grad():
                moved = ((net(x) - logits_before).norm() / logits_before.norm()).item()
            update = (top.detach() - top_before).norm().item()
            rows.append([grad, update, moved])
        out[placement] = torch.tensor(rows, dtype=torch.float64)
    return out


def absolute_position_runs(
    position: str,
    seed_list: Sequence[int],
    *,
    steps: int,
    targets: Callable[[torch.Tensor], torch.Tensor],
    lr: float = 3e-3,
    eval_length: int = 32,
    device: torch.device | str | None = None,
) -> tuple[SeedRuns, torch.Tensor]:
    """The capstone's third exercise: train on another task of the lag task's tokens
    (``targets``, e.g. ``t mod 5``) at a constant ``lr``, then score each position.

    Args:
        position: the position scheme (``"learned"``, ``"rope"``, ...).
        seed_list: the seeds.
        steps: training steps.
        targets: ``(B, L)`` token ids -> ``(B, L)`` integer targets.
        lr: AdamW's learning rate (constant, no warm-up).
        eval_length: the evaluation length (256 sequences of the evaluation seed).
        device: where to train.

    Returns:
        ``(runs, accuracy)``: the :class:`SeedRuns` and each seed's accuracy at each
        position, float64 ``(seeds, eval_length)``.
    """
    _validate.callable_("targets", targets)
    eval_length = _validate.positive_int("eval_length", eval_length)
    runs = run_seeds(
        capstone_model(position),
        _capstone_seeds("seed_list", seed_list),
        device=device,
        steps=steps,
        lr=lr,
        targets=targets,
        **CAPSTONE_TASK,
    )
    dev = next(runs.models[0].parameters()).device
    tokens, _ = lag_task(
        256,
        eval_length,
        lag=CAPSTONE_TASK["lag"],
        vocab_size=CAPSTONE_SIZES["vocab_size"],
        generator=torch.Generator().manual_seed(1234),  # position_accuracy's batch
        device=dev,
    )
    answer = _task_targets(targets, tokens)
    with torch.no_grad():
        hit = torch.stack(
            [m(tokens).argmax(dim=-1) == answer for m in runs.models]
        )  # (seeds, 256, eval_length)
    return runs, hit.double().mean(dim=1).cpu()


def _capstone_seeds(name: str, seed_list: object) -> tuple[int, ...]:
    """Distinct non-negative int seeds, as a tuple."""
    if (
        isinstance(seed_list, (str, bytes))
        or not isinstance(seed_list, Sequence)
        or not seed_list
    ):
        raise _validate.fail(TypeError, name, "a non-empty sequence of ints", seed_list)
    checked = tuple(
        _validate.integer(f"{name}[{i}]", s, minimum=0, maximum=2**32 - 1)
        for i, s in enumerate(seed_list)
    )
    if len(set(checked)) != len(checked):
        raise ValueError(f"{name} must not repeat a seed, got {checked}")
    return checked
