r"""The capstone's experiments: chapter :ref:`ch-tiny-transformer`'s trained runs.

The tiny Transformer of :mod:`companion.model` (:data:`CAPSTONE_SIZES`) trained on the
lag task (:data:`CAPSTONE_TASK`: the target at position :math:`t` is the token at
:math:`t - k`), and what the chapter reads from it:

* the position schemes compared (:func:`capstone_model`, :func:`train_capstone_scheme`,
  every seed at every budget in one batched run), scored per position by
  :func:`position_accuracies` and over bands of positions by :func:`band_accuracy`,
  :math:`\bar a_{[a, b)} = \frac{1}{b - a} \sum_{t=a}^{b-1} \mathrm{acc}(t)`;
* Post-LN against Pre-LN, with and without a warm-up (:func:`warmup_runs`), and the
  premises of the warm-up's explanation measured on one AdamW step
  (:func:`first_adamw_step`);
* the third exercise, another task on the same tokens (:func:`absolute_position_runs`);
* when a loss curve first gets below a threshold (:func:`first_step_below`, a moving
  mean) and when a trained run loses what it learned (:func:`first_relapse`).

Every model is built and trained by :mod:`companion.experiments`
(:func:`~companion.experiments.build`, :func:`~companion.experiments.train_batched`), so
the numeric variants of ``make claims`` act on it; the chapter and
``tests/test_model_claims.py`` call these functions with the constants below, so the
claims the harness checks are the chapter's own.

Shape:
    - :func:`position_accuracies`: ``(seeds, L)``; :func:`band_accuracy`:
      ``(seeds, L) -> (seeds, bands)``
    - :func:`first_adamw_step`: ``(seeds, 3)`` per placement
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.nn import functional as F

from companion import _validate, experiments
from companion.experiments import SeedRuns
from companion.model import ModelConfig, TinyTransformer, lag_task, position_accuracy

__all__ = [
    "ABSOLUTE_STEPS",
    "CAPSTONE_BUDGETS",
    "CAPSTONE_EVAL_LENGTH",
    "CAPSTONE_LR",
    "CAPSTONE_SEEDS",
    "CAPSTONE_SIZES",
    "CAPSTONE_TASK",
    "CAPSTONE_WARMUP_STEPS",
    "WARMUP_CONFIGS",
    "WARMUP_RUN_LR",
    "WARMUP_RUN_SEEDS",
    "WARMUP_RUN_STEPS",
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
"""The capstone's scheme comparison trains :func:`~companion.experiments.seeds`
``(CAPSTONE_SEEDS)``."""

CAPSTONE_BUDGETS: dict[str, tuple[int, int]] = {
    "none": (500, 1000),  # the slow learners: still learning at the larger budget
    "sinusoidal": (250, 500),  # below 0.01 nats within 250 steps
    "rope": (250, 500),
    "alibi": (500, 1000),
}
"""The capstone's budgets in steps, per scheme (:func:`train_capstone_scheme`'s
``budgets``): the results use the larger, the smaller (half of it) shows what the budget
changes. The schemes that still learn at the end get twice the steps of those that reach
a loss near zero early."""

CAPSTONE_LR = 1e-2
"""The capstone's peak learning rate (:func:`train_capstone_scheme`'s ``lr``)."""

CAPSTONE_WARMUP_STEPS = 50
"""The capstone's linear warm-up (:func:`train_capstone_scheme`'s ``warmup_steps``)."""

WARMUP_RUN_SEEDS = 6
"""The Post-LN/Pre-LN experiment's seed count, as in
:func:`~companion.experiments.seeds` ``(WARMUP_RUN_SEEDS)``."""

WARMUP_RUN_STEPS = 100
"""The Post-LN/Pre-LN experiment's steps (:func:`warmup_runs`'s ``steps``)."""

WARMUP_RUN_LR = 3e-2
"""The Post-LN/Pre-LN experiment's constant rate (:func:`warmup_runs`'s ``lr``)."""

ABSOLUTE_STEPS: dict[str, int] = {"learned": 100, "rope": 600}
"""The third exercise's steps per scheme (:func:`absolute_position_runs`'s ``steps``)."""


def capstone_model(position: str, **overrides: object) -> Callable[[], TinyTransformer]:
    """The factory of the capstone's model with one position scheme: give it to
    :func:`~companion.experiments.build` or :func:`~companion.experiments.run_seeds`.

    Args:
        position: ``"none"``, ``"sinusoidal"``, ``"learned"``, ``"rope"`` or ``"alibi"``.
        **overrides: other :class:`~companion.model.ModelConfig` fields (``num_layers``,
            ``placement``, ``rope_base``, ...), in place of :data:`CAPSTONE_SIZES`.

    Returns:
        A function of no arguments that builds a fresh
        :class:`~companion.model.TinyTransformer`.
    """
    config = ModelConfig(**{**CAPSTONE_SIZES, "position": position, **overrides})  # type: ignore[arg-type]
    return lambda: TinyTransformer(config)


def train_capstone_scheme(
    scheme: str,
    seed_list: Sequence[int],
    *,
    budgets: Sequence[int] | None = None,
    lr: float = CAPSTONE_LR,
    warmup_steps: int = CAPSTONE_WARMUP_STEPS,
    device: torch.device | str | None = None,
    progress: bool = False,
) -> dict[int, SeedRuns]:
    """The capstone's scheme comparison for one scheme: every seed at every budget.

    Each ``(budget, seed)`` model is built with :func:`~companion.experiments.build` (so
    the seed sets both the initial weights and the batches) and all of them train
    together in one :func:`~companion.experiments.train_batched` call on the lag task
    (:data:`CAPSTONE_TASK`): AdamW, a linear warm-up to ``lr`` over ``warmup_steps``,
    then half a cosine to zero at each run's own last step.

    Args:
        scheme: the position scheme (see :func:`capstone_model`).
        seed_list: the seeds (e.g. ``seeds(3)``).
        budgets: the numbers of steps, each run once per seed; ``None``: the
            scheme's :data:`CAPSTONE_BUDGETS`.
        lr: peak learning rate.
        warmup_steps: linear warm-up steps.
        device: where to train.
        progress: print the mean loss during training.

    Returns:
        budget -> :class:`~companion.experiments.SeedRuns` (the seeds in
        ``seed_list``'s order).
    """
    factory = capstone_model(scheme)
    seed_list = experiments.distinct_seeds("seed_list", seed_list)
    if budgets is None:
        budgets = CAPSTONE_BUDGETS[_validate.choice("scheme", scheme, CAPSTONE_BUDGETS)]
    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, Sequence):
        raise _validate.fail(TypeError, "budgets", "a sequence of step counts", budgets)
    budgets = tuple(
        _validate.positive_int(f"budgets[{i}]", b) for i, b in enumerate(budgets)
    )
    if not budgets or len(set(budgets)) != len(budgets):
        raise ValueError(f"budgets must be distinct step counts, got {budgets}")
    jobs = [(steps, seed) for steps in budgets for seed in seed_list]
    models = [experiments.build(factory, seed, device=device) for _, seed in jobs]
    runs = experiments.train_batched(
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
        runs: trained models (a :class:`~companion.experiments.SeedRuns`).
        length: the evaluation length.
        lag: the task's lag.

    Returns:
        float64 ``(seeds, length)``, ``nan`` at ``t < lag``.
    """
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
    configuration of :data:`WARMUP_CONFIGS` (one
    :func:`~companion.experiments.train_batched` call per placement).

    Args:
        seed_list: the seeds (e.g. ``seeds(6)``).
        steps: training steps of every run.
        lr: the learning rate, reached after the warm-up and then kept.
        num_layers: the model's depth.
        configs: label -> (placement, warm-up steps); :data:`WARMUP_CONFIGS` by default.
        device: where to train.
        progress: print the mean loss during training.

    Returns:
        label -> :class:`~companion.experiments.SeedRuns`, in ``configs``' order.
    """
    seed_list = experiments.distinct_seeds("seed_list", seed_list)
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
        models = [experiments.build(factory, seed, device=device) for _, seed in jobs]
        runs = experiments.train_batched(
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

    For each placement and seed: build the model (:func:`~companion.experiments.build`),
    take one batch of the lag task (from the seed), and record the norm of the gradient
    of the top MLP's output matrix, the norm of AdamW's first update of it, and how far
    the step moves the logits, ``|z_after - z_before| / |z_before|``.

    Args:
        seed_list: the seeds.
        lr: AdamW's learning rate.
        num_layers: the model's depth.
        device: where to compute.

    Returns:
        placement (``"post"``, ``"pre"``) -> float64 ``(seeds, 3)``: gradient norm,
        update norm, relative logit change.
    """
    seed_list = experiments.distinct_seeds("seed_list", seed_list)
    lr = _validate.positive_real("lr", lr)
    out = {}
    for placement in ("post", "pre"):
        factory = capstone_model("rope", num_layers=num_layers, placement=placement)
        rows = []
        for seed in seed_list:
            net = experiments.build(factory, seed, device=device)
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
        ``(runs, accuracy)``: the :class:`~companion.experiments.SeedRuns` and each
        seed's accuracy at each position, float64 ``(seeds, eval_length)``.
    """
    _validate.callable_("targets", targets)
    eval_length = _validate.positive_int("eval_length", eval_length)
    runs = experiments.run_seeds(
        capstone_model(position),
        experiments.distinct_seeds("seed_list", seed_list),
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
    answer = experiments.task_targets(targets, tokens)
    with torch.no_grad():
        hit = torch.stack(
            [m(tokens).argmax(dim=-1) == answer for m in runs.models]
        )  # (seeds, 256, eval_length)
    return runs, hit.double().mean(dim=1).cpu()
