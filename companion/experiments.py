r"""The book's training: one home for its loops, seeds, perturbations and result tables.

The chapters that train use small models (the lag task of :func:`companion.model.lag_task`)
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
  together), each at its own number of steps and warm-up if asked, and answers a call
  identical to an earlier one in the same process (the same initial weights bit for bit,
  seeds, budgets, task and thread count) with that call's result instead of training
  again (training is deterministic within a process, so the answer is bit for bit what
  training again would give);
* :func:`run_seeds` builds and trains one configuration over several seeds and returns a
  :class:`SeedRuns`, whose :meth:`SeedRuns.summary` gives the mean and spread the chapters
  print (:func:`summary_table` for several configurations).

The chapters' experiments live in a module each, named after their idea, and build and
train every model here: :mod:`companion.position_comparison` (chapter 4's trained
comparison of the position family), :mod:`companion.capstone` (chapter 7's scheme
comparison, Post-LN against Pre-LN, the third exercise), :mod:`companion.stability`
(chapter 9's stability runs and what the trained attention reads),
:mod:`companion.hybrid_positions` (chapter 10's RoPE/NoPE hybrids trained on the lag
task), :mod:`companion.sink_comparison` (chapter 10's learned sink against a sink token) and :mod:`companion.linear_attention` (chapter 11's linear attention against
softmax on the lag task). Their names were
here before; they still answer from here, with a ``DeprecationWarning`` naming the new
home, for one release.

``make claims`` (``scripts/claims.py``) reruns every trained claim (``tests/test_*claims*.py``,
marker ``trained``) with the jitter at ``+1e-7`` and ``-1e-7``, on one thread, with
``ATEN_CPU_CAPABILITY=default`` and with other seeds, and prints which claims held in
every variant. The book keeps only those.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from companion import _deprecation, _validate
from companion.environment import seed_everything
from companion.model import (
    TinyTransformer,
    check_lag_task,
    lag_task,
    model_config,
)

__all__ = [
    "JITTER_ENV",
    "SEED_OFFSET_ENV",
    "SeedRuns",
    "TrainingRun",
    "build",
    "clear_runs",
    "distinct_seeds",
    "init_jitter",
    "jitter_",
    "run_seeds",
    "seed_offset",
    "seeds",
    "summary_table",
    "task_targets",
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


def distinct_seeds(name: str, seed_list: object) -> tuple[int, ...]:
    """``seed_list`` checked to be distinct seeds in ``[0, 2**32)``, as a tuple: the
    check every experiment that takes a list of seeds shares (the position family's
    comparison, the capstone's runs and the stability runs).

    Args:
        name: the caller's name for the argument, for the message.
        seed_list: a non-empty sequence of ints.

    Returns:
        The seeds, in order.
    """
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

    A call identical to an earlier one in this process (the same model class, config
    and initial parameters and buffers bit for bit, seeds, steps, warm-ups, rate,
    schedule, task, device and thread count; ``targets=None`` and ``progress=False``)
    is answered with that call's trained weights and losses, copied, without training:
    within a process training is deterministic, so they are what training again would
    give. The position family's no-position and ALiBi runs are the capstone's, and
    ``make claims`` runs both chapters' claims in one process per variant. The last 16 calls are kept.

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

    key = None
    # a task given as a function, a hook or a frozen parameter: always trained
    if targets is None and not progress and _replayable(models):
        key = _run_key(models, seeds, step_counts, warmups, lr, schedule,
                       (batch_size, length, lag))  # fmt: skip
        if key in _DONE:
            return _replay(models, key)
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
            target = torch.stack([task_targets(targets, t) for t in tokens])
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
    if key is not None:
        _remember(key, models, runs)
    return runs


# Runs done in this process: a call of train_batched identical to an earlier one (the same
# model class, config, structure, initial parameters and buffers bit for bit, the same
# seeds, steps, warm-ups, rate, schedule and task, on the same device and thread count) is
# answered with that call's result instead of training again. Training is deterministic
# within a process, so the answer is the one training again would give, bit for bit;
# the position family's no-position and ALiBi runs are the capstone's, and `make claims`
# runs both chapters' claims in one process per variant. At most _KEEP calls are kept, their
# weights on the CPU; clear_runs() forgets them all.
_KEEP = 16
_DONE: OrderedDict[str, tuple[list[dict[str, torch.Tensor]], list[TrainingRun]]]
_DONE = OrderedDict()


def clear_runs() -> None:
    """Forget every :func:`train_batched` call remembered in this process, so that the
    next call trains, whatever came before it.

    A reader who re-trains on purpose (to time a run, or after patching the training
    step or a model's forward in a way the remembered call's key does not see: a
    monkeypatched function, a backend flag) calls this first. Example::

        >>> from companion import experiments
        >>> experiments.clear_runs()
    """
    _DONE.clear()


def _replayable(models: Sequence[nn.Module]) -> bool:
    """Whether a call's result is a function of what :func:`_run_key` sees: no module
    hook (global or on a submodule) and no frozen parameter."""
    from torch.nn.modules import module as _module  # torch's global hook tables

    if any(
        getattr(_module, name, None)
        for name in ("_global_forward_hooks", "_global_forward_pre_hooks",
                     "_global_backward_hooks", "_global_backward_pre_hooks")
    ):  # fmt: skip
        return False
    for m in models:
        if not all(p.requires_grad for p in m.parameters()):
            return False
        for sub in m.modules():
            if (sub._forward_hooks or sub._forward_pre_hooks or sub._backward_hooks
                    or sub._backward_pre_hooks):  # fmt: skip
                return False
    return True


def _run_key(
    models: Sequence[nn.Module],
    seeds: list[int],
    step_counts: list[int],
    warmups: list[int],
    lr: float,
    schedule: str,
    task: tuple[int, int, int],
) -> str:
    """A digest of everything a :func:`train_batched` call's result depends on."""
    digest = hashlib.sha256()
    first = models[0]
    setting = (
        f"{type(first).__module__}.{type(first).__qualname__}",
        repr(first.config),
        repr(first),
        seeds,
        step_counts,
        warmups,
        lr.hex(),
        schedule,
        task,
        str(first.embed.weight.device),
        torch.get_num_threads(),
        torch.__version__,
    )
    digest.update(repr(setting).encode())
    for m in models:
        for name, t in [*m.named_parameters(), *m.named_buffers()]:
            digest.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
            digest.update(t.detach().cpu().contiguous().view(torch.uint8).numpy())
    return digest.hexdigest()


def _remember(key: str, models: Sequence[nn.Module], runs: list[TrainingRun]) -> None:
    # kept on the CPU (a CUDA run's clones would hold GPU memory); _replay copies back
    weights = [
        {n: p.detach().to("cpu", copy=True) for n, p in m.named_parameters()}
        for m in models
    ]
    copies = [TrainingRun(list(r.losses), list(r.learning_rates)) for r in runs]
    _DONE[key] = (weights, copies)
    while len(_DONE) > _KEEP:
        _DONE.popitem(last=False)


@torch.no_grad()
def _replay(models: Sequence[nn.Module], key: str) -> list[TrainingRun]:
    """The remembered result of the call ``key``: its trained weights copied into
    ``models``, and copies of its runs."""
    _DONE.move_to_end(key)
    weights, runs = _DONE[key]
    for m, trained in zip(models, weights, strict=True):
        for name, p in m.named_parameters():
            p.copy_(trained[name])
        m.eval()
    return [TrainingRun(list(r.losses), list(r.learning_rates)) for r in runs]


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


def task_targets(
    targets: Callable[[torch.Tensor], torch.Tensor], tokens: torch.Tensor
) -> torch.Tensor:
    """``targets(tokens)``, checked to be integer targets of the tokens' shape: the
    check of :func:`train_batched`'s ``targets``, which an experiment that scores
    another task on the lag task's tokens shares
    (:func:`companion.capstone.absolute_position_runs`).

    Args:
        targets: ``(B, L)`` token ids -> ``(B, L)`` integer targets.
        tokens: the token ids.

    Returns:
        The targets as int64.

    Shape:
        - tokens, output: ``(B, L)``
    """
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


# Deprecated aliases, for one release: the chapters' experiments moved to a module each.
_MOVED = dict.fromkeys(
    """POSITION_FAMILY_SEEDS POSITION_FAMILY_STEPS POSITION_FAMILY_T5_SEEDS
    PositionComparison compare_position_schemes""".split(),
    "position_comparison",
)
_MOVED |= dict.fromkeys(
    """ABSOLUTE_STEPS CAPSTONE_BUDGETS CAPSTONE_EVAL_LENGTH CAPSTONE_LR CAPSTONE_SEEDS
    CAPSTONE_SIZES CAPSTONE_TASK CAPSTONE_WARMUP_STEPS WARMUP_CONFIGS WARMUP_RUN_LR
    WARMUP_RUN_SEEDS WARMUP_RUN_STEPS absolute_position_runs band_accuracy
    capstone_model first_adamw_step first_relapse first_step_below
    position_accuracies train_capstone_scheme warmup_runs""".split(),
    "capstone",
)
_MOVED |= dict.fromkeys(
    """MODERN_SIZES MODERN_TASK STABILITY_CAP STABILITY_RUNS STABILITY_STEPS
    StabilityMeasures first_attention_step first_token_mass lag_weight
    measure_stability modern_probe stability_runs uniform_first_token_share""".split(),
    "stability",
)
__getattr__ = _deprecation.moved_names(__name__, _MOVED)
